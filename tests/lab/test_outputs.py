"""The one output rule: regular files only, never through a link, never over an input,
``--out`` checked before the first run, ``--kv-events`` endpoints never taken for files.

Special files are made in ``tmp_path`` (a FIFO, a symbolic link, a socket; a character
device only when running as root): no test touches the system's ``/dev/null``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
from pathlib import Path

import pytest
from helpers import ROOT

from prefixkv.adapters.lab.cli import main
from prefixkv.adapters.lab.traces import write_trace
from prefixkv.adapters.lab.workloads import seed_example
from prefixkv.adapters.outputs import (
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
    with pytest.raises(OutputError, match="ends with a slash"):
        check_output(f"{tmp_path}/new/")
    if os.path.isdir("/proc/self"):  # permissions say yes to root; creating says no
        with pytest.raises(OutputError, match=r"cannot create /proc/prefixkv/x\.json"):
            check_output("/proc/prefixkv/x.json")
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


def _trace(tmp_path: Path) -> Path:
    trace = tmp_path / "seed.jsonl"
    write_trace(trace, seed_example())
    return trace


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prefixkv: error: "), err
    assert not out  # refused before any run: no table, no progress line
    return lines[0]


@pytest.mark.parametrize("flag", ["--out", "--kv-events"])
def test_replay_refuses_special_outputs(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path)
    specials = _specials(tmp_path)
    before = _kinds(specials)
    for name, path in specials.items():
        out = path if flag == "--out" else tmp_path / "hits.jsonl"
        argv = ["replay", str(trace), "--index", "radix", "--out", str(out)]
        if flag == "--kv-events":
            argv += ["--kv-events", str(path)]
        assert main(argv) == 2, name
        assert _MESSAGE[name] in _one_error(capsys)
    assert _kinds(specials) == before
    assert (tmp_path / "victim.txt").read_text() == "keep me\n"
    assert not (tmp_path / "hits.jsonl").exists()


def test_calibrate_checks_its_profile_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = _fifo(tmp_path / "profile.json")
    assert main(["calibrate", "--quick", "--out", str(fifo)]) == 2
    assert "is a FIFO" in _one_error(capsys)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_compare_and_cluster_refuse_their_inputs_as_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    trace = folder / "results.json"
    write_trace(trace, seed_example())
    before = trace.read_bytes()
    for argv in (
        ["cluster", "--trace", str(trace), "--out", str(folder), "--replicas", "2"],
        ["compare", "--trace", str(trace), "--out", str(folder)],
        ["cluster", "--trace", str(trace), "--out", str(trace)],
        ["compare", "--trace", str(folder / "results.json"), "--out", str(tmp_path / "x"),
         "--request-rate", "1", "--profile", str(tmp_path / "x" / "report.md")],
    ):  # fmt: skip
        if "--profile" in argv:  # a profile file is an input too
            (tmp_path / "x").mkdir()
            (tmp_path / "x" / "report.md").write_text("{}")
        assert main(argv) == 2, argv
        line = _one_error(capsys)
        assert "is the input" in line or "not a folder" in line, line
    assert trace.read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["results.json"]
    assert (tmp_path / "x" / "report.md").read_text() == "{}"


def test_cluster_checks_out_before_the_first_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("a file, not a folder")
    argv = ["cluster", "--workload", "multi_turn", "--replicas", "2", "--policies",
            "round_robin", "--out", str(blocker / "report")]  # fmt: skip
    assert main(argv) == 2
    assert "not a folder" in _one_error(capsys)
    report = tmp_path / "r"
    report.mkdir()
    (report / "hit_ratio.png").symlink_to(blocker)
    assert main([*argv[:-1], str(report)]) == 2
    assert "symbolic link" in _one_error(capsys)
    assert blocker.read_text() == "a file, not a folder"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("inproc://x", "inproc:// reaches only this process"),
        ("INPROC://x", "inproc:// reaches only this process"),
        ("http://127.0.0.1:80", "unknown scheme 'http'"),
        ("tcp://", "has no address"),
    ],
)
def test_kv_events_urls_are_never_file_names(
    value: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace = _trace(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = ["replay", str(trace), "--index", "radix", "--out", "h.jsonl", "--kv-events", value]
    assert main(argv) == 2
    assert message in _one_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no file named inproc:


def test_ipc_endpoints_never_delete_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ZeroMQ unlinks what sits at an ipc:// path before binding: a file there is refused.
    trace = _trace(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    fifo = _fifo(tmp_path / "fifo")
    out = str(tmp_path / "h.jsonl")
    for flags in (
        ["--kv-events", f"ipc://{victim}"],
        ["--kv-events", f"IPC://{fifo}"],
        ["--kv-events", f"ipc://{tmp_path / 'pub'}", "--kv-events-replay", f"ipc://{victim}"],
        ["--kv-events", f"ipc://{trace}"],
    ):
        assert main(["replay", str(trace), "--index", "radix", "--out", out, *flags]) == 2
        assert "is not a socket" in _one_error(capsys)
    assert victim.read_text() == "keep me\n" and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_wildcard_port_is_bound_and_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("zmq")
    monkeypatch.chdir(tmp_path)  # were it taken for a file name, it lands here
    trace = _trace(tmp_path)
    out = tmp_path / "h.jsonl"
    argv = ["replay", str(trace), "--index", "radix", "--out", str(out), "--quiet",
            "--kv-events", "TCP://127.0.0.1:*"]  # fmt: skip
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    bound = stdout.split("KV events: publishing on ", 1)[1].split()[0]
    host, _, port = bound.rpartition(":")
    assert host == "tcp://127.0.0.1" and port.isdigit() and int(port) > 0, stdout
    summary = json.loads(out.read_text().splitlines()[-1])["summary"]
    assert summary["kv_events"]["target"] == bound


def test_replay_refuses_event_flags_it_would_ignore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path)
    out = str(tmp_path / "h.jsonl")
    for flags, message in (
        (["--kv-events-topic", "kv"], "--kv-events-topic needs --kv-events to be a tcp://"),
        (["--kv-events", str(tmp_path / "e.jsonl"), "--kv-events-topic", "kv"], "tcp://"),
        ([], "ends with a slash"),
    ):
        target = out + "/" if not flags else out
        argv = ["replay", str(trace), "--index", "radix", "--out", target, *flags]
        assert main(argv) == 2
        assert message in _one_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed.jsonl"]


def test_event_files_follow_the_rule(tmp_path: Path) -> None:
    from prefixkv.adapters.events import EventFileWriter
    from prefixkv.adapters.events.wire import KVEventBatch

    specials = _specials(tmp_path)
    before = _kinds(specials)
    for name, path in specials.items():
        with pytest.raises(OutputError, match=_MESSAGE[name]):
            EventFileWriter(path)
    assert _kinds(specials) == before
    target = tmp_path / "events.jsonl"
    target.write_bytes(b"old\n")
    with EventFileWriter(target) as sink:
        sink.publish(KVEventBatch(ts=1.0, events=[]))
        assert target.read_bytes() == b"old\n"  # whole at shutdown, not line by line
    assert target.read_bytes() == b"[1.0,[],0]\n"
    with pytest.raises(KeyError), EventFileWriter(target) as sink:
        sink.publish(KVEventBatch(ts=2.0, events=[]))
        raise KeyError("a failed run")
    assert target.read_bytes() == b"[1.0,[],0]\n"  # the failed run left it as it was
    sink.shutdown()  # again: nothing more happens
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


WRITES = re.compile(
    r"open\([^)]*['\"][wax]b?\+?['\"]|\.write_(text|bytes)\(|\.savefig\(|os\.(replace|rename)\("
    r"|shutil\.(copy\w*|move)\(|\.to_(csv|parquet)\("
)


def test_every_writer_goes_through_the_one_rule() -> None:
    # Files are created only in prefixkv.adapters.outputs: everything else hands it bytes
    # (atomic_writer), a figure (save_figure) or a finished file (install_file).
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("indexes", "storage", "adapters")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != ROOT / "adapters" / "outputs.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if WRITES.search(line)
    ]
    assert not found, "\n".join(found)
