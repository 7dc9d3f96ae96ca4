"""Tidy tables of simulated runs: one row per request x run, one row per run.

Every row carries the run's labels (backend, block size, capacity, scheduler
settings, profile, workload...) beside its measurements, so the rows of many runs
stack into one table that ``pandas.read_csv`` loads and ``groupby`` slices. Writers
for CSV, flat JSON (a list of records), JSON lines and, when pyarrow is installed,
Parquet; :func:`to_dataframes` returns pandas DataFrames when pandas is installed.
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
from .errors import SimError
from .metrics import SimResult

if TYPE_CHECKING:
    import pandas

__all__ = [
    "TABLE_FORMATS",
    "TableFormatError",
    "request_rows",
    "run_rows",
    "to_dataframes",
    "write_rows",
    "write_tables",
]

TABLE_FORMATS = ("csv", "json", "jsonl", "parquet")
"""File formats :func:`write_rows` writes, picked by the file name's suffix."""


class TableFormatError(SimError):
    """An unknown table format, or Parquet without pyarrow installed."""


def request_rows(results: Iterable[SimResult]) -> list[dict[str, Any]]:
    """One row per request of every run: the run's labels, then the request's fields."""
    return [{**res.labels, **r.as_row()} for res in results for r in res.requests]


def run_rows(results: Iterable[SimResult]) -> list[dict[str, Any]]:
    """One row per run: its labels, then its summary."""
    return [{**res.labels, **res.run.as_row()} for res in results]


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    # Rows of different runs may carry different labels: the union, first seen first.
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def _json_value(value: Any) -> Any:
    # NaN (no second token, no value yet) is null in JSON, not the non-standard NaN.
    return None if isinstance(value, float) and math.isnan(value) else value


def write_rows(path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]]) -> Path:
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
            records = [{k: _json_value(row.get(k)) for k in columns} for row in rows]
            if fmt == "json":
                json.dump(records, f, allow_nan=False)
            else:
                f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in records)
        f.flush()
        f.detach()  # the writer closes the file itself, after syncing it
    return out


def _write_parquet(out: Path, rows: Sequence[Mapping[str, Any]], columns: list[str]) -> None:
    require_extra("parquet", f"writing {out.name!r}", ("pyarrow",), instead="(CSV and JSON do not)")
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([{k: row.get(k) for k in columns} for row in rows])
    with atomic_writer(out) as f:
        pq.write_table(table, f)


def write_tables(
    results: Sequence[SimResult],
    out_dir: str | os.PathLike[str],
    formats: Sequence[str] = ("csv",),
) -> list[Path]:
    """Write ``requests.<fmt>`` and ``runs.<fmt>`` for each format into ``out_dir``.

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
    tables = {"requests": request_rows(results), "runs": run_rows(results)}
    return [
        write_rows(directory / f"{name}.{fmt}", rows)
        for fmt in formats
        for name, rows in tables.items()
    ]


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
