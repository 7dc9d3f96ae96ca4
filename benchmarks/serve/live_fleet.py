#!/usr/bin/env python3
"""prefixkv's router in front of real ``vllm serve`` processes, fed by their KV events.

N native vLLM servers (vLLM's own prefix cache, ``sha256_cbor`` block hashes, block
size 32) run on this machine, each publishing KV events over ZeroMQ. For each routing
policy a fresh :class:`~prefixkv.adapters.router.Router` subscribes to every server's
stream (:func:`~prefixkv.adapters.router.subscribe`), routes a deterministic chat
trace one request at a time, and a streaming OpenAI client sends each request to the
server chosen. Per request it records the index's predicted hit on that server and
the ``cached_tokens`` the server reports, with the client's time to first token.

The sync rule (what "no event loss" means for a check made request by request):
after request ``i`` returns, the router polls the streams until its index holds, on
the server that served it, every full block of the tokens that server computed (the
prompt and all generated tokens but the last, whose K/V is never computed), hashed as
vLLM hashes them; only then is request ``i + 1`` routed. With the streams intact the
prediction then equals what the server serves, request for request, each prediction
capped as vLLM caps a hit (a prompt cached whole is served one block short).

Faults go between the servers and the router (``--faults``, :mod:`fault_relay`): a
window of dropped or delayed batches on one server's stream, or a restart of one
server (same ports, empty cache, its sequence numbers from 0). Their runs bound the
sync wait (``--fault-sync-timeout``), count the requests mispredicted and say when
the prediction is exact again: after the subscriber's resync (a gap is replayed from
the server's replay socket when the next batch arrives or the quiet-stream probe
asks; a restart makes the index forget the server).

    .venv/bin/python benchmarks/serve/live_fleet.py \\
        --vllm VENV/bin/vllm --model MODEL_DIR --servers 2 --out live-fleet

(``.venv``, the environment ``make`` creates, has the serving harness on its path.)

writes ``results.json``, ``report.md`` (the tables), ``requests-<run>.csv``, the trace
as sent (``trace.jsonl``, ``prefixkv cluster --trace`` reads it) and the cost profile
fitted on these servers (``profile.json``). Every server started is stopped, every wait
is bounded. Exit 1 when a fault-free run of an event-fed index mispredicts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from live_report import fault_summary, print_run, report, run_row, write_rows
from live_run import Fault, LiveRun, run_policy
from live_servers import LiveFleet
from live_trace import TraceShape, as_trace_requests, make_trace

from prefixkv.adapters.lab.traces.prefixkv import write_trace

DEFAULT_POLICIES = "round_robin@chained,llmd,dynamo,mooncake,sglang,round_robin,prefix_hash"


def build_parser() -> argparse.ArgumentParser:
    """The command's flags."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm", required=True, help="the vllm executable (a vLLM CPU build)")
    p.add_argument("--model", required=True, help="a model directory (config.json; dummy weights)")
    p.add_argument("--servers", type=int, default=2, help="vllm serve processes (default 2)")
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help=f"routing policies to run live (default {DEFAULT_POLICIES})")  # fmt: skip
    p.add_argument("--sessions", type=int, default=TraceShape.sessions)
    p.add_argument("--turns", type=int, default=TraceShape.turns)
    p.add_argument("--seed", type=int, default=0, help="trace and router seed")
    p.add_argument(
        "--sync-timeout",
        type=float,
        default=10.0,
        help="seconds the sync rule waits for one request's events (default 10)",
    )
    p.add_argument("--faults", type=Fault.parse, nargs="*", default=[],
                   metavar="KIND:R@I[+N][:S]",
                   help="fault runs (llmd, chained index), one run each: drop:1@6+4, "
                   "delay:0@6+4:1.5, restart:1@8")  # fmt: skip
    p.add_argument("--fault-sync-timeout", type=float, default=0.25,
                   help="the sync wait in fault runs (default 0.25 s, below the "
                   "subscriber's 1 s quiet probe)")  # fmt: skip
    p.add_argument(
        "--peer-router",
        metavar="PYTHON",
        help="a Python with sglang-router: run its cache_aware policy too",
    )
    p.add_argument("--profile", help="cost profile for the router and the simulator "
                   "(default: fitted on these servers from the first run)")  # fmt: skip
    p.add_argument("--no-sim", action="store_true", help="skip the simulator comparison")
    p.add_argument("--start-timeout", type=float, default=420.0, help="seconds per server start")
    p.add_argument("--out", default="live-fleet", help="output folder")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the live fleet; 0 when every fault-free event-fed prediction was exact."""
    args = build_parser().parse_args(argv)
    from sim_check import GAP_S, fit_profile, simulate  # the lab, for the comparison

    from prefixkv.adapters.lab.sim.profile import load_profile, save_profile

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = TraceShape(sessions=args.sessions, turns=args.turns, seed=args.seed)
    trace = make_trace(shape)
    policies = [p for p in args.policies.split(",") if p]
    fleet = LiveFleet(args.vllm, args.model, args.servers, out / "logs")
    if args.peer_router:  # it reads text prompts: the servers tokenize them back
        from word_tokenizer import write_word_tokenizer

        fleet.tokenizer = str(write_word_tokenizer(out / "tokenizer"))
    results: dict[str, Any] = {
        "command": "python benchmarks/serve/live_fleet.py "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()}",
        "trace": asdict(shape) | {"requests": len(trace)},
        "runs": [],
        "faults": [],
    }
    print(f"starting {args.servers} vllm serve ...", flush=True)
    profile = load_profile(args.profile) if args.profile else load_profile()
    runs: list[LiveRun] = []
    with _stopping(fleet):
        results["start_s"] = fleet.start(args.start_timeout)
        print(f"  up in {results['start_s']:.0f} s; {len(trace)} requests per run", flush=True)
        for k, policy in enumerate(policies):
            run = run_policy(
                fleet, trace, policy, profile, sync_timeout=args.sync_timeout, seed=args.seed
            )
            runs.append(run)
            print_run(run)
            if k == 0 and not args.profile:
                profile = fit_profile(run.rows, trace, name="live-fleet", model=args.model)
                save_profile(profile, out / "profile.json")
        for fault in args.faults:
            run = run_policy(
                fleet, trace, "llmd", profile, name=f"llmd {fault.text}", faults=[fault],
                sync_timeout=args.fault_sync_timeout, seed=args.seed,
            )  # fmt: skip
            runs.append(run)
            results["faults"].append(fault_summary(run, [fault]))
            print_run(run)
        if args.peer_router:
            from peer_router import run_peer

            results["peer"] = run_peer(args.peer_router, fleet, trace, out)
            print(
                f"  peer router: {results['peer'].get('summary') or results['peer'].get('error')}"
            )
    results["load_average_after"] = os.getloadavg()
    for run in runs:
        results["runs"].append(run_row(run) | {"faults": run.faults})
        slug = re.sub(r"[^A-Za-z0-9_.+-]+", "-", run.name)  # no *, @, : or space
        write_rows(out / f"requests-{slug}.csv", run.rows)
    if runs:
        first = runs[0]
        sent = [i * GAP_S for i in range(len(first.rows))]  # one at a time, as simulated
        write_trace(
            out / "trace.jsonl", as_trace_requests(trace, sent, [r.output for r in first.rows])
        )
        policies_run = ",".join(r.policy for r in runs if not r.faults)
        results["cluster_command"] = (
            f"prefixkv cluster --trace {out / 'trace.jsonl'} --replicas {args.servers} "
            "--block-size 32 --capacity-tokens 1048576 --max-num-seqs 128 "
            f"--max-num-batched-tokens 2048 --profile {args.profile or out / 'profile.json'} "
            f"--seed {args.seed} --policies {policies_run} --out {out / 'cluster'}"
        )
    if not args.no_sim:
        results["sim"] = [
            simulate(run, trace, profile, num_servers=args.servers, seed=args.seed)
            for run in runs
            if not run.faults
        ]
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "report.md").write_text(report(results))
    print(report(results))
    clean = [r for r in runs if not r.faults and r.index in ("chained", "radix")]
    return 1 if any(r.mispredicted() for r in clean) else 0


@contextlib.contextmanager
def _stopping(fleet: LiveFleet) -> Iterator[None]:
    try:
        yield
    finally:
        fleet.stop()


if __name__ == "__main__":
    sys.exit(main())
