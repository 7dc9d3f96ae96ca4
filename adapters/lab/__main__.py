"""``python -m prefixkv.adapters.lab``: the ``prefixkv`` command line (see :mod:`.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
