"""prefixkv inside a serving vLLM, against vLLM's own prefix cache: one trace, three servers.

The servers and the trace are the session fixture's (``conftest.py``); each test checks
one property of what they served:

* the engine core saw every request in the plan's order, on every server (so the
  comparisons below compare the same schedule, not timing);
* the pool was under pressure: blocks were evicted, requests preempted, prompts
  chunked (otherwise the equalities below would prove little);
* prefixkv's hash chain cached exactly native's tokens, request for request;
* prefixkv's radix tree cached at least native's tokens up to the first eviction; past
  it the two evict differently (below);
* greedy outputs are identical across the three servers: a cache hit gives the KV a
  recomputation would (in float32, which the servers run: in bfloat16 a reused block's
  rounding differs from a recomputed one's, so only cached tokens, counters and events
  would be the engine's guarantee there);
* ``/metrics`` prefix-cache and preemption counters: hash chain == native;
* KV events (ZeroMQ, ``sha256_cbor``): hash chain == native, byte for byte;
* the offline ``prefixkv replay`` of the sequential phase, with the server's block size
  and pool, predicts every request's cached tokens as native and the hash chain served.

Why the three engines see the same thing although requests run concurrently: the
trace's sequential phase sends one request at a time, and each of its concurrent waves
is handed to the engine whole -- the server paused (``/pause?mode=keep``: requests
queue unscheduled, the cache stays), the wave's requests sent one by one, each after
the server's log shows the previous one reached the engine core (``Added request``,
logged after the send on the one socket that carries every input to the engine core),
then ``/resume`` on that same socket. So every engine starts each wave with the same
waiting queue in the same order and nothing else arrives until its last answer;
vLLM's CPU scheduler (no async scheduling) then takes the same steps on any server
whose cache answers the same, however loaded the machine -- the three servers even
replay at once. ``test_engine_saw_the_plan_order`` checks the order from each server's
log.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
from conftest import BLOCK_SIZE, NUM_GPU_BLOCKS, Run
from served_trace import Plan, Served

USABLE_BLOCKS = NUM_GPU_BLOCKS - 1  # vLLM's block 0 is the null block


def _diffs(a: list[Served], b: list[Served]) -> list[tuple[str, int, int]]:
    return [(x.id, x.cached_tokens, y.cached_tokens) for x, y in zip(a, b, strict=True)
            if x.cached_tokens != y.cached_tokens]  # fmt: skip


def _events(run: Run) -> list[dict[str, object]]:
    return [e for _, p in run.frames for e in msgspec.msgpack.decode(p)[1]]


def _without_timestamp(payload: bytes) -> bytes:
    """A KVEventBatch message (msgpack ``[ts, events, data_parallel_rank]``) after its
    float64 timestamp: the events' bytes as the engine encoded them."""
    assert payload[:2] == b"\x93\xcb", payload[:16]
    return payload[10:]


