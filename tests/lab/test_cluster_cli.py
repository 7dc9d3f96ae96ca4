"""``prefixkv cluster`` end to end on a built-in workload and on a Mooncake trace head."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import NoReturn

import pytest
from helpers import TEST_DATA

from prefixkv.adapters.lab.cli import main
from prefixkv.adapters.lab.cli.flags import add_trace_flags
from prefixkv.adapters.lab.cli.main import build_parser
from prefixkv.adapters.lab.cluster.faults import FaultSpecError, parse_faults

MOONCAKE = TEST_DATA / "fidelity" / "mooncake_conversation_head.jsonl"


def test_cluster_command_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "report"
    argv = [
        "cluster",
        "--workload", "multi_turn",
        "--replicas", "2,4",
        "--capacity-tokens", "4k,16k",
        "--policies", "round_robin,dynamo,sglang,pooled",
        "--faults", "kill=1@50%,drop=0.1",
        "--request-rate", "4",
        "--quiet",
        "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    for name in ("report.md", "runs.csv", "requests.csv", "results.json", "hit_ratio.png",
                 "frontier.png", "ttft_cdf.png", "overlap.png", "decision_latency.png",
                 "hit_vs_replicas.png", "hit_vs_capacity.png", "faults.png"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    with (out / "runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    # 2 sizes x 2 capacities x 4 specs, then the 3 policies with faults
    assert len(runs) == 2 * 2 * 4 + 3
    assert all(r["invariants_hold"] == "True" for r in runs)
    report = (out / "report.md").read_text()
    assert "## Fault runs" in report and "kill=1@50%" in report
    assert "| dynamo | radix |" in report
    payload = json.loads((out / "results.json").read_text())
    assert payload["format"] == "prefixkv-cluster/2" and payload["partial"] is False
    policies = {p["labels"]["policy"] for p in payload["runs"]}
    assert policies == {"round_robin", "dynamo", "sglang", "pooled"}


def test_cluster_command_reads_a_mooncake_trace(tmp_path: Path) -> None:
    out = tmp_path / "mc"
    argv = ["cluster", "--trace", str(MOONCAKE), "--replicas", "2", "--prefill-only",
            "--policies", "round_robin,mooncake,infinite", "--time-scale", "4",
            "--no-requests-table", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    with (out / "runs.csv").open() as f:
        runs = {r["policy"]: r for r in csv.DictReader(f)}
    assert runs["mooncake"]["block_size"] == "512"  # Mooncake's tokens per hash id
    assert float(runs["infinite"]["hit_ratio"]) >= float(runs["round_robin"]["hit_ratio"])
    assert not (out / "requests.csv").exists()


@pytest.mark.parametrize(
    "bad",
    [
        ["--policies", "nope"],
        ["--policies", "dynamo:bogus=1"],
        ["--faults", "explode=1"],
        ["--faults", "kill=9@10"],
        ["--replicas", "0"],
        ["--replicas", "8,1000000"],
        ["--capacity-tokens", "lots"],
        ["--capacity-tokens", "4k,200T"],  # past the pool's 2**31 - 1 blocks
        ["--faults", "kill=0@inf"],
        ["--faults", "kill=0@nan"],
        ["--faults", "drop=nan"],
        ["--faults", "drop=1e400"],
        # accepted but ignored until now: refused by name
        ["--time-scale", "2"],
        ["--tokens-per-id", "16"],
        ["--trace-format", "mooncake"],
        ["--vocab-size", "1000"],
        ["--session-order", "sequential"],
        ["--max-prompt-tokens", "1k"],
        ["--max-output-tokens", "1k"],
        ["--max-pool-blocks", "1k"],  # 3m tokens a replica by default: 187,500 blocks
        ["--ray-address", "127.0.0.1:6379"],
        ["--ray-cpus", "0.5"],
    ],
)
def test_cluster_command_rejects_bad_flags(
    bad: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cluster", "--quiet", "--out", str(tmp_path / "x"), *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prefixkv: error:") and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_every_value_of_a_sweep_is_checked_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The last capacity is out of range: refused before the trace is read for the
    # faults' percentages, before Ray starts and before the first run.
    from prefixkv.adapters.lab.cli import cluster

    def never(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("work started before the flags were checked")

    for name in ("arrival_span", "_fleet", "run_experiment"):
        monkeypatch.setattr(cluster, name, never)
    argv = ["cluster", "--trace", str(MOONCAKE), "--replicas", "2,4",
            "--capacity-tokens", "4k,16k,200T", "--faults", "kill=0@50%", "--ray",
            "--quiet", "--out", str(tmp_path / "x")]  # fmt: skip
    assert main(argv) == 2
    assert "capacity_tokens must be an int in [1, " in capsys.readouterr().err


def test_cluster_on_a_workload_takes_max_requests(tmp_path: Path) -> None:
    out = tmp_path / "r"
    argv = ["cluster", "--workload", "multi_turn", "--max-requests", "12", "--replicas", "2",
            "--policies", "round_robin", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    with (out / "runs.csv").open() as f:
        (run,) = csv.DictReader(f)
    assert run["num_requests"] == "12"


def test_cluster_names_each_replicas_prefix_index_with_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One flag for the prefix index on every subcommand: --index, as replay and compare.
    out = tmp_path / "r"
    argv = ["cluster", "--workload", "multi_turn", "--max-requests", "8", "--replicas", "2",
            "--policies", "round_robin", "--quiet", "--out", str(out)]  # fmt: skip
    assert main([*argv, "--index", "radix"]) == 0
    with (out / "runs.csv").open() as f:
        (run,) = csv.DictReader(f)
    assert run["backend"] == "radix"
    assert main([*argv[:-1], str(tmp_path / "old"), "--backend", "radix"]) == 2
    assert "--backend" in capsys.readouterr().err


BAD_FAULTS = [
    "kill=0@inf", "kill=0@nan", "kill=0@-1", "kill=0@1e10", "kill=0@-0%", "kill=0@101%",
    "kill=0@ 5", "kill=0@1_000", "kill=\u0663@5", "restart=0@nan", "router_restart@inf",
    "scale_up@-3", "gap=0@inf", "drop=nan", "drop=inf", "drop=-0.1", "drop=1e400", "drop=1_0",
    "delay=-1", "delay=+inf", "jitter=nan", "lose_completions=2", "drop_removals=-0",
    "drop=0.1,drop=0.2", "mismatch=0:hash,mismatch=0:block_size",
]  # fmt: skip


@pytest.mark.parametrize("spec", BAD_FAULTS)
def test_bad_fault_values_are_refused_before_the_trace_is_opened(
    spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(FaultSpecError):
        parse_faults(spec)
    out = tmp_path / "x"
    argv = ["cluster", "--trace", str(tmp_path / "absent.jsonl"), "--faults", spec,
            "--no-plots", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"prefixkv: error: {spec.split(',')[-1]}: "), err
    assert not out.exists()


def test_a_good_fault_spec_reaches_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the premise of the test above: with good faults the missing trace is the error
    argv = ["cluster", "--trace", str(tmp_path / "absent.jsonl"), "--faults",
            "kill=0@50%,drop=0.1,delay=.5,jitter=1.,scale_up@2e1", "--no-plots", "--quiet",
            "--out", str(tmp_path / "x")]  # fmt: skip
    assert main(argv) == 2
    assert "absent.jsonl" in capsys.readouterr().err


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")}


def test_cluster_takes_the_trace_flags_compare_and_replay_take() -> None:
    # One flag per concept: every trace-input flag, with the same name, default, type
    # and choices, on every subcommand that reads a trace.
    shared = argparse.ArgumentParser()
    add_trace_flags(shared)
    wanted = _options(shared)
    assert {"--vocab-size", "--session-order", "--max-prompt-tokens", "--max-pool-blocks"} <= set(
        wanted
    )
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for command in ("compare", "replay", "cluster"):
        have = _options(sub.choices[command].add_flags())  # its module adds them
        for option, want in wanted.items():
            assert option in have, f"{command} lacks {option}"
            got = have[option]
            assert (got.dest, got.default, got.type, got.choices) == (
                want.dest, want.default, want.type, want.choices,
            ), f"{command} {option}"  # fmt: skip


def test_cluster_obeys_max_prompt_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The head's longest prompt is over 8k tokens: refused by name, at its line, and
    # nothing written; the default limit (2M) reads it.
    argv = ["cluster", "--trace", str(MOONCAKE), "--replicas", "2", "--prefill-only",
            "--policies", "round_robin", "--no-plots", "--quiet"]  # fmt: skip
    assert main([*argv, "--max-prompt-tokens", "8k", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "exceeds the limit of 8,000 (--max-prompt-tokens)" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()
    assert main([*argv, "--out", str(tmp_path / "ok")]) == 0


def test_cluster_obeys_max_pool_blocks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 4,000 tokens of 16-token blocks: a pool of 250 blocks a replica, the limit's edge.
    argv = ["cluster", "--workload", "multi_turn", "--max-requests", "8", "--replicas", "2",
            "--capacity-tokens", "1k,4k", "--policies", "round_robin", "--no-plots",
            "--quiet"]  # fmt: skip
    assert main([*argv, "--max-pool-blocks", "249", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "250 blocks of 16 tokens a replica, over the limit of 249 blocks" in err
    assert "--max-pool-blocks" in err and not (tmp_path / "x").exists()
    assert main([*argv, "--max-pool-blocks", "250", "--out", str(tmp_path / "ok")]) == 0
