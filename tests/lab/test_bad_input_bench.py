"""``calibrate --from-vllm-bench`` against hostile results files: every number
range-checked, every file bounded, the reading linear.

Files are generated: one per-request value replaced by one of the wrong type or
range (huge, negative, NaN, infinite, a bool, text, a list), whole documents of random
JSON, special files (a FIFO, ``/dev/zero``, a folder) and files past the size or value
cap. Each is a :class:`CalibrationInputError` naming the file, and through the CLI
exit 2, one line, no traceback, no profile written. The steps are read back in time
linear in the requests (counted in calls, never timed), with the same samples as the
definition (a direct, quadratic reading kept here as the reference).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from helpers import TEST_DATA
from hypothesis import given, settings
from hypothesis import strategies as st
from special_files import fifo_valve

pytest.importorskip("scipy")

from prefixkv.adapters.lab.cli import main
from prefixkv.adapters.lab.sim import StepSample
from prefixkv.adapters.lab.sim.bench_results import (
    BenchRequest,
    CalibrationInputError,
    bench_samples,
    read_vllm_bench,
)
from prefixkv.adapters.lab.sim.profile import attention_pairs

BENCH = TEST_DATA / "vllm_bench" / "tiny-llama-cpu.json"


def _doc(n: int = 6) -> dict[str, Any]:
    """A valid results document of ``n`` requests, one at a time."""
    return {
        "model_id": "m",
        "input_lens": [16 * (k + 1) for k in range(n)],
        "output_lens": [4] * n,
        "start_times": [float(k) for k in range(n)],
        "ttfts": [0.01] * n,
        "itls": [[0.002, 0.002, 0.002] for _ in range(n)],
        "errors": [""] * n,
    }


def _write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc, allow_nan=True))
    return path


def _text(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_bytes(text.encode(encoding))
    return path


# ------------------------------------------------------------- values out of range

NOT_A_NUMBER = st.one_of(
    st.booleans(),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
    st.none(),
)
BAD_VALUES: dict[str, Any] = {
    "input_lens": st.one_of(
        NOT_A_NUMBER,
        st.integers(max_value=0),
        st.integers(min_value=2**24 + 1),
        st.floats(),
        st.just(10**400),
    ),
    "output_lens": st.one_of(
        NOT_A_NUMBER, st.integers(max_value=-1), st.integers(min_value=2**24 + 1), st.floats()
    ),
    "start_times": st.one_of(
        NOT_A_NUMBER,
        st.floats(min_value=1e10, exclude_min=True),
        st.floats(max_value=-1e10, exclude_max=True),
        st.just(math.nan),
    ),
    "ttfts": st.one_of(
        NOT_A_NUMBER,
        st.floats(max_value=1e-6, exclude_max=True),
        st.floats(min_value=1e6, exclude_min=True),
        st.just(math.nan),
    ),
    "itls": st.one_of(
        st.booleans(),
        st.text(max_size=4),
        st.integers(),
        st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
        st.lists(
            st.one_of(
                NOT_A_NUMBER,
                st.floats(max_value=0, exclude_max=True),
                st.floats(min_value=1e6, exclude_min=True),
                st.just(math.nan),
            ),
            min_size=1,
            max_size=3,
        ),
    ),
}


@settings(max_examples=100)
@given(data=st.data(), key=st.sampled_from(sorted(BAD_VALUES)), index=st.integers(0, 5))
def test_a_per_request_value_out_of_range_is_named(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, key: str, index: int
) -> None:
    doc = _doc()
    value = data.draw(BAD_VALUES[key])
    if key == "itls" and isinstance(value, list) and value:
        doc["itls"][index] = [*doc["itls"][index][:-1], value[0]]  # one gap out of range
    else:
        doc[key][index] = value
    path = _write(tmp_path_factory.mktemp("bench") / "r.json", doc)
    with pytest.raises(CalibrationInputError) as info:
        read_vllm_bench(path)
    message = str(info.value)
    assert message.startswith(f"{path}") and "\n" not in message
    assert f"request {index}:" in message or "not JSON" in message


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from([*_doc(), "x"]), children, max_size=6)
    ),
    max_leaves=20,
)


@settings(max_examples=150)
@given(doc=JSON)
def test_any_json_document_is_read_or_named(
    tmp_path_factory: pytest.TempPathFactory, doc: Any
) -> None:
    path = _write(tmp_path_factory.mktemp("bench") / "r.json", doc)
    try:
        requests, _ = read_vllm_bench(path)
    except CalibrationInputError as exc:
        assert str(exc).startswith(str(path))
        return
    for r in requests:  # whatever is read is in range
        assert type(r.prompt_tokens) is int and 1 <= r.prompt_tokens <= 2**24
        assert math.isfinite(r.start_s) and 1e-6 <= r.ttft_s <= 1e6
        assert all(0 <= g <= 1e6 for g in r.itl_s)


# ------------------------------------------------------------ files that never end


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A FIFO without a writer. Should a reader block on it, a writer comes after a
    while and closes at once, so a blocked test fails on EOF instead of hanging."""
    path = tmp_path / "results.json"
    os.mkfifo(path)
    with fifo_valve(path):
        yield path


