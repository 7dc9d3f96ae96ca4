"""vLLM's scheduler, native or prefixkv's, timed step by step inside a serving engine.

    PYTHONPATH=benchmarks/serve PREFIXKV_STEP_TIMES=native.jsonl \\
        vllm serve MODEL --scheduler-cls step_timing.TimedScheduler ...
    PYTHONPATH=benchmarks/serve PREFIXKV_STEP_TIMES=chain.jsonl \\
        vllm serve MODEL --scheduler-cls step_timing.TimedPrefixKVScheduler \\
        --additional-config '{"prefixkv": {"index": "hash_chain"}}' ...

Both classes add the same thing to the scheduler they extend (vLLM's ``Scheduler``,
prefixkv's ``PrefixKVScheduler``): each ``schedule()`` and ``update_from_output()``
call is timed by the wall clock (``perf_counter_ns``) and by the scheduler thread's
CPU clock (``thread_time_ns``, which a busy machine's other processes do not inflate),
and the step's scheduled tokens and requests are kept. Everything the engine's
scheduler does per step is in those two calls: the prefix-cache lookup and block
allocation (``schedule``), caching and freeing a finished request's blocks
(``update_from_output``). When the engine has nothing left to run the buffered steps
are appended to ``$PREFIXKV_STEP_TIMES`` as JSON lines (outside the timed calls),
after a first line naming the class, vLLM's version and (for prefixkv) its build.

With ``PREFIXKV_STEP_TIMES_CACHE=1`` the KV-cache manager's share is timed too: the
scheduler's ``kv_cache_manager`` is wrapped so that every method call on it is timed
(``cache_ns``: their sum over the step). The wrapper costs both the same (about a
microsecond a call), so this mode is a separate run from the plain one.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import vllm
from vllm.v1.core.sched.scheduler import Scheduler

from prefixkv.adapters.vllm.scheduler import PrefixKVScheduler

ENV = "PREFIXKV_STEP_TIMES"
CACHE_ENV = "PREFIXKV_STEP_TIMES_CACHE"


class _TimedCalls:
    """A KV-cache manager whose method calls add their wall time to ``clock[0]``."""

    def __init__(self, manager: Any, clock: list[int]) -> None:
        self._manager = manager
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._manager, name)
        if not callable(value):
            return value
        clock = self._clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return value(*args, **kwargs)
            finally:
                clock[0] += time.perf_counter_ns() - t0

        return timed


class _StepTimer:
    """The timing both classes share (a mixin ahead of the scheduler class)."""

    _steps: list[tuple[int, ...]]
    _open: list[int]
    _cache_clock: list[int]

    def _start_timing(self) -> None:
        path = os.environ.get(ENV)
        if not path:
            raise RuntimeError(f"{type(self).__name__}: set {ENV} to the file for its steps")
        self._path = path
        self._steps = []
        self._open = []
        self._cache_clock = [0]
        if os.environ.get(CACHE_ENV) == "1":
            self.kv_cache_manager = _TimedCalls(self.kv_cache_manager, self._cache_clock)
        head = {"scheduler": type(self).__name__, "vllm": vllm.__version__, "pid": os.getpid()}
        if isinstance(self, PrefixKVScheduler):
            from prefixkv.indexes.buildinfo import build_kind

            head["prefixkv"] = build_kind()
        with open(path, "a") as f:
            f.write(json.dumps(head) + "\n")

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self._cache_clock[0] = 0
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        out = super().schedule(*args, **kwargs)  # type: ignore[misc]
        cpu, wall = time.thread_time_ns() - cpu, time.perf_counter_ns() - wall
        self._open = [wall, cpu, out.total_num_scheduled_tokens, len(out.num_scheduled_tokens)]
        return out

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        out = super().update_from_output(*args, **kwargs)  # type: ignore[misc]
        cpu, wall = time.thread_time_ns() - cpu, time.perf_counter_ns() - wall
        if self._open:
            s_wall, s_cpu, tokens, reqs = self._open
            self._steps.append((s_wall, s_cpu, wall, cpu, self._cache_clock[0], tokens, reqs))
            self._open = []
        if not self.has_unfinished_requests():  # type: ignore[attr-defined]
            self._flush()
        return out

    def _flush(self) -> None:
        if not self._steps:
            return
        keys = ("schedule_ns", "schedule_cpu_ns", "update_ns", "update_cpu_ns", "cache_ns",
                "tokens", "requests")  # fmt: skip
        with open(self._path, "a") as f:
            f.writelines(json.dumps(dict(zip(keys, s, strict=True))) + "\n" for s in self._steps)
        self._steps = []


class TimedScheduler(_StepTimer, Scheduler):  # type: ignore[misc]
    """vLLM's own scheduler (native prefix caching), timed per step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._start_timing()


class TimedPrefixKVScheduler(_StepTimer, PrefixKVScheduler):  # type: ignore[misc]
    """prefixkv's scheduler (the index ``additional_config`` names), timed per step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._start_timing()
