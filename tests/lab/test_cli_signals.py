"""Real signals to a real ``prefixkv`` process: nothing finished is lost, no traceback.

Each test starts ``python -m prefixkv.adapters.lab`` in a subprocess, sends a signal
(SIGINT, SIGTERM, SIGHUP as a closed terminal, SIGQUIT, SIGUSR1...: once, or a flood
of them, as an impatient user pressing Ctrl-C again while partial results are written)
once the command has reached an observable point, and checks the exit status
(128 + the signal), the one-line message and the files. Every wait is bounded; a
process still alive at the end is killed.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}
# Every signal a user, a terminal or a job scheduler sends to end a process.
STOPPING = [
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM",
                 "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGIO", "SIGPWR")
    if hasattr(signal, name)
]  # fmt: skip


HANG_S = 300.0
"""A bound against hangs only: each wait is for an event (a handler installed, rows
written, lines printed, the process gone), which takes seconds even at load 25."""


class Command:
    """A ``prefixkv`` subprocess whose stdout lines are collected as they come."""

    def __init__(self, cwd: Path, *argv: str, merge_stderr: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prefixkv.adapters.lab", *argv],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        assert self.proc.stdout is not None
        # One reader per pipe, to its end: nothing else reads them (a communicate() beside
        # a reader thread would split the output between the two).
        self.readers = [threading.Thread(target=self._read, args=(self.proc.stdout,),
                                         daemon=True)]  # fmt: skip
        if self.proc.stderr is not None:
            self.readers.append(threading.Thread(
                target=lambda f: self.stderr.extend(f), args=(self.proc.stderr,), daemon=True
            ))  # fmt: skip
        for reader in self.readers:
            reader.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.put(line)

    def wait_for(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``done`` every few milliseconds; fail (naming ``what``) after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not done():
            if self.proc.poll() is not None:
                pytest.fail(f"exited {self.proc.returncode} before {what}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout} s")
            time.sleep(0.005)

    def wait_for_lines(self, n: int, timeout: float) -> None:
        def enough() -> bool:
            while not self.lines.empty():
                self.stdout.append(self.lines.get())
            return len(self.stdout) >= n

        self.wait_for(enough, timeout, f"{n} lines of output")

    def flood(self, signum: int, timeout: float = HANG_S, every: float = 0.01) -> tuple[str, str]:
        """Send ``signum`` every ``every`` seconds until the process exits; returns its
        whole stdout and stderr."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.proc.send_signal(signum)
            time.sleep(every)
        return self.finish(timeout=HANG_S)

    def finish(self, timeout: float) -> tuple[str, str]:
        self.proc.wait(timeout=timeout)
        for reader in self.readers:
            reader.join(timeout)
        while not self.lines.empty():
            self.stdout.append(self.lines.get())
        return "".join(self.stdout), "".join(self.stderr)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def commands() -> Iterator[list[Command]]:
    made: list[Command] = []
    yield made
    for c in made:
        c.kill()


def _handler_installed(pid: int, signum: int = signal.SIGTERM) -> bool:
    # Python catches SIGINT from the start; the others only once the command's handler is in.
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _what(signum: int) -> str:
    if signum == signal.SIGINT:
        return "interrupted"
    if signum == signal.SIGTERM:
        return "terminated (SIGTERM)"
    return f"stopped by {signal.Signals(signum).name}"


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
@pytest.mark.parametrize("signum", STOPPING, ids=lambda s: signal.Signals(s).name)
def test_a_signal_in_the_first_instant_is_one_line(
    signum: int, tmp_path: Path, commands: list[Command]
) -> None:
    # The signal lands while the subcommands are still being imported (~0.4 s).
    cmd = Command(tmp_path, "compare", "-w", "seed", "--out", "o")
    commands.append(cmd)
    # Python catches SIGINT from its start: the command's own handler shows in SIGTERM's bit.
    probe = signal.SIGTERM if signum == signal.SIGINT else signum
    cmd.wait_for(lambda: _handler_installed(cmd.proc.pid, probe), HANG_S, "signal handler")
    cmd.proc.send_signal(signum)
    out, err = cmd.finish(timeout=HANG_S)
    assert cmd.proc.returncode == 128 + signum, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err == f"prefixkv: {_what(signum)} before anything was finished; nothing written\n"
    assert not out and not (tmp_path / "o").exists()


