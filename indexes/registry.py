"""Backends by name, so an engine picks its index with a config flag.

``make_index("hash_chain" | "radix" | "none", block_size=..., **options)``. A
third-party backend registers a factory with :func:`register_index`, or ships an
entry point in the ``prefixkv.indexes`` group that is loaded on first use.
"""

from __future__ import annotations

import inspect
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from .base import Described, IndexDescription, PrefixIndex
from .errors import IndexOptionError, PrefixKVError, UnknownIndexError

__all__ = [
    "IndexRegistry",
    "available_indexes",
    "default_registry",
    "describe_index",
    "index_options",
    "make_index",
    "pool_owned_options",
    "register_index",
]

IndexFactory = Callable[..., PrefixIndex]


class IndexRegistry:
    """A name -> factory table; ``homes`` names factories as ``"module:attr"``, each
    imported when first named. ``default_registry`` is the process-wide one."""

    def __init__(self, homes: Mapping[str, str] | None = None) -> None:
        self._factories: dict[str, IndexFactory] = {}
        self._descriptions: dict[str, IndexDescription] = {}
        self._homes = dict(homes or {})  # name -> "module:attr", imported on first use
        self._entry_points_loaded = False

    def register(
        self,
        name: str,
        factory: IndexFactory,
        *,
        description: IndexDescription | None = None,
        replace: bool = False,
    ) -> None:
        """Add a backend. ``factory(block_size=None | int, **options)`` builds it.

        Args:
            name: the registry name.
            factory: builds the index (a class or a function).
            description: what the backend says about itself; default: the factory's
                ``DESCRIPTION`` when it is a described class, else a plain block index.
            replace: allow replacing a registered name.

        Raises:
            PrefixKVError: the name is taken (pass ``replace=True``) or not a str.
        """
        if not isinstance(name, str) or not name:
            raise PrefixKVError(f"index name must be a non-empty str, got {name!r}")
        if (name in self._factories or name in self._homes) and not replace:
            raise PrefixKVError(f"an index named {name!r} is registered already")
        if description is None:
            description = factory.DESCRIPTION if isinstance(factory, Described) else None
        # Described, then listed, then off the lazy table: a lookup between never misses it.
        self._descriptions[name] = description or IndexDescription()
        self._factories[name] = factory
        self._homes.pop(name, None)

    def options(self, name: str) -> list[str]:
        """The options backend ``name`` takes (its factory's keyword arguments).

        Raises:
            UnknownIndexError: no such backend.
        """
        return [o for o in _option_names(self._factory(name)) if o != "block_size"]

    def describe(self, name: str) -> IndexDescription:
        """What backend ``name`` says about itself.

        Raises:
            UnknownIndexError: no such backend.
        """
        self._factory(name)
        return self._descriptions[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        self._load_entry_points()
        return sorted({*self._factories, *self._homes})

    def make(self, name: str, block_size: int | None = None, **options: Any) -> PrefixIndex:
        """Build the backend ``name``; ``block_size=None`` takes the backend's default.

        Raises:
            UnknownIndexError: no such backend (the message lists the known names).
        """
        factory = self._factory(name)
        if block_size is not None:
            options["block_size"] = block_size
        _check_options(name, factory, options)
        return factory(**options)

    def _factory(self, name: str) -> IndexFactory:
        home = self._homes.get(name)
        if home is not None:
            self.register(name, pkgutil.resolve_name(home), replace=True)
        factory = self._factories.get(name)
        if factory is None:
            self._load_entry_points()
            factory = self._factories.get(name)
        if factory is None:
            raise UnknownIndexError(
                f"unknown prefix index {name!r:.80}; known: {', '.join(self.names())}"
            )
        return factory

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        from importlib.metadata import entry_points  # a large import: only once one is asked for

        for ep in entry_points(group="prefixkv.indexes"):
            if ep.name not in self._factories and ep.name not in self._homes:
                self.register(ep.name, ep.load())


def _option_names(factory: IndexFactory) -> list[str]:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return []
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds]


def _check_options(name: str, factory: IndexFactory, options: dict[str, Any]) -> None:
    # A misspelt option is the caller's mistake, not a TypeError from deep inside.
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return
    try:
        signature.bind(**options)
    except TypeError:
        known = [
            p.name
            for p in signature.parameters.values()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        unknown = sorted(set(options) - set(known)) or sorted(options)
        raise IndexOptionError(
            f"index {name!r} takes no option {', '.join(map(repr, unknown))}; "
            f"its options: {', '.join(known) or 'none'}"
        ) from None


_BUILTINS = {
    "hash_chain": "prefixkv.indexes.hash_chain:HashChainIndex",
    "radix": "prefixkv.indexes.radix:RadixIndex",
    "none": "prefixkv.indexes.null:NoPrefixIndex",
}
"""The backends prefixkv ships, each imported when first named: an engine running one
never loads the others."""

default_registry = IndexRegistry(_BUILTINS)
"""The registry ``make_index`` uses."""


def make_index(name: str, block_size: int | None = None, **options: Any) -> PrefixIndex:
    """Build a prefix index by name: ``"hash_chain"``, ``"radix"`` or ``"none"``.

    Args:
        name: the backend.
        block_size: hit granularity in tokens (hash chain default 16, radix page
            size default 1).
        **options: backend options, e.g. ``seed``, ``hash_algorithm``, ``verify``
            (hash chain) or ``eviction`` (radix).

    Raises:
        UnknownIndexError: (a ``ValueError``) listing the known names.
    """
    return default_registry.make(name, block_size, **options)


def describe_index(name: str) -> IndexDescription:
    """What the registered backend ``name`` says about itself.

    Raises:
        UnknownIndexError: no such backend.
    """
    return default_registry.describe(name)


def index_options(name: str) -> list[str]:
    """The options the registered backend ``name`` takes, e.g. ``["eviction", ...]``.

    Raises:
        UnknownIndexError: no such backend.
    """
    return default_registry.options(name)


def pool_owned_options(name: str) -> dict[str, Any]:
    """Options for backend ``name`` when the caller owns the block pool (a manager).

    A manager never hands an index a block it already holds and checks ownership in
    its allocator's ledger, so a backend may skip its own per-block check; each
    backend says which options do that (``IndexDescription.pool_owned_options``).
    """
    return dict(describe_index(name).pool_owned_options)


def register_index(
    name: str,
    factory: IndexFactory,
    *,
    description: IndexDescription | None = None,
    replace: bool = False,
) -> None:
    """Register a third-party backend in the default registry (see ``IndexRegistry.register``)."""
    default_registry.register(name, factory, description=description, replace=replace)


def available_indexes() -> list[str]:
    """Names ``make_index`` accepts."""
    return default_registry.names()
