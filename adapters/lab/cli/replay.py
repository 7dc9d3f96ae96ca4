"""``prefixkv replay``: one trace through one backend; per-request hits in the reference
oracles' format; ``--kv-events`` also writes (or publishes over ZeroMQ) the KV events."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import stat
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import msgspec

from prefixkv.adapters.outputs import atomic_writer, check_output, refuse_overwrite
from prefixkv.indexes.buildinfo import prefixkv_version

from ...events.files import EventFileWriter
from ...events.wire import KVEvent, KVEventBatch
from ..backends import BackendSpec, CompareError, check_pool, parse_backends, roomy_capacity
from ..progress import progress
from ..replay import DRIVERS, HitRow, ReplayError, ReplayInterrupted, ReplayResult, replay
from ..workloads import Workload
from . import flags
from .args import CLIUsageError, number_arg, positive_int
from .common import backend_options, capacities, load_workloads_for
from .signals import Interrupts

if TYPE_CHECKING:
    from ...events.transport import ZmqEventPublisher


def add_arguments(rep: argparse.ArgumentParser) -> None:
    """Give the ``replay`` subcommand's parser its description and flags."""
    rep.description = (
        "Replay TRACE through one backend and write one {id, prompt_len, "
        "hit_tokens} line per request and a final {summary} line, as the vLLM and SGLang "
        "reference oracles do. Default capacity: roomy (no eviction). vLLM's oracle "
        "--num-blocks N matches --capacity-blocks N-1 (its block 0 is the null block)."
    )
    flags.add_trace(rep, positional=True)
    flags.add_index(rep)
    rep.add_argument(
        "--driver",
        choices=DRIVERS,
        help="call order: vllm, sglang or manager (default: the backend's own)",
    )
    flags.add_common(rep)
    flags.add_seed(rep, seeds="hash-id traces' tokens")
    flags.add_quiet(rep, also=", and no closing line or notes unless interrupted")
    flags.add_out(rep, file="one JSON line per request, then the summary line")
    _add_kv_event_flags(rep)


def _add_kv_event_flags(rep: argparse.ArgumentParser) -> None:
    """Where the index's KV events go (a file or a ZeroMQ endpoint) and how it is served."""
    ev = rep.add_argument_group("KV events (vLLM 0.33's wire format)")
    ev.add_argument(
        "--kv-events",
        metavar="FILE|ENDPOINT",
        help="write the index's KV events to FILE, one batch per scheduler step as one "
        "msgspec-JSON line (vLLM's KVEventBatch), or publish them on a ZeroMQ PUB socket at a "
        "tcp:// or ipc:// ENDPOINT as vLLM's ZmqEventPublisher does (tcp://*:5557 binds, "
        "tcp://127.0.0.1:* binds a free port and prints it; a host name connects). Any other "
        "SCHEME:// is refused, never taken for a file name",
    )
    ev.add_argument(
        "--kv-events-replay",
        metavar="ENDPOINT",
        help="with an ENDPOINT: also bind a ROUTER socket here that answers replay "
        "requests (vLLM's replay_endpoint), so late subscribers catch up",
    )
    ev.add_argument(
        "--kv-events-topic",
        default="",
        metavar="TOPIC",
        help="with an ENDPOINT: the topic frame of every message (default empty)",
    )
    ev.add_argument(
        "--kv-events-wait-subscribers",
        type=positive_int,
        metavar="N",
        help="with an ENDPOINT: wait until N subscribers have subscribed before the first batch, "
        "so none is lost to ZeroMQ's slow joiners (refused after --kv-events-wait-timeout)",
    )
    ev.add_argument(
        "--kv-events-wait-timeout",
        type=_seconds,
        metavar="S",
        help="with --kv-events-wait-subscribers: give up after S seconds, exit "
        "status 2 (default 30)",
    )
    ev.add_argument(
        "--kv-events-grace",
        type=_seconds,
        metavar="S",
        help="with --kv-events-replay: keep answering event replays for S seconds after the last "
        "batch, so a late subscriber catches up (default 0)",
    )


def _seconds(text: str) -> float:
    """Seconds in (0, one day]: the longest wait or grace the publisher takes."""
    bound = f"seconds in (0, {MAX_WAIT_S:g}]"
    return number_arg(text, float, "seconds", bound, lambda v: 0 < v <= MAX_WAIT_S)


MAX_WAIT_S = 86_400.0
"""The longest ``--kv-events-wait-timeout`` or ``--kv-events-grace`` (the publisher's)."""

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.DOTALL)


