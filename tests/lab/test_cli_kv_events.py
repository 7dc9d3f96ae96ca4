"""``prefixkv replay --kv-events``: the index's event stream, one batch per scheduler step.

The file is read back and compared, event for event, with the same trace driven
through the engine class in the engine's scheduler order (the driver the golden tests check
against vLLM's and SGLang's own streams); the lab's traces carry no namespaces, so
the trace's salts and LoRAs are dropped on both sides.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import TEST_DATA
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_event_drivers import SGLangDriver, VllmDriver, attach_recorder, run_k_live

import prefixkv.adapters.lab.cli as cli
from prefixkv.adapters.events import read_event_file, transport
from prefixkv.adapters.events.wire import EventBatch
from prefixkv.adapters.sglang import PrefixCache
from prefixkv.adapters.vllm import KVCacheManager
from prefixkv.indexes import make_index
from prefixkv.indexes.registry import pool_owned_options

DATA = TEST_DATA / "events"
TRACE = DATA / "trace.jsonl"
PLAIN = [
    {k: v for k, v in json.loads(line).items() if k in ("id", "tokens", "output")}
    for line in TRACE.read_text().splitlines()
]
VLLM_PYTHON = os.environ.get("PREFIXKV_VLLM_PYTHON")


def replay(capsys: pytest.CaptureFixture[str], tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "hits.jsonl"
    code = cli.main(
        [
            "replay",
            str(TRACE),
            "--out",
            str(out),
            "--concurrency",
            "2",
            "--quiet",
            *extra,
        ]
    )
    _, err = capsys.readouterr()
    assert code == 0, err
    summary: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])["summary"]
    return summary


def steps_of(driver_kind: str, index: Any, num_blocks: int) -> list[list[Any]]:
    """Each step's events (non-empty ones) when the engine class drives ``PLAIN``."""
    out: list[list[Any]] = []
    if driver_kind == "vllm":
        vllm = KVCacheManager(index, num_blocks + 1, enable_kv_cache_events=True)
        recorder = attach_recorder(vllm)
        driver: VllmDriver | SGLangDriver = VllmDriver(vllm, lambda: None)
    else:
        sglang = PrefixCache.create_simulated(
            index, num_blocks * index.block_size, enable_kv_cache_events=True
        )
        recorder = attach_recorder(sglang)
        driver = SGLangDriver(sglang, lambda: None)

    def end_step() -> None:
        events = recorder.take_events()
        if events:
            out.append(events)

    driver.end_step = end_step
    run_k_live(driver, PLAIN, 2)
    return out


