"""vLLM's general plug-in (entry point ``vllm.general_plugins``): checks prefixkv's
settings as soon as vLLM has parsed its configuration.

vLLM calls :func:`register` in each of its processes before any work. In the process
that parses the command line (``vllm serve``, ``LLM(...)``), it wraps
``EngineArgs.create_engine_config`` so that the ``VllmConfig`` it returns goes through
:func:`~.settings.check_vllm_config`, the rule the scheduler builds its index with. A
wrong ``--additional-config`` then stops vLLM there, before any engine process or model,
with one :class:`~prefixkv.adapters.errors.EngineSettingsError` line (where it used to
fail after the model had loaded). Other processes (the engine core, the workers) are left as they
are: the scheduler checks the same settings there.

Without ``--scheduler-cls`` naming prefixkv's scheduler and without ``prefixkv``
settings, the check does nothing. ``VLLM_PLUGINS`` (vLLM's list of plug-ins to load)
can leave it out.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from .settings import check_vllm_config

__all__ = ["register"]

_WRAPPED = "__prefixkv_checked__"


def register() -> None:
    """Wrap ``EngineArgs.create_engine_config`` with the settings check (once a process).

    Does nothing where vLLM's ``vllm.engine.arg_utils`` is not loaded (no configuration
    is parsed in that process), and nothing the second time.
    """
    arg_utils = sys.modules.get("vllm.engine.arg_utils")
    engine_args = getattr(arg_utils, "EngineArgs", None)
    original = getattr(engine_args, "create_engine_config", None)
    if original is None or getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = original(self, *args, **kwargs)
        check_vllm_config(config)
        return config

    setattr(create_engine_config, _WRAPPED, True)
    engine_args.create_engine_config = create_engine_config  # type: ignore[union-attr]
