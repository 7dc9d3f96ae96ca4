"""SGLang 0.5.23's scheduler-side cache steps, over the engine-free ``PrefixCache``.

In SGLang these live in the scheduler, not in the tree cache (``common.match_kv_cache``,
the prefill adder's lock, ``allocation.alloc_for_extend`` / ``alloc_token_slots`` /
``alloc_paged_token_slots_extend`` and the decode allocation, ``req_to_token_pool``);
they live here, beside the cache, as SGLang keeps ``RadixCache.create_simulated`` beside
``RadixCache``: what the lab, the tests and the benchmarks drive a simulated cache with.
Driven through them, the cache gives SGLang's hits request for request (SPEC SG-1..SG-6):

    req = SimpleReq("r1", prompt)
    hit = alloc_for_extend(cache, req)        # admission: None when it does not fit
    req.output_ids.append(first)              # the prefill samples a token
    cache.cache_unfinished_req(req)           # checkpoint after the prefill
    alloc_for_decode(cache, req)              # a slot for the token fed next step
    req.output_ids.append(token)
    cache.cache_finished_req(req)             # release

A chunked prefill allocates chunk by chunk, as SGLang does: ``alloc_for_extend(cache,
req, extend_len)`` the first, ``alloc_for_chunk(cache, req, extend_len)`` each next
(``cache.checkpoint(req, up_to=end)`` after each, as ``cache_unfinished_req``).
A step that does not fit returns ``None`` / ``False`` and changes nothing, where
SGLang would retract a request (``retract``). Whether pages can be had is the cache's
own answer: free pages plus what is evictable once the hit is locked (SGLang's
``available_size() + evictable_size()``). They drive a simulated cache
(``PrefixCache.create_simulated``: a ``BlockAllocator`` and ``PageRows``); inside SGLang,
SGLang's scheduler allocates. Compiled: the decode step is the replay's inner loop.
"""

from __future__ import annotations

from typing import Any, cast

from prefixkv.indexes.errors import InvalidTokenError, PrefixKVError, RequestStateError
from prefixkv.indexes.validation import ceil_div, check_count
from prefixkv.storage.allocator import BlockAllocator
from prefixkv.storage.block_table import slot_mapping

from ..requests import ReqLike
from .page_rows import PageRows
from .prefix_cache import PrefixCache, held_row

__all__ = ["alloc_for_chunk", "alloc_for_decode", "alloc_for_extend", "req_to_token", "retract"]


def alloc_for_extend(cache: PrefixCache, req: ReqLike, extend_len: int | None = None) -> int | None:
    """Admit ``req``: match, lock, allocate the extend, write its row (SG-1).

    The match is capped at ``len - 1`` (the last token is computed for its logits)
    and page-aligned. At page size > 1 it evicts for one page more than the extend
    needs, as SGLang's ``alloc_paged_token_slots_extend`` does.

    Args:
        cache: the simulated cache.
        req: the request.
        extend_len: tokens past the hit this step computes (SGLang's first chunk of a
            chunked prefill: ``req.extend_input_len``); the rest of the prompt by
            default or when it asks for more. :func:`alloc_for_chunk` allocates the next.

    Returns:
        The prefix (hit) length, or ``None`` when the pool (or the rows) cannot hold
        the extend even after evicting; then nothing is locked, allocated or evicted.

    Raises:
        RequestStateError: ``req`` holds a row already (it is running).
        InvalidTokenError: an empty prompt, a bad token id, namespace or priority.
        PrefixKVError: ``cache`` is not a ``PrefixCache``, or ``extend_len`` not a
            positive int.
    """
    cache = _check_cache(cache)
    kv = req.kv
    n = _waiting_len(req)
    chunk = None if extend_len is None else check_count("extend_len", extend_len, lo=1)
    pool, rows = _simulated(cache)
    m = cache.match_req(req, max_prefix_len=n - 1)
    if chunk is not None:
        n = min(n, m.prefix_len + chunk)
    ps = cache.page_size
    need = ceil_div(n, ps) - len(m.device_indices)
    lock = cache.lock(m.last_node)  # the prefill adder locks the hit first
    row = rows.alloc() if _fits(cache, need) else None
    pages = None if row is None else _take_pages(cache, pool, need, 1 if ps > 1 else 0)
    if pages is None:  # no room, no row, or the index evicted fewer pages than it counted
        cache.unlock(lock)
        if row is not None:
            rows.free(row)
        cache.totals.num_rejected += 1
        return None
    hit = m.device_indices
    if hit:  # the hit's pages go first; the new pages are not copied
        pages[:0] = hit
    # A list of its own (the pool's or the index's), handed over; row is not None here.
    rows.adopt(cast(Any, row), pages)
    kv.req_pool_idx = row
    kv.cache_protected_len = m.prefix_len
    kv.kv_committed_len = kv.kv_allocated_len = n
    req.prefix_len = m.prefix_len
    req.last_node = m.last_node
    req.lock = lock
    cache.on_admit(req, m)
    return m.prefix_len