def parse_endpoint(value: str, flag: str = "--kv-events") -> str | None:
    """The ZeroMQ endpoint ``value`` names (``tcp://`` or ``ipc://``, the scheme lower-cased),
    or ``None`` for a file name; :class:`CLIUsageError` for another scheme, an empty address,
    a tcp port not in 1-65535 or ``*``, or an ipc path that exists and is not a socket."""
    m = _URL.fullmatch(value)
    if m is None:
        return None
    scheme, address = m.group(1).lower(), m.group(2)
    host, colon, port = address.rpartition(":")
    if scheme == "tcp":  # the publisher's port rule, less port 0 (a connect reaching nothing)
        from ...events.sockets import MAX_TCP_PORT, is_tcp_port  # ZeroMQ only when publishing
    problem = None
    if scheme == "inproc":
        problem = (
            "inproc:// reaches only this process, so no subscriber can connect; use "
            "tcp:// (e.g. tcp://127.0.0.1:*) or ipc://"
        )
    elif scheme not in ("tcp", "ipc"):
        problem = (f"unknown scheme {m.group(1)!r}; give a file name or a tcp:// or ipc:// "
                   "endpoint")  # fmt: skip
    elif not address:
        problem = "the endpoint has no address"
    elif scheme == "ipc":  # ZeroMQ unlinks what is there: only a name or an old socket
        try:
            if not stat.S_ISSOCK(os.lstat(address).st_mode):
                raise CLIUsageError(
                    f"{flag} ipc://{address}: {address} exists and is not a socket; binding "
                    "there would delete it (give a new name)"
                )
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CLIUsageError(f"{flag} ipc://{address}: {exc.strerror or exc}") from None
    elif not colon or not host:
        problem = (
            "a tcp:// endpoint is HOST:PORT (e.g. tcp://127.0.0.1:5557, or "
            "tcp://127.0.0.1:* for a free port)"
        )
    elif not is_tcp_port(port, lowest=1):
        problem = f"port {port[:20]!r} is not a port; give 1-{MAX_TCP_PORT}, or * for a free one"
    if problem:
        raise CLIUsageError(f"{flag} {value}: {problem}")
    return f"{scheme}://{address}"


class _EventPublisher:
    """Where each step's events go (a file writer or a ZeroMQ publisher), and how many."""

    def __init__(self, target: EventFileWriter | ZmqEventPublisher, where: str) -> None:
        self.target, self.where, self.num_batches = target, where, 0  # where: as bound

    def publish(self, events: list[KVEvent]) -> None:
        self.target.publish(KVEventBatch(time.time(), events, None))
        self.num_batches += 1

    def summary(self) -> dict[str, Any]:
        """The summary's ``kv_events`` (read once the publisher has shut down)."""
        doc: dict[str, Any] = {"target": self.where, "batches": self.num_batches}
        if not isinstance(pub := self.target, EventFileWriter):
            doc.update(
                delivered=pub.num_delivered,
                max_subscribers=pub.max_subscribers,
                replays=pub.num_replays,
            )
        return doc

    def describe(self) -> str:
        """One line: how many batches went where, and who received them."""
        line = f"KV events: {self.num_batches:,} batches -> {self.where}"
        if isinstance(self.target, EventFileWriter):
            return line
        got, peak = self.target.num_delivered, self.target.max_subscribers
        replays = self.target.num_replays
        late = f", {replays:,} event replays answered" if replays else ""
        if got == 0:
            return f"{line}; no subscriber was connected as they were sent{late}"
        return f"{line}; {got:,} received by up to {peak} subscriber{'s' * (peak > 1)}{late}"


