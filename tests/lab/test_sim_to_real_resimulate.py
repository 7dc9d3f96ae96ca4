"""benchmarks/sim_to_real.py --resimulate: a recorded sweep predicted again with no
server, from a tiny recording in tests/data/sim_to_real (one rate, one run of six
multi-turn requests, a served profile that keeps its calibration samples)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import sim_to_real
from helpers import ROOT

from prefixkv.adapters.lab.sim import load_profile
from prefixkv.adapters.lab.sim.arrivals import poisson_arrivals

RECORDING = ROOT / "tests" / "data" / "sim_to_real"


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_the_requests_are_rebuilt_from_their_seeds_and_set_against_the_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "again"
    assert sim_to_real.main(["--resimulate", str(RECORDING), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "re-predicted from the recording" in said and said.count("| 1 |") == 1
    doc = json.loads((out / "results.json").read_text())
    (run,) = doc["runs"]
    recorded = _lines(RECORDING / "requests-1-1.jsonl")
    # the measurements are the recording's, untouched
    assert run["ttft_measured"] == [r["ttft_s"] for r in recorded]
    assert run["cached_exact"] == len(recorded)
    # the prediction is the simulator's for the rebuilt requests at the recorded times
    requests = sim_to_real.trace("multi_turn", 6, run["seed"], run["salt"], sim_to_real.VOCAB)
    assert [r[0] for r in requests] == [r["id"] for r in recorded]
    profile = load_profile(RECORDING / "profile.json")
    sent = [float(r["sent_s"]) for r in recorded]  # type: ignore[arg-type]
    predicted, _, _ = sim_to_real.predict(requests, sent, profile, 1 << 20, 32)
    assert run["ttft_sim"] == [t for _, t, _ in predicted]
    # one request sent 50 ms late, one read in a burst: the client's, left out
    assert run["client_stalled"] == [False, False, True, False, True, False]
    (rate,) = doc["rates"]
    assert rate["client_stalls"] == 2 and rate["verdict"].endswith("client stalled on 2 (left out)")
    assert doc["resimulated_from"] == str(RECORDING)
    # the recording is only read
    assert not (RECORDING / "table.md").exists()


def test_the_recorded_send_lateness_is_measured_from_the_rebuilt_arrivals() -> None:
    recorded = _lines(RECORDING / "requests-1-1.jsonl")
    doc = json.loads((RECORDING / "results.json").read_text())
    gen = poisson_arrivals(1.0, seed=doc["runs"][0]["seed"])
    late = [float(r["sent_s"]) - next(gen) for r in recorded]  # type: ignore[arg-type]
    assert late[2] == pytest.approx(0.05) and max(late[:2] + late[3:]) < 0.002


def test_refit_fits_the_kept_samples_again(tmp_path: Path) -> None:
    out = tmp_path / "refit"
    argv = ["--resimulate", str(RECORDING), "--out", str(out), "--refit"]
    assert sim_to_real.main(argv) == 0
    doc = json.loads((out / "results.json").read_text())
    kept = load_profile(RECORDING / "profile.json")
    # the same samples and the same model: the same coefficients
    for key, value in doc["profile"]["coefficients"].items():
        assert value == pytest.approx(getattr(kept, key), rel=1e-6, abs=1e-12)


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "rec"
    shutil.copytree(RECORDING, copy)
    return copy


def test_a_recording_of_other_requests_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = _copy(tmp_path)
    path = copy / "requests-1-1.jsonl"
    lines = _lines(path)
    lines[3]["prompt"] = int(lines[3]["prompt"]) + 1  # type: ignore[call-overload]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert sim_to_real.main(["--resimulate", str(copy), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "line 4" in err and "not the one its seed rebuilds" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "results.json").unlink(), "no such file"),
        (lambda d: (d / "results.json").write_text("{"), "not JSON"),
        (lambda d: (d / "requests-1-1.jsonl").unlink(), "no such file"),
        (lambda d: (d / "requests-1-1.jsonl").write_text('{"id": 1}\n'), "requests, its seed"),
    ],
)
def test_a_damaged_recording_is_a_named_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: object, message: str
) -> None:
    copy = _copy(tmp_path)
    damage(copy)  # type: ignore[operator]
    assert sim_to_real.main(["--resimulate", str(copy), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_recording_is_never_written_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = _copy(tmp_path)
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    assert sim_to_real.main(["--resimulate", str(copy), "--out", str(copy)]) == 2
    assert "the recording itself" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before
    # by default the re-prediction goes beside it
    assert sim_to_real.main(["--resimulate", str(copy)]) == 0
    assert (tmp_path / "rec-resimulated" / "table.md").is_file()


def test_an_older_recording_is_read_from_its_command_and_the_rates_order(tmp_path: Path) -> None:
    # recorded before the sweep kept its own fields: the seed is the rate's index and
    # the run's, the workload and sizes are the command's
    copy = _copy(tmp_path)
    doc = json.loads((copy / "results.json").read_text())
    for key in ("workload", "max_requests", "request_rates", "block_size", "kv_cache_tokens"):
        doc.pop(key)
    doc["runs"][0].pop("seed")
    (copy / "results.json").write_text(json.dumps(doc))
    lines = _lines(copy / "requests-1-1.jsonl")
    for line in lines:  # nor the latency and tokens
        line.pop("latency_s"), line.pop("tokens")
    (copy / "requests-1-1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    new, old = tmp_path / "new", tmp_path / "old"
    assert sim_to_real.main(["--resimulate", str(RECORDING), "--out", str(new)]) == 0
    assert sim_to_real.main(["--resimulate", str(copy), "--out", str(old)]) == 0
    a, b = (json.loads((d / "results.json").read_text())["runs"][0] for d in (new, old))
    for key in ("ttft_sim", "tpot_sim", "ttft_measured", "client_stalled", "cached_exact"):
        assert a[key] == b[key]
    assert a["throughput_measured"] == pytest.approx(b["throughput_measured"])


def test_pool_predicts_every_rate_from_all_the_recordings_calibrations(tmp_path: Path) -> None:
    import dataclasses as dc

    from prefixkv.adapters.lab.sim import save_profile

    copy = _copy(tmp_path)
    kept = load_profile(copy / "profile.json")
    # two more calibrations of the same server: one alike, one twice as slow
    for tag, scale in (("-2", 1.0), ("-4", 2.0)):
        rows = [{**s, "seconds": s["seconds"] * scale} for s in kept.fit["samples"]]
        save_profile(
            dc.replace(kept, fit={**kept.fit, "samples": rows}), copy / f"profile{tag}.json"
        )
    out = tmp_path / "pooled"
    assert sim_to_real.main(["--resimulate", str(copy), "--out", str(out), "--pool"]) == 0
    doc = json.loads((out / "results.json").read_text())
    rounds = doc["profile"]["fit"]["rounds"]
    assert (rounds["count"], rounds["kept"]) == (3, 2)
    # the two alike are kept: the fit is the one calibration's, fitted again
    again = sim_to_real.refit_server_profile(kept)
    assert doc["profile"]["coefficients"]["step_s"] == pytest.approx(again.step_s, rel=1e-5)