def alloc_for_chunk(cache: PrefixCache, req: ReqLike, extend_len: int) -> bool:
    """The next chunk of a chunked prefill: slots for the prompt's next ``extend_len``
    tokens (SGLang's ``alloc_for_extend`` for the continuing chunked request, on the
    row it keeps). Evicts as :func:`alloc_for_extend` does.

    Returns:
        ``False`` when the pool cannot hold the chunk even after evicting; nothing
        changes then.

    Raises:
        RequestStateError: ``req`` holds no row.
        PrefixKVError: ``cache`` is not a ``PrefixCache``; ``extend_len`` not a positive
            int, or past the prompt's end.
    """
    cache = _check_cache(cache)
    kv = req.kv
    row = held_row(req)
    start = kv.kv_allocated_len
    left = len(req.origin_input_ids) - start
    end = start + check_count("extend_len", extend_len, left, lo=1)
    pool, rows = _simulated(cache)
    ps = cache.page_size
    have = ceil_div(start, ps)
    need = ceil_div(end, ps) - have
    if need:
        pages = _take_pages(cache, pool, need, 1 if ps > 1 else 0) if _fits(cache, need) else None
        if pages is None:
            return False
        rows.write(row, have, pages)
    kv.kv_committed_len = kv.kv_allocated_len = end
    return True