def test_a_fifo_is_refused_before_it_is_opened(fifo: Path) -> None:
    with pytest.raises(CalibrationInputError, match=f"{fifo}: a FIFO, not a regular file"):
        read_vllm_bench(fifo)


@pytest.mark.parametrize(
    ("path", "kind"), [("/dev/zero", "a character device"), ("/dev/null", "a character device")]
)
def test_a_device_is_refused(path: str, kind: str) -> None:
    with pytest.raises(CalibrationInputError, match=f"{path}: {kind}, not a regular file"):
        read_vllm_bench(path)


def test_a_socket_and_a_folder_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CalibrationInputError, match="a folder, not a regular file"):
        read_vllm_bench(tmp_path)
    sock_path = tmp_path / "s.json"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        with pytest.raises(CalibrationInputError, match="a socket, not a regular file"):
            read_vllm_bench(sock_path)


def test_a_file_past_the_size_cap_is_refused_by_its_size(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(300 * 2**20)  # sparse: 300 MB that cost no disk and are never read
    with pytest.raises(CalibrationInputError, match="314,572,800 bytes exceed the results file"):
        read_vllm_bench(path)
    with pytest.raises(CalibrationInputError, match="exceed the results file limit of 1,000"):
        read_vllm_bench(BENCH, max_bytes=1000)


def test_a_file_past_the_value_cap_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = _write(tmp_path / "r.json", _doc(6))
    assert len(read_vllm_bench(path, max_values=200)[0]) == 6
    with pytest.raises(CalibrationInputError, match=r"about \d+ JSON values, more than the 20 "):
        read_vllm_bench(path, max_values=20)


# ------------------------------------------------------------ the command line, whole


def _cases(tmp_path: Path) -> dict[str, Path | str]:
    huge = _doc()
    huge["input_lens"][0] = 10**400
    nan = _doc()
    nan["ttfts"][2] = math.nan
    sparse = tmp_path / "sparse.json"
    with open(sparse, "wb") as f:
        f.truncate(300 * 2**20)
    folder = tmp_path / "folder"
    folder.mkdir()
    return {
        "10**400 tokens": _write(tmp_path / "huge.json", huge),
        "NaN TTFT": _write(tmp_path / "nan.json", nan),
        "array": _write(tmp_path / "array.json", [1, 2]),
        "number": _write(tmp_path / "number.json", 5),
        "5000 digits": _text(tmp_path / "digits.json", '{"input_lens": [' + "7" * 5000 + "]}"),
        "not UTF-8": _text(tmp_path / "latin1.json", '{"model_id": "caf\xe9"}', "latin-1"),
        "300 MB": sparse,
        "folder": folder,
        "/dev/zero": "/dev/zero",
    }


@pytest.mark.parametrize(
    "case",
    ["10**400 tokens", "NaN TTFT", "array", "number", "5000 digits", "not UTF-8", "300 MB",
     "folder", "/dev/zero", "fifo"],
)  # fmt: skip
def test_the_cli_exits_2_with_one_line_naming_the_file(
    case: str, tmp_path: Path, fifo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = fifo if case == "fifo" else _cases(tmp_path)[case]
    out = tmp_path / "out" / "p.json"
    code = main(["calibrate", "--from-vllm-bench", str(path), "-o", str(out)])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"prefixkv: error: {path}")
    assert "Traceback" not in err and not out.parent.exists()


# ---------------------------------------------------------- linear, and still exact


def _reference(
    requests: Sequence[BenchRequest], budget: int = 8192, same_step_s: float = 5e-4
) -> tuple[list[StepSample], list[StepSample]]:
    """The samples by their definition, each request against every other (quadratic)."""
    usable = [r for r in requests if len(r.itl_s) == r.output_tokens - 1]
    times = [r.token_times() for r in usable]
    spans = [(r.start_s, t[0], t[-1]) for r, t in zip(usable, times, strict=True)]
    ttft = []
    for i, r in enumerate(usable):
        start, first, _ = spans[i]
        if all(j == i or end < start or s > first for j, (s, _, end) in enumerate(spans)):
            p = r.prompt_tokens
            ttft.append(StepSample(p, attention_pairs(p, 0), 0, 0, r.ttft_s, -(-p // budget), 1))
    events = sorted((t, i, k) for i, ts in enumerate(times) for k, t in enumerate(ts))
    steps: list[list[tuple[float, int, int]]] = []
    for e in events:
        if steps and e[0] - steps[-1][-1][0] <= same_step_s:
            steps[-1].append(e)
        else:
            steps.append([e])
    decode = []
    for prev, step in itertools.pairwise(steps):
        t0, t1 = prev[-1][0], step[-1][0]
        emitters = {i: k for _, i, k in step}
        if len(emitters) != len(step) or any(k == 0 for k in emitters.values()):
            continue
        if any(s < t1 and first > t0 for s, first, _ in spans):
            continue
        live = {i for i, (_, first, last) in enumerate(spans) if first <= t0 and last >= t1}
        if live != set(emitters):
            continue
        context = sum(usable[i].prompt_tokens + k for i, k in emitters.items())
        decode.append(StepSample(0, 0, len(emitters), context, t1 - t0))
    return ttft, decode


TIMES = st.sampled_from([0.0, 0.0004, 0.001, 0.002, 0.005, 0.01, 0.03])


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 64),  # prompt
            st.sampled_from([0.0, 0.001, 0.01, 0.02, 0.05, 0.1]),  # start
            st.sampled_from([0.001, 0.002, 0.004, 0.01]),  # ttft
            st.lists(TIMES, max_size=5),  # gaps
            st.integers(0, 1),  # output length off by one (not usable) or not
        ),
        max_size=8,
    )
)
def test_the_linear_reading_gives_the_definitions_samples(rows: list[Any]) -> None:
    requests = [
        BenchRequest(p, len(gaps) + 1 + off, s, t, tuple(gaps)) for p, s, t, gaps, off in rows
    ]
    assert bench_samples(requests) == _reference(requests)


