"""vLLM's ``--additional-config '{"prefixkv": {...}}'``: one rule, checked before the engine.

Engine-free: the settings module imports no vLLM, and the start-up hook
(``prefixkv.adapters.vllm.plugin``, vLLM's ``vllm.general_plugins`` entry point) is
driven here through a stand-in ``vllm.engine.arg_utils`` whose ``EngineArgs`` counts
the engines it would build. Every bad setting is an ``EngineSettingsError`` whose one
line names the key, raised where vLLM builds its configuration, before any engine.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.errors import EngineSettingsError
from prefixkv.adapters.vllm.settings import (
    check_vllm_config,
    index_from_settings,
    settings_of,
    uses_prefixkv,
)
from prefixkv.indexes import HashChainIndex, PrefixKVError, RadixIndex
from prefixkv.indexes.null import NoPrefixIndex

SCHEDULER = "prefixkv.adapters.vllm.scheduler.PrefixKVScheduler"

# (additional_config, a word the one-line message must hold: the key at fault)
BAD: list[tuple[Any, str]] = [
    ({"prefixkv": {"block_size": 7}}, "block_size"),
    ({"prefixkv": {"page_size": 16}}, "page_size"),
    ({"prefixkv": {"name": "radix"}}, "name"),
    ({"prefixkv": {"index": "radix", "seed": 1}}, "seed"),  # a hash-chain option
    ({"prefixkv": {"evicton": "lfu", "index": "radix"}}, "evicton"),
    ({"prefixkv": {"index": "radx"}}, "index"),
    ({"prefixkv": {"index": 3}}, "index"),
    ({"prefixkv": {"index": None}}, "index"),
    ({"prefixkv": {"index": ["radix"]}}, "index"),
    ({"prefixkv": {"index": "radix", "eviction": "sometimes"}}, "radix"),
    ({"prefixkv": {"index": "radix", "eviction": 3}}, "radix"),
    ({"prefixkv": {"hash_algorithm": "md4"}}, "hash_chain"),
    ({"prefixkv": {"hash_algorithm": 5}}, "hash_chain"),
    ({"prefixkv": "radix"}, "prefixkv"),
    ({"prefixkv": ["radix"]}, "prefixkv"),
    ({"prefixkv": None}, "prefixkv"),
    ({"prefixkv": 1}, "prefixkv"),
    ({"prefixkv": {1: "radix"}}, "keys"),
    ({"PrefixKV": {"index": "radix"}}, "PrefixKV"),
    ({"prefix_kv": {"index": "radix"}}, "prefix_kv"),
    ({"prefix-kv": {}}, "prefix-kv"),
    ({"PREFIX_KV": {}}, "PREFIX_KV"),
    ({"prefixKV": {"index": "hash_chain"}}, "prefixKV"),
    ({" prefixkv": {}}, " prefixkv"),
]


def config(extra: Any, *, caching: bool = True, scheduler: Any = SCHEDULER) -> Any:
    """The parts of vLLM's ``VllmConfig`` the check reads."""
    return SimpleNamespace(
        additional_config=extra,
        cache_config=SimpleNamespace(
            block_size=16, enable_prefix_caching=caching, prefix_caching_hash_algo="sha256"
        ),
        scheduler_config=SimpleNamespace(scheduler_cls=scheduler),
    )


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize(("extra", "key"), BAD, ids=[repr(b[0])[:40] for b in BAD])
def test_every_bad_setting_is_refused_by_name(extra: Any, key: str, caching: bool) -> None:
    # With prefix caching off too: the settings are checked, then the "none" index built.
    for check in (
        lambda: index_from_settings(
            extra, block_size=16, enable_prefix_caching=caching, hash_algorithm="sha256"
        ),
        lambda: check_vllm_config(config(extra, caching=caching)),
    ):
        with pytest.raises(EngineSettingsError) as info:
            check()
        line = str(info.value)
        assert "\n" not in line and key in line, line
        assert isinstance(info.value, PrefixKVError)