def _mooncake_trace(path: Path, num_requests: int, max_ids: int) -> Path:
    """A Mooncake-format trace: shared prefixes of 512-token hash ids, 50 ms apart."""
    rng = random.Random(0)
    with path.open("w", encoding="utf-8") as f:
        for i in range(num_requests):
            n = rng.randint(2, max_ids)
            base = rng.randint(0, 30) * 100
            f.write(json.dumps({"timestamp": i * 50, "input_length": n * 512,
                                "output_length": 4, "hash_ids": list(range(base, base + n))})
                    + "\n")  # fmt: skip
    return path


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_replay_keeps_its_rows_through_a_flood_of_signals(
    signum: int, tmp_path: Path, commands: list[Command]
) -> None:
    trace = _mooncake_trace(tmp_path / "mc.jsonl", 4000, 40)
    out = tmp_path / "hits.jsonl"
    cmd = Command(tmp_path, "replay", str(trace), "--index", "hash_chain", "--quiet",
                  "--out", str(out))  # fmt: skip
    commands.append(cmd)

    def rows_written() -> bool:  # the temporary file beside hits.jsonl has rows in it
        return any(p.stat().st_size > 0 for p in tmp_path.glob(".hits.jsonl.*.tmp"))

    cmd.wait_for(rows_written, HANG_S, "rows")
    stdout, err = cmd.flood(signum)
    assert cmd.proc.returncode == STATUS[signum], err
    assert "Traceback" not in err, err
    assert "(interrupted: partial)" in stdout
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    summary = lines[-1]["summary"]
    assert summary["partial"] is True
    assert 0 < summary["requests"] == len(lines) - 1 < 4000
    assert [r["id"] for r in lines[:-1]] == [f"mc-{i + 1}" for i in range(len(lines) - 1)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hits.jsonl", "mc.jsonl"]


@pytest.mark.parametrize(
    "signum",
    [s for s in STOPPING if s not in STATUS],  # SIGINT and SIGTERM: the flood test above
    ids=lambda s: signal.Signals(s).name,
)
def test_replay_keeps_its_rows_on_every_stopping_signal(
    signum: int, tmp_path: Path, commands: list[Command]
) -> None:
    # A closed terminal (SIGHUP), Ctrl-\\ (SIGQUIT), a job scheduler's SIGUSR1...: each
    # stops the replay as Ctrl-C does, keeping every finished row, leaving no temporary file.
    trace = _mooncake_trace(tmp_path / "mc.jsonl", 4000, 40)
    out = tmp_path / "hits.jsonl"
    cmd = Command(tmp_path, "replay", str(trace), "--index", "hash_chain", "--quiet",
                  "--out", str(out))  # fmt: skip
    commands.append(cmd)

    def rows_written() -> bool:
        return any(p.stat().st_size > 0 for p in tmp_path.glob(".hits.jsonl.*.tmp"))

    cmd.wait_for(rows_written, 60, "rows")
    cmd.proc.send_signal(signum)
    stdout, err = cmd.finish(timeout=HANG_S)
    assert cmd.proc.returncode == 128 + signum, err
    assert "Traceback" not in err, err
    assert "(interrupted: partial)" in stdout
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    summary = lines[-1]["summary"]
    assert summary["partial"] is True
    assert 0 < summary["requests"] == len(lines) - 1 < 4000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hits.jsonl", "mc.jsonl"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_a_signal_ends_the_kv_events_grace_at_once(
    signum: int, tmp_path: Path, commands: list[Command]
) -> None:
    # Every row is written and every batch sent; the replay socket would answer for an
    # hour. The signal ends that wait: the hit file is whole, the exit 128 + signal.
    trace = _mooncake_trace(tmp_path / "mc.jsonl", 20, 4)
    out = tmp_path / "hits.jsonl"
    cmd = Command(tmp_path, "replay", str(trace), "--index", "hash_chain", "--quiet",
                  "--out", str(out), "--kv-events", f"ipc://{tmp_path}/pub",
                  "--kv-events-replay", f"ipc://{tmp_path}/rep", "--kv-events-grace", "3600",
                  merge_stderr=True)  # fmt: skip
    commands.append(cmd)

    def in_grace() -> bool:
        while not cmd.lines.empty():
            cmd.stdout.append(cmd.lines.get())
        return any("answering event replays" in line for line in cmd.stdout)

    cmd.wait_for(in_grace, 60, "the grace line")
    cmd.proc.send_signal(signum)
    output, _ = cmd.finish(timeout=HANG_S)  # without the fix: an hour
    assert cmd.proc.returncode == 128 + signum, output
    assert "Traceback" not in output and "Ctrl-C ends it" in output, output
    lines = out.read_text(encoding="utf-8").splitlines()
    summary = json.loads(lines[-1])["summary"]
    assert summary["partial"] is False and summary["requests"] == 20 == len(lines) - 1
    assert summary["kv_events"]["delivered"] == 0
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_cluster_writes_the_finished_runs_when_interrupted(
    tmp_path: Path, commands: list[Command]
) -> None:
    trace = _mooncake_trace(tmp_path / "mc.jsonl", 1500, 12)
    policies = "round_robin,dynamo,llmd,sglang,mooncake,prefix_hash,pooled"
    argv = ["--prefill-only", "--replicas", "4", "--no-requests-table", "--out", "report"]
    cmd = Command(tmp_path, "cluster", "--trace", str(trace), "--policies", policies, *argv)
    commands.append(cmd)
    cmd.wait_for_lines(2, HANG_S)  # two runs finished
    stdout, err = cmd.flood(signal.SIGINT)
    assert cmd.proc.returncode == 130, err
    assert "Traceback" not in err and not err, err
    finished = [line.split()[0] for line in stdout.splitlines() if "hit " in line]
    assert 2 <= len(finished) < 7
    assert "partial results (interrupted after" in stdout
    doc = json.loads((tmp_path / "report" / "results.json").read_text(encoding="utf-8"))
    assert doc["partial"] is True and doc["partial_reason"].endswith("of 7 runs")
    assert [r["labels"]["policy"] for r in doc["runs"]] == finished
    report = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "**Partial results**: interrupted after" in report
    runs = (tmp_path / "report" / "runs.csv").read_text(encoding="utf-8").splitlines()
    assert len(runs) == 1 + len(finished)
    assert not [p for p in (tmp_path / "report").iterdir() if p.name.startswith(".")]


