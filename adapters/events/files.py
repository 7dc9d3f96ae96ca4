"""KV-event files: one batch per line, the batch as msgspec's JSON encoder writes it.

Each line is exactly what ``msgspec.json.encode`` gives for vLLM 0.33's own
``KVEventBatch`` (``[ts, [{"type": "BlockStored", ...}], rank]``), so
``msgspec.json.decode(line, type=vllm.distributed.kv_events.KVEventBatch)`` reads it,
and tools that read vLLM's structs read these files unchanged. Hashes given as bytes
appear as base64 strings, as msgspec writes bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import IO

import msgspec

from .codec import EventDecodeError
from .wire import EventBatch, KVEventBatch

__all__ = ["EventFileWriter", "read_event_file"]


class EventFileWriter:
    """Writes batches to a JSON-lines file; has the publisher interface (``publish``).

    Args:
        target: a path (opened for writing, truncated; ``"-"`` is not special) or an
            open binary file (left open by :meth:`shutdown`).
        data_parallel_rank: stamped on batches without one, as a publisher does.
    """

    def __init__(self, target: str | os.PathLike[str] | IO[bytes], *, data_parallel_rank: int = 0):
        if isinstance(target, (str, os.PathLike)):
            self._file: IO[bytes] = open(target, "wb")  # noqa: SIM115 - closed by shutdown
            self._owned = True
        else:
            self._file = target
            self._owned = False
        self.data_parallel_rank = data_parallel_rank
        self._encoder = msgspec.json.Encoder()
        self.num_batches = 0
        """Batches written so far."""

    def publish(self, batch: EventBatch) -> None:
        """Append one batch as one line."""
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = self.data_parallel_rank
        self._file.write(self._encoder.encode(batch) + b"\n")
        self.num_batches += 1

    def shutdown(self) -> None:
        """Flush, and close the file if this writer opened it."""
        self._file.flush()
        if self._owned:
            self._file.close()

    def __enter__(self) -> EventFileWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def read_event_file(path: str | os.PathLike[str]) -> Iterator[KVEventBatch]:
    """The batches of a KV-event file, in order (blank lines skipped).

    Raises:
        EventDecodeError: a line is not a batch; the message gives its number.
    """
    decoder = msgspec.json.Decoder(KVEventBatch)
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield decoder.decode(line)
            except msgspec.DecodeError as e:
                raise EventDecodeError(
                    f"{os.fspath(path)}:{number}: not a KV-event batch: {e}"
                ) from None
            except RecursionError:  # msgspec's bound on nesting, even in ignored fields
                raise EventDecodeError(
                    f"{os.fspath(path)}:{number}: not a KV-event batch: nested too deeply"
                ) from None
