"""The one output rule: regular files only, never through a link, never over an input.

Special files are made in ``tmp_path`` (a FIFO, a symbolic link, a socket; a character
device only when running as root): no test touches the system's ``/dev/null``.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from prefixkv.adapters.lab.traces.files import (
    OutputError,
    atomic_writer,
    check_output,
    check_output_folder,
    install_file,
)

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX special files")


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _socket(path: Path) -> Path:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return path


def _specials(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a socket, a link to a file, a dangling link (and a device when root)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    link = tmp_path / "link.txt"
    link.symlink_to(victim)
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "nowhere.txt")
    made = {
        "FIFO": _fifo(tmp_path / "fifo"),
        "socket": _socket(tmp_path / "sock"),
        "symbolic link": link,
        "dangling link": dangling,
    }
    if os.geteuid() == 0:  # a null device of our own, never the system's
        device = tmp_path / "null"
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        made["character device"] = device
    return made


def _kinds(paths: dict[str, Path]) -> dict[str, int]:
    return {name: os.lstat(p).st_mode for name, p in paths.items()}


_MESSAGE = {
    "FIFO": "is a FIFO",
    "socket": "is a socket",
    "symbolic link": "is a symbolic link",
    "dangling link": "is a symbolic link",
    "character device": "is a character device",
}


def test_only_regular_files_are_written(tmp_path: Path) -> None:
    specials = _specials(tmp_path)
    before = _kinds(specials)
    for name, path in specials.items():
        with pytest.raises(OutputError, match=_MESSAGE[name]):
            check_output(path)
        with pytest.raises(OutputError, match=_MESSAGE[name]), atomic_writer(path) as f:
            f.write(b"x")
        staged = tmp_path / "staged.png"
        staged.write_bytes(b"png")
        with pytest.raises(OutputError, match=_MESSAGE[name]):
            install_file(staged, path)
    assert _kinds(specials) == before  # every one still what it was
    assert (tmp_path / "victim.txt").read_text() == "keep me\n"
    assert not (tmp_path / "nowhere.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(OutputError, match="is a folder"):
        check_output(tmp_path)
    with pytest.raises(OutputError, match="not a folder"):
        check_output(tmp_path / "victim.txt" / "below.json")
    regular = tmp_path / "regular.json"
    regular.write_text("old")
    with atomic_writer(regular) as f:
        f.write(b"new")
    assert regular.read_text() == "new"


def test_report_folders_are_checked_before_anything_runs(tmp_path: Path) -> None:
    trace = tmp_path / "d" / "results.json"
    trace.parent.mkdir()
    trace.write_text("{}")
    with pytest.raises(OutputError, match="is the input"):
        check_output_folder(tmp_path / "d", ["results.json", "report.md"], [trace])
    with pytest.raises(OutputError, match="is the input"):
        check_output_folder(tmp_path / "d", ["report.md"], [tmp_path / "d"])
    with pytest.raises(OutputError, match="inside it"):
        check_output_folder(tmp_path / "d" / "sub", ["report.md"], [tmp_path / "d"])
    with pytest.raises(OutputError, match="not a folder"):
        check_output_folder(trace, ["report.md"], [])
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "report.md").symlink_to(trace)
    with pytest.raises(OutputError, match="symbolic link"):
        check_output_folder(tmp_path / "e", ["report.md"], [])
    assert check_output_folder(tmp_path / "new" / "deeper", ["report.md"], [trace]).name == "deeper"
    assert not (tmp_path / "new").exists()  # checking creates nothing
