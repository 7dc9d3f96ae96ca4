"""Output files that never destroy inputs or earlier results.

Every file the bench writes goes to a temporary file beside its target and is renamed
over it only once complete (``os.replace`` is atomic on POSIX and Windows), so an
interrupted or failed run leaves either the old file or the new one, never a torn or
empty one. :func:`refuse_overwrite` stops an output that names an input.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from prefixkv.indexes.errors import PrefixKVError

from .reading import StrPath

__all__ = ["OutputError", "atomic_writer", "refuse_overwrite"]


class OutputError(PrefixKVError):
    """An output path is unusable: it names an input, or a folder where a file goes."""


@contextlib.contextmanager
def atomic_writer(path: StrPath) -> Iterator[IO[bytes]]:
    """A binary file object whose content replaces ``path`` when the block exits cleanly.

    Missing parent folders are created. If the block raises, the temporary file is
    removed and ``path`` is left as it was.

    Raises:
        OutputError: ``path`` is an existing folder.
        OSError: the folder cannot be written.
    """
    target = Path(path)
    if target.is_dir():
        raise OutputError(f"{target} is a folder; give a file name")
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
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _same(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


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
            if src.is_dir() and _same(out.parent, src):
                raise OutputError(
                    f"output {out} would land in the input folder {src}; choose another place"
                )
