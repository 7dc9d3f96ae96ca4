"""The one rule for every file prefixkv writes: regular files only, whole or not at all,
never over an input.

* **Regular files only.** An output that exists must be a regular file: never a
  symbolic link (nothing is written through one), a character or block device, a FIFO
  or a socket (``--kv-events /dev/null`` run as root must not replace ``/dev/null``).
  The folders above it may be links (``/tmp`` often is); only the last name counts.
* **Whole or not at all.** :func:`atomic_writer` writes a temporary file beside the
  target, syncs it to disk, and renames it over the target only once complete
  (``os.replace`` is atomic on POSIX and Windows), so an interrupted or failed run
  leaves either the old file or the new one, never a torn or empty one.
* **Never over an input.** :func:`refuse_overwrite` stops an output that names an
  input (a trace, a profile) or lands in an input folder;
  :func:`check_output_folder` checks a report folder and the names it will hold
  before the first run, so a mistake costs nothing: the folder and the inputs never
  overlap (it is no input, is inside none, and holds none).

Every writer (the lab's reports, tables, plots, ``results.json``, hit files and
profiles; :class:`~prefixkv.adapters.events.EventFileWriter`) goes through
:func:`atomic_writer`, :func:`save_figure` or :func:`install_file`. Standard library
only, so the engine-facing packages (``adapters/events``) use it without the lab, torch
or ZeroMQ.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol, Union

from prefixkv.indexes.errors import PrefixKVError

__all__ = [
    "OutputError",
    "atomic_writer",
    "check_output",
    "check_output_folder",
    "install_file",
    "refuse_overwrite",
    "save_figure",
]

StrPath = Union[str, "os.PathLike[str]"]
"""A path as callers give it."""


class OutputError(PrefixKVError):
    """An output path is unusable: not a regular file, an input, or a folder where a
    file goes."""


_KINDS = (
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "special file")


def _writable_parent(path: Path) -> None:
    """The nearest existing folder above ``path`` is a folder where this process can
    create the folders and the file ``path`` needs (tried: permissions alone do not say,
    for root or on special file systems such as ``/proc``)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        if parent.is_symlink():  # a dangling link: mkdir would fail late
            raise OutputError(f"{parent} is a broken symbolic link; cannot create {path}")
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"{parent} is not a folder; cannot create {path}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".prefixkv-probe-", dir=parent))
    except OSError as exc:
        raise OutputError(f"cannot create {path}: {exc.strerror or exc} in {parent}") from None


def check_output(path: StrPath) -> Path:
    """Check that ``path`` may be written as a regular file; returns it as a ``Path``.

    Nothing is created. ``path`` may be absent (its nearest existing parent must be a
    writable folder) or a regular file; anything else is refused.

    Raises:
        OutputError: ``path`` is a symbolic link, a folder, a device, a FIFO or a
            socket, or its folder cannot be created or written.
    """
    target = Path(path)
    if os.fspath(path).endswith(("/", os.sep)):
        raise OutputError(
            f"{os.fspath(path)} ends with a slash, as a folder does; give a file name"
        )
    try:
        st = target.lstat()
    except (FileNotFoundError, NotADirectoryError):
        _writable_parent(target)
        return target
    except OSError as exc:
        raise OutputError(f"cannot use {target} as an output: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(
            f"{target} is a symbolic link; outputs are regular files, never written "
            "through a link (remove it or give another name)"
        )
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{target} is a folder; give a file name")
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(
            f"{target} is a {_kind(st.st_mode)}; outputs are regular files only "
            "(it is left as it is)"
        )
    _writable_parent(target)
    return target


def _sync_folder(folder: Path) -> None:
    # The rename is durable once the folder's entry is on disk (POSIX; a no-op elsewhere).
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: StrPath) -> Iterator[IO[bytes]]:
    """A binary file object whose content replaces ``path`` when the block exits cleanly.

    ``path`` is checked first (:func:`check_output`) and again just before the rename;
    missing parent folders are created. The file is synced before the rename and the
    folder after it. If the block raises, the temporary file is removed and ``path`` is
    left as it was.

    Raises:
        OutputError: ``path`` is not a regular file or an absent name
            (see :func:`check_output`).
        OSError: the folder cannot be written.
    """
    target = check_output(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp makes the file private (0600); an output gets the usual permissions.
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        install_file(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def install_file(src: StrPath, target: StrPath) -> Path:
    """Rename the finished file ``src`` over ``target`` (same file system), under the
    output rule: ``target`` is checked just before the rename and its folder synced.

    Raises:
        OutputError: ``target`` is not a regular file or an absent name.
    """
    out = check_output(target)
    os.replace(src, out)
    _sync_folder(out.parent)
    return out


class _Figure(Protocol):
    def savefig(self, fname: IO[bytes], *, format: str) -> Any: ...


def save_figure(figure: _Figure, path: StrPath) -> Path:
    """Save a matplotlib figure to ``path`` under the rule (:func:`atomic_writer`), in
    the format its suffix names (``.png`` when it has none).

    Raises:
        OutputError: ``path`` is not a regular file or an absent name.
    """
    target = Path(path)
    with atomic_writer(target) as f:
        figure.savefig(f, format=target.suffix.lstrip(".") or "png")
    return target


def _same(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def _inside(path: Path, folder: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def refuse_overwrite(outputs: Iterable[StrPath], inputs: Iterable[StrPath]) -> None:
    """Raise if any output file is one of the inputs (or lands inside an input folder).

    Hard links, symbolic links and ``./a`` vs ``a`` spellings count as the same file.

    Raises:
        OutputError: naming the output and the input it would overwrite.
    """
    ins = [Path(p) for p in inputs]
    for out in map(Path, outputs):
        for src in ins:
            if _same(out, src):
                raise OutputError(f"output {out} is the input {src}; refusing to overwrite it")
            if src.is_dir() and _inside(out.parent, src):
                raise OutputError(
                    f"output {out} would land in the input folder {src}; choose another place"
                )


def check_output_folder(
    folder: StrPath, names: Iterable[str], inputs: Iterable[StrPath | None] = ()
) -> Path:
    """Check a report folder before the first run: it is a folder (or absent, and
    creatable), it is not an input, not inside an input folder and holds no input (a
    report beside a kv-cache-tester conversation would make its folder read as another
    trace), and each file it will hold passes :func:`check_output` and is no input.
    Nothing is created.

    Args:
        folder: the ``--out`` folder.
        names: the file names the command may write there.
        inputs: the input paths (trace, profile; ``None`` entries are skipped).

    Returns:
        ``folder`` as a ``Path``.

    Raises:
        OutputError: naming the first problem.
    """
    out = Path(folder)
    ins = [Path(p) for p in inputs if p is not None]
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out} is not a folder; give a folder for the report")
    if not out.exists():
        _writable_parent(out)
    for src in ins:
        if _same(out, src) or (src.is_dir() and _inside(out, src)):
            raise OutputError(f"--out {out} is the input {src} or inside it; choose another folder")
    outputs = [out / name for name in names]
    for path in outputs:
        check_output(path)
    refuse_overwrite(outputs, ins)
    for src in ins:
        if out.exists() and _inside(src, out):
            raise OutputError(
                f"--out {out} holds the input {src}; the report would be written among the "
                "inputs (a trace folder would then read its files as conversations); "
                "choose another folder"
            )
    return out
