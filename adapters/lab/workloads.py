"""Where a run's requests come from: seeded built-in workloads, the seed example, traces.

Each generator is a pure function of its arguments, drawing from its own
``random.Random(seed)``, with the prefix-sharing shapes of SGLang's and vLLM's
benchmarks. Every generator takes ``output_len`` (an inclusive range), ``vocab_size``
(ids in ``[1, vocab_size)``) and ``seed``. Its knobs are checked before anything is
drawn (:class:`WorkloadError` names the bad one): a count is an int >= 1 (>= 0 for
``system_len`` and ``depth``), a range an inclusive ``(low, high)`` pair of ints with
``low`` >= 1 (0 for ``output_len``, 2 for ``root_len`` and ``thought_len``).
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

LengthRange = tuple[int, int]  # inclusive


class WorkloadError(PrefixKVError):
    """A workload size knob or range is invalid."""


class UnknownWorkloadError(WorkloadError):
    """``make_workload`` was given a name that is not in ``WORKLOADS``."""


class _Tokens:
    """Token draws from one seeded RNG; a fresh segment's head token is new for its kind
    (while the vocabulary lasts), so unrelated segments share not one token by chance."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self._ids = range(1, vocab_size)
        self._heads: dict[str, set[int]] = {}

    def length(self, bounds: LengthRange) -> int:
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

    def output(self, bounds: LengthRange) -> list[int]:
        """A fresh output of a length drawn from ``bounds``."""
        return self.fresh(self.length(bounds), "output")

    def ask(
        self, rid: str, prefix: list[int], bounds: LengthRange, kind: str, output: LengthRange
    ) -> TraceRequest:
        """Request ``rid``: ``prefix`` and a fresh ``kind`` part, then a fresh output."""
        return make_request(
            rid, prefix + self.fresh(self.length(bounds), kind), self.output(output)
        )


_MINIMUM = dict(system_len=0, depth=0, output_len=0, root_len=2, thought_len=2, vocab_size=2)


