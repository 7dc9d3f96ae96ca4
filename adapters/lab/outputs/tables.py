"""The tidy tables every command writes: one row per request, one row per run.

One schema for all of them: a row is the run's labels (what was varied: backend,
capacity, scheduler settings, policy, workload...) followed by the record's flat
fields (a request's timeline and cache accounting, a run's totals and percentiles).
Rows of many runs therefore stack into one table that ``pandas.read_csv`` loads and
``groupby`` slices. Writers for CSV, flat JSON (a list of records), JSON lines and,
when pyarrow is installed, Parquet; :func:`to_dataframes` returns pandas DataFrames
when pandas is installed.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefixkv.adapters.outputs import atomic_writer

from ..extras import require_extra
from ..sim.errors import SimError
from ..sim.metrics import SimResult, request_table
from ..sim.runs import RunRow, run_table

if TYPE_CHECKING:
    import pandas

    from ..cluster.metrics import ClusterResult

__all__ = [
    "TABLE_FORMATS",
    "TableFormatError",
    "json_safe",
    "request_rows",
    "run_rows",
    "to_dataframes",
    "write_json",
    "write_rows",
    "write_tables",
]

TABLE_FORMATS = ("csv", "json", "jsonl", "parquet")
"""File formats :func:`write_rows` writes, picked by the file name's suffix."""

Row = Mapping[str, Any]


class TableFormatError(SimError):
    """An unknown table format, or Parquet without pyarrow installed."""


def request_rows(
    results: Iterable[SimResult | ClusterResult], keys: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """One row per request of every run: the run's labels (only ``keys`` of them, in
    that order, when given), then the request's fields."""
    return [
        row
        for res in results
        for row in request_table(res.labels, res.requests, keys=keys, position=False)
    ]


def run_rows(results: Iterable[SimResult]) -> list[dict[str, Any]]:
    """One row per run: its labels, then its summary (:func:`~..sim.runs.run_table`)."""
    return run_table(RunRow(res.labels, (res.run,)) for res in results)


def _columns(rows: Sequence[Row]) -> list[str]:
    # Rows of different runs may carry different labels: the union, first seen first.
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def json_safe(value: Any) -> Any:
    """``value`` with every NaN and infinity (no second token, a ratio of nothing) as
    ``None``, inside mappings and lists too: JSON's null, not the non-standard NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(path: Path, doc: Mapping[str, Any]) -> Path:
    """Write ``doc`` as standard JSON (see :func:`json_safe`; other objects as their
    text), whole or not at all; returns ``path``."""
    text = json.dumps(json_safe(doc), indent=1, ensure_ascii=False, allow_nan=False, default=str)
    with atomic_writer(path) as f:
        f.write((text + "\n").encode("utf-8"))
    return path


def write_rows(path: str | os.PathLike[str], rows: Sequence[Row]) -> Path:
    """Write ``rows`` in the format the suffix names (``.csv``, ``.json``, ``.jsonl``,
    ``.parquet``).

    CSV and Parquet get one column per key (the union over rows, a missing value
    empty); JSON is a list of flat records, JSON lines one record a line (NaN is
    ``null`` in both). The file appears whole or not at all (written beside
    ``path``, then renamed over it); missing folders are created.

    Raises:
        TableFormatError: another suffix, or ``.parquet`` without pyarrow.
    """
    out = Path(path)
    fmt = out.suffix.removeprefix(".").lower()
    if fmt not in TABLE_FORMATS:
        raise TableFormatError(
            f"cannot write {out.name!r}: the suffix must be one of "
            f"{', '.join('.' + f for f in TABLE_FORMATS)}"
        )
    columns = _columns(rows)
    if fmt == "parquet":
        _write_parquet(out, rows, columns)
        return out
    with atomic_writer(out) as raw:
        f = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        if fmt == "csv":
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        else:
            records = [{k: json_safe(row.get(k)) for k in columns} for row in rows]
            if fmt == "json":
                json.dump(records, f, allow_nan=False)
            else:
                f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in records)
        f.flush()
        f.detach()  # the writer closes the file itself, after syncing it
    return out


def _write_parquet(out: Path, rows: Sequence[Row], columns: list[str]) -> None:
    require_extra("parquet", f"writing {out.name!r}", ("pyarrow",), instead="(CSV and JSON do not)")
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([{k: row.get(k) for k in columns} for row in rows])
    with atomic_writer(out) as f:
        pq.write_table(table, f)


def write_tables(
    tables: Mapping[str, Sequence[Row]],
    out_dir: str | os.PathLike[str],
    formats: Sequence[str] = ("csv",),
    written: dict[str, str] | None = None,
) -> list[Path]:
    """Write ``<name>.<fmt>`` for each table and format into ``out_dir``, each file
    whole, format by format.

    Args:
        tables: rows by table name (``{"requests": ..., "runs": ...}``).
        out_dir: the folder (created).
        formats: of :data:`TABLE_FORMATS`.
        written: filled in as each file is complete (``{"requests_csv":
            "requests.csv"}``), so an interrupted caller knows which are this run's.

    Returns:
        The files written.

    Raises:
        TableFormatError: an unknown format.
        ExtraNotInstalledError: Parquet without pyarrow (nothing written).
    """
    if "parquet" in formats:
        require_extra("parquet", "Parquet tables", ("pyarrow",), instead="(CSV and JSON do not)")
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for fmt in formats:
        for name, rows in tables.items():
            files.append(write_rows(directory / f"{name}.{fmt}", rows))
            if written is not None:
                written[f"{name}_{fmt}"] = f"{name}.{fmt}"
    return files


def to_dataframes(
    results: Iterable[SimResult],
) -> tuple[pandas.DataFrame, pandas.DataFrame]:
    """The request table and the run table as pandas DataFrames.

    Raises:
        ExtraNotInstalledError: pandas is not installed (an ``ImportError`` too).
    """
    require_extra("pandas", "to_dataframes")
    import pandas

    res = list(results)
    return pandas.DataFrame(request_rows(res)), pandas.DataFrame(run_rows(res))
