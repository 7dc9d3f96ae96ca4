"""The client-path experiment's parts that run without a server: which streams were
read in one burst, its table, its arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import client_paths
import pytest


def row(variant: str, ttft_ms: float, *, gap: float = 0.3, **more: Any) -> dict[str, Any]:
    out = {
        "variant": variant,
        "gap_s": gap,
        "tokens": 32,
        "client_ttft_s": ttft_ms / 1e3,
        "client_decode_s": 0.1,
        "wait_to_first_s": ttft_ms / 1e4,
        "load": 2.0,
    }
    out.update(more)
    return out


def test_a_stream_read_in_one_burst_is_told_from_a_streamed_one() -> None:
    assert client_paths.burst(row("probe", 9.0, client_decode_s=31 * 1e-3))
    assert not client_paths.burst(row("probe", 9.0, client_decode_s=31 * 2e-3))
    # a one-token request has no stream after its first token to be held
    assert not client_paths.burst(row("one-token", 9.0, tokens=1, client_decode_s=0.0))


def test_the_table_leaves_bursts_out_of_each_variant_and_gaps_percentiles() -> None:
    rows = [row("probe", t) for t in (9.0, 10.0, 11.0, 12.0)]
    rows.append(row("probe", 90.0, client_decode_s=0.001))  # held: its TTFT is the stream's
    rows += [row("sweep", 20.0), row("sweep", 8.0, gap=2.0)]
    lines = client_paths.table(rows).splitlines()
    assert len(lines) == 5  # head, rule, three cells
    probe = next(ln for ln in lines if ln.startswith("| probe | 0.3 |"))
    cells = [c.strip() for c in probe.strip("|").split("|")]
    assert cells[2:7] == ["5", "1", "11.00", "12.00", "1.10"]
    assert any(ln.startswith("| sweep | 2 | 1 | 0 | 8.00 |") for ln in lines)


def test_the_table_says_dash_where_every_request_was_held() -> None:
    lines = client_paths.table([row("sweep", 80.0, client_decode_s=0.0)]).splitlines()
    assert [c.strip() for c in lines[2].strip("|").split("|")][3:6] == ["1", "-", "-"]


def test_an_unknown_variant_is_refused_before_any_server_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        client_paths.main(
            ["--vllm", "no-such-vllm", "--model", "m", "--variants", "probe,nope",
             "--out", str(tmp_path / "out")]
        )  # fmt: skip
    assert exc.value.code == 2
    assert "--variants" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
