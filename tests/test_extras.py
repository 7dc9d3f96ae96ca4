"""Optional extras are checked before any work: one named error, exit status 2, one
line naming ``pip install 'prefixkv[EXTRA]'``, and nothing written.

A missing module is simulated by ``sys.modules[name] = None``: the import system's
finders then report it absent and ``import name`` fails, as on an install without it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prefixkv.adapters.lab import extras
from prefixkv.adapters.lab.cli import main
from prefixkv.adapters.lab.extras import has_extra, missing_modules, require_extra
from prefixkv.indexes.errors import PrefixKVError
from prefixkv.storage.extras import ExtraNotInstalledError


def _without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    return err[0]


def test_the_error_names_the_modules_and_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "scipy")
    assert missing_modules(["json", "scipy"]) == ["scipy"]
    assert not has_extra("calibrate") and has_extra("calibrate", ("numpy",))
    with pytest.raises(ExtraNotInstalledError) as info:
        require_extra("calibrate", "the fit")
    assert str(info.value) == ("the fit: scipy is not installed; pip install 'prefixkv[calibrate]'")
    assert isinstance(info.value, PrefixKVError) and isinstance(info.value, ImportError)
    _without(monkeypatch, "numpy")
    with pytest.raises(
        ExtraNotInstalledError, match=r"fit: numpy and scipy are not installed; .* \(or not\)$"
    ):
        require_extra("calibrate", "the fit", instead="(or not)")


def test_an_extra_must_install_what_it_is_asked_for() -> None:
    with pytest.raises(KeyError):
        require_extra("nope", "x")
    with pytest.raises(KeyError):
        require_extra("pandas", "x", ("scipy",))


def test_the_extras_are_the_projects() -> None:
    tomllib = pytest.importorskip("tomllib")
    pyproject = Path(__file__).parents[1] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    for extra, modules in extras.EXTRAS.items():
        names = {req.split(">")[0].split("=")[0].split("[")[0].strip() for req in declared[extra]}
        assert set(modules) == names, extra


def test_calibrate_without_scipy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _without(monkeypatch, "scipy")
    out = tmp_path / "p.json"
    assert main(["calibrate", "--device", "cpu", "--quick", "--out", str(out)]) == 2
    assert _error_line(capsys) == (
        "prefixkv: error: prefixkv calibrate: scipy is not installed; "
        "pip install 'prefixkv[calibrate]'"
    )
    assert not out.exists()


def test_calibrate_server_without_httpx(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _without(monkeypatch, "httpx")
    out = tmp_path / "p.json"
    argv = ["calibrate", "--server", "http://127.0.0.1:9", "--model", "m", "--out", str(out)]
    assert main(argv) == 2
    assert _error_line(capsys) == (
        "prefixkv: error: prefixkv calibrate: httpx is not installed; "
        "pip install 'prefixkv[calibrate]'"
    )
    assert not out.exists()
    # the reference engine's calibration needs no HTTP client
    assert main(["calibrate", "--device", "cpu", "--quick", "--out", str(out)]) == 0


def test_compare_plots_without_matplotlib(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _without(monkeypatch, "matplotlib")
    out = tmp_path / "report"
    argv = ["compare", "--workload", "few_shot", "--max-requests", "5", "--timing-repeats", "1",
            "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    assert _error_line(capsys) == (
        "prefixkv: error: compare's plots: matplotlib is not installed; "
        "pip install 'prefixkv[report]' (or give --no-plots)"
    )
    assert not out.exists()
    assert main([*argv, "--no-plots"]) == 0
    assert (out / "report.md").exists() and not list(out.glob("*.png"))


def test_cluster_plots_without_matplotlib(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _without(monkeypatch, "matplotlib")
    out = tmp_path / "report"
    argv = ["cluster", "--workload", "multi_turn", "--max-requests", "20", "--replicas", "2",
            "--capacity-tokens", "4k", "--policies", "round_robin,sglang", "--faults",
            "drop=0.1", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    assert _error_line(capsys) == (
        "prefixkv: error: the cluster report's plots: matplotlib is not installed; "
        "pip install 'prefixkv[report]' (or give --no-plots)"
    )
    assert not out.exists()
    assert main([*argv, "--no-plots"]) == 0
    report = (out / "report.md").read_text()
    assert "## Fault runs" in report and ".png" not in report
    assert not list(out.glob("*.png"))


def test_cluster_ray_without_ray(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _without(monkeypatch, "ray")
    out = tmp_path / "report"
    argv = ["cluster", "--ray", "--workload", "multi_turn", "--max-requests", "5", "--quiet",
            "--no-plots", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    assert _error_line(capsys) == (
        "prefixkv: error: --ray: ray is not installed; pip install 'prefixkv[cluster]'"
    )
    assert not out.exists()
    from prefixkv.adapters.lab.cluster.ray_fleet import RayFleet

    with pytest.raises(ExtraNotInstalledError, match=r"RayFleet: ray is not installed"):
        RayFleet()


def test_tables_without_pandas_or_pyarrow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from prefixkv.adapters.lab.outputs.tables import to_dataframes, write_tables

    _without(monkeypatch, "pandas", "pyarrow")
    with pytest.raises(ExtraNotInstalledError, match=r"pip install 'prefixkv\[pandas\]'"):
        to_dataframes([])
    out = tmp_path / "tables"
    with pytest.raises(ExtraNotInstalledError, match=r"prefixkv\[parquet\]' \(CSV and JSON"):
        write_tables({}, out, formats=("csv", "parquet"))
    assert not out.exists()


def test_no_progress_bar_without_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefixkv.adapters.lab.progress import _NoProgress, progress

    _without(monkeypatch, "tqdm")
    assert isinstance(progress(10, "x"), _NoProgress)
