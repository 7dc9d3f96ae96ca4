"""Record SGLang 0.5.23's RadixCache KV-event stream (run in an environment with SGLang).

Replays a trace through SGLang's own ``RadixCache`` built with
``enable_kv_cache_events=True``, in the K-live schedule (at most K live requests; the
oldest finishes first by decoding its remaining output one token per step; the whole
prompt is prefilled in one step, which samples the first output token; a request
whose only output token is sampled at prefill finishes there). After every step it
takes the tree's events as the scheduler's ``publish_kv_events`` does (and notes the
page hashes the tree then holds), publishes each
non-empty ``KVEventBatch`` through SGLang's ``ZmqEventPublisher`` and records the
frames its replay socket returns, then ``reset()`` (``AllBlocksCleared``). The
scheduler is the fidelity oracle's (``sglang_oracle.SGLangReplay``: match, lock, slot
allocation with eviction, ``checkpoint`` / ``release_kv_cache``, all SGLang's own
helpers); batch timestamps come from a virtual clock (1 ms per step) so the
recording is reproducible.

    SGLANG_PYTHON sglang_kv_events.py trace.jsonl settings.json PAGE_SIZE out.jsonl
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import sglang_oracle  # installs the torchvision stand-in before SGLang is imported
from event_recording import StepBatches, publish_and_replay, read_inputs, write_recording


class Replayer:
    """One SGLang ``RadixCache`` with events on, stepped by the oracle's ``SGLangReplay``."""

    def __init__(self, settings: dict[str, Any], page_size: int) -> None:
        from sglang.srt.disaggregation.kv_events import KVEventBatch

        params = sglang_oracle.build_pools(
            page_size,
            settings["capacity_tokens"],
            settings["concurrency"] + 1,
            settings["max_model_len"],
            enable_kv_cache_events=True,
        )
        self.cache = sglang_oracle.make_cache("radix", params)
        self.page_size = page_size
        # The scheduler loop's publish_kv_events: take the tree's events, batch them.
        self.steps = StepBatches(self.cache.take_events, KVEventBatch, self.cached)
        self.replay = sglang_oracle.SGLangReplay(self.cache, params, self.steps.end_step)

    def cached(self) -> list[list[int]]:
        """What the tree holds now: ``[event hash, pages with it]`` of every node, sorted.

        The hashes are the ones SGLang's recorder would publish on removing each node
        (computed by a second ``KVCacheEventRecorder``), so the events' consumer can be
        compared with the tree itself.
        """
        from sglang.srt.mem_cache.events import KVCacheEventRecorder

        probe = KVCacheEventRecorder(
            enabled=True, page_size=self.page_size, lora_names=self.cache.kv_events.lora_names
        )
        stack = list(self.cache.root_node.children.values())
        while stack:
            node = stack.pop()
            probe.record_remove(node)
            stack.extend(node.children.values())
        counts: dict[int, int] = {}
        for event in probe.take():
            for h in event.block_hashes:
                counts[h] = counts.get(h, 0) + 1
        return sorted([h, n] for h, n in counts.items())

    def run(self, trace: list[dict[str, Any]], k: int) -> None:
        self.replay.run(trace, k)
        self.cache.reset()
        self.steps.end_step()


def main(argv: list[str] | None = None) -> int:
    import sglang
    from sglang.srt.disaggregation.kv_events import ZmqEventPublisher

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("settings")
    ap.add_argument("page_size", type=int)
    ap.add_argument("out")
    args = ap.parse_args(argv)
    trace, settings = read_inputs(args.trace, args.settings)
    rp = Replayer(settings, args.page_size)
    rp.run(trace, settings["concurrency"])
    frames = publish_and_replay(ZmqEventPublisher, "attn_dp_rank", rp.steps.batches, settings)
    head = {"sglang": sglang.__version__, "page_size": args.page_size, "batches": len(frames)}
    write_recording(args.out, head, frames, rp.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