def test_replay_writes_vllms_batches_one_line_per_step(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    events = tmp_path / "events.jsonl"
    summary = replay(
        capsys,
        tmp_path,
        "--index",
        "hash_chain",
        "--block-size",
        "4",
        "--capacity-blocks",
        "23",
        "--index-option",
        "hash_chain.hash_algorithm=sha256_cbor",
        "--index-option",
        "hash_chain.seed=0",
        "--kv-events",
        str(events),
    )
    lines = events.read_bytes().splitlines()
    assert summary["kv_events"] == {"target": str(events), "batches": len(lines)}
    batches = list(read_event_file(events))
    # each line is exactly msgspec's JSON of the batch (what vLLM's structs give)
    assert [msgspec.json.encode(b) for b in batches] == lines
    assert all(b.data_parallel_rank == 0 for b in batches)
    assert [b.ts for b in batches] == sorted(b.ts for b in batches)
    index = make_index("hash_chain", block_size=4, hash_algorithm="sha256_cbor", seed=0)
    want = steps_of("vllm", index, 23)
    assert [b.events for b in batches] == want
    assert summary["evicted_blocks"] > 0  # the stream has removals, not only stores


def test_replay_writes_the_radix_trees_events(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    events = tmp_path / "events.jsonl"
    replay(
        capsys,
        tmp_path,
        "--index",
        "radix",
        "--page-size",
        "2",
        "--capacity-tokens",
        "52",
        "--kv-events",
        str(events),
    )
    batches = list(read_event_file(events))
    index = make_index("radix", block_size=2, **pool_owned_options("radix"))
    assert [b.events for b in batches] == steps_of("sglang", index, 26)
    # SGLang's hashes are signed: the file holds negative ints where SGLang's would
    hashes = [h for b in batches for e in b.events for h in getattr(e, "block_hashes", [])]
    assert min(hashes) < 0 < max(hashes)  # type: ignore[operator]


class FakePublisher:
    """Stands in for ZmqEventPublisher: records its settings and batches."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.endpoint = kwargs["endpoint"]  # as bound: the real one resolves a wildcard port
        self.replay_endpoint = kwargs.get("replay_endpoint")
        self.batches: list[EventBatch] = []
        self.closed = False
        self.num_delivered = 0  # as if one subscriber received every batch
        self.max_subscribers = 1
        self.num_replays = 0

    def publish(self, batch: EventBatch) -> None:
        self.batches.append(batch)
        self.num_delivered += 1

    def end_grace(self) -> None:
        pass

    def shutdown(self) -> None:
        self.closed = True


def test_replay_publishes_to_an_endpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[FakePublisher] = []

    def make(**kwargs: Any) -> FakePublisher:
        made.append(FakePublisher(**kwargs))
        return made[-1]

    monkeypatch.setattr(transport, "ZmqEventPublisher", make)  # the CLI imports it when used
    flags = ["--index", "hash_chain", "--block-size", "4", "--capacity-blocks", "23"]
    summary = replay(
        capsys,
        tmp_path,
        *flags,
        "--kv-events",
        "tcp://*:5557",
        "--kv-events-replay",
        "tcp://*:5558",
        "--kv-events-topic",
        "kv",
    )
    (pub,) = made
    assert pub.kwargs == {
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5558",
        "topic": "kv",
        "replay_grace": 0.0,
    }
    assert pub.closed and len(pub.batches) == summary["kv_events"]["batches"] > 0
    assert summary["kv_events"]["delivered"] == len(pub.batches)
    assert summary["kv_events"]["max_subscribers"] == 1
    # the same stream a file gets
    (tmp_path / "hits.jsonl").unlink()
    replay(capsys, tmp_path, *flags, "--kv-events", str(tmp_path / "e.jsonl"))
    in_file = list(read_event_file(tmp_path / "e.jsonl"))
    assert [len(b.events) for b in in_file] == [len(b.events) for b in pub.batches]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kv-events", "{out}"], "name the same file"),
        (["--kv-events-replay", "tcp://*:5558"], "needs --kv-events ENDPOINT"),
        (["--kv-events", "{tmp}/e.jsonl", "--kv-events-replay", "tcp://*:1"], "tcp:// or ipc://"),
        (["--kv-events", "{tmp}/e.jsonl", "--kv-events-wait-subscribers", "1"], "tcp:// or ipc://"),
        (["--kv-events", "tcp://*:1", "--kv-events-wait-timeout", "5"], "needs --kv-events-wait-s"),
        (["--kv-events", "tcp://*:1", "--kv-events-grace", "5"], "needs --kv-events-replay"),
        (["--kv-events", "tcp://*:1", "--kv-events-grace", "inf"], "must be seconds in (0, "),
        (["--kv-events", "tcp://*:1", "--kv-events-wait-subscribers", "0"], "positive int"),
        (["--kv-events", "tcp://*:1", "--kv-events-replay", "{tmp}/r"], "give a tcp:// or ipc"),
        (["--kv-events", "ipc://{tmp}/s", "--kv-events-replay", "ipc://{tmp}/s"], "both name"),
        (["--kv-events", "ipc://{tmp}/s", "--kv-events-replay", "ipc://{tmp}/./s"], "both name"),
        (
            ["--kv-events", "tcp://127.0.0.1:5557", "--kv-events-replay", "tcp://127.0.0.1:5557"],
            "both name",
        ),
    ],
)
def test_replay_kv_event_flag_errors(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "hits.jsonl"
    argv = [f.format(out=out, tmp=tmp_path) for f in flags]
    code = cli.main(["replay", str(TRACE), "--index", "hash_chain", "--out", str(out), *argv])
    _, err = capsys.readouterr()
    assert code == 2 and message in err, err
    assert not out.exists()


BAD_PORTS = [
    "99999",
    "65536",
    "0",
    "-1",
    "abc",
    "",
    "5557 ",
    "\u0665\u0665\u0665\u0667",
    "*5",
    "1e3",
    "[5000-6000]",
    "!",
]


@pytest.mark.parametrize("flag", ["--kv-events", "--kv-events-replay"])
@pytest.mark.parametrize("port", BAD_PORTS)
def test_replay_refuses_a_port_that_is_not_one(
    flag: str, port: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # ZeroMQ keeps a port's low 16 bits: 99999 would bind 34463 without a word.
    out = tmp_path / "hits.jsonl"
    bad = f"tcp://127.0.0.1:{port}"
    flags = {"--kv-events": bad, "--kv-events-replay": bad}
    if flag == "--kv-events-replay":
        flags["--kv-events"] = f"ipc://{tmp_path}/pub"
    argv = ["replay", str(TRACE), "--index", "hash_chain", "--out", str(out)]
    for name, value in flags.items():
        argv += [name, value]
    code = cli.main(argv)
    _, err = capsys.readouterr()
    assert code == 2 and f"{flag} {bad}" in err and "1-65535" in err, err
    assert len(err.splitlines()) == 1 and not out.exists()


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=8)
    | st.integers(-2, 70000).map(str)
    | st.sampled_from(["0", "00", "1", "65535", "65536", "*", "٣", "+1", " 1"])
)
def test_the_cli_takes_the_publishers_tcp_ports_but_port_0(port: str) -> None:
    # One port rule: the publisher's (check_endpoint), less port 0, which the CLI
    # refuses by name (ZeroMQ connects to it and reaches nothing; * binds a free one).
    from prefixkv.adapters.events.sockets import TransportError, check_endpoint
    from prefixkv.adapters.lab.cli.args import CLIUsageError
    from prefixkv.adapters.lab.cli.replay import parse_endpoint

    endpoint = f"tcp://127.0.0.1:{port}"
    try:
        check_endpoint("endpoint", endpoint)
        product = not (port.isdigit() and int(port) == 0)
    except TransportError:
        product = False
    try:
        cli_takes = parse_endpoint(endpoint) == endpoint
    except CLIUsageError as e:
        assert "give 1-65535, or * for a free one" in str(e)  # main prints it on one line
        cli_takes = False
    assert cli_takes == product


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1", "tcp://:5557", "tcp://5557"])
def test_replay_refuses_a_tcp_endpoint_without_host_and_port(
    endpoint: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "hits.jsonl"
    code = cli.main(["replay", str(TRACE), "--index", "hash_chain", "--out", str(out),
                     "--kv-events", endpoint])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2 and "HOST:PORT" in err, err


def test_replay_says_when_no_subscriber_received_the_batches(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "hits.jsonl"
    endpoint = f"ipc://{tmp_path}/pub"
    argv = ["replay", str(TRACE), "--index", "hash_chain", "--block-size", "4",
            "--capacity-blocks", "23", "--out", str(out), "--kv-events", endpoint]  # fmt: skip
    assert cli.main(argv) == 0
    stdout, _ = capsys.readouterr()
    summary = json.loads(out.read_text().splitlines()[-1])["summary"]["kv_events"]
    assert summary["batches"] > 0 and summary["delivered"] == summary["max_subscribers"] == 0
    line = stdout.splitlines()[-1]
    assert line == (f"KV events: {summary['batches']:,} batches -> {endpoint}; no subscriber "
                    "was connected as they were sent")  # fmt: skip


def test_replay_refuses_to_publish_when_no_subscriber_comes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "hits.jsonl"
    endpoint = f"ipc://{tmp_path}/pub"
    argv = ["replay", str(TRACE), "--index", "hash_chain", "--out", str(out),
            "--kv-events", endpoint,
            "--kv-events-wait-subscribers", "2", "--kv-events-wait-timeout", "0.3"]  # fmt: skip
    assert cli.main(argv) == 2
    _, err = capsys.readouterr()
    assert err.splitlines() == [
        f"prefixkv: error: --kv-events-wait-subscribers 2: 0 subscribed to {endpoint} within "
        "0.3 s; nothing was replayed (raise --kv-events-wait-timeout)"
    ]
    assert not out.exists()


def test_replay_waits_for_subscribers_and_answers_late_ones(tmp_path: Path) -> None:
    # A real subscriber that connects before the replay starts gets every batch live,
    # from seq 0 (no replay socket to repair a loss with); one that comes after the last
    # batch catches up by event replay during --kv-events-grace. Bounded: 60 s in all.
    import time

    pub, rep = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/rep"
    argv = [sys.executable, "-m", "prefixkv.adapters.lab", "replay", str(TRACE), "--index",
            "hash_chain", "--block-size", "4", "--capacity-blocks", "23", "--quiet",
            "--out", str(tmp_path / "hits.jsonl"), "--kv-events", pub, "--kv-events-replay",
            rep, "--kv-events-wait-subscribers", "1", "--kv-events-wait-timeout", "30",
            "--kv-events-grace", "8"]  # fmt: skip
    live: list[int] = []
    late: list[int] = []
    deadline = time.monotonic() + 300  # a hang guard: the command exits after its grace
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            with transport.ZmqEventSubscriber(pub, lambda seq, b: live.append(seq)) as sub:
                while proc.poll() is None and time.monotonic() < deadline:
                    sub.poll(0.05)
                    if late or not proc.stderr:
                        continue
                    # the grace line: every batch is sent; only event replays are answered now
                    line = proc.stderr.readline()
                    assert "answering event replays on" in line and "for 8 s" in line, line
                    with transport.ZmqEventSubscriber(
                        pub, lambda seq, b: late.append(seq), replay_endpoint=rep
                    ) as newcomer:
                        newcomer.sync()
                    assert late, "no event replay during the grace"
                sub.poll(0.2)
        finally:
            proc.kill()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    summary = json.loads((tmp_path / "hits.jsonl").read_text().splitlines()[-1])["summary"]
    batches = summary["kv_events"]["batches"]
    assert batches > 0
    assert summary["kv_events"]["delivered"] == batches
    assert summary["kv_events"]["max_subscribers"] == 1
    assert summary["kv_events"]["replays"] >= 1  # the late subscriber caught up
    assert live == list(range(batches))
    assert late == list(range(batches))


_VLLM_READS = """
import sys, msgspec
from vllm.distributed.kv_events import KVEventBatch
n = 0
with open(sys.argv[1], "rb") as f:
    for line in f:
        msgspec.json.decode(line, type=KVEventBatch)
        n += 1
print(n)
"""


@pytest.mark.skipif(not VLLM_PYTHON, reason="set PREFIXKV_VLLM_PYTHON to a python with vLLM")
def test_vllm_reads_every_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for index, size in (("hash_chain", "--capacity-blocks=23"), ("radix", "--capacity-tokens=88")):
        events = tmp_path / f"{index}.jsonl"
        (tmp_path / "hits.jsonl").unlink(missing_ok=True)
        replay(capsys, tmp_path, "--index", index, "--block-size=4", "--page-size=4", size,
               "--kv-events", str(events))  # fmt: skip
        assert VLLM_PYTHON is not None
        proc = subprocess.run(
            [VLLM_PYTHON, "-c", _VLLM_READS, str(events)],
            capture_output=True,
            check=True,
            timeout=300,
        )
        assert int(proc.stdout.split()[-1]) == len(events.read_bytes().splitlines())
