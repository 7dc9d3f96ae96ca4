"""Route keys in the request's namespace: the router predicts a hit only where the engine
would serve one.

An engine (vLLM's hasher and ``BlockPool`` events, prefixkv's hash chain, SGLang's page
hashes and ``RadixCache`` events) caches a prompt in one namespace (LoRA, cache salt)
and publishes it; the router, fed those events through the wire codec, is asked about
another prompt in another namespace. The property: every index predicts no more
leading blocks than the engine's own hashes share (no prediction of another tenant's
blocks), and exactly as many when the namespaces are equal (sharing is kept).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.events import EventDecoder, SGLangEventRecorder, VllmEventRecorder, encode
from prefixkv.adapters.router import (
    POLICIES,
    ChainedHashIndex,
    HashScheme,
    RadixBlockIndex,
    RouteKeys,
    Router,
    Worker,
    make_policy,
    parse_policy,
)
from prefixkv.indexes.errors import InvalidTokenError
from prefixkv.indexes.hashing import make_block_hasher
from prefixkv.indexes.sglang_hashing import namespace_prior, page_hashes
from prefixkv.indexes.tokens import ExtraKey, make_extra_key
from prefixkv.indexes.vllm_hashing import VllmBlockHasher

BS = 4


class Engine(NamedTuple):
    """How one engine hashes a namespaced prompt and publishes its blocks."""

    scheme: HashScheme
    digests: Callable[[array[int], ExtraKey | None], list[bytes]]
    recorder: Callable[[], Any]
    namespaces: list[ExtraKey | None]


def _chain(hasher: Any) -> Callable[[array[int], ExtraKey | None], list[bytes]]:
    def digests(tokens: array[int], extra_key: ExtraKey | None) -> list[bytes]:
        out: list[bytes] = []
        hasher.extend(out, tokens, extra_key)
        return out

    return digests


def _sglang(tokens: array[int], extra_key: ExtraKey | None) -> list[bytes]:
    full = len(tokens) - len(tokens) % BS
    return page_hashes(tokens[:full], namespace_prior(extra_key), BS)


VLLM_NAMESPACES = [
    None,
    make_extra_key(cache_salt="a"),
    make_extra_key(cache_salt="b"),
    make_extra_key(lora="a"),
    make_extra_key(lora="x", lora_path="/p"),
    make_extra_key(lora="x", cache_salt="a"),
    make_extra_key(tenant="a"),
    make_extra_key(extra="a"),
    make_extra_key(tenant="a", cache_salt="a"),
]
ENGINES = {
    "vllm": Engine(
        HashScheme.vllm(BS),
        _chain(VllmBlockHasher(BS, "sha256_cbor")),
        VllmEventRecorder,
        [*VLLM_NAMESPACES, make_extra_key(cache_salt="")],  # vLLM: an empty salt is none
    ),
    "prefixkv": Engine(
        HashScheme.prefixkv(BS, 7),
        _chain(make_block_hasher(BS, "xxh3_128", 7)),
        VllmEventRecorder,
        VLLM_NAMESPACES,
    ),
    # SGLang hashes and publishes its salt, nothing else of a namespace
    "sglang": Engine(
        HashScheme.sglang(BS),
        _sglang,
        SGLangEventRecorder,
        [None, make_extra_key(cache_salt="a"), make_extra_key(cache_salt="b")],
    ),
}


def _published(engine: Engine, tokens: array[int], extra_key: ExtraKey | None) -> Any:
    """The engine's batch for one cached prompt, through the wire and back."""
    recorder = engine.recorder()
    digests = engine.digests(tokens, extra_key)
    recorder.on_stored(digests, None, tokens[: len(digests) * BS].tolist(), BS, extra_key)
    if isinstance(recorder, SGLangEventRecorder):
        payload = encode(recorder.take_sglang_batch(0.0))
    else:
        payload = encode(recorder.take_batch(0.0))
    return EventDecoder().decode(payload)


