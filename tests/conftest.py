"""Shared test configuration: hypothesis profiles, the markers, shared fixtures.

Profiles: ``ci`` (default; derandomized, bounded examples, no deadline) and ``dev``
(random, many more examples). Pick one with ``HYPOTHESIS_PROFILE=dev``.

Markers: ``cuda`` tests are skipped without a CUDA device; ``slow`` ones are left out
by ``make check`` (``make test`` runs them); ``both_builds`` is given here to every test
of the modules in ``BOTH_BUILDS``, the ones ``make test`` runs again on the compiled
wheel.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    max_examples=1000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

BOTH_BUILDS = frozenset(
    {
        # The compiled modules' own behaviour (pyproject.toml, [tool.prefixkv.mypyc]):
        # what compiled code could do differently is refuse, convert or accept input,
        # subclass and set attributes, so their contracts, refused input, state machines
        # and the engines' recorded hits run on both builds; so does the differential
        # test, which runs the same random operation sequences on both and compares every
        # result. The lab, the cluster, the events, the CLI and the plots run on the pure
        # build only: they reach the compiled modules through the API these suites pin.
        "test_accounting.py",
        "test_adversarial.py",
        "test_bad_input.py",
        "test_bad_input_sweep.py",
        "test_build.py",
        "test_checked_parameters.py",
        "test_conformance.py",
        "test_decode_cost.py",
        "test_decode_loops.py",
        "test_differential.py",
        "test_engine.py",
        "test_engine_class_fuzz.py",
        "test_engine_class_lookups.py",
        "test_engine_classes.py",
        "test_event_emission.py",
        "test_fidelity.py",
        "test_hash_chain.py",
        "test_hash_chain_extend_locked.py",
        "test_isolation.py",
        "test_namespaces.py",
        "test_radix.py",
        "test_request_shapes.py",
        "test_stateful.py",
        "test_storage.py",
        "test_validation.py",
        "test_vllm_hashing.py",
        "test_vllm_kv_cache_manager.py",
        "test_vllm_settings.py",
    }
)


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for a module (``pytestmark = usefixtures(...)``): the tiny
    model's matmuls gain nothing from more, and stall on a busy CI box."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


@pytest.hookimpl(tryfirst=True)  # before -m selects by the markers given here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in BOTH_BUILDS:
            item.add_marker(pytest.mark.both_builds)
    # The slow ones first: with pytest-xdist's workers, the soak test then runs beside
    # the rest instead of after it.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
