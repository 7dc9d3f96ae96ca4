"""The router fed by a real ZeroMQ KV-event stream (vLLM's publisher protocol)."""

from __future__ import annotations

import socket
from array import array

from prefixkv.adapters.events import BlockStored, KVEventBatch, ZmqEventPublisher
from prefixkv.adapters.lab.sim import SimRequest, load_profile
from prefixkv.adapters.router import (
    ChainedHashIndex,
    HashScheme,
    Router,
    Worker,
    make_policy,
    parse_policy,
)
from prefixkv.adapters.router.block_tree import RadixBlockIndex
from prefixkv.adapters.router.event_feed import subscribe
from prefixkv.adapters.router.policies import POLICIES


def test_a_zmq_stream_steers_the_router() -> None:
    scheme = HashScheme.prefixkv(16, seed=0)
    router = Router(
        make_policy(parse_policy("dynamo", tuple(POLICIES))),
        RadixBlockIndex(scheme),
        scheme,
        load_profile(),
    )
    prompt = array("I", range(1, 161))
    hashes = scheme.block_hashes(prompt)
    pubs = [
        ZmqEventPublisher(f"inproc://kv{r}", replay_endpoint=f"inproc://kv{r}-replay")
        for r in range(3)
    ]
    subs = [
        subscribe(router, r, f"inproc://kv{r}", replay_endpoint=f"inproc://kv{r}-replay")
        for r in range(3)
    ]
    try:
        stored = BlockStored(hashes, None, prompt.tolist(), 16, None, "GPU", None, group_idx=0)
        pubs[2].publish(KVEventBatch(0.0, [stored], 0))
        for _ in range(200):
            subs[2].sync()
            if router.cluster_index is not None and router.cluster_index.held(Worker(2)):
                break
        decision = router.route(SimRequest("q", array("I", [*prompt, *[7] * 16]), 4, 0.0), 0.0)
        assert decision.worker == Worker(2) and decision.predicted_blocks == 10
    finally:
        for s in subs:
            s.close()
        for p in pubs:
            p.shutdown()


def test_a_publisher_that_connects_feeds_a_router_that_binds() -> None:
    """vLLM given ``tcp://127.0.0.1:PORT`` connects its PUB socket: the router binds."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scheme = HashScheme.vllm(32)
    router = Router(
        make_policy(parse_policy("llmd", tuple(POLICIES))),
        ChainedHashIndex(scheme),
        scheme,
        load_profile(),
    )
    sub = subscribe(router, 0, f"tcp://127.0.0.1:{port}", bind=True)
    pub = ZmqEventPublisher(f"tcp://127.0.0.1:{port}")  # no wildcard: connects
    prompt = array("I", range(3, 131))
    try:
        stored = BlockStored(
            scheme.block_hashes(prompt), None, prompt.tolist(), 32, None, "GPU", None
        )
        for _ in range(600):  # bounded by batches published, not by a deadline
            if router.cluster_index is None or router.cluster_index.held(Worker(0)):
                break
            pub.publish(KVEventBatch(0.0, [stored], 0))  # the first may precede the connection
            sub.poll(0.05)
        else:
            raise AssertionError("the bound subscriber got nothing from 600 batches")
        decision = router.route(SimRequest("q", array("I", [*prompt, 7]), 4, 0.0), 0.0)
        assert decision.predicted_blocks == 4
    finally:
        sub.close()
        pub.shutdown()
