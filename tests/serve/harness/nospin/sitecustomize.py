"""Make vLLM's shared-memory queue readers nap instead of spinning (an experiment only).

Put this folder on ``PYTHONPATH`` of a ``vllm serve`` process (never of a client).
Every reader of vLLM's shm ``MessageQueue`` (the engine core waiting for its
worker's reply, the worker waiting for the next step) busy-waits for ``busy_loop_s``
(1 s) after each read, calling ``sched_yield()`` in a loop; a writer waits for its
readers the same way. Here each such turn sleeps :data:`NAP_S` instead, so a waiting
process leaves the core to the others (the API server, the client) at the cost of up
to that much latency per hop. (Setting ``busy_loop_s`` to 0, so that readers sleep on
the queue's ZMQ notification, left a vLLM 0.32 CPU server at about one step per 5 s:
the notification did not wake them.) ``tests/serve/harness/serving_hops.py`` starts
one server with it and one without.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from types import ModuleType
from typing import Any

_TARGET = "vllm.distributed.device_communicators.shm_broadcast"


NAP_S = float(os.environ.get("PREFIXKV_SHM_NAP_S", "0.0002"))
"""Seconds each busy-wait turn sleeps (``PREFIXKV_SHM_NAP_S``)."""


def _patch(module: ModuleType) -> None:
    def nap() -> None:
        time.sleep(NAP_S)

    module.sched_yield = nap  # the name shm_broadcast calls in its wait loops
    print(
        f"nospin: vLLM's shm queue waits nap {NAP_S * 1e6:.0f} us a turn (pid {os.getpid()})",
        file=sys.stderr,
    )


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target)  # type: ignore[attr-defined]
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


sys.meta_path.insert(0, _Finder())