def first_eviction(served: list[Served], block_size: int, usable_blocks: int) -> int:
    """Index of the first sequential request (K=1) during which the pool had to evict.

    A request holds every block of its prompt and output but the last token (which has
    no KV), full or partial; the full ones stay cached after it. The pool evicts when
    the cached blocks and the running request's blocks exceed it.
    """
    cached: set[tuple[int, ...]] = set()
    for i, s in enumerate(served):
        tokens = [*s.prompt, *s.output[:-1]]
        full = {tuple(tokens[: (k + 1) * block_size]) for k in range(len(tokens) // block_size)}
        partial = 1 if len(tokens) % block_size else 0
        if len(cached | full) + partial > usable_blocks:
            return i
        cached |= full
    return len(served)


def test_engine_saw_the_plan_order(runs: dict[str, Run], plan: Plan) -> None:
    want = [s.id for s in plan.sequential] + [s.id for wave in plan.waves for s in wave]
    for label, run in runs.items():
        # cmpl-<id>-<index>-<random>: vLLM's prefix and suffixes around the client's id
        got = [x.removeprefix("cmpl-").rsplit("-", 2)[0] for x in run.added]
        assert got == want, f"{label}: the engine core received {got}"


def test_pool_under_pressure(runs: dict[str, Run]) -> None:
    native = runs["native"]
    for run in runs.values():
        assert run.num_gpu_blocks == NUM_GPU_BLOCKS, (run.label, run.num_gpu_blocks)
    removed = sum(e["type"] == "BlockRemoved" for e in _events(native))  # type: ignore[index]
    assert removed > 0, "no block was evicted"
    assert native.metrics["vllm:num_preemptions_total"] > 0, native.metrics
    assert max(s.prompt_tokens for s in native.served) > 128  # chunked: > one step's budget
    assert sum(s.cached_tokens > 0 for s in native.served) > len(native.served) // 2


def test_hash_chain_caches_what_native_caches(runs: dict[str, Run]) -> None:
    native, chain = runs["native"], runs["hash_chain"]
    assert [s.prompt for s in chain.served] == [s.prompt for s in native.served]
    assert _diffs(native.served, chain.served) == [], "(request, native, hash chain)"


def test_radix_caches_at_least_native_until_the_pool_evicts(runs: dict[str, Run]) -> None:
    """Until the first eviction both caches hold every block served so far, and the tree
    matches a prompt as far as the hash chain does (whole blocks inside vLLM), so it
    caches at least as much. From the first eviction on they keep different blocks --
    vLLM evicts the block freed longest ago (a finished request's tail first), the tree
    its least recently used leaf, a whole node at a time -- and either can cache more
    for a given request (in this trace the tree less for some session turns, more
    for others); after that the check is only that it served everything.

    Not checked: the offline replay of the tree. It allocates a whole prompt at once;
    served with chunked prefill the tree evicts a chunk's worth at a time, a whole node
    each time, and keeps different blocks (in this trace one request: 256 cached
    tokens served, 0 predicted; served without chunked prefill, 0 -- as predicted). The
    hash chain evicts block by block in the same order either way."""
    native, radix = runs["native"], runs["radix"]
    seq = [s for s in native.served if s.phase == "sequential"]
    cut = first_eviction(seq, BLOCK_SIZE, USABLE_BLOCKS)
    assert 0 < cut < len(seq), cut  # the trace evicts inside the sequential phase
    less = [(n.id, n.cached_tokens, r.cached_tokens)
            for n, r in zip(native.served[:cut], radix.served[:cut], strict=True)
            if r.cached_tokens < n.cached_tokens]  # fmt: skip
    assert less == [], "(request, native, radix) before the first eviction"
    assert [s.id for s in radix.served] == [s.id for s in native.served]


def test_greedy_outputs_identical_on_all_three(runs: dict[str, Run]) -> None:
    native = runs["native"]
    for label in ("hash_chain", "radix"):
        run = runs[label]
        differ = [n.id for n, r in zip(native.served, run.served, strict=True)
                  if (n.prompt, n.output) != (r.prompt, r.output)]  # fmt: skip
        assert differ == [], f"{label}: prompt or greedy output differs from native's"


def test_metrics_equal_native(runs: dict[str, Run]) -> None:
    native, chain = runs["native"], runs["hash_chain"]
    assert chain.metrics == native.metrics
    assert native.metrics["vllm:prefix_cache_hits_total"] > 0


def test_kv_events_byte_equal_native(runs: dict[str, Run]) -> None:
    native, chain = runs["native"], runs["hash_chain"]
    assert len(native.frames) > 0
    assert [seq for seq, _ in chain.frames] == [seq for seq, _ in native.frames]
    for (seq, a), (_, b) in zip(native.frames, chain.frames, strict=True):
        assert _without_timestamp(b) == _without_timestamp(a), f"batch {seq} differs"


def replay_offline(served: list[Served], out_dir: Path, *, num_gpu_blocks: int) -> list[int]:
    """``prefixkv replay`` of served requests (prompts and the outputs the server gave)
    with vLLM's call order, one request at a time, the server's block size and pool;
    the predicted cached tokens, in order."""
    trace = out_dir / "sequential.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"id": s.id, "tokens": s.prompt, "output": s.output}) + "\n" for s in served
        )
    )
    out = out_dir / "predicted.jsonl"
    cmd = [
        str(Path(sys.executable).parent / "prefixkv"), "replay", str(trace),
        "--index", "hash_chain", "--driver", "vllm", "--concurrency", "1",
        "--block-size", str(BLOCK_SIZE),
        "--capacity-blocks", str(num_gpu_blocks - 1),  # the null block is not usable
        "--prefix-caching-hash-algo", "sha256_cbor", "--quiet", "--out", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=300)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    return [r["hit_tokens"] for r in rows if "id" in r]


def test_offline_replay_predicts_the_sequential_phase(runs: dict[str, Run], tmp_path: Path) -> None:
    native = runs["native"]
    seq = [s for s in native.served if s.phase == "sequential"]
    predicted = replay_offline(seq, tmp_path, num_gpu_blocks=native.num_gpu_blocks)
    for label in ("native", "hash_chain"):
        served = [s.cached_tokens for s in runs[label].served if s.phase == "sequential"]
        assert predicted == served, f"{label}: served {served}, predicted {predicted}"
