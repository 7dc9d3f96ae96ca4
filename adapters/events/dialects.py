"""The recorder for an index: the one that speaks the engine dialect the index declares.

An index that reports its changes (``SupportsEventSink``) names, in its
``kv_event_dialect``, whose events its sink calls reproduce: the hash chain (and the
no-cache index) vLLM's ``BlockPool``, the radix tree SGLang's ``RadixCache``. This
module maps the dialect to its recorder; nothing here looks at backend names. The
engine-facing contract: ``recorder = make_event_recorder(index)``,
``index.set_event_sink(recorder)``, then ``recorder.take_events()`` once per scheduler
step (vLLM's ``KVCacheManager.take_events``).
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from prefixkv.indexes.base import EventSink, SupportsEventSink
from prefixkv.indexes.errors import PrefixKVError

from .wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

__all__ = [
    "EventRecorder",
    "EventsUnsupportedError",
    "attach_event_recorder",
    "make_event_recorder",
]


class EventsUnsupportedError(PrefixKVError):
    """The index reports no events, or declares a dialect no recorder speaks."""


class EventRecorder(EventSink, Protocol):
    """An :class:`~prefixkv.indexes.base.EventSink` that queues wire events."""

    def take_events(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
        """The events queued since the last call, oldest first, as vLLM 0.33 structs."""
        ...

    def take_batch(self, ts: float, data_parallel_rank: int | None = None) -> KVEventBatch | None:
        """The queued events as one batch stamped ``ts``, or None when there are none."""
        ...


_RECORDERS: Mapping[str, str] = {
    "vllm": "prefixkv.adapters.events.recorder:VllmEventRecorder",
    "sglang": "prefixkv.adapters.events.sglang_recorder:SGLangEventRecorder",
}
"""Recorder classes by ``kv_event_dialect``, each imported when an index first speaks it:
an engine never loads the other engine's."""


def make_event_recorder(index: object, **options: Any) -> EventRecorder:
    """A new recorder for ``index``'s dialect (not attached: call ``set_event_sink``).

    Args:
        index: an index that supports an event sink.
        **options: the recorder's options (``medium``; vLLM's ``group_idx``,
            ``int_hashes``, ``kv_cache_spec_kind``; SGLang's ``announce_start``).

    Raises:
        EventsUnsupportedError: the index has no ``set_event_sink``, or declares a
            dialect no recorder speaks.
    """
    if not isinstance(index, SupportsEventSink):
        raise EventsUnsupportedError(
            f"{type(index).__name__} reports no KV events (it has no set_event_sink)"
        )
    dialect = index.kv_event_dialect
    home = _RECORDERS.get(dialect)
    if home is None:
        raise EventsUnsupportedError(
            f"{type(index).__name__} speaks KV-event dialect {dialect!r}; "
            f"recorders exist for {', '.join(sorted(_RECORDERS))}"
        )
    factory: Callable[..., EventRecorder] = pkgutil.resolve_name(home)
    return factory(**options)


def attach_event_recorder(index: object, **options: Any) -> EventRecorder:
    """:func:`make_event_recorder`, attached to ``index`` as its sink.

    Raises:
        EventsUnsupportedError: as :func:`make_event_recorder`.
    """
    recorder = make_event_recorder(index, **options)
    assert isinstance(index, SupportsEventSink)
    index.set_event_sink(recorder)
    return recorder
