"""The engines' defaults the lab states are written once: every setting, flag and help
text reads the named constant (``sim/config.py``, ``sim/profile.py``,
``cluster/config.py``), so changing it changes them all."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from prefixkv.adapters.lab.admission import AdmissionRule, length_rule
from prefixkv.adapters.lab.backends import parse_backends
from prefixkv.adapters.lab.cli import cluster, common, flags
from prefixkv.adapters.lab.cli.main import build_parser, main
from prefixkv.adapters.lab.cluster.config import DEFAULT_BUFFER_STEPS, ClusterSettings
from prefixkv.adapters.lab.cluster.publisher import EventPublisher
from prefixkv.adapters.lab.compare import CompareOptions
from prefixkv.adapters.lab.compare.plan import TimeSettings
from prefixkv.adapters.lab.sim.bench_results import bench_samples, calibrate_from_vllm_bench
from prefixkv.adapters.lab.sim.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    SimSettings,
)
from prefixkv.adapters.lab.sim.profile import DEFAULT_GPU_MEMORY_UTILIZATION

LAB = Path(__file__).resolve().parents[2] / "adapters" / "lab"


def _field_default(cls: Any, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _param_default(func: Any, name: str) -> Any:
    return inspect.signature(func).parameters[name].default


def test_every_settings_record_defaults_to_the_named_constants() -> None:
    for cls in (SimSettings, TimeSettings, CompareOptions):
        assert _field_default(cls, "max_num_seqs") == DEFAULT_MAX_NUM_SEQS, cls
        assert _field_default(cls, "max_num_batched_tokens") == DEFAULT_MAX_NUM_BATCHED_TOKENS
    budgets = [
        _field_default(AdmissionRule, "max_num_batched_tokens"),
        *(
            _param_default(f, "max_num_batched_tokens")
            for f in (length_rule, bench_samples, calibrate_from_vllm_bench)
        ),
    ]
    assert budgets == [DEFAULT_MAX_NUM_BATCHED_TOKENS] * 4
    assert _field_default(ClusterSettings, "buffer_steps") == DEFAULT_BUFFER_STEPS
    blocks = [
        *(
            _field_default(cls, "block_size")
            for cls in (AdmissionRule, CompareOptions, ClusterSettings)
        ),
        *(_param_default(f, "block_size") for f in (length_rule, parse_backends)),
        build_parser().parse_args(["compare"]).block_size,
    ]
    assert blocks == [DEFAULT_BLOCK_SIZE] * 6
    assert _param_default(EventPublisher, "buffer_steps") == DEFAULT_BUFFER_STEPS


def test_the_cluster_flags_default_to_the_named_constants() -> None:
    args = build_parser().parse_args(["cluster"])
    assert args.max_num_seqs == DEFAULT_MAX_NUM_SEQS
    assert args.max_num_batched_tokens == DEFAULT_MAX_NUM_BATCHED_TOKENS
    assert args.buffer_steps == DEFAULT_BUFFER_STEPS


@pytest.mark.parametrize(
    ("command", "module", "constant", "shown"),
    [
        ("compare", flags, "DEFAULT_MAX_NUM_SEQS", "(SGLang --max-running-requests; default 77)"),
        ("compare", flags, "DEFAULT_MAX_NUM_BATCHED_TOKENS", "prefill-size; default 77)"),
        ("calibrate", flags, "DEFAULT_MAX_NUM_BATCHED_TOKENS", "prefill-size; default 77)"),
        ("cluster", cluster, "DEFAULT_BUFFER_STEPS", "(vLLM's 77)"),
        ("cluster", flags, "DEFAULT_BLOCK_SIZE", "tokens per id, else 77)"),
        ("cluster", flags, "DEFAULT_GPU_MEMORY_UTILIZATION", "vLLM's flag (default 77)"),
    ],
)
def test_a_help_text_quotes_its_constant(
    command: str,
    module: Any,
    constant: str,
    shown: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A help text that wrote the figure by hand would still say the real default.
    monkeypatch.setattr(module, constant, 77)
    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag: the phrase is not wrapped
    assert main([command, "--help"]) == 0
    assert shown in capsys.readouterr().out


def test_the_lab_writes_no_engine_default_by_hand() -> None:
    # The figures, next to the words that name them, outside the constants' modules.
    by_hand = re.compile(
        r"\b8192\b"
        r"|(max.num.seqs|max.running).*\b256\b"
        r"|(buffer.steps|replay).*\b10_?000\b"
        r"|(memory.utilization).*\b0\.9\b"
        r"|block.size\b.*\bor 16\b",
        re.IGNORECASE,
    )
    homes = {"sim/config.py", "sim/profile.py", "cluster/config.py"}
    found = [
        f"{path.relative_to(LAB)}:{n}: {line.strip()}"
        for path in sorted(LAB.rglob("*.py"))
        if path.relative_to(LAB).as_posix() not in homes
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if by_hand.search(line)
    ]
    assert found == []


def test_the_memory_share_falls_back_to_the_constant() -> None:
    args = build_parser().parse_args(["compare"])
    assert common.memory_utilization(args) == DEFAULT_GPU_MEMORY_UTILIZATION


def test_no_help_text_restates_its_flags_default_by_hand() -> None:
    # "(default %(default)s)" reads the flag's own default; a figure typed beside it
    # goes stale when the default changes.
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    stale = []
    for name, command in sub.choices.items():
        for action in command.add_flags()._actions:
            default = action.default
            if default in (None, False, "", [], argparse.SUPPRESS) or not action.help:
                continue
            # as Python writes it, and as %g and a thousands comma would (300.0 as 300)
            number = type(default) in (int, float)
            spellings = {str(default), *((f"{default:g}", f"{default:,}") if number else ())}
            if any(re.search(rf"default:? {re.escape(t)}\b", action.help) for t in spellings):
                stale.append(f"{name} {action.option_strings[0]}")
    assert stale == []


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser, its flags added."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: command.add_flags() for name, command in sub.choices.items()}


def _by_flag(value: Any) -> dict[str, set[Any]]:
    """``value(action)`` for each subcommand's action, gathered by flag."""
    values: dict[str, set[Any]] = {}
    for command in _commands().values():
        for action in command._actions:
            for flag in action.option_strings:
                values.setdefault(flag, set()).add(value(action))
    return values