def alloc_for_decode(cache: PrefixCache, req: ReqLike) -> bool:
    """One decode step: a slot for the last sampled token, the one fed now.

    Keeps one page free at page size > 1 (evicting when none is), as SGLang's
    decode allocation does.

    Returns:
        ``False`` when no page can be had (SGLang would retract the request);
        nothing changes then.

    Raises:
        RequestStateError: ``req`` is not running or has no sampled token to feed.
        PrefixKVError: ``cache`` is not a ``PrefixCache``.
    """
    cache = _check_cache(cache)
    kv = req.kv
    row = kv.req_pool_idx
    pos = kv.kv_committed_len
    fed = pos - len(req.origin_input_ids)
    if row is None or not 0 <= fed < len(req.output_ids):
        raise RequestStateError(f"request {req.rid!r:.80} has no sampled token to feed at {pos}")
    ps = cache.page_size
    pool, rows = _simulated(cache)
    if pos % ps == 0:
        page = pool.allocate_one()  # a free page: the common step
        if page < 0:
            pages = _take_pages(cache, pool, 1, 0) if _fits(cache, 1) else None
            if pages is None:
                return False
            page = pages[0]
        rows.append_page(row, pos // ps, page)
    elif pool.num_free_blocks == 0:
        cache.evict(ps)  # best effort
    kv.kv_committed_len = kv.kv_allocated_len = pos + 1
    return True


def req_to_token(cache: PrefixCache, req: ReqLike) -> list[int]:
    """The request's token slots (its ``req_to_token_pool`` row), one per committed token.

    Raises:
        RequestStateError: ``req`` holds no row.
        PrefixKVError: ``cache`` is not a ``PrefixCache``.
    """
    cache = _check_cache(cache)
    row = held_row(req)
    n = req.kv.kv_committed_len
    ps = cache.page_size
    return slot_mapping(cache.rows.read(row, 0, ceil_div(n, ps)), 0, n, ps)


def retract(cache: PrefixCache, req: ReqLike) -> None:
    """Give a running request's pages back without caching more (SGLang's retraction).

    Raises:
        RequestStateError: ``req`` holds no row.
        PrefixKVError: ``cache`` is not a ``PrefixCache``.
    """
    _check_cache(cache).cache_finished_req(req, is_insert=False)


def _check_cache(cache: object) -> PrefixCache:
    # A scheduler step's cache, checked before anything of it is read.
    if not isinstance(cache, PrefixCache):
        raise PrefixKVError(f"cache must be a PrefixCache, got {cache!r:.80}")
    return cache


def _waiting_len(req: ReqLike) -> int:
    # A request fit for admission (not running, a prompt, an int priority): its length.
    if req.kv.req_pool_idx is not None:
        raise RequestStateError(f"request {req.rid!r:.80} is running already")
    n = len(req.origin_input_ids)
    if n == 0:
        raise InvalidTokenError("a prompt needs at least one token; got an empty prompt")
    priority = req.priority
    if priority is not None and type(priority) is not int:
        raise InvalidTokenError(f"priority must be an int, got {priority!r:.80}")
    return n


def _simulated(cache: PrefixCache) -> tuple[BlockAllocator, PageRows]:
    # The simulated pools, typed: the compiled build calls them directly.
    pool, rows = cache.pool, cache.rows
    if not isinstance(pool, BlockAllocator) or not isinstance(rows, PageRows):
        raise PrefixKVError(
            "SGLang's scheduler steps drive a simulated cache (PrefixCache.create_simulated: "
            f"a BlockAllocator and PageRows), not {type(pool).__name__}/{type(rows).__name__}"
        )
    return pool, rows


def _fits(cache: PrefixCache, need: int) -> bool:
    # Whether ``need`` pages can be had, as the cache answers it: free pages plus the
    # evictable ones (a locked hit is not evictable).
    return need * cache.page_size <= cache.available_size() + cache.evictable_size()


def _take_pages(
    cache: PrefixCache, pool: BlockAllocator, need: int, reserve: int
) -> list[int] | None:
    # Evict until need + reserve pages are free (the reserve best effort), then take
    # need; None (the evicted pages stay free) if eviction fell short. The evicted
    # pages go out first, as freeing them and allocating would hand them out (the
    # pool's LIFO), but they never pass through the pool: they were the caller's as
    # cached pages and stay so (no ledger pass each way, a page per token at page
    # size 1). What is left over is freed after the allocation, as it would lie.
    # The list returned is the caller's alone (a new one, or an evicted leaf's).
    free = pool.num_free_blocks
    if free >= need + reserve:
        return pool.allocate(need)
    evicted = cache._evict_pages(need + reserve - free)
    use = min(need, len(evicted))
    if need - use > free:
        if evicted:
            pool.free(evicted)
        return None
    if use < need:  # every evicted page, then free ones
        more = pool.allocate(need - use)
        assert more is not None  # need - use <= free
        return evicted + more
    if use < len(evicted):  # the leftover (a leaf's tail) is freed; the rest kept as is
        if 2 * use <= len(evicted):
            # Mostly leftover (a decode step's one page out of a whole leaf): the kept
            # pages move to a list of their own and the evicted list itself is freed,
            # rather than copying the leftover to free it and deleting it.
            kept = evicted[:use]
            del evicted[:use]
            pool.free(evicted)
            return kept
        pool.free(evicted[use:])
        del evicted[use:]
    return evicted
