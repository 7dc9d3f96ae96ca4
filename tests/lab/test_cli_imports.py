"""What each ``prefixkv`` subcommand loads: only what it runs.

The parser names the subcommands without importing them; a subcommand's module adds
its flags once it is chosen. So ``prefixkv --help`` loads no subcommand, and
``prefixkv replay`` (the K-live replay of one trace) never loads the comparison, the
cluster simulation, the calibration or the plots.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

LAB = "prefixkv.adapters.lab"


def _modules_after(code: str) -> set[str]:
    code = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    return set(out.split())


def _under(mods: set[str], *packages: str) -> set[str]:
    return {m for m in mods if any(m == p or m.startswith(f"{p}.") for p in packages)}


REPLAY_NEVER = (
    f"{LAB}.compare",
    f"{LAB}.cluster",
    f"{LAB}.outputs",
    f"{LAB}.cli.compare",
    f"{LAB}.cli.cluster",
    f"{LAB}.cli.calibrate",
    f"{LAB}.sim.calibration",
    f"{LAB}.sim.calibration_rounds",
    f"{LAB}.sim.server_calibration",
    f"{LAB}.sim.replica",
    "matplotlib",
    "scipy",
    "torch",
    "httpx",
    "ray",
    "zmq",
)
"""Modules and packages a replay without ``--kv-events ENDPOINT`` has no use for."""


def test_replay_loads_neither_compare_cluster_calibration_nor_plots() -> None:
    # The parser built, replay's arguments parsed and its handler resolved, as main() does.
    mods = _modules_after(
        "from prefixkv.adapters.lab.cli.main import build_parser, command\n"
        "args = build_parser().parse_args(['replay', 't.jsonl', '--index', 'hash_chain', "
        "'-o', 'hits.jsonl'])\n"
        "assert args.command == 'replay' and callable(command(args.command).run)"
    )
    assert f"{LAB}.cli.replay" in mods and f"{LAB}.replay" in mods  # what it runs
    assert not _under(mods, *REPLAY_NEVER)


def test_the_top_level_help_loads_no_subcommand() -> None:
    mods = _modules_after(
        "from prefixkv.adapters.lab.cli.main import build_parser\nbuild_parser().format_help()"
    )
    assert not _under(mods, *(f"{LAB}.cli.{name}" for name in
                              ("compare", "replay", "calibrate", "cluster", "common")))  # fmt: skip
    assert not _under(mods, f"{LAB}.traces", f"{LAB}.sim", "numpy", "msgspec")


@pytest.mark.parametrize(
    ("name", "others"),
    [
        ("replay", ("compare", "cluster", "calibrate")),
        ("calibrate", ("compare", "cluster", "replay")),
    ],
)
def test_a_subcommand_does_not_load_the_others(name: str, others: tuple[str, ...]) -> None:
    mods = _modules_after(
        "from prefixkv.adapters.lab.cli.main import build_parser, command\n"
        f"build_parser(); command({name!r}).add_arguments"
    )
    assert f"{LAB}.cli.{name}" in mods
    assert not _under(mods, *(f"{LAB}.cli.{o}" for o in others))


def test_the_simulator_package_loads_a_part_only_when_it_is_used() -> None:
    mods = _modules_after("import prefixkv.adapters.lab.replay")
    assert not _under(mods, f"{LAB}.sim.calibration", f"{LAB}.sim.replica", f"{LAB}.sim.profile")
    mods = _modules_after("from prefixkv.adapters.lab.sim import CostProfile, simulate")
    assert {f"{LAB}.sim.profile", f"{LAB}.sim.replica"} <= mods


def test_every_subcommand_parser_takes_its_flags_when_asked() -> None:
    import argparse

    from prefixkv.adapters.lab.cli.args import CommandParser
    from prefixkv.adapters.lab.cli.main import COMMANDS, build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(sub.choices) == list(COMMANDS)
    for name, parser in sub.choices.items():
        assert isinstance(parser, CommandParser)
        assert len(parser.add_flags()._actions) > 1, name  # more than -h
        assert parser.description, name
