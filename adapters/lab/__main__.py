"""``python -m prefixkv.adapters.lab``: the ``prefixkv`` command line (see :mod:`.cli`)."""

import contextlib
import os
import sys

from .cli import main

if __name__ == "__main__":
    status = main()
    if status > 128:
        # Stopped by a signal (128 + its number). Under ``python -m``, CPython reports an
        # exit by SIGINT whenever a KeyboardInterrupt once left code run through its
        # PyRun_* functions (as some C extensions' imports do), even though the command
        # caught it: leave now, with the status that names the signal. Everything is
        # written and closed; only the streams' buffers remain.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(status)
    sys.exit(status)
