"""The granularity loss per workload: tokens matched but recomputed at block boundaries.

For every built-in workload, the hash chain (16-token blocks), the radix tree at page
16 and at page 1 replay the same requests with the accounting on; ``extra_info``
holds the hit ratio, the boundary-lost and the last-block tokens (``make report``'s
``report.md`` has the same numbers), and the timing is the whole replay's.
"""

from __future__ import annotations

import pytest
from conftest import SCALE
from pytest_benchmark.fixture import BenchmarkFixture

from prefixkv.adapters.lab.replay import replay
from prefixkv.adapters.lab.workloads import WORKLOADS
from prefixkv.indexes import make_index
from prefixkv.indexes.registry import pool_owned_options

BACKENDS = [("hash_chain", 16, "vllm"), ("radix", 16, "sglang"), ("radix", 1, "sglang")]
SIZE = {"smoke": 8, "medium": None, "full": None}[SCALE]


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize(
    ("name", "bs", "driver"), BACKENDS, ids=[f"{n}-{b}" for n, b, _ in BACKENDS]
)
def test_granularity_loss(
    benchmark: BenchmarkFixture, workload: str, name: str, bs: int, driver: str
) -> None:
    reqs = WORKLOADS[workload]()
    if SIZE is not None:
        reqs = reqs[:SIZE]
    tokens = sum(len(r.tokens) + len(r.output) for r in reqs)

    def run() -> object:
        index = make_index(name, block_size=bs, **pool_owned_options(name))
        return replay(reqs, index, tokens // bs + 4 * len(reqs), driver=driver,  # type: ignore[arg-type]
                      track_boundaries=True)  # fmt: skip

    result = benchmark.pedantic(run, rounds=1, iterations=1)
    prompt = sum(r.prompt_len for r in result.records)
    benchmark.extra_info.update(
        hit_ratio=sum(r.hit_tokens for r in result.records) / prompt,
        boundary_lost_tokens=sum(r.boundary_lost_tokens or 0 for r in result.records),
        last_block_lost_tokens=sum(r.cap_lost_tokens or 0 for r in result.records),
        prompt_tokens=prompt,
    )
    if name == "radix" and bs == 1:
        assert benchmark.extra_info["boundary_lost_tokens"] == 0  # token-exact: nothing lost
