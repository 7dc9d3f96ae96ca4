"""The ``prefixkv`` command line: compare's tables and files, replay's hit file, errors.

Runs ``main([...])`` in-process on tiny inputs written into ``tmp_path`` (and once
through ``python -m``); the seed test pins SPEC BB-2/BB-3 as the report shows them.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import TEST_DATA, interrupt_after

from prefixkv.adapters.lab.cli import main
from prefixkv.adapters.lab.cli.args import parse_token_count, parse_token_counts
from prefixkv.adapters.lab.compare import parse_backends
from prefixkv.adapters.lab.compare.k_live import percentile, select_strip_requests
from prefixkv.adapters.lab.compare.plan import sweep_capacities
from prefixkv.adapters.lab.sim.metrics import RequestRow
from prefixkv.adapters.lab.sim.runs import RunRow
from prefixkv.adapters.lab.traces import write_trace
from prefixkv.adapters.lab.workloads import make_workload, seed_example

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


_PER_REQUEST = {
    "request_id": str,
    "prompt_tokens": int,
    "hit_tokens": int,
    "matched_tokens": int,
    "boundary_lost_tokens": int,
    "cap_lost_tokens": int,
    "index_us": float,
    "admit_us": float,
}


def _backends(out: Path, workload: int = 0) -> dict[str, dict[str, Any]]:
    """The K-live table's run records by backend (results.json), each with its
    per-request columns read back from requests.csv."""
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    name = doc["workloads"][workload]["workload"]
    with (out / "requests.csv").open(encoding="utf-8", newline="") as f:
        requests = [r for r in csv.DictReader(f) if r["workload"] == name]
    runs = {}
    for run in doc["runs"]:
        if (run["workload"], run["schedule"], run["role"]) != (name, "k_live", "table"):
            continue
        mine = [r for r in requests if r["schedule"] == "k_live" and r["backend"] == run["backend"]]
        assert [int(r["position"]) for r in mine] == list(range(len(mine)))
        run["per_request"] = {k: [t(r[k]) for r in mine] for k, t in _PER_REQUEST.items()}
        runs[run["backend"]] = run
    return runs


def _sweep(doc: dict[str, Any], workload: int = 0) -> dict[str, dict[int, float | None]]:
    """K-live sweep hit ratios: backend -> capacity -> ratio."""
    name = doc["workloads"][workload]["workload"]
    out: dict[str, dict[int, float | None]] = {}
    for run in doc["runs"]:
        if (run["workload"], run["schedule"], run["role"]) == (name, "k_live", "sweep"):
            out.setdefault(run["backend"], {})[run["capacity_tokens"]] = run["hit_ratio"]
    return out


def _error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("prefixkv: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_help_through_python_m() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "prefixkv.adapters.lab", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "compare" in proc.stdout and "replay" in proc.stdout


def test_compare_writes_report_json_and_pngs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    code, stdout, _ = _run(
        capsys,
        "compare",
        "--workload",
        "tree_of_thought",
        "few_shot",
        "--max-requests",
        "25",
        "--capacity-sweep",
        "--timing-repeats",
        "1",
        "--quiet",
        "--out",
        str(out),
    )
    assert code == 0
    assert "tree_of_thought" in stdout and "boundary lost" in stdout
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == [
        "hit_ratio_vs_capacity.png",
        "index_time_vs_prompt_length.png",
        "strips_few_shot.png",
        "strips_tree_of_thought.png",
    ]
    for name in pngs:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
    md = (out / "report.md").read_text(encoding="utf-8")
    for name in pngs:
        assert f"]({name})" in md  # relative links
    assert "## Machine" in md and "| hash_chain |" in md
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["config"]["capacity_sweep"] is True
    for w in range(2):
        by = _backends(out, w)
        assert set(by) == {"hash_chain", "radix", "none"}
        hc, rx, none = by["hash_chain"], by["radix"], by["none"]
        # Shared prefixes: token granularity never hits less than block granularity.
        assert rx["hit_tokens"] >= hc["hit_tokens"] > 0
        assert none["hit_tokens"] == 0
        assert rx["boundary_lost_tokens"] == 0
        for b in by.values():
            per = b["per_request"]
            assert b["hit_tokens"] == sum(per["hit_tokens"])
            assert (
                b["prompt_tokens"]
                == sum(per["prompt_tokens"])
                == doc["workloads"][w]["prompt_tokens"]
            )
            assert b["hit_ratio"] == pytest.approx(b["hit_tokens"] / b["prompt_tokens"])
            assert b["boundary_lost_tokens"] == sum(per["boundary_lost_tokens"])
            assert b["timing_runs_agree"] and b["evicted_blocks"] == 0  # roomy default
            assert len(per["index_us"]) == len(per["admit_us"]) == 25
            assert all(a <= t for a, t in zip(per["admit_us"], per["index_us"], strict=True))
        sweep = _sweep(doc, w)
        caps = list(sweep["radix"])
        assert caps == sorted(caps) and len(caps) >= 2
        assert caps[-1] == doc["workloads"][w]["capacity_tokens"]
        assert sweep["radix"][caps[-1]] == pytest.approx(rx["hit_ratio"])
    tot = _backends(out, 0)["hash_chain"]
    assert tot["boundary_lost_tokens"] > 0  # forks are unaligned in tree_of_thought


def test_seed_workload_shows_the_boundary_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stdout, _ = _run(
        capsys,
        "compare",
        "--workload",
        "seed",
        "--index",
        "hash_chain,radix",
        "--no-plots",
        "--timing-repeats",
        "1",
        "--out",
        str(tmp_path),
    )
    assert code == 0
    by = _backends(tmp_path)
    hc, rx = by["hash_chain"]["per_request"], by["radix"]["per_request"]
    assert hc["request_id"] == rx["request_id"] == ["A", "B", "A-again"]
    # BB-2: B shares 30 tokens; the chain reuses block 0 and recomputes tokens 16..29.
    assert (hc["hit_tokens"][1], hc["matched_tokens"][1], hc["boundary_lost_tokens"][1]) == (
        16,
        30,
        14,
    )
    assert (rx["hit_tokens"][1], rx["boundary_lost_tokens"][1]) == (30, 0)
    # BB-3: A again; the chain recomputes its whole last block, the tree one token.
    assert (hc["hit_tokens"][2], hc["cap_lost_tokens"][2]) == (64, 16)
    assert (rx["hit_tokens"][2], rx["cap_lost_tokens"][2]) == (79, 1)
    row = next(line for line in stdout.splitlines() if line.startswith("hash_chain"))
    assert " 14 " in row
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "B hit 16 of 80 tokens, matched 30, 14 lost to the block boundary" in md
    assert not list(tmp_path.glob("*.png"))


def test_replay_writes_the_oracle_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "seed.jsonl"
    write_trace(trace, seed_example())
    expected = {"radix": [0, 30, 79], "hash_chain": [0, 16, 64]}
    for index, hits in expected.items():
        out = tmp_path / index / "hits.jsonl"  # the folder is created
        code, stdout, _ = _run(
            capsys, "replay", str(trace), "--index", index, "--page-size", "1", "--out", str(out)
        )
        assert code == 0 and str(out) in stdout
        lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        assert len(lines) == 4
        assert [set(r) for r in lines[:3]] == [{"id", "prompt_len", "hit_tokens"}] * 3
        assert [r["hit_tokens"] for r in lines[:3]] == hits
        assert [r["prompt_len"] for r in lines[:3]] == [80, 80, 80]
        summary = lines[3]["summary"]
        assert summary["requests"] == 3 and summary["total_hit_tokens"] == sum(hits)
        assert summary["total_prompt_tokens"] == 240 and summary["trace"] == "seed.jsonl"
        assert summary["config"]["index"] == index
        assert summary["config"]["driver"] == {"radix": "sglang", "hash_chain": "vllm"}[index]


def test_replay_capacity_and_driver_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, make_workload("shared_system_prompt", num_requests=20, system_len=64))
    out = tmp_path / "hits.jsonl"
    argv = ["replay", str(trace), "--index", "hash_chain", "--driver", "manager", "-q"]
    code, stdout, _ = _run(capsys, *argv, "--capacity-blocks", "40", "--out", str(out))
    assert code == 0 and stdout == ""
    summary = json.loads(out.read_text(encoding="utf-8").splitlines()[-1])["summary"]
    assert summary["config"]["num_blocks"] == 40
    assert summary["config"]["capacity_tokens"] == 640
    assert summary["config"]["driver"] == "manager"
    assert summary["evicted_blocks"] > 0  # 20 prompts of 96..320 tokens in 640 tokens


def _mooncake_trace(path: Path, lines: int) -> None:
    # A shared 3-block system prefix, then conversations that resend their history.
    records = []
    next_id = 100
    history: dict[int, list[int]] = {}
    for i in range(lines):
        session = i % 7
        ids = history.get(session, [0, 1, 2])
        ids = [*ids, next_id]
        next_id += 1
        history[session] = ids
        input_length = 512 * (len(ids) - 1) + 100 + 37 * session
        records.append(
            {"timestamp": i, "input_length": input_length, "output_length": 20, "hash_ids": ids}
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_compare_reads_a_mooncake_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "mooncake.jsonl"
    _mooncake_trace(trace, 60)
    out = tmp_path / "out"
    code, stdout, _ = _run(
        capsys,
        "compare",
        "--trace",
        str(trace),
        "--max-requests",
        "50",
        "--tokens-per-id",
        "16",
        "--index",
        "hash_chain,radix",
        "--timing-repeats",
        "1",
        "--no-plots",
        "--out",
        str(out),
    )
    assert code == 0
    assert "mooncake.jsonl: 50 requests" in stdout
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["workloads"][0]["num_requests"] == 50
    assert _sweep(doc) == {}  # a trace sweeps only when asked
    by = _backends(out)
    assert by["radix"]["hit_tokens"] >= by["hash_chain"]["hit_tokens"] > 0


def test_replay_does_not_import_matplotlib(tmp_path: Path) -> None:
    trace = tmp_path / "seed.jsonl"
    write_trace(trace, seed_example())
    code = (
        "import sys; from prefixkv.adapters.lab.cli import main; "
        f"rc = main(['replay', {str(trace)!r}, '--index', 'radix', '-q', "
        f"'--out', {str(tmp_path / 'h.jsonl')!r}]); "
        "print(rc, 'matplotlib' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.stdout.split() == ["0", "False"], proc.stderr


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["compare", "--workload", "nope"], "unknown workload 'nope'"),
        (["compare", "--workload", "seed", "--index", "hash_chain,bogus"], "'bogus'"),
        (["compare", "--index", "radix:0"], "radix:0"),
        (["compare", "--concurrency", "0"], "--concurrency"),
        (["compare", "--capacity-tokens", "64", "--capacity-blocks", "4"], "not allowed"),
        (["compare", "--workload", "seed", "--tokens-per-id", "16"], "tokens_per_id=16"),
        (["frobnicate"], "invalid choice"),
        (["replay", "trace.jsonl", "--index", "radix"], "--out"),
    ],
)
def test_bad_arguments_are_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert needle in _error_line(err)


def test_missing_trace_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "absent.jsonl"
    for argv in (
        ["compare", "--trace", str(missing), "--out", str(tmp_path / "o")],
        ["replay", str(missing), "--index", "radix", "--out", str(tmp_path / "h.jsonl")],
    ):
        code, _, err = _run(capsys, *argv)
        assert code == 2
        assert str(missing) in _error_line(err)


def test_malformed_trace_line_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"id": "a", "tokens": [1, 2, 3]}\n\n{"id": "b", "tokens": [1, -2]}\n')
    for argv in (
        ["compare", "--trace", str(trace), "--out", str(tmp_path / "o")],
        ["replay", str(trace), "--index", "hash_chain", "--out", str(tmp_path / "h.jsonl")],
    ):
        code, _, err = _run(capsys, *argv)
        assert code == 2
        assert f"{trace}:3:" in _error_line(err)


def test_capacity_too_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(
        capsys, "compare", "-w", "seed", "--capacity-tokens", "40", "--out", str(tmp_path)
    )
    assert code == 2
    assert "capacity 40 tokens" in _error_line(err)
    trace = tmp_path / "seed.jsonl"
    write_trace(trace, seed_example())
    code, _, err = _run(
        capsys,
        "replay",
        str(trace),
        "--index",
        "radix",
        "--capacity-blocks",
        "2",
        "--out",
        str(tmp_path / "h.jsonl"),
    )
    assert code == 2
    assert "capacity 32 tokens" in _error_line(err)


def test_parse_backends_natural_drivers_and_sizes() -> None:
    specs = parse_backends("hash_chain, radix,none,radix:16", block_size=8, page_size=1)
    assert [(s.label, s.index, s.block_size, s.driver) for s in specs] == [
        ("hash_chain", "hash_chain", 8, "vllm"),
        ("radix", "radix", 1, "sglang"),
        ("none", "none", 8, "manager"),
        ("radix:16", "radix", 16, "sglang"),
    ]
    assert {s.driver for s in parse_backends("hash_chain,radix", driver="manager")} == {"manager"}


def test_sweep_percentile_and_strip_selection() -> None:
    caps = sweep_capacities(100, 10_000, 5)
    assert caps == [100, 316, 1000, 3162, 10000]
    assert sweep_capacities(500, 400) == [400]
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([1.0, 2.0], 99) == 2.0 and percentile([], 50) == 0.0

    def result(index: str, hits: list[int], boundary: list[int]) -> RunRow:
        rows = [
            RequestRow(str(i), prompt_tokens=60, hit_tokens=h, matched_tokens=h,
                       boundary_lost_tokens=b)
            for i, (h, b) in enumerate(zip(hits, boundary, strict=True))
        ]  # fmt: skip
        # select_strip_requests reads only a run's index label and its requests.
        return RunRow({"index": index}, (), rows)

    rows = [
        result("hash_chain", [0, 16, 32, 48, 0], [0, 0, 0, 5, 0]),
        result("radix", [0, 16, 40, 53, 0], [0, 0, 0, 0, 0]),
        result("none", [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]),
    ]
    # Boundary loss first (3), then differing hits (2), then the rest in order (0).
    assert select_strip_requests(rows, limit=3) == [0, 2, 3]


# --- units, sweeps, engine flags, --version ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("65536", 65536),
        ("1k", 1000),
        ("1K", 1024),
        ("512K", 524288),
        ("1m", 1_000_000),
        ("1M", 2**20),
        ("25.6k", 25600),
        ("2g", 2_000_000_000),
        ("1_000_000", 1_000_000),
    ],
)
def test_token_counts_read_like_vllm(text: str, value: int) -> None:
    assert parse_token_count(text) == value


@pytest.mark.parametrize("text", ["0", "-5", "1.5", "1.5K", "1e9", "lots", "", "1x", "2" * 30])
def test_bad_token_counts(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_token_count(text)


def test_token_count_lists() -> None:
    assert parse_token_counts("1m,3m,10m") == [1_000_000, 3_000_000, 10_000_000]
    for bad in ("1m,1m", ",", "1m,x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_token_counts(bad)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--version")
    assert code == 0
    assert re.match(r"prefixkv \d+\.\d+\.\S+ \((compiled|pure Python)\)\nPython 3\.", out)


def test_capacity_list_is_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    code, stdout, _ = _run(
        capsys,
        "compare",
        "-w",
        "multi_turn",
        "--max-requests",
        "40",
        "--index",
        "hash_chain,radix",
        "--capacity-tokens",
        "4k,2K,16k",
        "--timing-repeats",
        "0",
        "--no-plots",
        "-q",
        "--out",
        str(out),
    )
    assert code == 0, stdout
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    w = doc["workloads"][0]
    assert doc["config"]["capacity_sweep"] is True
    assert w["capacity_tokens"] == 4000  # the first listed is the table's
    sweep = _sweep(doc)["radix"]
    assert list(sweep) == [2048, 4000, 16000]
    ratios = list(sweep.values())
    assert ratios == sorted(ratios) and ratios[0] < ratios[-1]  # more room, more hits
    assert _backends(out)["radix"]["hit_ratio"] == pytest.approx(ratios[1])
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "| 16,000 |" in md and "Hit ratio at each capacity" in md


def test_engine_named_flags_reach_the_backends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    code, _, err = _run(
        capsys,
        "compare",
        "-w",
        "seed",
        "--index",
        "hash_chain,radix",
        "--prefix-caching-hash-algo",
        "sha256",
        "--radix-eviction-policy",
        "lfu",
        "--index-option",
        "hash_chain.verify=true",
        "--timing-repeats",
        "0",
        "--no-plots",
        "-q",
        "--out",
        str(out),
    )
    assert code == 0, err
    by = _backends(out)
    opts = {label: b["options"] for label, b in by.items()}
    assert opts == {"hash_chain": "hash_algorithm=sha256,verify=True", "radix": "eviction=lfu"}
    assert [h for h in by["hash_chain"]["per_request"]["hit_tokens"]] == [0, 16, 64]
    code, _, err = _run(
        capsys, "compare", "-w", "seed", "--index-option", "radix.bogus=1", "--out", str(out)
    )
    assert code == 2 and "takes no option 'bogus'" in _error_line(err)


# --- long runs: interrupts, atomic outputs, inputs never overwritten ---------------------


def test_replay_interrupted_writes_partial_hits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefixkv.adapters import vllm

    trace = tmp_path / "t.jsonl"
    write_trace(trace, make_workload("shared_system_prompt", num_requests=20, system_len=64))
    out = tmp_path / "hits.jsonl"
    # Ctrl-C in the 8th lookup: 7 requests were admitted.
    interrupt_after(monkeypatch, vllm.KVCacheManager, "get_computed_blocks", 8)
    code, stdout, _ = _run(capsys, "replay", str(trace), "--index", "hash_chain", "-k", "2",
                           "--out", str(out))  # fmt: skip
    assert code == 130
    assert "interrupted: partial" in stdout
    lines = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in lines[:-1]] == [f"sys-{i}" for i in range(7)]
    summary = lines[-1]["summary"]
    assert summary["partial"] is True and summary["requests"] == 7


def test_compare_interrupted_keeps_finished_backends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefixkv.adapters.lab.sim import seats

    out = tmp_path / "o"
    # The radix tree runs second: interrupt its first replay midway.
    interrupt_after(monkeypatch, seats, "alloc_for_extend", 5)
    code, stdout, _ = _run(capsys, "compare", "-w", "few_shot", "--index", "hash_chain,radix",
                           "--timing-repeats", "1", "--out", str(out))  # fmt: skip
    assert code == 130
    assert "(interrupted: partial)" in stdout and "partial results" in stdout
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["partial"] is True and doc["plots"] == {}
    w = doc["workloads"][0]
    assert w["partial"] is True and [b["backend"] for b in doc["runs"]] == ["hash_chain"]
    assert list(_backends(out)) == ["hash_chain"]  # the tables hold what finished
    assert "Partial results" in (out / "report.md").read_text(encoding="utf-8")
    assert not list(out.glob("*.png")) and not list(out.glob(".*"))


def test_interrupt_while_loading_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefixkv.adapters.lab.traces import source

    trace = tmp_path / "t.jsonl"
    write_trace(trace, seed_example())
    out = tmp_path / "h.jsonl"
    out.write_text("earlier results\n")
    interrupt_after(monkeypatch, source.TraceSource, "scan", 1)
    code, _, err = _run(capsys, "replay", str(trace), "--index", "radix", "--out", str(out))
    assert code == 130 and "nothing written" in err
    assert out.read_text() == "earlier results\n"


def test_failed_replay_leaves_the_old_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "seed.jsonl"
    write_trace(trace, seed_example())
    out = tmp_path / "h.jsonl"
    out.write_text("earlier results\n")
    code, _, _ = _run(capsys, "replay", str(trace), "--index", "radix", "--capacity-blocks", "2",
                      "--out", str(out))  # fmt: skip
    assert code == 2
    assert out.read_text() == "earlier results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.jsonl", "seed.jsonl"]


def test_out_equal_to_the_input_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "seed.jsonl"
    write_trace(trace, seed_example())
    before = trace.read_bytes()
    link = tmp_path / "alias.jsonl"
    link.symlink_to(trace)
    for out in (trace, tmp_path / "." / "seed.jsonl"):
        code, _, err = _run(capsys, "replay", str(trace), "--index", "radix", "--out", str(out))
        assert code == 2 and "refusing to overwrite" in _error_line(err)
    code, _, err = _run(capsys, "replay", str(trace), "--index", "radix", "--out", str(link))
    assert code == 2 and "is a symbolic link" in _error_line(err)  # never written through
    code, _, err = _run(capsys, "compare", "--trace", str(tmp_path / "results.json"),
                        "--out", str(tmp_path))  # fmt: skip
    assert code == 2
    (tmp_path / "results.json").write_bytes(before)
    code, _, err = _run(capsys, "compare", "--trace", str(tmp_path / "results.json"),
                        "--out", str(tmp_path))  # fmt: skip
    assert code == 2 and "refusing to overwrite" in _error_line(err)
    assert trace.read_bytes() == before == (tmp_path / "results.json").read_bytes()


# --- no input file or flag ever prints a traceback --------------------------------------


def _bad_inputs(tmp_path: Path) -> dict[str, Path]:
    good = "".join(
        json.dumps({"id": f"r{i}", "tokens": list(range(1, 200))}) + "\n" for i in range(300)
    )
    data = gzip.compress(good.encode(), mtime=0)
    files = {
        "truncated gzip": data[: len(data) // 2],
        "corrupt gzip": data[:60] + b"\xff" * 80 + data[140:],
        "bad gzip header": b"\x1f\x8b\x08" + b"\xff" * 40,
        "bad utf-8": b'{"id": "caf\xe9", "tokens": [1]}\n',
        "binary junk": bytes(range(256)) * 4,
        "giant integer": b'{"id": "a", "tokens": [1' + b"0" * 5000 + b"]}\n",
        "giant output": b'{"input_length": 1, "output_length": 1000000000, "hash_ids": [1]}\n',
        "giant prompt": b'{"input_length": 1000000000000, "output_length": 1, "hash_ids": [1]}\n',
        "deep nesting": b'{"id": "a", "tokens": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        "lone surrogate": b'{"id": "\\ud800", "tokens": [1]}\n',
        "empty": b"",
        "not a trace": b'{"prompt": "hello"}\n',
        "kvct without requests": b'{"id": "x", "block_size": 64}\n',
    }
    paths = {}
    for name, content in files.items():
        p = tmp_path / (name.replace(" ", "_") + ".jsonl")
        p.write_bytes(content)
        paths[name] = p
    return paths


def test_no_input_file_prints_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, path in _bad_inputs(tmp_path).items():
        for argv in (
            ["replay", str(path), "--index", "radix", "--out", str(tmp_path / "h.jsonl")],
            ["compare", "--trace", str(path), "--out", str(tmp_path / "o"), "--no-plots"],
        ):
            code, _, err = _run(capsys, *argv)
            assert code == 2, (name, err)
            line = _error_line(err)
            assert str(path) in line or "empty" in line, (name, line)
    assert not (tmp_path / "h.jsonl").exists()


@pytest.mark.parametrize(
    "flags",
    [
        ["--capacity-tokens", "1g"],
        ["--capacity-tokens", "99999999999999999999"],
        ["--capacity-blocks", "-3"],
        ["--max-output-tokens", "3"],
        ["--max-prompt-tokens", "50"],
        ["--max-pool-blocks", "5"],
        ["--seed", "1" * 400],
        ["--vocab-size", "1"],
        ["--trace-format", "mooncake"],
        ["--tokens-per-id", "16"],
        ["--index-option", "nonsense"],
        ["--index-option", "radix.page=x=y"],
    ],
)
def test_no_flag_prints_a_traceback(
    flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "seed.jsonl"
    write_trace(trace, seed_example())
    argv = ["replay", str(trace), "--index", "radix", "--out", str(tmp_path / "h.jsonl"), *flags]
    code, _, err = _run(capsys, *argv)
    assert code == 2, err
    _error_line(err)


def test_giant_mooncake_output_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "mc.jsonl"
    trace.write_text('{"input_length": 1, "output_length": 1000000000, "hash_ids": [1]}\n')
    code, _, err = _run(capsys, "replay", str(trace), "--index", "hash_chain",
                        "--out", str(tmp_path / "h.jsonl"))  # fmt: skip
    assert code == 2
    assert f"{trace}:1: request 'mc-1': output of 1,000,000,000 tokens" in _error_line(err)


def test_formats_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = TEST_DATA / "traces"
    for trace, requests in (
        (data / "mooncake_small.jsonl", 4),
        (data / "bailian_small.jsonl", 3),
        (data / "kv_cache_tester", 6),
        (data / "prefixkv_small.jsonl", 3),
    ):
        out = tmp_path / f"{trace.stem}.jsonl"
        code, stdout, err = _run(
            capsys, "replay", str(trace), "--index", "radix", "--out", str(out)
        )
        assert code == 0, err
        summary = json.loads(out.read_text(encoding="utf-8").splitlines()[-1])["summary"]
        assert summary["requests"] == requests
        hash_ids = trace.suffix != ".jsonl" or "prefixkv" not in trace.name
        assert ("cannot show any sub-block gain" in stdout) == hash_ids


@pytest.mark.parametrize("command", ["compare", "cluster"])
def test_a_report_never_lands_among_its_inputs(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A kv-cache-tester trace is a folder of .json conversations: a report written into
    # it (results.json above all) would make the folder read as another trace. --out may
    # not be an input, be inside one, or hold one, whichever input names the folder.
    folder = tmp_path / "kvct"
    shutil.copytree(TEST_DATA / "traces" / "kv_cache_tester", folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    one = folder / "conv_a.json"
    extra = ["--replicas", "2"] if command == "cluster" else ["--no-plots"]
    cases = [
        (folder, folder, "is the input"),  # the folder itself
        (folder, folder / "sub", "is the input"),  # inside it
        (one, folder, "holds the input"),  # one conversation, the report beside it
        (one, tmp_path, "holds the input"),  # a folder above the trace
        (folder, tmp_path, "holds the input"),
    ]
    for trace, out, message in cases:
        code, _, err = _run(capsys, command, "--trace", str(trace), "--out", str(out), *extra)
        assert code == 2 and message in _error_line(err), (trace, out, err)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not (folder / "sub").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kvct"]
    code, _, err = _run(capsys, command, "--trace", str(one), "--out", str(tmp_path / "r"),
                        "--quiet", *extra)  # fmt: skip
    assert code == 0, err  # beside the inputs, not among them
