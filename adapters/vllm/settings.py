"""The ``prefixkv`` settings in vLLM's ``--additional-config``: one rule, engine-free.

    --additional-config '{"prefixkv": {"index": "radix", "eviction": "lfu"}}'

:func:`index_from_settings` reads and checks them and builds the index they name. The
scheduler builds its index with it, and the start-up check (:mod:`.plugin`, run by vLLM
as soon as its configuration is parsed, before any engine process or model) calls the
same function, so a setting the scheduler would refuse is refused before the model
loads, with the same one-line :class:`EngineSettingsError`.

What is refused, each naming the key and what is allowed:

* a key of ``additional_config`` that is ``"prefixkv"`` up to case, ``_``, ``-`` or
  spaces (``"PrefixKV"``, ``"prefix_kv"``): it would otherwise be ignored;
* settings that are not a JSON object, keys that are not strings;
* an ``index`` that is not a registered name;
* ``block_size`` / ``page_size`` (vLLM's ``--block-size`` sets the index's block size)
  and any other key the named index does not take (``name``, a misspelt option);
* an option value the index refuses.

With prefix caching off (``--no-enable-prefix-caching``) the settings are still checked
in full, then the ``"none"`` index is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.registry import (
    available_indexes,
    describe_index,
    index_options,
    make_index,
    pool_owned_options,
)

from ..errors import EngineSettingsError

__all__ = [
    "DEFAULT_INDEX",
    "SETTINGS_KEY",
    "check_vllm_config",
    "index_from_settings",
    "settings_of",
    "uses_prefixkv",
]

SETTINGS_KEY = "prefixkv"
DEFAULT_INDEX = "hash_chain"
# Keys vLLM owns: the index's block size is --block-size.
_ENGINE_OWNED = {"block_size": "--block-size", "page_size": "--block-size"}


def _normalised(key: str) -> str:
    return "".join(c for c in key.casefold() if c not in "_- .")


def settings_of(additional_config: object) -> dict[str, Any] | None:
    """The ``prefixkv`` settings in ``additional_config``; ``None`` when there are none.

    ``additional_config`` may be anything vLLM accepts (a dict, or an object of a
    platform's own): only a dict can hold prefixkv settings.

    Raises:
        EngineSettingsError: a near-miss of the ``"prefixkv"`` key, or settings that
            are not a JSON object with string keys.
    """
    if not isinstance(additional_config, Mapping):
        return None
    for key in additional_config:
        if isinstance(key, str) and key != SETTINGS_KEY and _normalised(key) == SETTINGS_KEY:
            raise EngineSettingsError(
                f"additional_config key {key!r:.80} is not {SETTINGS_KEY!r} (keys are exact); "
                f"write {SETTINGS_KEY!r}"
            )
    if SETTINGS_KEY not in additional_config:
        return None
    settings = additional_config[SETTINGS_KEY]
    if not isinstance(settings, Mapping):
        raise EngineSettingsError(
            f"additional_config[{SETTINGS_KEY!r}] must be a JSON object such as "
            f'{{"index": "radix"}}, not {type(settings).__name__} {settings!r:.80}'
        )
    for key in settings:
        if not isinstance(key, str):
            raise EngineSettingsError(
                f"{SETTINGS_KEY}: keys must be strings, not {type(key).__name__} {key!r:.80}"
            )
    return dict(settings)


def _index_name(settings: dict[str, Any]) -> str:
    name = settings.pop("index", DEFAULT_INDEX)
    known = available_indexes()
    if not isinstance(name, str) or name not in known:
        raise EngineSettingsError(
            f"{SETTINGS_KEY}.index must be one of {', '.join(known)}, not {name!r:.80}"
        )
    return name


def _check_keys(name: str, settings: dict[str, Any]) -> None:
    allowed = [o for o in index_options(name) if o not in _ENGINE_OWNED]
    for key in settings:
        if key in _ENGINE_OWNED:
            raise EngineSettingsError(
                f"{SETTINGS_KEY}.{key:.80} is not a setting: vLLM's {_ENGINE_OWNED[key]} sets "
                f"the index's block size; {SETTINGS_KEY} keys for {name!r}: "
                f"index, {', '.join(allowed)}"
            )
        if key not in allowed:
            raise EngineSettingsError(
                f"{SETTINGS_KEY}.{key:.80} is not a setting of index {name!r}; "
                f"{SETTINGS_KEY} keys for {name!r}: index, {', '.join(allowed)}"
            )


def index_from_settings(
    additional_config: object,
    *,
    block_size: int | None,
    enable_prefix_caching: bool,
    hash_algorithm: str | None = None,
) -> PrefixIndex:
    """The index ``additional_config["prefixkv"]`` names, checked in full and built.

    Args:
        additional_config: vLLM's ``VllmConfig.additional_config``.
        block_size: vLLM's block size (``None``: the index's default, for a check made
            before vLLM has settled it).
        enable_prefix_caching: vLLM's ``--enable-prefix-caching``; off builds the
            ``"none"`` index (after checking the settings).
        hash_algorithm: vLLM's ``--prefix-caching-hash-algo``, the default of an index
            that models vLLM's block hashes.

    Raises:
        EngineSettingsError: one line naming the key and what is allowed.
    """
    settings = settings_of(additional_config) or {}
    name = _index_name(settings)
    _check_keys(name, settings)
    options = {**pool_owned_options(name), **settings}
    if describe_index(name).models == "vllm" and hash_algorithm is not None:
        # vLLM's own block hashes (and so KV events a router can match with vLLM
        # replicas): its --prefix-caching-hash-algo; PYTHONHASHSEED seeds it as in vLLM.
        options.setdefault("hash_algorithm", hash_algorithm)
    try:
        index = make_index(name, block_size=block_size, **options)
    except (TypeError, ValueError, OverflowError) as exc:  # PrefixKVError is a ValueError
        raise EngineSettingsError(f"{SETTINGS_KEY} (index {name!r}): {exc}") from exc
    if enable_prefix_caching:
        return index
    return make_index("none", block_size=block_size, **pool_owned_options("none"))


def uses_prefixkv(scheduler_cls: object) -> bool:
    """Whether vLLM's ``--scheduler-cls`` (a qualified name or a class) is prefixkv's or
    a subclass of it (a timing wrapper, a user's own): a name outside prefixkv is
    imported as vLLM imports it; one that does not import is not prefixkv's (vLLM then
    names the error itself)."""
    cls = scheduler_cls
    if isinstance(scheduler_cls, str):
        if scheduler_cls.startswith("prefixkv."):
            return True
        module, _, name = scheduler_cls.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            return False
    mro = getattr(cls, "__mro__", None)
    if not isinstance(mro, tuple):
        return False
    return any(str(getattr(c, "__module__", "")).startswith("prefixkv.") for c in mro)


def check_vllm_config(vllm_config: Any) -> None:
    """The start-up check of a parsed ``VllmConfig``: the settings as the scheduler will
    read them (:func:`index_from_settings`), before any engine process starts.

    Raises:
        EngineSettingsError: the settings are wrong, or ``prefixkv`` settings are given
            while ``--scheduler-cls`` is not prefixkv's (they would be ignored).
    """
    additional_config = vllm_config.additional_config
    cache = vllm_config.cache_config
    if not uses_prefixkv(vllm_config.scheduler_config.scheduler_cls):
        if settings_of(additional_config) is not None:
            raise EngineSettingsError(
                f"additional_config[{SETTINGS_KEY!r}] is set but --scheduler-cls is not "
                "prefixkv's, so it would be ignored; add --scheduler-cls "
                "prefixkv.adapters.vllm.scheduler.PrefixKVScheduler or remove it"
            )
        return
    block_size = cache.block_size
    index_from_settings(
        additional_config,
        block_size=block_size if isinstance(block_size, int) else None,
        enable_prefix_caching=bool(cache.enable_prefix_caching),
        hash_algorithm=cache.prefix_caching_hash_algo,
    )