@pytest.mark.parametrize(
    ("extra", "caching", "kind"),
    [
        (None, True, HashChainIndex),
        ({}, True, HashChainIndex),
        ({"other": 1}, True, HashChainIndex),
        ({"prefixkv": {}}, True, HashChainIndex),
        ({"prefixkv": {"index": "radix", "eviction": "lfu"}}, True, RadixIndex),
        (
            {"prefixkv": {"index": "hash_chain", "hash_algorithm": "sha256_cbor"}},
            True,
            HashChainIndex,
        ),
        ({"prefixkv": {"index": "radix"}}, False, NoPrefixIndex),
        (SimpleNamespace(compute_hash=lambda: "x"), True, HashChainIndex),  # a platform's own
    ],
)
def test_good_settings_build_their_index(extra: Any, caching: bool, kind: type) -> None:
    index = index_from_settings(
        extra, block_size=16, enable_prefix_caching=caching, hash_algorithm="sha256"
    )
    assert type(index) is kind and index.block_size == 16
    check_vllm_config(config(extra, caching=caching))


def test_vllms_hash_algorithm_is_the_hash_chains_default() -> None:
    index = index_from_settings(
        {}, block_size=16, enable_prefix_caching=True, hash_algorithm="sha256_cbor"
    )
    assert isinstance(index, HashChainIndex)
    assert index.hasher.algorithm == "sha256_cbor"  # type: ignore[attr-defined]
    mine = {"prefixkv": {"hash_algorithm": "sha256"}}  # the settings' own choice wins
    index = index_from_settings(
        mine, block_size=16, enable_prefix_caching=True, hash_algorithm="sha256_cbor"
    )
    assert index.hasher.algorithm == "sha256"  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=12))
def test_only_the_exact_key_is_read(key: str) -> None:
    # Any spelling that folds to "prefixkv" but is not it is refused; any other key is
    # vLLM's (or another plug-in's) and left alone.
    folded = "".join(c for c in key.casefold() if c not in "_- .")
    if key == "prefixkv":
        assert settings_of({key: {}}) == {}
    elif folded == "prefixkv":
        with pytest.raises(EngineSettingsError, match="is not 'prefixkv'"):
            settings_of({key: {}})
    else:
        assert settings_of({key: {}}) is None


@pytest.mark.parametrize(
    "near", ["PrefixKV", "prefix_kv", "Prefix-KV", "PREFIXKV", "prefix kv", "prefix.kv"]
)
def test_a_near_miss_is_refused_even_beside_the_right_key(near: str) -> None:
    with pytest.raises(EngineSettingsError, match=near.replace(".", r"\.")):
        settings_of({"prefixkv": {}, near: {"index": "radix"}})


def test_settings_without_prefixkvs_scheduler_are_refused() -> None:
    # They would be ignored: vLLM's own scheduler never reads them.
    for scheduler in (None, "vllm.v1.core.sched.scheduler.Scheduler", dict):
        with pytest.raises(EngineSettingsError, match="--scheduler-cls"):
            check_vllm_config(config({"prefixkv": {"index": "radix"}}, scheduler=scheduler))
        check_vllm_config(config({"other": 1}, scheduler=scheduler))  # not ours: untouched


def test_the_scheduler_is_recognised_by_name_or_class() -> None:
    assert uses_prefixkv(SCHEDULER)
    assert uses_prefixkv("prefixkv.adapters.plugins.vllm.PrefixKVScheduler")
    fake = type("PrefixKVScheduler", (), {"__module__": "prefixkv.adapters.vllm.scheduler"})
    assert uses_prefixkv(fake)
    assert not uses_prefixkv(None) and not uses_prefixkv("vllm.v1.core.sched.Scheduler")