def _shared(a: list[bytes], b: list[bytes]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


blocks = st.lists(st.integers(1, 3), min_size=1, max_size=5)


def _tokens(block_ids: list[int]) -> array[int]:
    out = array("I")
    for b in block_ids:
        out.extend([b] * BS)
    return out


@pytest.mark.parametrize("name", sorted(ENGINES))
@settings(max_examples=150, deadline=None)
@given(data=st.data(), stored=blocks, asked=blocks)
def test_no_hit_across_namespaces(
    name: str, data: st.DataObject, stored: list[int], asked: list[int]
) -> None:
    engine = ENGINES[name]
    ns_stored = data.draw(st.sampled_from(engine.namespaces), "stored namespace")
    ns_asked = data.draw(st.sampled_from(engine.namespaces), "asked namespace")
    s_tokens, a_tokens = _tokens(stored), _tokens(asked)
    batch = _published(engine, s_tokens, ns_stored)
    engine_hit = _shared(engine.digests(s_tokens, ns_stored), engine.digests(a_tokens, ns_asked))
    for index in (ChainedHashIndex(engine.scheme), RadixBlockIndex(engine.scheme)):
        index.apply(0, batch, 0.0)
        assert not index.incompatible
        predicted = index.match(RouteKeys(a_tokens, engine.scheme, ns_asked), 0.0)
        got = predicted.get(Worker(0), 0)
        assert got <= engine_hit, (type(index).__name__, ns_stored, ns_asked)
        if ns_stored == ns_asked:
            assert got == engine_hit, (type(index).__name__, ns_stored)


class _Cost:
    step_s = 0.0

    def prefill_s(self, num_tokens: int, num_cached: int = 0) -> float:
        return 1e-4 * num_tokens


class _Req(NamedTuple):
    id: str
    prompt: array[int]
    output_len: int
    extra_key: Any = None


@pytest.mark.parametrize("index_kind", ["chained", "radix"])
def test_router_routes_in_the_request_namespace(index_kind: str) -> None:
    """A salted tenant's cached prompt attracts only requests with its salt."""
    engine = ENGINES["vllm"]
    index = (ChainedHashIndex if index_kind == "chained" else RadixBlockIndex)(engine.scheme)
    router = Router(
        make_policy(parse_policy("dynamo", tuple(POLICIES))), index, engine.scheme, _Cost()
    )
    for r in range(3):
        router.add_replica(r)
    tokens = _tokens([1, 2, 3, 1, 2])
    salt = make_extra_key(cache_salt="tenant-a")
    index.apply(2, _published(engine, tokens, salt), 0.0)
    own = router.route(_Req("a", tokens + array("I", [9]), 1, salt), 0.0)
    assert own.worker == Worker(2) and own.predicted_blocks == 5
    other = router.route(
        _Req("b", tokens + array("I", [9]), 1, make_extra_key(cache_salt="t-b")), 0.0
    )
    assert other.predicted_blocks == 0
    plain = router.route(_Req("c", tokens + array("I", [9]), 1), 0.0)
    assert plain.predicted_blocks == 0
    # a plain string is SGLang's extra_key: another namespace again
    assert (
        router.route(_Req("d", tokens + array("I", [9]), 1, "tenant-a"), 0.0).predicted_blocks == 0
    )


def test_router_refuses_a_malformed_namespace_by_name() -> None:
    engine = ENGINES["vllm"]
    router = Router(
        make_policy(parse_policy("dynamo", tuple(POLICIES))),
        ChainedHashIndex(engine.scheme),
        engine.scheme,
        _Cost(),
    )
    router.add_replica(0)
    for bad in (3.5, [("cache_salt", "a")], (("cache_salt", 1.5),), (("k",),)):
        with pytest.raises(InvalidTokenError):
            router.route(_Req("x", _tokens([1]), 1, bad), 0.0)
    assert router.num_decisions == 0