@contextlib.contextmanager
def _kv_event_stream(
    args: argparse.Namespace, endpoint: str | None, replay_at: str | None, interrupts: Interrupts
) -> Iterator[_EventPublisher | None]:
    """Where ``--kv-events`` sends each step's batch: a file, a ZeroMQ socket, or nowhere."""
    target: str | None = args.kv_events
    if target is None:
        yield None
        return
    if endpoint is None:
        with atomic_writer(target) as f:
            writer = EventFileWriter(f)
            yield _EventPublisher(writer, target)
            writer.shutdown()
        return
    from ...events.sockets import TransportError
    from ...events.transport import ZmqEventPublisher  # ZeroMQ only when publishing

    grace = args.kv_events_grace or 0.0
    pub = ZmqEventPublisher(
        endpoint=endpoint, replay_endpoint=replay_at, topic=args.kv_events_topic, replay_grace=grace
    )
    where = f" (event replay on {pub.replay_endpoint})" if pub.replay_endpoint else ""
    print(f"KV events: publishing on {pub.endpoint}{where}", flush=True)
    try:
        n = args.kv_events_wait_subscribers
        if n is not None:
            timeout = args.kv_events_wait_timeout or 30.0
            print(f"KV events: waiting for {n} subscriber{'s' * (n > 1)} (at most {timeout:g} s)",
                  flush=True)  # fmt: skip
            got = pub.wait_for_subscribers(n, timeout)
            if got < n:
                raise TransportError(
                    f"--kv-events-wait-subscribers {n}: {got} subscribed to {pub.endpoint} "
                    f"within {timeout:g} s; nothing was replayed (raise --kv-events-wait-timeout)"
                )
        yield _EventPublisher(pub, pub.endpoint)
    finally:
        with interrupts.calling(pub.end_grace):
            # every batch is sent before the grace is announced: a later subscriber
            # catches up by replay alone
            if grace and pub.finish_sending():
                print(
                    f"prefixkv: KV events: answering event replays on {pub.replay_endpoint} "
                    f"for {grace:g} s after the last batch (Ctrl-C ends it)",
                    file=sys.stderr,
                    flush=True,
                )
            pub.shutdown()


def run(args: argparse.Namespace, argv: Sequence[str], interrupts: Interrupts | None = None) -> int:
    """Run ``prefixkv replay``; returns the exit status (130 or 143: interrupted, partial)."""
    interrupts = interrupts or Interrupts()
    specs = parse_backends(
        args.index,
        block_size=args.block_size,
        page_size=args.page_size,
        driver=args.driver,
        options=backend_options(args),
    )
    if len(specs) != 1:
        raise CompareError(f"replay takes one backend, got {args.index!r}")
    spec, caps = specs[0], capacities(args)
    if caps is not None and len(caps) > 1:
        raise CLIUsageError("replay takes one capacity; give several to compare for a sweep")
    out, endpoint, replay_at = _outputs(args)
    t_load = time.perf_counter()
    (workload,) = load_workloads_for(args, None)
    load_seconds = time.perf_counter() - t_load
    capacity = roomy_capacity(workload.stats, [spec]) if caps is None else caps[0]
    check_pool(capacity, [spec], args.max_pool_blocks)
    num_blocks = spec.num_blocks(capacity)
    with atomic_writer(out) as f:
        with _kv_event_stream(args, endpoint, replay_at, interrupts) as events:
            result, interrupted = _replay(f, args, workload, spec, capacity, events, interrupts)
            interrupts.held = True  # the finished rows are in f: nothing may discard them now
        summary = _replay_summary(args, argv, workload, spec, num_blocks, result)
        summary["scan_seconds"] = load_seconds
        if events is not None:  # shut down: every batch is counted
            summary["kv_events"] = events.summary()
        f.write(msgspec.json.encode({"summary": summary}) + b"\n")
    if not args.quiet or interrupted:
        state = " (interrupted: partial)" if interrupted else ""
        print(
            f"{summary['trace']} {spec.describe()} K={args.concurrency} "
            f"capacity={num_blocks * spec.block_size:,} tokens: hit {summary['total_hit_tokens']:,}"
            f"/{summary['total_prompt_tokens']:,} = {summary['hit_ratio']:.4f}, evicted "
            f"{summary['evicted_blocks']:,} blocks, {summary['wall_seconds']:.1f} s -> {out}{state}"
        )
        if events is not None:
            print(events.describe())
        for note in workload.notes:
            print(f"note: {note}")
    return interrupts.status() if interrupted or interrupts.received else 0


