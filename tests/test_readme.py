"""The READMEs: every Python example runs as written, standalone, with no deprecated name,
and prints what the text says; every relative link resolves; every SPEC id cited anywhere
is defined in exactly one README; the front door stays a front door."""

from __future__ import annotations

import contextlib
import functools
import io
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRONT = ROOT / "README.md"
READMES = [FRONT] + sorted(
    p
    for folder in ("indexes", "storage", "adapters", "tests", "benchmarks")
    for p in (ROOT / folder).rglob("README.md")
)
# Its examples run in tests/router/test_router_readme.py.
OWN_TEST = {ROOT / "adapters" / "router" / "README.md"}
FRONT_DOOR_MAX_LINES = 300

BLOCK = re.compile(r"```python\n(.*?)```", flags=re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SPEC_ID = re.compile(r"\b(?:HC|RX|BB|VL|SG)-\d+\b")
SPEC_DEFINITION = re.compile(r"\*\*((?:HC|RX|BB|VL|SG)-\d+)\*\*")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


class Ran:
    """One example: its source, the names it defined, what it printed, what it warned."""

    def __init__(self, path: Path, source: str) -> None:
        self.source = source
        self.scope: dict[str, Any] = {}
        out = io.StringIO()
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
            warnings.simplefilter("always")
            exec(compile(source, str(path), "exec"), self.scope)
        self.lines = out.getvalue().splitlines()
        # A prefixkv deprecation names a prefixkv path or is raised at the caller's line.
        self.deprecated = [
            str(w.message)
            for w in caught
            if issubclass(w.category, DeprecationWarning)
            and (w.filename == str(path) or "prefixkv" in str(w.message))
        ]


@functools.cache
def run_examples(path: Path) -> tuple[Ran, ...]:
    """Each ```python block of ``path`` in a fresh namespace, in order (run once per process)."""
    return tuple(Ran(path, source) for source in BLOCK.findall(path.read_text()))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6} (.*)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_readmes_are_found() -> None:
    names = {rel(p) for p in READMES}
    for expected in (
        "README.md",
        "indexes/README.md",
        "storage/README.md",
        "adapters/README.md",
        "adapters/router/README.md",
        "adapters/lab/README.md",
        "tests/README.md",
        "benchmarks/README.md",
    ):
        assert expected in names


@pytest.mark.parametrize("path", [p for p in READMES if p not in OWN_TEST], ids=rel)
def test_examples_run_standalone_without_deprecated_names(path: Path) -> None:
    for ran in run_examples(path):
        assert not ran.deprecated, f"{rel(path)}: {ran.deprecated}\n{ran.source}"


def test_front_door_examples_print_what_the_text_says() -> None:
    ran = run_examples(FRONT)
    assert len(ran) >= 2
    lines = [line for r in ran for line in r.lines]
    assert "hash_chain 0 16 64" in lines and "radix 0 30 79" in lines
    engine = [re.fullmatch(r"(none|hash_chain|radix) (\d+) (\[.*\])", line) for line in lines]
    rows = {m.group(1): (int(m.group(2)), m.group(3)) for m in engine if m}
    assert rows.keys() == {"none", "hash_chain", "radix"}
    assert len({out for _, out in rows.values()}) == 1  # identical tokens for all three
    prefill = {name: n for name, (n, _) in rows.items()}
    assert prefill == {"none": 240, "hash_chain": 160, "radix": 131}  # as the comment says
    assert "none 240, hash_chain 160, radix 131" in FRONT.read_text()


def test_room_examples_print_what_their_comments_say() -> None:
    adapters = [line for r in run_examples(ROOT / "adapters" / "README.md") for line in r.lines]
    assert "a 0 ([1, 2, 3, 4, 5],)" in adapters and "b 64 ([1, 2, 3, 4, 6],)" in adapters
    assert "r1 0" in adapters and "r2 99" in adapters
    indexes = [line for r in run_examples(ROOT / "indexes" / "README.md") for line in r.lines]
    assert indexes == ["[10, 11, 12, 13]"]
    (storage,) = [r.lines for r in run_examples(ROOT / "storage" / "README.md")]
    assert storage == ["True True"]


def test_dataframe_example_is_short_and_gives_dataframes() -> None:
    pandas = pytest.importorskip("pandas")
    (ran,) = [
        r
        for r in run_examples(ROOT / "adapters" / "lab" / "README.md")
        if "compare_backends" in r.source
    ]
    assert len([line for line in ran.source.splitlines() if line.strip()]) <= 5
    t = ran.scope["t"]
    assert isinstance(t.requests, pandas.DataFrame) and isinstance(t.runs, pandas.DataFrame)
    # one scheduler (vLLM's) under every backend: only the index varies
    assert set(ran.scope["arrival"]["engine"]) == {"vllm"}
    assert len(t.requests) == 2 * 3 * 60  # k_live and arrival, three backends, 60 requests
    printed = "\n".join(ran.lines)
    assert "ttft_p50_s" in printed and "k_live" in printed and "arrival" in printed


@pytest.mark.parametrize("path", READMES, ids=rel)
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{rel(path)}: {broken}"


def test_every_cited_spec_id_is_defined_in_one_readme() -> None:
    defined: dict[str, list[str]] = {}
    for path in READMES:
        for spec_id in SPEC_DEFINITION.findall(path.read_text()):
            defined.setdefault(spec_id, []).append(rel(path))
    twice = {k: v for k, v in defined.items() if len(v) > 1}
    assert not twice, twice
    cited: dict[str, str] = {}
    sources = [*READMES, *(p for d in ("indexes", "storage", "adapters", "tests", "benchmarks")
                           for p in (ROOT / d).rglob("*.py"))]  # fmt: skip
    for path in sources:
        for spec_id in SPEC_ID.findall(path.read_text()):
            cited.setdefault(spec_id, rel(path))
    missing = {k: v for k, v in cited.items() if k not in defined}
    assert not missing, f"cited but defined in no README: {missing}"
    assert len(cited) >= 38  # HC-1..13, RX-1..7, BB-1..8, VL-1..4, SG-1..6


def test_front_door_stays_short_and_carries_no_bookkeeping() -> None:
    text = FRONT.read_text()
    assert len(text.splitlines()) <= FRONT_DOOR_MAX_LINES
    for word in ("goal", "this VM", "TBD"):
        assert word not in text, word
    assert not re.search(r"\bcommit [0-9a-f]{7}\b", text)
