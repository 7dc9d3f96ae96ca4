"""The live-fleet benchmark's parts that need no vLLM: its trace, fault specs, relay,
sync rule and word tokenizer (``benchmarks/serve``, ``tests/serve/harness``; the servers' test is
``tests/serve/test_live_fleet.py``)."""

from __future__ import annotations

import json
import socket
import time
from array import array
from pathlib import Path

import pytest
from fault_relay import FaultRelay
from live_run import Fault, computed_blocks, wait_for_blocks
from live_trace import TraceShape, make_trace
from word_tokenizer import as_text, write_word_tokenizer

from prefixkv.adapters.events import BlockStored, KVEventBatch, ZmqEventPublisher
from prefixkv.adapters.lab.sim import load_profile
from prefixkv.adapters.router import (
    POLICIES,
    ChainedHashIndex,
    HashScheme,
    Router,
    Worker,
    make_policy,
    parse_policy,
    subscribe,
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_trace_is_deterministic_chat_sessions_over_shared_system_prompts() -> None:
    shape = TraceShape(sessions=4, turns=3, repeats=3, seed=5)
    trace = make_trace(shape)
    assert [(r.id, r.prompt.tolist()) for r in trace] == [
        (r.id, r.prompt.tolist()) for r in make_trace(shape)
    ]
    assert len(trace) == shape.num_requests == len({r.id for r in trace})
    by_id = {r.id: r for r in trace}
    for r in trace:
        assert min(r.prompt) >= 3  # never the simulator's filler, BOS or EOS
        if r.turn and not r.id.endswith("r"):
            before = by_id[f"s{r.session}t{r.turn - 1}"]
            assert r.prompt[: len(before.prompt)] == before.prompt  # the conversation so far
            assert trace.index(before) < trace.index(r)
    # a repeat comes after what it repeats; the system prompt alone is whole blocks
    assert trace.index(by_id["s0t0"]) < trace.index(by_id["sys0"])
    assert len(by_id["sys0"].prompt) % 32 == 0
    assert by_id["s0t0"].prompt[:320] == by_id["sys0"].prompt


def test_fault_specs() -> None:
    assert Fault.parse("drop:1@6+4") == Fault("drop", 1, 6, 4)
    assert Fault.parse("delay:*@6+2:1.5") == Fault("delay", -1, 6, 2, 1.5)
    assert Fault.parse("restart:*@8").text == "restart:*@8"
    assert Fault.parse("delay:0@3+2:0.5").text == "delay:0@3+2:0.5"
    for bad in ("drop", "explode:1@2", "drop:x@1", "drop:1@-1", "drop:1@2+0"):
        with pytest.raises(Exception, match=r"fault|want"):
            Fault.parse(bad)


def test_the_sync_rule_waits_for_the_blocks_the_server_computed() -> None:
    scheme = HashScheme.vllm(32)
    router = Router(
        make_policy(parse_policy("llmd", tuple(POLICIES))),
        ChainedHashIndex(scheme),
        scheme,
        load_profile(),
    )
    prompt = array("I", range(3, 63))  # 60 tokens; 4 generated: 63 computed, 1 full block
    keys = computed_blocks(router, prompt, [7, 7, 7, 9])
    assert keys.num_tokens == 63 and keys.num_blocks == 1
    assert wait_for_blocks(router, [], Worker(0), keys, 0.05)[0] is False
    tokens = keys.tokens[:32].tolist()
    stored = BlockStored(scheme.block_hashes(keys.tokens), None, tokens, 32, None, "GPU", None)
    assert router.cluster_index is not None
    router.cluster_index.apply(0, KVEventBatch(0.0, [stored], 0), 0.0)
    assert wait_for_blocks(router, [], Worker(0), keys, 0.05)[0] is True
    assert wait_for_blocks(router, [], Worker(1), keys, 0.05)[0] is False  # another server


def test_the_relay_drops_and_delays_and_the_subscriber_replays_the_gap() -> None:
    engine, relay_out, replay = _port(), _port(), _port()
    scheme = HashScheme.vllm(32)
    router = Router(
        make_policy(parse_policy("llmd", tuple(POLICIES))),
        ChainedHashIndex(scheme),
        scheme,
        load_profile(),
    )
    relay = FaultRelay(f"tcp://127.0.0.1:{engine}", f"tcp://127.0.0.1:{relay_out}")
    sub = subscribe(
        router,
        0,
        f"tcp://127.0.0.1:{relay_out}",
        replay_endpoint=f"tcp://127.0.0.1:{replay}",
        probe_interval=None,  # only a gap (the next live batch) may reveal the loss
        replay_timeout=60.0,  # the answer is an event; this only bounds a hang, at any load
    )
    pub = ZmqEventPublisher(f"tcp://127.0.0.1:{engine}", f"tcp://127.0.0.1:{replay}")
    assert router.cluster_index is not None
    index = router.cluster_index

    def publish(n: int) -> None:
        tokens = array("I", [3 + n] * 32)
        block = BlockStored(
            scheme.block_hashes(tokens), None, tokens.tolist(), 32, None, "GPU", None
        )
        pub.publish(KVEventBatch(0.0, [block], 0))

    def until(check: object) -> None:
        # bounded by events: each poll returns as soon as a frame arrives, and a frame
        # is on its way whenever this waits (no wall-clock deadline to miss under load)
        for _ in range(600):
            if check():  # type: ignore[operator]
                return
            sub.poll(1.0)
        raise AssertionError("600 polls without the expected frame")

    try:
        # both hops connected before the first batch (no slow-joiner loss, at any load)
        assert pub.wait_for_subscribers(1, 120.0) == 1 and relay.wait_for_subscriber(120.0)
        sub.sync()
        publish(0)
        # the relay forwarded it (the router may hold it sooner, from the answer to its
        # sync: then the frame still in the relay must not meet the drop fault below)
        until(lambda: relay.stats["forwarded"] == 1 and len(index.held(Worker(0))) == 1)
        relay.set_fault("drop")
        publish(1)
        publish(2)
        until(lambda: relay.stats["dropped"] == 2)
        sub.poll(0.05)
        assert len(index.held(Worker(0))) == 1  # lost on the way
        relay.set_fault("delay", 0.5)
        publish(3)
        t0 = time.monotonic()
        until(lambda: len(index.held(Worker(0))) == 4)  # the gap, replayed from the engine
        assert time.monotonic() - t0 >= 0.4  # ... once the delayed batch arrived
        assert sub.stats["gaps"] == 1 and relay.stats["delayed"] == 1
    finally:
        relay.close()
        sub.close()
        pub.shutdown()


def test_the_word_tokenizer_file(tmp_path: Path) -> None:
    folder = write_word_tokenizer(tmp_path / "tok", vocab_size=40)
    spec = json.loads((folder / "tokenizer.json").read_text())
    assert spec["model"]["type"] == "WordLevel"
    assert spec["model"]["vocab"]["t39"] == 39 and len(spec["model"]["vocab"]) == 40
    assert spec["post_processor"] is None  # no BOS added: the text's ids are the prompt
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert not {"bos_token", "eos_token", "unk_token"} & set(config)  # "t1" would split "t18"
    assert as_text([4405, 3]) == "t4405 t3"
