"""The one rule for every file prefixkv reads: regular files only, opened without
blocking, read within a byte budget.

* **Regular files only.** An input is stat'ed before it is opened: a FIFO would block
  the open until some writer came (forever, without one), a character device such as
  ``/dev/zero`` never ends, a folder is not a document. Each is refused by name. A
  symbolic link is followed (its target is what counts).
* **Opened without blocking.** The open itself uses ``O_NONBLOCK``, and the open file
  is stat'ed again, so a path swapped for a FIFO between the two looks cannot block it
  either.
* **Read within a budget.** :func:`read_input` reads at most one byte past its limit,
  so a file that grows while it is read, or that says it is smaller than it is
  (``/proc``), costs the limit, never its size.

Every refusal is one line that names the file, raised as the caller's named error
class. Standard library only, like :mod:`prefixkv.adapters.outputs`.
"""

from __future__ import annotations

import os
import stat
from typing import IO, Union

from prefixkv.adapters.outputs import _kind as special_kind
from prefixkv.indexes.errors import PrefixKVError

__all__ = ["InputError", "check_input", "open_input", "read_input"]

StrPath = Union[str, "os.PathLike[str]"]
"""A path as callers give it."""


class InputError(PrefixKVError):
    """An input path is unusable: missing, unreadable, not a regular file, or larger
    than its limit."""


def _kind(mode: int) -> str:
    return "folder" if stat.S_ISDIR(mode) else special_kind(mode)


def _refuse_special(path: StrPath, mode: int, what: str, error: type[Exception]) -> None:
    if not stat.S_ISREG(mode):
        raise error(
            f"{os.fspath(path)}: a {_kind(mode)}, not a regular file; a {what} is read "
            "from a regular file only"
        )


def check_input(
    path: StrPath, *, what: str = "file", error: type[Exception] = InputError
) -> os.stat_result:
    """Stat ``path`` (following links) and refuse anything but a regular file,
    without opening it.

    Raises:
        error: ``path`` is missing or unreadable, or not a regular file.
    """
    try:
        st = os.stat(path)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise error(f"{os.fspath(path)}: cannot read the {what}: {_reason(exc)}") from None
    _refuse_special(path, st.st_mode, what, error)
    return st


def open_input(
    path: StrPath, *, what: str = "file", error: type[Exception] = InputError
) -> IO[bytes]:
    """``path`` opened for binary reading, once it is known to be a regular file.

    Raises:
        error: ``path`` is missing or unreadable, or not a regular file (checked
            before the open and again on the open file).
    """
    check_input(path, what=what, error=error)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise error(f"{os.fspath(path)}: cannot read the {what}: {_reason(exc)}") from None
    try:
        _refuse_special(path, os.fstat(fd).st_mode, what, error)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(
    path: StrPath, max_bytes: int, *, what: str = "file", error: type[Exception] = InputError
) -> bytes:
    """The whole of a regular file of at most ``max_bytes`` bytes.

    Raises:
        error: the checks of :func:`open_input`, a read that fails, or a file past
            ``max_bytes`` (refused by its size before reading, or after reading one
            byte past the limit when its size said less).
    """
    with open_input(path, what=what, error=error) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise error(
                f"{os.fspath(path)}: {size:,} bytes exceed the {what} limit of {max_bytes:,}"
            )
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise error(f"{os.fspath(path)}: cannot read the {what}: {_reason(exc)}") from None
    if len(data) > max_bytes:
        raise error(f"{os.fspath(path)}: more than the {what} limit of {max_bytes:,} bytes")
    return data


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