def _outputs(args: argparse.Namespace) -> tuple[Path, str | None, str | None]:
    """The ``--out`` file and the ``--kv-events`` and ``--kv-events-replay`` endpoints
    (``None``: a file or none), checked before the trace is read."""
    out = check_output(args.out)
    outputs = [out]
    endpoint = None if args.kv_events is None else parse_endpoint(args.kv_events)
    replay_at = None
    if args.kv_events_replay is not None:
        if args.kv_events is None:
            raise CLIUsageError("--kv-events-replay needs --kv-events ENDPOINT")
        if endpoint is None:
            raise CLIUsageError("--kv-events-replay needs --kv-events to be a tcp:// or ipc:// "
                                "endpoint")  # fmt: skip
        replay_at = parse_endpoint(args.kv_events_replay, "--kv-events-replay")
        if replay_at is None:
            raise CLIUsageError(
                f"--kv-events-replay {args.kv_events_replay}: give a tcp:// or ipc:// endpoint"
            )
        # one address: an ipc path compared as a file, a tcp address as written (never *)
        if endpoint.startswith("ipc://") and replay_at.startswith("ipc://"):
            same = os.path.abspath(endpoint[6:]) == os.path.abspath(replay_at[6:])
        else:
            same = endpoint == replay_at and not endpoint.endswith(":*")
        if same:
            raise CLIUsageError(
                f"--kv-events and --kv-events-replay both name {endpoint}; give the replay "
                "socket its own address"
            )
    for flag in ("kv_events_topic", "kv_events_wait_subscribers"):
        if getattr(args, flag) and endpoint is None:
            raise CLIUsageError(f"--{flag.replace('_', '-')} needs --kv-events to be a tcp:// "
                                "or ipc:// endpoint")  # fmt: skip
    if args.kv_events_wait_timeout is not None and args.kv_events_wait_subscribers is None:
        raise CLIUsageError("--kv-events-wait-timeout needs --kv-events-wait-subscribers N")
    if args.kv_events_grace is not None and args.kv_events_replay is None:
        raise CLIUsageError("--kv-events-grace needs --kv-events-replay ENDPOINT (the grace "
                            "is how long event replays are answered)")  # fmt: skip
    if args.kv_events is not None and endpoint is None:
        events = check_output(args.kv_events)
        if os.path.realpath(events) == os.path.realpath(out):
            raise CLIUsageError("--kv-events and --out name the same file; give two")
        outputs.append(events)
    for ipc_at in (endpoint, args.kv_events_replay):
        if ipc_at is not None and ipc_at.lower().startswith("ipc://"):
            outputs.append(Path(ipc_at[len("ipc://") :]))
    refuse_overwrite(outputs, [args.trace])
    return out, endpoint, replay_at


def _replay(
    f: IO[bytes],
    args: argparse.Namespace,
    workload: Workload,
    spec: BackendSpec,
    capacity: int,
    events: _EventPublisher | None,
    interrupts: Interrupts,
) -> tuple[ReplayResult, bool]:
    """Replay, writing a line per request to ``f``; returns the result and whether a signal
    cut it short (never between a request counted and its row written)."""
    encoder = msgspec.json.Encoder()
    num_blocks = spec.num_blocks(capacity)

    def write_row(row: HitRow) -> None:
        # One write per row: a signal between two writes would tear the line.
        record = {"id": row.id, "prompt_len": row.prompt_len, "hit_tokens": row.hit_tokens}
        f.write(encoder.encode(record) + b"\n")

    bar = progress(
        workload.stats.prompt_tokens, f"replay {spec.label}", quiet=args.quiet, unit="tok"
    )
    try:
        result = replay(
            workload.requests,
            spec.make(),
            num_blocks,
            driver=spec.driver,
            concurrency=args.concurrency,
            keep_per_request=False,
            on_admit=write_row,
            progress=bar.update,
            on_events=events.publish if events else None,
            guard=interrupts.deferral,
        )
    except ReplayInterrupted as exc:
        return exc.result, True
    except ReplayError as exc:
        raise ReplayError(
            f"capacity {capacity:,} tokens ({num_blocks:,} × {spec.block_size}-token blocks) "
            f"is too small at concurrency {args.concurrency}: {exc}"
        ) from None
    finally:
        bar.close()
    return result, False


def _replay_summary(
    args: argparse.Namespace,
    argv: Sequence[str],
    workload: Workload,
    spec: BackendSpec,
    num_blocks: int,
    result: ReplayResult,
) -> dict[str, Any]:
    """The final ``{summary}`` line: the totals and the run's configuration."""
    summary = result.summary()
    summary["trace"] = os.path.basename(os.path.normpath(args.trace))
    summary["trace_source"] = workload.source
    summary["notes"] = list(workload.notes)
    summary["config"] = {
        "command": shlex.join(["prefixkv", *argv]),
        "index": spec.index,
        "driver": spec.driver,
        "block_size": spec.block_size,
        "options": dict(spec.options),
        "num_blocks": num_blocks,
        "capacity_tokens": num_blocks * spec.block_size,
        "concurrency": args.concurrency,
        "max_requests": args.max_requests,
        "tokens_per_id": args.tokens_per_id,
        "seed": args.seed,
        "prefixkv": prefixkv_version(),
        "python": sys.version.split()[0],
    }
    return summary