def test_the_command_line_imports_light_before_its_handler() -> None:
    # What loads before main() can install the handler: the entry point's package chain.
    code = (
        "import sys; import prefixkv.adapters.lab.cli; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('prefixkv') "
        "or m in ('numpy', 'msgspec', 'zmq', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()  # fmt: skip
    assert out == [
        "prefixkv",
        "prefixkv.adapters",
        "prefixkv.adapters.lab",
        "prefixkv.adapters.lab.cli",
        "prefixkv.adapters.lab.cli.main",
        "prefixkv.adapters.lab.cli.signals",
        "prefixkv.indexes",  # a face whose names load on first use: nothing else yet
        "prefixkv.indexes.lazy",  # the load-on-first-use lookup, standard library only
    ]


def test_a_signal_while_writing_is_held_until_the_files_are_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # In-process, with a real signal sent to this process once the replay has finished:
    # held, so the hit file is completed and committed, and the exit says interrupted.
    from prefixkv.adapters.lab.cli import main
    from prefixkv.adapters.lab.cli import replay as replay_cli

    trace = _mooncake_trace(tmp_path / "mc.jsonl", 30, 4)
    real = replay_cli._replay_summary

    def summary_then_signal(*args: object) -> object:
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(replay_cli, "_replay_summary", summary_then_signal)
    previous = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "hits.jsonl"
    code = main(["replay", str(trace), "--index", "radix", "--quiet", "--out", str(out)])
    assert code == 143, capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == previous  # the caller's handler is back
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 31 and json.loads(lines[-1])["summary"]["partial"] is False


def test_a_signal_while_the_cluster_report_is_written_is_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefixkv.adapters.lab.cli import cluster as cluster_cli
    from prefixkv.adapters.lab.cli import main

    real = cluster_cli.write_report

    def signal_then_write(*args: object, **kwargs: object) -> object:
        os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cluster_cli, "write_report", signal_then_write)
    out = tmp_path / "r"
    argv = ["cluster", "--workload", "multi_turn", "--max-requests", "20", "--replicas", "2",
            "--policies", "round_robin,llmd", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 130, capsys.readouterr().err
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["partial"] is False and len(doc["runs"]) == 2  # every run had finished
    assert (out / "report.md").exists()


def test_a_second_signal_while_stopping_loses_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C in the 5th request, and again while the replay unwinds (its progress bar
    # closes): the second is only counted, the finished rows are written.
    from prefixkv.adapters.lab.cli import main
    from prefixkv.adapters.lab.cli import replay as replay_cli

    class Bar:
        calls = 0

        def update(self, n: int) -> None:
            Bar.calls += 1
            if Bar.calls == 5:
                os.kill(os.getpid(), signal.SIGINT)

        def close(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(replay_cli, "progress", lambda *a, **k: Bar())
    trace = _mooncake_trace(tmp_path / "mc.jsonl", 30, 4)
    out = tmp_path / "hits.jsonl"
    code = main(["replay", str(trace), "--index", "radix", "--out", str(out)])
    assert code == 130, capsys.readouterr().err
    lines = out.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[-1])["summary"]["partial"] is True and 4 <= len(lines) - 1 < 30


def test_a_closed_terminal_keeps_the_rows_and_says_sighup(tmp_path: Path) -> None:
    # SIGHUP from a terminal that is gone: stdout and stderr are closed by the time the
    # command would print its partial line. The rows are written; the status is 129.
    trace = _mooncake_trace(tmp_path / "mc.jsonl", 4000, 40)
    out = tmp_path / "hits.jsonl"
    argv = [sys.executable, "-m", "prefixkv.adapters.lab", "replay", str(trace), "--index",
            "hash_chain", "--quiet", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not any(p.stat().st_size > 0 for p in tmp_path.glob(".hits.jsonl.*.tmp")):
            assert proc.poll() is None and time.monotonic() < deadline, "no rows"
            time.sleep(0.005)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the terminal is gone
        proc.stderr.close()
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=HANG_S) == 129
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert lines[-1]["summary"]["partial"] is True and 0 < len(lines) - 1 < 4000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hits.jsonl", "mc.jsonl"]


def test_a_signal_between_a_row_counted_and_written_keeps_the_two_equal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The 5th request is admitted (counted in the summary's totals); the signal lands
    # before its row is written. The row is still written, then the replay stops.
    from prefixkv.adapters.lab.cli import main
    from prefixkv.adapters.lab.cli import replay as replay_cli

    real = replay_cli.replay

    def signal_before_the_5th_row(*args: object, **kwargs: object) -> object:
        write = kwargs["on_admit"]
        seen = [0]

        def on_admit(row: object) -> None:
            seen[0] += 1
            if seen[0] == 5:
                os.kill(os.getpid(), signal.SIGUSR1)
            write(row)  # type: ignore[operator]

        kwargs["on_admit"] = on_admit
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(replay_cli, "replay", signal_before_the_5th_row)
    trace = _mooncake_trace(tmp_path / "mc.jsonl", 30, 4)
    out = tmp_path / "hits.jsonl"
    code = main(["replay", str(trace), "--index", "radix", "--quiet", "--out", str(out)])
    assert code == 128 + signal.SIGUSR1, capsys.readouterr().err
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    summary = lines[-1]["summary"]
    assert summary["partial"] is True and summary["requests"] == len(lines) - 1 == 5
    assert summary["total_prompt_tokens"] == sum(r["prompt_len"] for r in lines[:-1])


def test_a_signal_while_the_handlers_go_in_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # SIGHUP lands right after its handler is in, while the later ones are still being
    # installed (outside the command's try): recorded, then the usual one line.
    from prefixkv.adapters.lab.cli import main

    real = signal.signal
    sent: list[int] = []

    def install_then_signal(signum: int, handler: object) -> object:
        previous = real(signum, handler)  # type: ignore[arg-type]
        if signum == signal.SIGHUP and not sent:
            sent.append(signum)
            os.kill(os.getpid(), signal.SIGHUP)
        return previous

    monkeypatch.setattr(signal, "signal", install_then_signal)
    code = main(["compare", "-w", "seed", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert sent and code == 129, err
    assert err == "prefixkv: stopped by SIGHUP before anything was finished; nothing written\n"
    assert not (tmp_path / "o").exists()


_PROBE = """
import ctypes, importlib, os, runpy, signal
cli_main = importlib.import_module("prefixkv.adapters.lab.cli.main")

# A KeyboardInterrupt that leaves code run through PyRun_String (as some C extensions'
# imports run theirs), caught: CPython then reports an exit by SIGINT under python -m.
run = ctypes.pythonapi.PyRun_String
run.restype = ctypes.py_object
run.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]
try:
    run(b"raise KeyboardInterrupt", 257, {"__builtins__": __builtins__}, {})
except KeyboardInterrupt:
    pass
cli_main._run = lambda args, interrupts: os.kill(os.getpid(), signal.SIGUSR1) or 0
runpy.run_module("prefixkv.adapters.lab", run_name="__main__")
"""


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's exit rule")
def test_python_m_exits_with_the_signals_status(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(_PROBE, encoding="utf-8")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "probe", "replay"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": path},  # PYTHONSAFEPATH too
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 128 + signal.SIGUSR1, proc.stderr
    assert proc.stderr == (
        "prefixkv: stopped by SIGUSR1 before anything was finished; nothing written\n"
    )
