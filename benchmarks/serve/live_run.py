"""One routing policy's pass over the live fleet, one request at a time, and its faults.

:func:`run_policy` empties the servers' caches, builds a fresh router (the policy and
the cluster index it reads, vLLM's hashes), subscribes it to every server's stream,
then for each request: route, stream it to the server chosen, and apply the sync rule
(:func:`wait_for_blocks`) before the next one. :class:`Fault` schedules a drop or delay
window on the relays, or a server restart, by request number.
"""

from __future__ import annotations

import argparse
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from live_servers import BLOCK_SIZE, HASH_ALGO, LiveFleet
from live_trace import LiveRequest
from vllm_server import ServerError

from prefixkv.adapters.events.transport import ZmqEventSubscriber
from prefixkv.adapters.router import (
    POLICIES,
    HashScheme,
    RouteKeys,
    Router,
    Worker,
    make_cluster_index,
    make_policy,
    parse_policy,
)
from prefixkv.adapters.router.routing import CostModel

__all__ = [
    "Fault",
    "LiveRun",
    "RequestRow",
    "computed_blocks",
    "drain",
    "run_policy",
    "wait_for_blocks",
    "wait_reset",
]


@dataclass(frozen=True)
class Fault:
    """A fault on one server's stream: ``kind:replica@start[+count][:delay_s]``.

    ``drop`` and ``delay`` act on the relay while requests ``start .. start+count-1``
    are routed; ``restart`` stops and starts the server before request ``start``.
    Replica ``*`` (-1): every server's stream for ``drop`` and ``delay``; for
    ``restart`` the server that served the request before (the one holding the
    conversation's blocks, where a dead run's blocks would be predicted).
    """

    kind: str
    replica: int
    start: int
    count: int = 1
    delay_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Fault:
        """Read one spec, e.g. ``drop:1@6+4``, ``delay:0@6+4:1.5``, ``restart:1@8``."""
        try:
            kind, rest = text.split(":", 1)
            where, _, delay = rest.partition(":")
            replica, _, span = where.partition("@")
            start, _, count = span.partition("+")
            r = -1 if replica == "*" else int(replica)
            fault = cls(kind, r, int(start), int(count or 1), float(delay or 0))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"want kind:replica@start[+count][:delay_s], got {text!r}"
            ) from None
        if kind not in ("drop", "delay", "restart") or fault.count < 1 or fault.start < 0:
            raise argparse.ArgumentTypeError(f"bad fault {text!r} (drop, delay or restart)")
        return fault

    @property
    def text(self) -> str:
        """The spec."""
        tail = f":{self.delay_s:g}" if self.kind == "delay" else ""
        span = f"+{self.count}" if self.kind != "restart" else ""
        who = "*" if self.replica < 0 else self.replica
        return f"{self.kind}:{who}@{self.start}{span}{tail}"


@dataclass
class RequestRow:
    """One request as routed and served."""

    index: int
    id: str
    replica: int
    prompt_tokens: int
    predicted_tokens: int | None
    cached_tokens: int
    ttft_s: float
    e2e_s: float
    routed_at_s: float
    synced: bool
    sync_s: float
    output: list[int]

    @property
    def exact(self) -> bool | None:
        """Whether the prediction was what the server served (None: no prediction)."""
        return (
            None if self.predicted_tokens is None else self.predicted_tokens == self.cached_tokens
        )


@dataclass
class LiveRun:
    """One policy's pass over the trace."""

    name: str
    policy: str
    index: str
    faults: list[str]
    rows: list[RequestRow]
    counters_delta: list[dict[str, float]]
    stream_stats: dict[str, int]
    index_stats: dict[str, int]
    wall_s: float
    relay_stats: list[dict[str, int]] = field(default_factory=list)

    def hit_ratio_metrics(self) -> float:
        """Hits over queries, from the servers' own ``/metrics`` deltas."""
        q = sum(c["vllm:prefix_cache_queries_total"] for c in self.counters_delta)
        h = sum(c["vllm:prefix_cache_hits_total"] for c in self.counters_delta)
        return h / q if q else 0.0

    def hit_ratio_usage(self) -> float:
        """Cached over prompt tokens, from the responses' ``usage``."""
        p = sum(r.prompt_tokens for r in self.rows)
        return sum(r.cached_tokens for r in self.rows) / p if p else 0.0

    def mispredicted(self) -> list[RequestRow]:
        """Rows whose prediction the server did not serve."""
        return [r for r in self.rows if r.exact is False]


def computed_blocks(router: Router, prompt: array[int], output: Sequence[int]) -> RouteKeys:
    """The keys of what the server computed: the prompt and the output but its last
    token (sampled, never fed back): every full block of it is cached there."""
    return RouteKeys(prompt + array("I", output[:-1]), router.scheme)


def drain(subs: Sequence[ZmqEventSubscriber]) -> None:
    """Apply whatever has arrived on every stream."""
    while sum(s.poll(0) for s in subs):
        pass


