"""Errors the engine integrations raise, and the check that runs before an engine is
imported (no engine imported here)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from prefixkv.indexes.errors import PrefixKVError

__all__ = [
    "EngineNotInstalledError",
    "EngineSettingsError",
    "UnsupportedEngineFeatureError",
    "engine_imports",
]


class UnsupportedEngineFeatureError(PrefixKVError):
    """The engine is configured with a feature (or is a version) prefixkv does not support.

    Raised at start-up, before any request runs; the message is one line naming the
    feature and the flag that turned it on.
    """


class EngineSettingsError(PrefixKVError):
    """prefixkv's settings inside an engine's own configuration are wrong (a misspelt
    key, an unknown index or option, a bad value).

    Raised as soon as the engine's configuration is parsed, before any model loads; the
    message is one line naming the key and what is allowed.
    """


class EngineNotInstalledError(PrefixKVError, ImportError):
    """A module that runs inside an engine was imported without that engine, or beside a
    version prefixkv does not support.

    An ``ImportError`` too, so code that probes for an optional integration with
    ``except ImportError`` keeps working. The message is one line naming the supported
    versions and the engine-free class to use instead.
    """


@contextlib.contextmanager
def engine_imports(
    module: str, engine: str, supported: Sequence[str], engine_free: str
) -> Iterator[str]:
    """Guard the imports of an engine: checks first that the engine is installed in a
    supported version (from its metadata, without importing it), then turns an
    ``ImportError`` of the guarded imports into :class:`EngineNotInstalledError`.

    Args:
        module: the importing module, named in the message.
        engine: ``"vllm"`` or ``"sglang"`` (:data:`~prefixkv.indexes.buildinfo.ENGINES`).
        supported: the releases supported, as version prefixes (``"0.32"``, ``"0.5.23"``).
        engine_free: the class to use without the engine.

    Yields:
        The installed version.

    Raises:
        EngineNotInstalledError: the engine is missing, another version, or fails to import.
    """
    from prefixkv.indexes.buildinfo import ENGINES, installed_version

    distributions = dict(ENGINES)[engine]
    version = installed_version(*distributions)
    name = {"vllm": "vLLM", "sglang": "SGLang"}.get(engine, engine)
    wanted = " or ".join(f"{name} {v}" for v in supported)
    instead = f"without {name}, use {engine_free}"
    if version is None:
        raise EngineNotInstalledError(
            f"{module} runs inside {wanted}: {name} is not installed; {instead}"
        )
    release = version.split()[0].split("+")[0]
    if not any(release == v or release.startswith(v + ".") for v in supported):
        raise EngineNotInstalledError(
            f"{module} runs inside {wanted}, not {name} {version}; install one of those, "
            f"or {instead}"
        )
    try:
        yield version
    except ImportError as exc:
        raise EngineNotInstalledError(
            f"{module}: {name} {version} is installed but failed to import "
            f"({type(exc).__name__}: {exc}); {instead}"
        ) from exc
