"""Seeded synthetic workloads with known prefix-sharing structure, as trace requests.

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

import functools
import inspect
import random
from array import array
from collections.abc import Callable, Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ParamSpec

from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.validation import check_count

from .traces import TraceRequest

__all__ = [
    "WORKLOADS",
    "UnknownWorkloadError",
    "WorkloadError",
    "few_shot",
    "long_document",
    "make_workload",
    "multi_turn",
    "no_sharing",
    "shared_system_prompt",
    "tree_of_thought",
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


def _request(
    request_id: str,
    prompt: Sequence[int],
    output: Sequence[int],
    *,
    session: str | None = None,
    parent: str | None = None,
    turn: int | None = None,
) -> TraceRequest:
    """A request with its (already valid) tokens in compact arrays."""
    return TraceRequest(
        request_id, array("I", prompt), array("I", output), None, session, parent, turn
    )


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
        _request(
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
                _request(rid, prompt, reply, session=f"chat-{s}", parent=parent, turn=t + 1)
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
            _request(f"fewshot-{i}", prompt, draw.fresh(draw.length(output_len), "output"))
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
                requests.append(_request(f"tot-{tree}-{path}", prompt, out))
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
        _request(
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
                _request(f"doc-{d}-{q}", prompt, draw.fresh(draw.length(output_len), "output"))
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
