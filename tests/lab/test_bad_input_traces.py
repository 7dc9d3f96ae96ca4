"""Hostile trace files: compression bombs, FIFOs, devices, sockets.

Every trace is a regular file (or a kv-cache-tester folder), refused otherwise before
it is opened, and every archive member is read within the document limit and a
decompression budget counted while it streams: a few KB cannot cost hundreds of MB.
Each fault is a :class:`TraceFormatError` naming the file, and through the CLI exit 2,
one line, no traceback, nothing written. Memory is measured with tracemalloc (bytes
allocated, not time).
"""

from __future__ import annotations

import bz2
import contextlib
import io
import os
import socket
import tarfile
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from special_files import fifo_valve

from prefixkv.adapters.lab.cli import main
from prefixkv.adapters.lab.traces import TraceFormatError, open_trace
from prefixkv.adapters.lab.traces.kvcache_tester import EXPANSION_FLOOR_BYTES

BOMB_BYTES = 96 * 2**20
"""One member of spaces: 94 KB as gzip, 14 KB as xz."""


class _Spaces(io.RawIOBase):
    """``n`` spaces, read without holding them."""

    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        k = min(len(b), self.left)
        b[:k] = b" " * k
        self.left -= k
        return k


def _bomb(path: Path, mode: str, **kwargs: int) -> Path:
    with tarfile.open(path, mode, **kwargs) as tar:  # type: ignore[call-overload]
        info = tarfile.TarInfo("c.json")
        info.size = BOMB_BYTES
        tar.addfile(info, io.BufferedReader(_Spaces(BOMB_BYTES)))
    return path


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bombs")
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w") as tar:
        info = tarfile.TarInfo("c.json")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"{}  "))
    (d / "bz2.tar").write_bytes(bz2.compress(plain.getvalue()))
    (d / "zstd.tar.xz").write_bytes(b"\x28\xb5\x2f\xfd" + plain.getvalue())
    return {
        "xz": _bomb(d / "bomb.tar.xz", "w:xz", preset=0),
        "gzip": _bomb(d / "bomb.tar.gz", "w:gz", compresslevel=9),
        "bzip2": d / "bz2.tar",
        "zstd": d / "zstd.tar.xz",
    }


def _peak(read: Callable[[], object]) -> tuple[str, int]:
    """The error ``read()`` fails with, and the most bytes Python held meanwhile."""
    tracemalloc.start()
    try:
        with pytest.raises(TraceFormatError) as info:
            read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return str(info.value), peak


@pytest.mark.parametrize("kind", ["xz", "gzip"])
def test_a_compression_bomb_stops_within_its_budget(bombs: dict[str, Path], kind: str) -> None:
    path = bombs[kind]
    assert path.stat().st_size < 100_000 and BOMB_BYTES > 2 * EXPANSION_FLOOR_BYTES
    message, peak = _peak(lambda: open_trace(path).scan())
    assert message.startswith(f"{path}:c.json: decompresses past 33,554,432 bytes and 100")
    assert "compression bomb" in message and "extract the archive" in message
    # The floor and 100 times the compressed bytes, a growing buffer's slack and one
    # chunk: never the member's 96 MiB (nor twice that, as it cost before).
    assert peak < 1.25 * (EXPANSION_FLOOR_BYTES + 100 * path.stat().st_size) + 2**21


@pytest.mark.parametrize("kind", ["bzip2", "zstd"])
def test_an_archive_in_a_compression_not_read_is_refused_by_name(
    bombs: dict[str, Path], kind: str
) -> None:
    path = bombs[kind]
    with pytest.raises(TraceFormatError, match=f"{path}: a {kind}-compressed file"):
        open_trace(path).scan()


# ---------------------------------------------------------------- special files


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "trace.jsonl"
    os.mkfifo(path)
    with fifo_valve(path):
        yield path


@pytest.fixture
def fifo_with_writer(tmp_path: Path) -> Iterator[Path]:
    """A FIFO that a writer keeps offering a valid trace to."""
    path = tmp_path / "fed.jsonl"
    os.mkfifo(path)
    done = threading.Event()

    def feed() -> None:
        while not done.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet
                done.wait(0.01)
                continue
            with contextlib.suppress(OSError):
                os.write(fd, b'{"id": "a", "tokens": [1, 2, 3]}\n')
            os.close(fd)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    try:
        with fifo_valve(path):
            yield path
    finally:
        done.set()
        thread.join(timeout=10)


@pytest.mark.parametrize("trace_format", [None, "prefixkv", "mooncake", "kv-cache-tester"])
def test_a_fifo_is_refused_before_it_is_opened(fifo: Path, trace_format: str | None) -> None:
    with pytest.raises(TraceFormatError, match=f"{fifo}: a FIFO, not a regular file"):
        open_trace(fifo, trace_format).scan()  # type: ignore[arg-type]


def test_a_fifo_with_a_writer_is_refused_naming_it(fifo_with_writer: Path) -> None:
    with pytest.raises(TraceFormatError, match=f"{fifo_with_writer}: a FIFO, not a regular"):
        open_trace(fifo_with_writer).scan()


def test_a_fifo_named_as_an_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.tar.xz"
    os.mkfifo(path)
    with fifo_valve(path), pytest.raises(TraceFormatError, match=f"{path}: a FIFO, not a regular"):
        open_trace(path).scan()


def test_devices_and_sockets_are_refused(tmp_path: Path) -> None:
    for device in ("/dev/zero", "/dev/urandom"):
        if os.path.exists(device):
            with pytest.raises(TraceFormatError, match=f"{device}: a character device, not a"):
                open_trace(device, "prefixkv").scan()
    path = tmp_path / "s.jsonl"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(TraceFormatError, match=f"{path}: a socket, not a regular file"):
            open_trace(path).scan()


def test_a_missing_trace_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.jsonl"
    with pytest.raises(TraceFormatError, match=f"{path}: cannot read the trace: No such file"):
        open_trace(path).scan()


# ------------------------------------------------------------ the command line, whole


@pytest.mark.parametrize("case", ["xz bomb", "gzip bomb", "bzip2", "fifo", "fed fifo", "zero"])
def test_the_cli_exits_2_with_one_line_naming_the_trace(
    case: str,
    bombs: dict[str, Path],
    fifo: Path,
    fifo_with_writer: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = {
        "xz bomb": bombs["xz"],
        "gzip bomb": bombs["gzip"],
        "bzip2": bombs["bzip2"],
        "fifo": fifo,
        "fed fifo": fifo_with_writer,
        "zero": Path("/dev/zero"),
    }[case]
    out = tmp_path / "out" / "hits.jsonl"
    code = main(["replay", str(path), "--index", "hash_chain", "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"prefixkv: error: {path}")
    assert "Traceback" not in err and not out.parent.exists()


def test_an_archive_of_many_members_keeps_no_index_of_them(tmp_path: Path) -> None:
    path = tmp_path / "many.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for k in range(10_000):
            info = tarfile.TarInfo(f"d{k}")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
    message, peak = _peak(lambda: open_trace(path).scan())
    assert message == f"{path}: no .json conversation file in the archive"
    assert peak < 2**20  # the 10,000 headers kept would be 4.4 MB
