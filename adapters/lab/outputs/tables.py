"""The tidy tables every command writes: one row per request, one row per run.

A row is the run's labels (what was varied) followed by the record's flat fields, so rows
of many runs stack into one table. CSV, flat JSON, JSON lines and (with pyarrow) Parquet.
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
    "TableFormatError",
    "json_safe",
    "request_rows",
    "run_rows",
    "to_dataframes",
    "write_json",
    "write_rows",
    "write_tables",
]

_FORMATS = ("csv", "json", "jsonl", "parquet")

Row = Mapping[str, Any]


class TableFormatError(SimError):
    """An unknown table format (a file suffix no writer knows)."""


def request_rows(
    results: Iterable[SimResult | ClusterResult], keys: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """One row per request of every run: the run's labels (only ``keys``, in that order,
    when given), then the request's fields."""
    return [
        row
        for res in results
        for row in request_table(res.labels, res.requests, keys=keys, position=False)
    ]


def run_rows(results: Iterable[SimResult]) -> list[dict[str, Any]]:
    """One row per run: its labels, then its summary."""
    return run_table(RunRow(res.labels, (res.run,)) for res in results)


def json_safe(value: Any) -> Any:
    """``value`` with every NaN and infinity as ``None`` (JSON's null), nested too."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(path: Path, doc: Mapping[str, Any]) -> Path:
    """Write ``doc`` as standard JSON (other objects as their text), whole or not at all."""
    text = json.dumps(json_safe(doc), indent=1, ensure_ascii=False, allow_nan=False, default=str)
    with atomic_writer(path) as f:
        f.write((text + "\n").encode("utf-8"))
    return path


def write_rows(path: str | os.PathLike[str], rows: Sequence[Row]) -> Path:
    """Write ``rows`` in the format the suffix names (``.csv``, ``.json``, ``.jsonl``,
    ``.parquet``), one column per key of any row, whole or not at all.

    Raises:
        TableFormatError: another suffix.
        ExtraNotInstalledError: ``.parquet`` without pyarrow.
    """
    out = Path(path)
    fmt = out.suffix.removeprefix(".").lower()
    if fmt not in _FORMATS:
        raise TableFormatError(
            f"cannot write {out.name!r}: the suffix must be one of "
            f"{', '.join('.' + f for f in _FORMATS)}"
        )
    columns = list(dict.fromkeys(k for row in rows for k in row))  # the union, first seen first
    records = [{k: row.get(k) for k in columns} for row in rows]
    if fmt == "parquet":
        require_extra(
            "parquet", f"writing {out.name!r}", ("pyarrow",), instead="(CSV and JSON do not)"
        )
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist(records)
        with atomic_writer(out) as raw:
            pq.write_table(table, raw)
        return out
    with atomic_writer(out) as raw:
        f = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        if fmt == "csv":
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(records)
        elif fmt == "json":
            json.dump(json_safe(records), f, allow_nan=False)
        else:
            f.writelines(json.dumps(json_safe(r), allow_nan=False) + "\n" for r in records)
        f.flush()
        f.detach()  # the writer closes the file itself, after syncing it
    return out


def write_tables(
    tables: Mapping[str, Sequence[Row]],
    out_dir: str | os.PathLike[str],
    formats: Sequence[str] = ("csv",),
    written: dict[str, str] | None = None,
) -> list[Path]:
    """Write ``<name>.<fmt>`` for each table (rows by name) and format into ``out_dir``
    (created), format by format; ``written`` gets each file's name as it is complete
    (``{"requests_csv": "requests.csv"}``).

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


def to_dataframes(results: Iterable[SimResult]) -> tuple[pandas.DataFrame, pandas.DataFrame]:
    """The request table and the run table as pandas DataFrames.

    Raises:
        ExtraNotInstalledError: pandas is not installed.
    """
    require_extra("pandas", "to_dataframes")
    import pandas

    res = list(results)
    return pandas.DataFrame(request_rows(res)), pandas.DataFrame(run_rows(res))