def wait_for_blocks(
    router: Router,
    subs: Sequence[ZmqEventSubscriber],
    worker: Worker,
    keys: RouteKeys,
    timeout: float,
) -> tuple[bool, float]:
    """The sync rule: poll until the index holds every block of ``keys`` on ``worker``.

    Returns:
        (whether it did within ``timeout`` seconds, the seconds waited).
    """
    index = router.cluster_index
    t0 = time.monotonic()
    if index is None or not index.event_fed or keys.num_blocks == 0:
        drain(subs)
        return True, 0.0
    while True:
        drain(subs)
        if index.match(keys, router.now).get(worker, 0) >= keys.num_blocks:
            return True, time.monotonic() - t0
        if time.monotonic() - t0 >= timeout:
            return False, time.monotonic() - t0
        for s in subs:
            s.poll(0.002)


def wait_reset(
    fleet: LiveFleet, router: Router, subs: Sequence[ZmqEventSubscriber], timeout: float
) -> None:
    """Poll until ``router``'s index holds no block of any server (the resets
    arrived), or raise ``ServerError`` after ``timeout`` seconds."""
    index = router.cluster_index
    deadline = time.monotonic() + timeout
    while index is not None and index.event_fed:
        drain(subs)
        held = [r for r in range(fleet.num_servers) if index.num_blocks(Worker(r))]
        if not held:
            return
        if time.monotonic() > deadline:
            raise ServerError(f"servers {held}: their reset never reached the router")
        for s in subs:
            s.poll(0.01)


def run_policy(
    fleet: LiveFleet,
    trace: Sequence[LiveRequest],
    policy: str,
    profile: CostModel,
    *,
    name: str | None = None,
    faults: Sequence[Fault] = (),
    sync_timeout: float = 10.0,
    seed: int = 0,
    log: Any = print,
) -> LiveRun:
    """Route ``trace`` over the fleet with ``policy``, one request at a time.

    The servers' caches are emptied first; the router is new, its subscribers replay
    each stream from its start (the reset's ``AllBlocksCleared`` included).
    """
    scheme = HashScheme.vllm(BLOCK_SIZE, HASH_ALGO)
    spec = parse_policy(policy, tuple(POLICIES))
    index = make_cluster_index(spec, scheme)
    router = Router(make_policy(spec), index, scheme, profile, seed=seed)
    fleet.reset()
    if faults:
        fleet.insert_relays()
    subs = [fleet.subscribe(router, r) for r in range(fleet.num_servers)]
    rows: list[RequestRow] = []
    try:
        time.sleep(0.5)  # the connections (a relay's PUB drops what it sends before)
        for s in subs:
            s.sync()
        wait_reset(fleet, router, subs, sync_timeout)
        before = fleet.counters()
        t0 = time.monotonic()
        for i, req in enumerate(trace):
            _apply_faults(fleet, faults, i, rows, log)
            drain(subs)
            now = time.monotonic() - t0
            decision = router.route(req, now)
            worker = decision.worker
            out = fleet.servers[worker.replica].stream(req.prompt, req.output_len)
            router.first_token(req.id)
            router.finished(req.id)
            keys = computed_blocks(router, req.prompt, out.token_ids)
            synced, waited = wait_for_blocks(router, subs, worker, keys, sync_timeout)
            predicted = decision.predicted_blocks
            rows.append(
                RequestRow(
                    i, req.id, worker.replica, out.prompt_tokens,
                    None if predicted is None else predicted * BLOCK_SIZE,
                    out.cached_tokens, out.ttft_s, out.e2e_s, now, synced, waited,
                    out.token_ids,
                )
            )  # fmt: skip
        for relay in fleet.relays if faults else ():
            relay.set_fault("pass")
        wall = time.monotonic() - t0
        delta = [{k: a[k] - b[k] for k in a} for a, b in zip(fleet.counters(), before, strict=True)]
        stats: dict[str, int] = {}
        for s in subs:
            for k, v in s.stats.items():
                stats[k] = stats.get(k, 0) + v
    finally:
        for s in subs:
            s.close()
    return LiveRun(
        name or policy,
        policy,
        "none" if index is None else index.kind,
        [f.text for f in faults],
        rows,
        delta,
        stats,
        {} if index is None else index.stats(),
        wall,
        [dict(r.stats) for r in fleet.relays] if faults else [],
    )


def _apply_faults(
    fleet: LiveFleet, faults: Sequence[Fault], i: int, rows: Sequence[RequestRow], log: Any
) -> None:
    for f in faults:
        if f.kind == "restart" and f.start == i:
            r = f.replica if f.replica >= 0 else (rows[-1].replica if rows else 0)
            log(f"  restarting server {r} before request {i} ...")
            fleet.restart(r)
            log(f"  server {r} back after {fleet.servers[r].start_seconds:.0f} s")
        elif f.kind != "restart" and i in (f.start, f.start + f.count):
            mode = f.kind if i == f.start else "pass"
            for relay in fleet.relays if f.replica < 0 else [fleet.relays[f.replica]]:
                relay.set_fault(mode, f.delay_s)