def _run(n: int) -> list[BenchRequest]:
    """``n`` requests: one at a time, then in batches of 4 decoding together."""
    out = []
    t = 0.0
    for k in range(n):
        if k % 8 < 4:  # alone
            out.append(BenchRequest(64 + k % 50, 6, t, 0.01, (0.003,) * 5))
            t += 1.0
        else:
            out.append(BenchRequest(32 + k % 7, 10, t, 0.02, (0.004,) * 9))
            if k % 8 == 7:
                t += 1.0
    return out


def _work(read: Callable[[], object]) -> int:
    """Python lines and calls run by ``read()`` (loop steps inside one frame, a
    generator's included): a count of its work that no clock or load changes."""
    count = 0

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        count += 1
        return trace

    sys.settrace(trace)
    try:
        read()
    finally:
        sys.settrace(None)
    return count


def test_reading_the_steps_back_is_linear_in_the_requests() -> None:
    # Lines and calls run at n, 2n and 4n requests: the reading by its definition grows
    # 4x a doubling (each request against every other), this one 2x.
    small, double, quadruple = (_work(lambda n=n: bench_samples(_run(n))) for n in (400, 800, 1600))
    assert double < 2.2 * small and quadruple < 2.2 * double
    assert _work(lambda: _reference(_run(400))) > 20 * small
