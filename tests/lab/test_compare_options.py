"""``prefixkv compare`` resolves its flags through :class:`CompareOptions`, the one path
from what a caller writes to the settings a comparison runs (no second copy in the CLI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prefixkv.adapters.lab.cli import compare as compare_cli
from prefixkv.adapters.lab.cli.main import main
from prefixkv.adapters.lab.compare import CompareOptions
from prefixkv.adapters.lab.compare.plan import CompareSettings
from prefixkv.adapters.lab.compare.run import run_comparison
from prefixkv.adapters.lab.sim import load_profile


def _workloads(options: CompareOptions) -> Any:
    return options.load_workloads()


def test_the_capacity_sweep_defaults_as_the_command_does() -> None:
    # On for the default set of built-in workloads or several capacities, else off.
    seed = CompareOptions(["seed"])
    assert not seed.settings(_workloads(seed)).capacity_sweep
    assert CompareOptions(["seed"], capacity_tokens=[400, 800]).settings([]).capacity_sweep
    assert CompareOptions().settings([]).capacity_sweep
    assert not CompareOptions(capacity_sweep=False).settings([]).capacity_sweep


def test_a_given_profile_states_the_capacities_in_gib() -> None:
    profile = load_profile()
    assert CompareOptions(["seed"], profile=profile).settings([]).profile is profile
    assert CompareOptions(["seed"]).settings([]).profile is None
    timed = CompareOptions(["seed"], request_rate=1.0).settings([])
    assert timed.time is not None and timed.profile is timed.time.profile


def test_the_command_runs_the_settings_its_options_resolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolved: list[CompareSettings] = []
    ran: list[CompareSettings] = []
    settings = CompareOptions.settings

    def spy_settings(self: CompareOptions, workloads: Any) -> CompareSettings:
        resolved.append(settings(self, workloads))
        return resolved[-1]

    def spy_run(plans: Any, s: CompareSettings, **kwargs: Any) -> Any:
        ran.append(s)
        return run_comparison(plans, s, **kwargs)

    monkeypatch.setattr(CompareOptions, "settings", spy_settings)
    monkeypatch.setattr(compare_cli, "run_comparison", spy_run)
    argv = ["compare", "-w", "seed", "--request-rate", "2", "--max-num-seqs", "3",
            "--timing-repeats", "0", "--no-plots", "-q", "-o", str(tmp_path / "r")]  # fmt: skip
    assert main(argv) == 0
    assert len(resolved) == len(ran) == 1 and ran[0] is resolved[0]
    (s,) = ran
    assert s.time is not None and s.time.max_num_seqs == 3 and s.timing_repeats == 0