def _checked(generator: Callable[P, list[TraceRequest]]) -> Callable[P, list[TraceRequest]]:
    """``generator`` with its knobs checked first, in signature order: a knob whose
    default is a pair is a range, any other but ``seed`` a count."""
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
        for name, is_range, low in knobs:
            value = values.arguments[name]
            if not is_range:
                check_count(name, value, lo=low, error=WorkloadError)
            elif not (
                isinstance(value, (tuple, list))
                and len(value) == 2
                and all(type(v) is int for v in value)
                and low <= value[0] <= value[1]
            ):
                raise WorkloadError(
                    f"{name} must be a (low, high) pair of ints with {low} <= low <= high, "
                    f"got {value!r}"
                )
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
    """Requests that share exactly one ``system_len``-token system prompt, then a user part."""
    draw = _Tokens(vocab_size, seed)
    system = draw.fresh(system_len, "system")
    return [draw.ask(f"sys-{i}", system, user_len, "user", output_len) for i in range(num_requests)]


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

    Turn ``k + 1``'s prompt is turn ``k``'s prompt and output and a new user message;
    sessions share only the optional system prompt. The order is a random interleaving
    that keeps each session's turns in order. Ids: ``chat-<session>-<turn>``.
    """
    draw = _Tokens(vocab_size, seed)
    system = draw.fresh(system_len, "system")
    sessions: list[list[TraceRequest]] = []
    for s in range(num_sessions):
        history = list(system)
        session: list[TraceRequest] = []
        for t in range(draw.length(turns)):
            prompt = history + draw.fresh(draw.length(user_len), "user")
            reply = draw.output(output_len)
            parent = session[-1].id if session else None
            session.append(
                make_request(
                    f"chat-{s}-{t}", prompt, reply, session=f"chat-{s}", parent=parent, turn=t + 1
                )
            )
            history = prompt + reply
        sessions.append(session)
    # a uniform shuffle of all turns, each session's own kept in order
    slots = [s for s, session in enumerate(sessions) for _ in session]
    draw.rng.shuffle(slots)
    turns_left = [iter(session) for session in sessions]
    return [next(turns_left[s]) for s in slots]


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
    """Few-shot prompts: one of ``num_templates`` runs of worked examples, then a question;
    requests on one template share exactly it, others nothing."""
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
        requests.append(draw.ask(f"fewshot-{i}", template, question_len, "question", output_len))
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

    A child takes its node's first ``p`` tokens, ``p`` drawn past the node's own fork
    point (for the root's children, in its second half) and never a multiple of
    ``unaligned_to``, then a fresh thought: hits end inside a block, where hash chains
    and radix trees differ. Trees share nothing; they come tree by tree, breadth first,
    ids ``tot-<tree>-r`` for a root and ``tot-<tree>-<path>`` below (``tot-3-0.2``).
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
                requests.append(make_request(f"tot-{tree}-{path}", prompt, draw.output(output_len)))
                if d == depth:
                    continue
                # of two consecutive positions at most one is a multiple: a choice exists
                span = range(own_start, len(prompt) + 1)
                forks = [x for x in span if x % unaligned_to] if unaligned_to > 1 else span
                for c in range(draw.length(branching)):
                    p = draw.rng.choice(forks)
                    # a thought never starts with the parent's token at p: the fork is at p
                    thought = draw.fresh(draw.length(thought_len), "thought", prompt[p : p + 1])
                    child = str(c) if path == "r" else f"{path}.{c}"
                    next_level.append((child, prompt[:p] + thought, p + 1))
            level = next_level
    return requests


@_checked
def no_sharing(
    num_requests: int = 200,
    *,
    prompt_len: LengthRange = (128, 2048),
    output_len: LengthRange = (5, 80),
    vocab_size: int = 32000,
    seed: int = 0,
) -> list[TraceRequest]:
    """Unrelated prompts (pairwise different first tokens): a prefix cache can only lose."""
    draw = _Tokens(vocab_size, seed)
    return [
        draw.ask(f"unique-{i}", [], prompt_len, "prompt", output_len) for i in range(num_requests)
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
    """Long-document QA: questions after each of a few long documents, shuffled, so the
    documents compete for the cache. Ids ``doc-<doc>-<question>``."""
    draw = _Tokens(vocab_size, seed)
    requests: list[TraceRequest] = []
    for d in range(num_documents):
        document = draw.fresh(draw.length(document_len), "document")
        for q in range(draw.length(questions)):
            rid = f"doc-{d}-{q}"
            requests.append(draw.ask(rid, document, question_len, "question", output_len))
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
"""Workload generators by name (read-only)."""


def make_workload(name: str, **kwargs: Any) -> list[TraceRequest]:
    """Generate the workload ``name`` of :data:`WORKLOADS` with the generator's keywords.

    Raises:
        UnknownWorkloadError: no such workload (the message lists the names).
    """
    generator = WORKLOADS.get(name)
    if generator is None:
        raise UnknownWorkloadError(
            f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}"
        )
    return generator(**kwargs)


_SEED = "seed"  # the seed document's example

DEFAULT_WORKLOADS = (_SEED, "shared_system_prompt", "multi_turn", "tree_of_thought", "few_shot")
"""What ``prefixkv compare`` runs when neither a workload nor a trace is named."""


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests to compare on (in arrival order, re-iterable: a list or a
    :class:`~prefixkv.adapters.lab.traces.TraceSource`), where they came from, their
    sizes, the report's notes on them, and the requests left out for their length.

    Attributes:
        path: the trace file, ``None`` for built-in workloads.
        tokens_per_id: a hash-id trace's tokens per id; ``None`` for token traces and
            built-in workloads (the boundary-accounting default reads it).
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
    """The seed document's example (SPEC BB-2, BB-3): ``A`` (80 random tokens), ``B``
    (``A[:30]`` and 50 new tokens), ``A`` again; each decodes 4 tokens."""
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
    return sorted([*WORKLOADS, _SEED])


def trace_workload(source: TraceSource, trace: str, *, quiet: bool = True) -> Workload:
    """An opened trace as a workload, scanned once (every request validated) with a
    progress bar over its bytes."""
    bar = progress(source.input_bytes(), "loading", quiet=quiet, unit="B")
    try:
        stats = source.scan(bar.update)
    finally:
        bar.close()
    notes = tuple(n for n in (source.order_note(), source.granularity_note()) if n)
    name = os.path.basename(os.path.normpath(trace))
    description = f"{trace} ({source.describe()})"
    return Workload(name, description, source, stats, notes, str(trace), source.tokens_per_id)


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
    """The workloads of a comparison: named generators (default
    :data:`DEFAULT_WORKLOADS`) or one trace (:func:`trace_workload`), the first
    ``max_requests`` of each; ``tokens_per_id`` and ``seed`` replace ``settings``'.

    Raises:
        WorkloadError: both a trace and names, a bad ``max_requests``.
        UnknownWorkloadError: a name that is neither a generator nor ``seed``.
        TraceOptionError: ``tokens_per_id`` without a hash-id trace.
        TraceFormatError: a malformed trace (the message names file and line).
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
    for name in dict.fromkeys(names or DEFAULT_WORKLOADS):
        if name == _SEED:
            requests = seed_example(seed)
            source_text = f"seed document example (seed={seed})"
        elif name in WORKLOADS:
            requests = make_workload(name, seed=seed)
            source_text = f"{name}(seed={seed}), default sizes"
        else:
            raise UnknownWorkloadError(
                f"unknown workload {name!r}; known: {', '.join(workload_names())}"
            )
        kept = requests[:max_requests]
        out.append(Workload(name, source_text, kept, stats_of(kept)))
    return out