def test_a_subclass_of_prefixkvs_scheduler_elsewhere_is_prefixkvs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A timing wrapper (benchmarks/serve/step_timing.py) or a user's own subclass, named
    # from its own module: its settings are read, so they are checked, not refused. The
    # module is imported by name, as vLLM imports it: here it is one already imported.
    base = type("PrefixKVScheduler", (), {"__module__": "prefixkv.adapters.vllm.scheduler"})
    timed = type("Timed", (base,), {"__module__": "my_timing"})
    my_timing = types.ModuleType("my_timing")
    vars(my_timing).update(Timed=timed, Other=type("Other", (), {"__module__": "my_timing"}))
    monkeypatch.setitem(sys.modules, "my_timing", my_timing)
    assert uses_prefixkv("my_timing.Timed") and uses_prefixkv(timed)
    check_vllm_config(config({"prefixkv": {"index": "radix"}}, scheduler="my_timing.Timed"))
    with pytest.raises(EngineSettingsError, match="index"):
        check_vllm_config(config({"prefixkv": {"index": "nope"}}, scheduler="my_timing.Timed"))
    assert not uses_prefixkv("my_timing.Other") and not uses_prefixkv("my_timing.Missing")
    assert not uses_prefixkv("no_such_module_here.Scheduler") and not uses_prefixkv("x")


# --- the start-up hook, as vLLM drives it ----------------------------------------------


class FakeEngineArgs:
    """vLLM's ``EngineArgs`` as far as the hook sees it; counts the engines started."""

    engines = 0

    def __init__(self, extra: Any, scheduler: Any = SCHEDULER) -> None:
        self.extra, self.scheduler = extra, scheduler

    def create_engine_config(self, usage_context: object = None) -> Any:
        return config(self.extra, scheduler=self.scheduler)

    def start(self) -> None:  # what vLLM does with the config next: the engine, the model
        config = self.create_engine_config()
        FakeEngineArgs.engines += 1
        assert config is not None


@pytest.fixture
def vllm_arg_utils(monkeypatch: pytest.MonkeyPatch) -> type[FakeEngineArgs]:
    cls = type("EngineArgs", (FakeEngineArgs,), {})
    module = types.ModuleType("vllm.engine.arg_utils")
    module.EngineArgs = cls  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.engine.arg_utils", module)
    FakeEngineArgs.engines = 0
    return cls


@pytest.mark.parametrize(("extra", "key"), BAD, ids=[repr(b[0])[:40] for b in BAD])
def test_the_hook_refuses_before_any_engine_starts(
    vllm_arg_utils: type[FakeEngineArgs], extra: Any, key: str
) -> None:
    from prefixkv.adapters.vllm import plugin

    plugin.register()
    with pytest.raises(EngineSettingsError, match=None) as info:
        vllm_arg_utils(extra).start()
    assert key in str(info.value)
    assert FakeEngineArgs.engines == 0


def test_the_hook_wraps_once_and_passes_good_settings(
    vllm_arg_utils: type[FakeEngineArgs],
) -> None:
    from prefixkv.adapters.vllm import plugin

    plugin.register()
    wrapped = vllm_arg_utils.create_engine_config
    plugin.register()  # vLLM may load plug-ins again: still one wrapper
    assert vllm_arg_utils.create_engine_config is wrapped
    vllm_arg_utils({"prefixkv": {"index": "radix"}}).start()
    vllm_arg_utils({"anything": 1}, scheduler=None).start()  # native vLLM: untouched
    assert FakeEngineArgs.engines == 2


def test_the_hook_does_nothing_where_no_configuration_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefixkv.adapters.vllm import plugin

    monkeypatch.delitem(sys.modules, "vllm.engine.arg_utils", raising=False)
    plugin.register()  # an engine-core or worker process: nothing to wrap, no import
    assert "vllm.engine.arg_utils" not in sys.modules


def test_vllm_finds_the_hook_as_a_general_plugin() -> None:
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    group = meta["project"]["entry-points"]["vllm.general_plugins"]
    module, _, func = group["prefixkv"].partition(":")
    from importlib import import_module

    assert callable(getattr(import_module(module), func))
