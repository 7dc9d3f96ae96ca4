"""The ``prefixkv`` command line, one module per subcommand.

:mod:`.main` builds the parser and runs a command (``prefixkv`` is
``prefixkv.adapters.lab.cli:main``); :mod:`.compare`, :mod:`.replay`,
:mod:`.calibrate` and :mod:`.cluster` each add one subcommand's flags and run it;
:mod:`.common` holds what they share (argument types, common flags, exit codes).
"""

from .common import CLIUsageError, parse_token_count, parse_token_counts
from .main import build_parser, main

__all__ = ["CLIUsageError", "build_parser", "main", "parse_token_count", "parse_token_counts"]
