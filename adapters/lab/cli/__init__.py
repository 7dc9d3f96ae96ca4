"""The ``prefixkv`` command line, one module per subcommand.

:mod:`.main` builds the parser and runs a command (``prefixkv`` is
``prefixkv.adapters.lab.cli:main``); :mod:`.compare`, :mod:`.replay`,
:mod:`.calibrate` and :mod:`.cluster` each add one subcommand's flags and run it;
:mod:`.common` holds what they share (argument types, common flags, exit codes);
:mod:`.signals` stops a command on Ctrl-C or SIGTERM without losing what finished.
Importing this package loads only :mod:`.main` and :mod:`.signals` (the standard
library), so the signal handler is in place before anything heavy loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .main import main

if TYPE_CHECKING:
    from .common import parse_token_count, parse_token_counts

__all__ = ["main", "parse_token_count", "parse_token_counts"]

_FROM_COMMON = ("parse_token_count", "parse_token_counts")


def __getattr__(name: str) -> object:
    # The argument types live with the subcommands' shared flags; loaded on first use.
    if name in _FROM_COMMON:
        from . import common

        return getattr(common, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
