"""Where a decode step's work goes: CPU instructions per step, by function (callgrind).

Wall time on a shared machine moves by 2x from minute to minute; the instructions a
step executes do not. This runs the decode loop of ``test_decode_step.py`` (a
17-token prompt, then ``--steps`` decode steps, ``--rounds`` requests one after the
other, each round's finished request freed) under valgrind's callgrind twice, at
``--rounds`` and at three times as many, and prints each function's inclusive
instructions per step from the difference (start-up, imports and the first round
cancel out). A driver row, the same loop around a call that does nothing, is the
share of the loop itself. Works on either build: run it with the Python of an
environment where the compiled wheel is installed to profile that one (its functions
are named ``CPyDef_<module>___<Class>___<method>``).

    python benchmarks/decode_profile.py --engine-class vllm --index hash_chain [--top 25]
    make wheel-venv                        # the wheel of this tree, in build/wheel-venv
    build/wheel-venv/bin/python benchmarks/decode_profile.py --engine-class sglang --index radix

Needs ``valgrind`` (Debian: ``apt install valgrind``); a run takes about a minute.
"""

from __future__ import annotations

import argparse
import random

from callgrind import count, inclusive, require_valgrind

__all__ = ["inclusive", "per_step"]

STEPS = 1024
PROMPT = 17  # one full block and one token: the steps dominate, not the admission


def run_child(engine_class: str, index: str, rounds: int, steps: int) -> None:
    """The profiled loop: ``rounds`` requests, each decoding ``steps`` steps."""
    from prefixkv.adapters.sglang import PrefixCache, SimpleReq
    from prefixkv.adapters.sglang.simulated import alloc_for_decode, alloc_for_extend
    from prefixkv.adapters.vllm import KVCacheManager, SimpleRequest

    rng = random.Random(17)
    prompt = [rng.randrange(32000) for _ in range(PROMPT)]
    out = [rng.randrange(32000) for _ in range(steps + 1)]
    backend = "hash_chain" if index == "driver" else index
    if engine_class == "vllm":
        kv = KVCacheManager(backend, (rounds + 2) * (PROMPT + steps + 16) // 16 + 1, 16)
        done: SimpleRequest | None = None
        for r in range(rounds):
            if done is not None:
                kv.free(done)
            req = SimpleRequest(f"r{r}", list(prompt))
            blocks, hit, _ = kv.get_computed_blocks(req)
            kv.allocate_slots(req, req.num_tokens - hit, hit, blocks)
            req.num_computed_tokens = req.num_tokens
            req.append_output_token_ids(out[0])
            step = kv.allocate_slots if index != "driver" else (lambda r, n: None)
            tokens = req.all_token_ids
            for k in range(1, steps + 1):
                step(req, 1)
                req.num_computed_tokens += 1
                tokens.append(out[k])
            done = req
        return
    page = 1 if backend == "radix" else 16
    cache = PrefixCache.create_simulated(backend, (rounds + 2) * (PROMPT + steps + 16), page)
    prev: SimpleReq | None = None
    for r in range(rounds):
        if prev is not None:
            cache.cache_finished_req(prev)
        sreq = SimpleReq(f"r{r}", prompt)
        alloc_for_extend(cache, sreq)
        sreq.output_ids.append(out[0])
        cache.cache_unfinished_req(sreq)
        alloc = alloc_for_decode if index != "driver" else (lambda c, r: True)
        outs = sreq.output_ids
        for k in range(1, steps + 1):
            alloc(cache, sreq)
            outs.append(out[k])
        prev = sreq


def per_step(small: dict[str, int], large: dict[str, int], steps: int) -> dict[str, float]:
    """Instructions per step of each function: the difference of two run lengths."""
    return {k: (v - small.get(k, 0)) / steps for k, v in large.items() if v > small.get(k, 0)}


def profile(args: argparse.Namespace, index: str, rounds: int) -> dict[str, int]:
    argv = [__file__, "--child", "--engine-class", args.engine_class, "--index", index,
            "--rounds", str(rounds), "--steps", str(args.steps)]  # fmt: skip
    return count(argv)[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-class", choices=("vllm", "sglang"), default="vllm")
    ap.add_argument("--index", choices=("hash_chain", "radix", "driver"), default="hash_chain")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_child(args.engine_class, args.index, args.rounds, args.steps)
        return
    require_valgrind("decode_profile.py")
    steps = 2 * args.rounds * args.steps
    rows = {}
    for index in (args.index, "driver"):
        small, large = profile(args, index, args.rounds), profile(args, index, 3 * args.rounds)
        rows[index] = per_step(small, large, steps)
    mine, driver = rows[args.index], rows["driver"]
    extra = {k: v - driver.get(k, 0.0) for k, v in mine.items()}
    total = extra.get("Py_RunMain", 0.0)
    print(f"{args.engine_class} engine class, {args.index}: {total:.0f} instructions per "
          "decode step beyond the driver loop's; by function, inclusive, per step:")  # fmt: skip
    # Leave out the frames the driver's loop runs under too (main, the interpreter loop).
    loop = 0.5 * driver.get("Py_RunMain", 0.0)
    parts = [(k, v) for k, v in extra.items() if v > 0.01 * total and driver.get(k, 0) < loop]
    for name, cost in sorted(parts, key=lambda kv: -kv[1])[: args.top]:
        print(f"{cost:9.0f}  {name}")


if __name__ == "__main__":
    main()
