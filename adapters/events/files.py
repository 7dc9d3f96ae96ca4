"""KV-event files: one batch per line, the batch as msgspec's JSON encoder writes it.

Each line is exactly what ``msgspec.json.encode`` gives for vLLM 0.33's own
``KVEventBatch`` (``[ts, [{"type": "BlockStored", ...}], rank]``), so
``msgspec.json.decode(line, type=vllm.distributed.kv_events.KVEventBatch)`` reads it,
and tools that read vLLM's structs read these files unchanged. Hashes given as bytes
appear as base64 strings, as msgspec writes bytes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import IO

import msgspec

from ..outputs import atomic_writer
from .codec import EventDecodeError
from .wire import EventBatch, KVEventBatch

__all__ = ["EventFileWriter", "read_event_file"]


class EventFileWriter:
    """Writes batches to a JSON-lines file; has the publisher interface (``publish``).

    A path is written under prefixkv's output rule (:mod:`prefixkv.adapters.outputs`):
    it must be a regular file or an absent name (never a link, a device or a FIFO:
    refused at construction), and the batches go to a temporary file beside it that
    replaces it at :meth:`shutdown`, whole. Leaving a ``with`` block by an exception
    discards them and leaves the path as it was.

    Args:
        target: a path, or an open binary file (written as it comes, and left open by
            :meth:`shutdown`; ``"-"`` is not special).
        data_parallel_rank: stamped on batches without one, as a publisher does.

    Raises:
        OutputError: the path is not a regular file or an absent name, or its folder
            cannot be written.
    """

    def __init__(self, target: str | os.PathLike[str] | IO[bytes], *, data_parallel_rank: int = 0):
        self._output: contextlib.AbstractContextManager[IO[bytes]] | None = None
        self._closed = False
        if isinstance(target, (str, os.PathLike)):
            self._output = atomic_writer(target)
            self._file: IO[bytes] = self._output.__enter__()
        else:
            self._file = target
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
        """Flush; a path this writer opened is then replaced by what was written."""
        self._close(None)

    def _close(self, exc: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        output, self._output = self._output, None
        if output is None:
            self._file.flush()
        elif exc is None:
            output.__exit__(None, None, None)
        else:
            with contextlib.suppress(BaseException):  # the caller's exception goes on
                output.__exit__(type(exc), exc, exc.__traceback__)

    def __enter__(self) -> EventFileWriter:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        self._close(exc)


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