def test_a_flag_several_subcommands_take_reads_its_value_one_way() -> None:
    # --max-num-batched-tokens 8k or --seed 2**64 means the same to compare and cluster.
    types = _by_flag(lambda action: action.type)
    assert {flag: t for flag, t in types.items() if len(t) > 1} == {}


def test_a_flag_several_subcommands_take_is_defined_in_flags_py_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One definition per flag: what differs between subcommands is a keyword of its
    # function in cli/flags.py, never a second add_argument in a subcommand's module.
    where: dict[str, set[str]] = {}
    add = argparse._ActionsContainer.add_argument

    def recorded(self: Any, *args: Any, **kwargs: Any) -> argparse.Action:
        action = add(self, *args, **kwargs)
        caller = Path(sys._getframe(1).f_code.co_filename).name
        for flag in action.option_strings:
            where.setdefault(flag, set()).add(caller)
        return action

    monkeypatch.setattr(argparse._ActionsContainer, "add_argument", recorded)
    taken: dict[str, int] = {}
    for command in _commands().values():
        for flag in {f for action in command._actions for f in action.option_strings}:
            taken[flag] = taken.get(flag, 0) + 1
    shared = {flag for flag, count in taken.items() if count > 1} - {"-h", "--help"}
    assert {"--seed", "--quiet", "--out", "--index", "--workload"} <= shared
    assert {flag: where[flag] for flag in shared if where[flag] != {"flags.py"}} == {}


_SUBCOMMAND = re.compile(r"\b(compare|replay|cluster|calibrate)\b")
_MAY_NAME_ANOTHER = {
    # --profile says where a profile file comes from: the command that writes one.
    r"prefixkv calibrate": ("compare", "cluster"),
    # calibrate's description says who reads what it writes.
    r"compare and cluster read": ("calibrate",),
    # to replay requests through a cache, or KV events to a late router: the verb.
    r"\breplay (at|once|itself|closed)\b|\bfor replay\b": ("compare", "cluster"),
}


def test_no_subcommands_help_names_another_subcommand() -> None:
    # compare --help says what --seed, --quiet or --index mean to compare, not to cluster.
    named = []
    for name, command in _commands().items():
        text = " ".join(command.format_help().split())
        for allowed, where in _MAY_NAME_ANOTHER.items():
            if name in where:
                text = re.sub(allowed, "", text)
        named += [f"{name}: {m[0]}" for m in _SUBCOMMAND.finditer(text) if m[0] != name]
    assert named == []
