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

from .main import main

__all__ = ["main"]
