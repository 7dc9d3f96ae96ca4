"""Instructions counted by valgrind's callgrind, which do not move with the machine's load.

:func:`count` runs a Python command under callgrind and returns its output with each
function's inclusive instructions (``callgrind_annotate --inclusive=yes``);
:func:`require_valgrind` stops a script that needs it with one line saying how to get it;
:func:`workload_command` is the command line of a script that counts compiled methods per
workload. ``decode_profile.py``, ``chain_profile.py`` and ``match_profile.py`` count
with them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

LINE = re.compile(r"\s*([\d,]+) \([ \d.]+%\)\s+(?:\*\s+)?(\S+?):(\S+)")


def require_valgrind(script: str) -> None:
    """Exit with one line when valgrind or callgrind_annotate is missing."""
    if not (shutil.which("valgrind") and shutil.which("callgrind_annotate")):
        raise SystemExit(f"{script} needs valgrind (Debian: apt install valgrind)")


def inclusive(annotated: str) -> dict[str, int]:
    """Function -> inclusive instructions, from ``callgrind_annotate --inclusive=yes``.

    A function listed under several files (its symbol and its source) keeps the
    largest count.
    """
    costs: dict[str, int] = {}
    for line in annotated.splitlines():
        m = LINE.match(line)
        if m:
            name = m.group(3).split(" ")[0].split("'")[0]
            costs[name] = max(costs.get(name, 0), int(m.group(1).replace(",", "")))
    return costs


def count(argv: Sequence[str], collect: Sequence[str] = ()) -> tuple[str, dict[str, int]]:
    """Run ``python argv...`` under callgrind: its standard output and each function's
    inclusive instructions. With ``collect``, only the instructions inside those
    functions are counted (``--toggle-collect``), so a count is its share of them."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        toggles = [f"--toggle-collect={name}" for name in collect]
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *toggles,
               sys.executable, *argv]  # fmt: skip
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=os.environ)
        annotated = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
    return done.stdout, inclusive(annotated)


def workload_command(
    doc: str,
    workloads: Iterable[str],
    run_child: Callable[[str], None],
    script: str,
    extra: Callable[[argparse.ArgumentParser], None] = lambda ap: None,
) -> argparse.Namespace | None:
    """Parse a per-workload profile's flags (``--workload``, repeatable; ``extra``'s).
    Under ``--child WORKLOAD`` this is the profiled process: it runs ``run_child`` and
    returns None. Otherwise it checks that counting can work (the compiled wheel is
    what runs, valgrind is there) and returns the flags."""
    from prefixkv.indexes.buildinfo import build_kind

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--workload", action="append", choices=sorted(workloads))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    extra(ap)
    args = ap.parse_args()
    if args.child:
        run_child(args.child)
        return None
    if build_kind() != "compiled":
        raise SystemExit(f"{script} counts compiled methods: run it on the wheel")
    require_valgrind(script)
    return args
