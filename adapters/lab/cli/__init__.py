"""The ``prefixkv`` command line, a module per subcommand; importing it loads only
:mod:`.main` and :mod:`.signals`, so the signal handler is in before anything heavy."""

from .main import main

__all__ = ["main"]
