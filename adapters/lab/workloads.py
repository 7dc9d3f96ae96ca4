"""Where a run's requests come from: seeded built-in workloads, the seed example, traces.

The generators below are synthetic workloads with known prefix-sharing structure, as
trace requests; :func:`load_workloads` turns names (or a trace) into
:class:`Workload` s, and the seed example is the seed document's three requests
(SPEC BB-2, BB-3).

Each generator is a pure function of its arguments: it draws from its own
``random.Random(seed)``, so a seed names a workload the way a file names a trace.
The shapes follow the usual prefix-cache benchmarks (SGLang's and vLLM's).

Every generator also takes ``output_len``, the inclusive range of each request's
output length; ``vocab_size``, token ids are drawn from ``[1, vocab_size)``; and
``seed``, the workload's seed. Its size knobs are checked before anything is drawn:
a count is an int (at least 1, or 0 for ``system_len`` and ``depth``), a range an
inclusive ``(low, high)`` pair of ints with ``low`` at least 1 (0 for ``output_len``,
2 for ``root_len`` and ``thought_len``); ``vocab_size`` is at least 2. A knob out of
range raises :class:`WorkloadError` naming it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ParamSpec

from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.validation import check_count

from .progress import progress
from .traces import (
    ReadSettings,
    TraceFormat,
    TraceOptionError,
    TraceRequest,
    TraceSource,
    TraceStats,
    make_request,
    open_trace,
    stats_of,
)

__all__ = [
    "DEFAULT_WORKLOADS",
    "SEED_WORKLOAD",
    "WORKLOADS",
    "UnknownWorkloadError",
    "Workload",
    "WorkloadError",
    "few_shot",
    "load_workloads",
    "long_document",
    "make_workload",
    "multi_turn",
    "no_sharing",
    "seed_example",
    "shared_system_prompt",
    "trace_workload",
    "tree_of_thought",
    "workload_names",
]

P = ParamSpec("P")

LengthRange = tuple[int, int]
"""An inclusive ``(low, high)`` range of token counts."""


class WorkloadError(PrefixKVError):
    """A workload size knob or range is invalid."""


class UnknownWorkloadError(WorkloadError):
    """``make_workload`` was given a name that is not in ``WORKLOADS``."""


class _Tokens:
    """Token draws for one workload: ids in ``[1, vocab_size)`` from one seeded RNG.

    Every fresh segment starts with a head token no earlier segment of the same
    kind used (while the vocabulary lasts), so unrelated segments share no prefix
    at all, not even one token by chance, and the intended sharing is exact.
    """

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self._ids = range(1, vocab_size)
        self._heads: dict[str, set[int]] = {}

    def length(self, bounds: LengthRange) -> int:
        """A length drawn uniformly from the inclusive range."""
        return self.rng.randint(bounds[0], bounds[1])

    def fresh(self, n: int, kind: str, avoid: Collection[int] = ()) -> list[int]:
        """``n`` random ids whose first is new for ``kind`` and not in ``avoid``."""
        if n == 0:
            return []
        used = self._heads.setdefault(kind, set())
        if len(used) + len(avoid) >= len(self._ids):
            used.clear()  # vocabulary exhausted: heads may repeat from here on
        head = self.rng.choice(self._ids)
        if len(avoid) < len(self._ids):
            while head in used or head in avoid:
                head = self.rng.choice(self._ids)
        used.add(head)
        return [head, *self.rng.choices(self._ids, k=n - 1)]


_MINIMUM: Mapping[str, int] = MappingProxyType(
    {"system_len": 0, "depth": 0, "output_len": 0, "root_len": 2, "thought_len": 2, "vocab_size": 2}
)
"""The knobs whose least value is not 1."""


def _check_range(name: str, value: object, minimum: int) -> None:
    ok = (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(type(v) is int for v in value)
        and minimum <= value[0] <= value[1]
    )
    if not ok:
        raise WorkloadError(
            f"{name} must be a (low, high) pair of ints with {minimum} <= low <= high, "
            f"got {value!r}"
        )


def _checked(generator: Callable[P, list[TraceRequest]]) -> Callable[P, list[TraceRequest]]:
    """``generator`` with its knobs checked first, in signature order (module docstring).

    A knob whose default is a pair is a range, any other but ``seed`` a count.
    """
    signature = inspect.signature(generator)
    knobs = [
        (name, isinstance(p.default, tuple), _MINIMUM.get(name, 1))
        for name, p in signature.parameters.items()
        if name != "seed"
    ]

    @functools.wraps(generator)
    def checked(*args: P.args, **kwargs: P.kwargs) -> list[TraceRequest]:
        values = signature.bind(*args, **kwargs)
        values.apply_defaults()
        for name, is_range, minimum in knobs:
            value = values.arguments[name]
            if is_range:
                _check_range(name, value, minimum)
            else:
                check_count(name, value, lo=minimum, error=WorkloadError)
        return generator(*args, **kwargs)

    return checked


@_checked
def shared_system_prompt(
    num_requests: int = 200,
    *,
    system_len: int = 512,
    user_len: LengthRange = (32, 256),
    output_len: LengthRange = (5, 80),
    vocab_size: int = 32000,
    seed: int = 0,
) -> list[TraceRequest]:
    """Requests that share one system prompt and then ask something unique.

    Structure: every prompt is the same ``system_len`` tokens followed by a user part;
    any two prompts share exactly ``system_len`` leading tokens.

    Args:
        num_requests: number of requests.
        system_len: tokens of the common system prompt.
        user_len: range of the unique user part's length.
        output_len, vocab_size, seed: as every workload's (module docstring).

    Raises:
        WorkloadError: a knob is out of range.
    """
    draw = _Tokens(vocab_size, seed)
    system = draw.fresh(system_len, "system")
    return [
        make_request(
            f"sys-{i}",
            system + draw.fresh(draw.length(user_len), "user"),
            draw.fresh(draw.length(output_len), "output"),
        )
        for i in range(num_requests)
    ]


@_checked
def multi_turn(
    num_sessions: int = 32,
    *,
    turns: LengthRange = (2, 10),
    system_len: int = 0,
    user_len: LengthRange = (16, 160),
    output_len: LengthRange = (8, 96),
    vocab_size: int = 32000,
    seed: int = 0,
) -> list[TraceRequest]:
    """Chat sessions whose turns each resend the whole history, interleaved.

    Structure: turn ``k + 1``'s prompt is turn ``k``'s prompt, then turn ``k``'s
    output, then a new user message; different sessions share only the optional
    system prompt. Requests are ordered by a random interleaving of the sessions that
    keeps each session's turns in order. Ids: ``chat-<session>-<turn>``.

    Args:
        num_sessions: number of sessions.
        turns: range of turns per session.
        system_len: tokens of a system prompt all sessions start with (0: none).
        user_len: range of each user message's length.
        output_len, vocab_size, seed: as every workload's (module docstring).

    Raises:
        WorkloadError: a knob is out of range.
    """
    draw = _Tokens(vocab_size, seed)
    system = draw.fresh(system_len, "system")
    sessions: list[list[TraceRequest]] = []
    for s in range(num_sessions):
        history = list(system)
        session: list[TraceRequest] = []
        for t in range(draw.length(turns)):
            prompt = history + draw.fresh(draw.length(user_len), "user")
            reply = draw.fresh(draw.length(output_len), "output")
            rid = f"chat-{s}-{t}"
            parent = session[-1].id if session else None
            session.append(
                make_request(rid, prompt, reply, session=f"chat-{s}", parent=parent, turn=t + 1)
            )
            history = prompt + reply
        sessions.append(session)
    # Draw the next session in proportion to its remaining turns: a uniform shuffle
    # of all turns, with each session's own turns kept in order.
    slots = [s for s, session in enumerate(sessions) for _ in session]
    draw.rng.shuffle(slots)
    cursor = [0] * num_sessions
    order: list[TraceRequest] = []
    for s in slots:
        order.append(sessions[s][cursor[s]])
        cursor[s] += 1
    return order


@_checked
def few_shot(
    num_requests: int = 200,
    *,
    num_templates: int = 4,
    examples: LengthRange = (4, 8),
    example_len: LengthRange = (40, 120),
    question_len: LengthRange = (16, 64),
    output_len: LengthRange = (5, 80),
    vocab_size: int = 32000,
    seed: int = 0,
) -> list[TraceRequest]:
    """Few-shot prompts: one of a handful of example templates, then a question.

    Structure: each template is a run of worked examples; a request picks a template
    uniformly and appends its own question, so requests on the same template share
    exactly that template and requests on different templates share nothing.

    Args:
        num_requests: number of requests.
        num_templates: number of distinct templates.
        examples: range of examples per template.
        example_len: range of each example's length.
        question_len: range of each question's length.
        output_len, vocab_size, seed: as every workload's (module docstring).

    Raises:
        WorkloadError: a knob is out of range.
    """
    draw = _Tokens(vocab_size, seed)
    templates: list[list[int]] = []
    for _ in range(num_templates):
        template = draw.fresh(draw.length(example_len), "template")
        for _ in range(draw.length(examples) - 1):
            template += draw.fresh(draw.length(example_len), "example")
        templates.append(template)
    requests = []
    for i in range(num_requests):
        template = templates[draw.rng.randrange(num_templates)]
        prompt = template + draw.fresh(draw.length(question_len), "question")
        requests.append(
            make_request(f"fewshot-{i}", prompt, draw.fresh(draw.length(output_len), "output"))
        )
    return requests


@_checked
def tree_of_thought(
    num_trees: int = 8,
    *,
    depth: int = 3,
    branching: LengthRange = (2, 3),
    root_len: LengthRange = (256, 640),
    thought_len: LengthRange = (48, 224),
    unaligned_to: int = 16,
    output_len: LengthRange = (5, 80),
    vocab_size: int = 32000,
    seed: int = 0,
) -> list[TraceRequest]:
    """Branching reasoning: each node's prompt forks its parent's at an unaligned position.

    Structure: a tree's root is a fresh prompt. A child of a node takes the node's
    first ``p`` tokens and appends a fresh thought, where ``p`` is drawn from the
    node's own part (past the node's own fork point; for the root's children, from
    its second half) and is never a multiple of ``unaligned_to``. So any two prompts
    of a tree agree on exactly the first ``p`` tokens for some fork ``p`` (the
    lowest fork between them): the hit ends inside a block, which is where hash
    chains and radix trees differ. Trees share nothing. Requests come tree by tree,
    breadth first; ids ``tot-<tree>-r`` for a root, ``tot-<tree>-<path>`` below
    it (e.g. ``tot-3-0.2``: child 2 of the root's child 0).

    Args:
        num_trees: number of independent trees.
        depth: levels below the root.
        branching: range of children per node.
        root_len: range of the root prompt's length (at least 2).
        thought_len: range of each appended thought's length (at least 2).
        unaligned_to: fork positions avoid multiples of this (1: no constraint).
        output_len, vocab_size, seed: as every workload's (module docstring).

    Raises:
        WorkloadError: a knob is out of range.
    """
    draw = _Tokens(vocab_size, seed)
    requests: list[TraceRequest] = []
    for tree in range(num_trees):
        root = draw.fresh(draw.length(root_len), "root")
        # (path, prompt, index where this node's own tokens start)
        level: list[tuple[str, list[int], int]] = [("r", root, len(root) // 2)]
        for d in range(depth + 1):
            next_level: list[tuple[str, list[int], int]] = []
            for path, prompt, own_start in level:
                out = draw.fresh(draw.length(output_len), "output")
                requests.append(make_request(f"tot-{tree}-{path}", prompt, out))
                if d < depth:
                    node = (path, prompt, own_start)
                    next_level += _thoughts(draw, node, branching, thought_len, unaligned_to)
            level = next_level
    return requests


def _thoughts(
    draw: _Tokens,
    node: tuple[str, list[int], int],
    branching: LengthRange,
    thought_len: LengthRange,
    unaligned_to: int,
) -> list[tuple[str, list[int], int]]:
    """A tree-of-thought node's children: each forks the node's own part at an
    unaligned position and appends a fresh thought."""
    path, prompt, own_start = node
    children = []
    for c in range(draw.length(branching)):
        # own_start < len(prompt) always (roots have >= 2 tokens, thoughts >= 2), and
        # of two consecutive positions at most one is a multiple: a choice exists.
        lo, hi = own_start, len(prompt)
        p = draw.rng.choice([x for x in range(lo, hi + 1) if unaligned_to == 1 or x % unaligned_to])
        # The thought must not start with the parent's token at p, so the fork is
        # exactly at p; siblings' heads differ as fresh heads do.
        thought = draw.fresh(draw.length(thought_len), "thought", prompt[p : p + 1])
        child_path = str(c) if path == "r" else f"{path}.{c}"
        children.append((child_path, prompt[:p] + thought, p + 1))
    return children


@_checked
def no_sharing(
    num_requests: int = 200,
    *,
    prompt_len: LengthRange = (128, 2048),
    output_len: LengthRange = (5, 80),
    vocab_size: int = 32000,
    seed: int = 0,
) -> list[TraceRequest]:
    """Unrelated prompts: the baseline where a prefix cache can only lose.

    Structure: prompts start with pairwise different tokens (while fewer than
    ``vocab_size - 1`` requests), so no two share even one leading token.

    Args:
        num_requests: number of requests.
        prompt_len: range of each prompt's length.
        output_len, vocab_size, seed: as every workload's (module docstring).

    Raises:
        WorkloadError: a knob is out of range.
    """
    draw = _Tokens(vocab_size, seed)
    return [
        make_request(
            f"unique-{i}",
            draw.fresh(draw.length(prompt_len), "prompt"),
            draw.fresh(draw.length(output_len), "output"),
        )
        for i in range(num_requests)
    ]


@_checked
def long_document(
    num_documents: int = 8,
    *,
    questions: LengthRange = (16, 32),
    document_len: LengthRange = (768, 1792),
    question_len: LengthRange = (16, 96),
    output_len: LengthRange = (5, 80),
    vocab_size: int = 32000,
    seed: int = 0,
) -> list[TraceRequest]:
    """Long-document QA: several questions asked after each of a few long documents.

    Structure: a request is a document followed by a question; requests on the same
    document share exactly the document, others nothing. Questions of all documents
    arrive shuffled, so documents compete for the cache. Ids ``doc-<doc>-<question>``.

    Args:
        num_documents: number of documents.
        questions: range of questions per document.
        document_len: range of each document's length.
        question_len: range of each question's length.
        output_len, vocab_size, seed: as every workload's (module docstring).

    Raises:
        WorkloadError: a knob is out of range.
    """
    draw = _Tokens(vocab_size, seed)
    requests: list[TraceRequest] = []
    for d in range(num_documents):
        document = draw.fresh(draw.length(document_len), "document")
        for q in range(draw.length(questions)):
            prompt = document + draw.fresh(draw.length(question_len), "question")
            requests.append(
                make_request(f"doc-{d}-{q}", prompt, draw.fresh(draw.length(output_len), "output"))
            )
    draw.rng.shuffle(requests)
    return requests


WORKLOADS: Mapping[str, Callable[..., list[TraceRequest]]] = MappingProxyType(
    {
        "shared_system_prompt": shared_system_prompt,
        "multi_turn": multi_turn,
        "few_shot": few_shot,
        "tree_of_thought": tree_of_thought,
        "no_sharing": no_sharing,
        "long_document": long_document,
    }
)
"""Workload generators by name (read-only), for the CLI and benchmarks."""


def make_workload(name: str, **kwargs: Any) -> list[TraceRequest]:
    """Generate the workload ``name`` with the generator's keyword arguments.

    Args:
        name: a key of :data:`WORKLOADS`.
        **kwargs: passed to the generator (size knobs, ``vocab_size``, ``seed``).

    Raises:
        UnknownWorkloadError: no such workload (the message lists the names).
        WorkloadError: a knob is out of range.
    """
    generator = WORKLOADS.get(name)
    if generator is None:
        raise UnknownWorkloadError(
            f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}"
        )
    return generator(**kwargs)


SEED_WORKLOAD = "seed"
"""The seed document's example: A (80 tokens), B = A[:30] + 50 new, A again."""

DEFAULT_WORKLOADS: tuple[str, ...] = (
    SEED_WORKLOAD,
    "shared_system_prompt",
    "multi_turn",
    "tree_of_thought",
    "few_shot",
)
"""What ``prefixkv compare`` runs when neither a workload nor a trace is named."""


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests to compare on, where they came from, and their sizes.

    Attributes:
        name: workload name or trace file name.
        source: how it was made (generator call, or the trace and its format).
        requests: the requests in arrival order, re-iterable: a list for built-in
            workloads, a :class:`~prefixkv.adapters.lab.traces.TraceSource` (read
            again on each pass, never held whole) for traces.
        stats: counts and sizes, from a scan (traces) or the list.
        notes: what the report must say about it (a hash-id trace's granularity).
        path: the trace file, ``None`` for built-in workloads.
        tokens_per_id: a hash-id trace's tokens per id (its sharing granularity);
            ``None`` for token traces and built-in workloads.
        rejected_requests: requests left out for their length
            (:func:`~prefixkv.adapters.lab.admission.admit`), as vLLM refuses them.
    """

    name: str
    source: str
    requests: Iterable[TraceRequest]
    stats: TraceStats
    notes: tuple[str, ...] = ()
    path: str | None = None
    tokens_per_id: int | None = None
    rejected_requests: int = 0


def seed_example(seed: int = 0, *, vocab_size: int = 32000) -> list[TraceRequest]:
    """The seed document's example (SPEC BB-2, BB-3) as three requests.

    ``A`` is 80 random tokens, ``B`` is ``A[:30]`` followed by 50 new tokens (the
    first of them differs from ``A[30]``), then ``A`` again. At block size 16 the
    hash chain hits 16 of B (tokens 16..29 are recomputed) and 64 of A again; the
    radix tree at page size 1 hits 30 and 79. Each request decodes 4 tokens.
    """
    rng = random.Random(seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(1, vocab_size) for _ in range(n)]

    a = draw(80)
    fresh = draw(50)
    while fresh[0] == a[30]:
        fresh[0] = rng.randrange(1, vocab_size)
    return [
        make_request("A", a, draw(4)),
        make_request("B", a[:30] + fresh, draw(4)),
        make_request("A-again", a, draw(4)),
    ]


def workload_names() -> list[str]:
    """Every name ``--workload`` accepts."""
    return sorted([*WORKLOADS, SEED_WORKLOAD])


def trace_workload(source: TraceSource, trace: str, *, quiet: bool = True) -> Workload:
    """An opened trace as a workload: scanned once (sizes only, every request
    validated) with a progress bar over its bytes.

    Raises:
        TraceFormatError: a malformed trace (the message names file and line).
        OSError: the trace cannot be read.
    """
    bar = progress(source.input_bytes(), "loading", quiet=quiet, unit="B")
    try:
        stats = source.scan(bar.update)
    finally:
        bar.close()
    notes = tuple(n for n in (source.order_note(), source.granularity_note()) if n)
    name = os.path.basename(os.path.normpath(trace))
    return Workload(
        name,
        f"{trace} ({source.describe()})",
        source,
        stats,
        notes,
        str(trace),
        source.tokens_per_id,
    )


def load_workloads(
    names: Sequence[str] | None,
    trace: str | None,
    *,
    max_requests: int | None = None,
    tokens_per_id: int | None = None,
    seed: int = 0,
    trace_format: TraceFormat | None = None,
    settings: ReadSettings | None = None,
    quiet: bool = True,
) -> list[Workload]:
    """Build the workloads of a comparison: named generators, or one trace.

    A trace is opened as a stream and scanned once (sizes only, every request
    validated) with a progress bar over its bytes.

    Args:
        names: generator names (``None`` and no trace: :data:`DEFAULT_WORKLOADS`).
        trace: a trace file or folder instead (any format :func:`open_trace` reads).
        max_requests: keep the first this many requests of each.
        tokens_per_id: hash-id traces: tokens each id expands to (default: the
            format's block size).
        seed: generator seed, and the hash-id traces' token seed.
        trace_format: the trace's format (default: detected).
        settings: the trace reader's settings (limits, vocabulary, outputs); its
            ``tokens_per_id`` and ``seed`` are replaced by the arguments above.
        quiet: no progress bar.

    Raises:
        WorkloadError: both a trace and names, a bad ``max_requests``.
        UnknownWorkloadError: a name that is neither a generator nor ``seed``.
        TraceOptionError: ``tokens_per_id`` without a hash-id trace.
        TraceFormatError: a malformed trace (the message names file and line).
        OSError: the trace cannot be read.
    """
    if max_requests is not None and (type(max_requests) is not int or max_requests < 1):
        raise WorkloadError(f"max_requests must be a positive int, got {max_requests!r}")
    if trace is not None:
        if names:
            raise WorkloadError(f"give workloads or a trace, not both: {list(names)} and {trace}")
        base = ReadSettings() if settings is None else settings
        opts = dataclasses.replace(base, tokens_per_id=tokens_per_id, seed=seed)
        source = open_trace(trace, trace_format, max_requests=max_requests, settings=opts)
        return [trace_workload(source, trace, quiet=quiet)]
    if tokens_per_id is not None:
        raise TraceOptionError(
            f"tokens_per_id={tokens_per_id} applies to hash-id traces (--trace) only"
        )
    out: list[Workload] = []
    for name in names or DEFAULT_WORKLOADS:
        if not any(w.name == name for w in out):
            out.append(_generated_workload(name, seed, max_requests))
    return out


def _generated_workload(name: str, seed: int, max_requests: int | None) -> Workload:
    """A built-in generator's requests (or the seed example), the first ``max_requests``."""
    if name == SEED_WORKLOAD:
        requests = seed_example(seed)
        source_text = f"seed document example (seed={seed})"
    else:
        if name not in WORKLOADS:
            raise UnknownWorkloadError(
                f"unknown workload {name!r}; known: {', '.join(workload_names())}"
            )
        requests = make_workload(name, seed=seed)
        source_text = f"{name}(seed={seed}), default sizes"
    kept = requests[:max_requests]
    return Workload(name, source_text, kept, stats_of(kept))
