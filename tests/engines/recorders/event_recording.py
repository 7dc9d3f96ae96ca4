"""What the two KV-event recorders share: batching per step, the publisher's replay, the file.

``vllm_kv_events.py`` and ``sglang_kv_events.py`` each step their engine's own cache;
after every step they take its events as the engine's scheduler loop does and hand
them to :class:`StepBatches`, which batches them on a virtual clock (1 ms per step)
and notes what the cache then holds. The batches go out through the engine's own
``ZmqEventPublisher`` and come back through its replay socket
(:func:`publish_and_replay`); :func:`write_recording` writes the fixture file that
``record_kv_event_fixtures.py`` describes.

Standard library only at import; ``zmq`` and ``msgspec`` (both engines' dependencies)
are imported where used.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable
from typing import Any

T0 = 1_700_000_000.0
"""The virtual clock's start: a batch's ``ts`` is ``T0 + step / 1000``."""


class StepBatches:
    """One batch per step that produced events, and what the cache held right after.

    Args:
        take_events: the cache's ``take_events``.
        batch: the engine's ``KVEventBatch`` class.
        cached: ``[hash, count]`` pairs of what the cache holds now.
    """

    def __init__(
        self,
        take_events: Callable[[], list[Any]],
        batch: Callable[..., Any],
        cached: Callable[[], list[list[int]]],
    ) -> None:
        self._take, self._batch, self._cached = take_events, batch, cached
        self.step = 0
        self.batches: list[Any] = []
        self.states: list[list[list[int]]] = []

    def end_step(self, *_: Any) -> None:
        """Take the step's events; batch them if any (the step counts either way)."""
        events = self._take()
        if events:
            self.batches.append(self._batch(ts=T0 + self.step / 1000, events=events))
            self.states.append(self._cached())
        self.step += 1


def publish_and_replay(
    publisher: Any, rank_arg: str, batches: list[Any], settings: dict[str, Any]
) -> list[Any]:
    """Send ``batches`` through the engine's ``ZmqEventPublisher``; read them back by replay.

    Args:
        publisher: the engine's ``ZmqEventPublisher`` class (in-process endpoints).
        rank_arg: the name of its data-parallel rank argument.
        batches: what the replay recorded.
        settings: the fixture settings (``data_parallel_rank``, ``topic``).

    Returns:
        ``[topic, seq, payload]`` frames, in sequence order.

    Raises:
        SystemExit: the publisher does not answer, or fewer batches come back.
    """
    import zmq

    name = f"prefixkv-events-{os.getpid()}"
    pub = publisher(
        **{rank_arg: settings["data_parallel_rank"]},
        endpoint=f"inproc://{name}-pub",
        replay_endpoint=f"inproc://{name}-replay",
        buffer_steps=len(batches) + 1,
        topic=settings["topic"],
    )
    for batch in batches:
        pub.publish(batch)
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(f"inproc://{name}-replay")
    frames: list[Any] = []
    for _attempt in range(200):
        frames = []
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            if not dealer.poll(5000):
                raise SystemExit("no replay answer from the publisher")
            _, topic, seq, payload = dealer.recv_multipart()
            if seq == publisher.END_SEQ:
                break
            frames.append([topic, seq, payload])
        if len(frames) == len(batches):
            break
        time.sleep(0.05)  # the publisher thread is still draining its queue
    pub.shutdown()
    dealer.close(linger=0)
    if len(frames) != len(batches):
        raise SystemExit(f"replayed {len(frames)} of {len(batches)} batches")
    return frames


def read_inputs(trace_path: str, settings_path: str) -> tuple[list[dict[str, Any]], Any]:
    """The fixture trace (one JSON request a line) and its replay settings."""
    with open(settings_path) as f:
        settings = json.load(f)
    with open(trace_path) as f:
        trace = [json.loads(line) for line in f if line.strip()]
    return trace, settings


def write_recording(
    out: str, head: dict[str, Any], frames: list[Any], recorded: StepBatches
) -> None:
    """The header line, then one line per published batch.

    Each batch line holds the frame (``topic``, ``seq``, the msgpack payload in
    base64), the engine's own struct through msgspec's JSON encoder (with the rank
    the publisher stamped: the line a file sink must write) and ``cached``.
    """
    import msgspec

    with open(out, "w") as f:
        f.write(json.dumps({"header": head}) + "\n")
        rows = zip(frames, recorded.batches, recorded.states, strict=True)
        for (topic, seq, payload), batch, state in rows:
            line = {
                "topic": topic.decode(),
                "seq": int.from_bytes(seq, "big"),
                "msgpack": base64.b64encode(payload).decode(),
                "json": msgspec.json.encode(batch).decode(),
                "cached": state,
            }
            f.write(json.dumps(line) + "\n")
