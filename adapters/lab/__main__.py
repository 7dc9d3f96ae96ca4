"""``python -m prefixkv.adapters.lab``: the ``prefixkv`` command line."""

import contextlib
import os
import sys

from .cli import main

if __name__ == "__main__":
    status = main()
    if status > 128:
        # Stopped by a signal: exit now with its status, since CPython under ``python -m``
        # would report SIGINT once a caught KeyboardInterrupt left C-run code.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(status)
    sys.exit(status)
