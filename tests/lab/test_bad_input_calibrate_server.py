"""``calibrate --server`` against a hostile server: every answer bounded, every number
range-checked, every fault one named line.

A tiny threaded HTTP server on 127.0.0.1 answers as told: streams that never end,
keep-alive comments, a byte at a time, JSON arrays or numbers where objects belong,
negative, huge, NaN or boolean token counts. The client must end each request on its
deadline or byte budget (the server counts what it was made to send; no test reads a
clock), and the CLI must exit 2 with one line, no traceback, and no profile written.
Every hostile loop of the server is bounded, so a client that does not stop makes the
test fail instead of hanging.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("httpx")
pytest.importorskip("scipy")

from prefixkv.adapters.lab.cli import main
from prefixkv.adapters.lab.sim.errors import ServerError
from prefixkv.adapters.lab.sim.http_limits import RequestLimits
from prefixkv.adapters.lab.sim.served import ServedEngine

TOKEN = b'data: {"choices": [{"text": "a"}]}\n\n'
MODELS = {"data": [{"id": "m", "max_model_len": 4096}]}
METRICS = (
    b'vllm:cache_config_info{block_size="16",gpu_memory_utilization="0.9",'
    b'kv_cache_memory_bytes="1048576",num_gpu_blocks="1024"} 1.0\n'
)
MOST_CHUNKS = 20_000
"""The most chunks a hostile loop sends at full speed, and ``MOST_DRIPS`` the most it
sends 20 ms apart (20 s): a client that does not stop on its own ends there, with
another outcome than the test expects, instead of hanging."""
MOST_DRIPS = 1000


@dataclass
class Behaviour:
    """What the server answers; the tests set it, the handler reads it."""

    models: bytes = json.dumps(MODELS).encode()
    version: bytes = b'{"version": "0.32.0"}'
    metrics: bytes = METRICS
    stream: str = "normal"  # or one of the hostile modes in Handler.do_POST
    chunk: bytes = b""  # the bad chunk of "bad_chunk"
    usage: Any = None  # the usage object of "normal" (None: a correct one)
    sent: int = 0  # bytes of completion streams the server was made to send
    chunks: int = 0  # and their chunks
    stop: threading.Event = field(default_factory=threading.Event)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HostileServer

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _start_stream(self, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
        self.server.behaviour.sent += len(data)
        self.server.behaviour.chunks += 1

    def _endless(self, data: bytes, pause: float = 0.0) -> None:
        b = self.server.behaviour
        for _ in range(MOST_DRIPS if pause else MOST_CHUNKS):
            if b.stop.wait(pause) if pause else b.stop.is_set():
                break
            self._chunk(data)
        self._chunk(b"")

    def do_GET(self) -> None:
        b = self.server.behaviour
        if self.path == "/v1/models":
            if b.models == b"endless":
                self._start_stream()
                return self._endless(b" " * 65536)
            return self._send(b.models)
        if self.path == "/version":
            return self._send(b.version)
        if self.path == "/metrics":
            if b.metrics == b"endless":
                self._start_stream()
                return self._endless(b"# x\n" * 16384)
            return self._send(b.metrics)
        return self._send(b"{}", 404)

    def do_POST(self) -> None:
        b = self.server.behaviour
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt, n = body["prompt"], body["max_tokens"]
        try:
            if b.stream == "error_endless":
                self._start_stream(500)
                return self._endless(b"x" * 65536)
            self._start_stream()
            if b.stream == "endless_tokens":
                return self._endless(TOKEN)
            if b.stream == "endless_comments":
                return self._endless(b": keep-alive\n\n" * 1024)
            if b.stream == "keepalive":
                self._chunk(TOKEN)
                return self._endless(b": ping\n\n", pause=0.02)
            if b.stream == "drip":
                self._chunk(TOKEN)
                return self._endless(b" ", pause=0.02)
            if b.stream == "endless_line":
                return self._endless(b"data: " + b"1" * 65536)
            if b.stream == "bad_chunk":
                self._chunk(b.chunk)
            else:
                for _ in range(n):
                    self._chunk(TOKEN)
            usage = b.usage
            if usage is None:
                usage = {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": n,
                    "prompt_tokens_details": {"cached_tokens": 0},
                }
            text = json.dumps({"choices": [], "usage": usage}, allow_nan=True)
            self._chunk(b"data: " + text.encode() + b"\n\n")
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: what it must do


class HostileServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.behaviour = Behaviour()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up on a hostile answer is what the tests want: no report."""
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture(scope="module")
def server() -> Iterator[HostileServer]:
    srv = HostileServer()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.behaviour.stop.set()
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


@pytest.fixture
def hostile(server: HostileServer) -> Iterator[HostileServer]:
    """The server, answering correctly until the test says otherwise."""
    server.behaviour = Behaviour()
    try:
        yield server
    finally:
        server.behaviour.stop.set()  # end any hostile loop still running


def _complete(srv: HostileServer, limits: RequestLimits, max_tokens: int = 4) -> Any:
    engine = ServedEngine(srv.url, limits=limits)

    async def run() -> Any:
        async with engine.client() as client:
            await engine.info(client)
            return await engine.complete(client, [5, 6, 7, 8], max_tokens)

    return asyncio.run(run())


SMALL = RequestLimits(deadline_s=0.5, max_response_bytes=256 * 1024, max_line_bytes=8192)


# --------------------------------------------------------- the deadline and the budgets


@pytest.mark.parametrize("stream", ["keepalive", "drip"])
def test_a_stream_that_trickles_ends_on_the_deadline(hostile: HostileServer, stream: str) -> None:
    hostile.behaviour.stream = stream
    with pytest.raises(ServerError, match=r"no whole answer within 0.5 s \(calibrate --request"):
        _complete(hostile, SMALL)
    # The server stopped short of its own end: the client left first.
    assert hostile.behaviour.chunks < 1 + MOST_DRIPS


@pytest.mark.parametrize(
    ("stream", "fault"),
    [
        ("endless_comments", "a stream longer than 262,144 bytes"),
        ("endless_line", "a stream line longer than 8,192 bytes"),
        ("endless_tokens", "more than 12 token chunks streamed for max_tokens 4"),
        ("error_endless", "an answer longer than 262,144 bytes"),
    ],
)
def test_an_endless_stream_ends_on_the_byte_budget(
    hostile: HostileServer, stream: str, fault: str
) -> None:
    hostile.behaviour.stream = stream
    limits = RequestLimits(deadline_s=60.0, max_response_bytes=256 * 1024, max_line_bytes=8192)
    with pytest.raises(ServerError, match=fault):
        _complete(hostile, limits)
    # What the server was made to send is bounded by the budget and the socket buffers
    # between the two (a few MB), not by the server's own end (20,000 chunks).
    assert hostile.behaviour.sent < 256 * 1024 + 32 * 2**20


@pytest.mark.parametrize(
    ("where", "fault"),
    [("models", "/v1/models: an answer longer than"), ("metrics", "/metrics: an answer longer")],
)
def test_an_endless_answer_of_an_info_endpoint_ends_on_the_byte_budget(
    hostile: HostileServer, where: str, fault: str
) -> None:
    setattr(hostile.behaviour, where, b"endless")
    with pytest.raises(ServerError, match=fault):
        _complete(hostile, SMALL)


# ------------------------------------------------------- wrong shapes and wrong numbers

JSON_NOT_OBJECT = st.one_of(
    st.lists(st.integers(), max_size=3),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.booleans(),
)
BAD_COUNT = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**31),
    st.floats(),  # NaN and infinities included (sent as NaN / Infinity)
    st.booleans(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
SETTINGS = settings(
    max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None
)


@SETTINGS
@given(value=JSON_NOT_OBJECT)
def test_a_chunk_that_is_not_an_object_is_a_named_error(hostile: HostileServer, value: Any) -> None:
    hostile.behaviour.stream = "bad_chunk"
    hostile.behaviour.chunk = b"data: " + json.dumps(value).encode() + b"\n\n"
    with pytest.raises(ServerError, match="/v1/completions: a streamed chunk is not a JSON object"):
        _complete(hostile, SMALL)


@SETTINGS
@given(
    field_name=st.sampled_from(["prompt_tokens", "completion_tokens", "cached_tokens"]),
    value=BAD_COUNT,
)
def test_a_usage_number_out_of_range_is_a_named_error(
    hostile: HostileServer, field_name: str, value: Any
) -> None:
    usage: dict[str, Any] = {
        "prompt_tokens": 4,
        "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    if field_name == "cached_tokens":
        usage["prompt_tokens_details"]["cached_tokens"] = value
    else:
        usage[field_name] = value
    hostile.behaviour.usage = usage
    # NaN and Infinity are no JSON: refused as such; every other value by its field.
    with pytest.raises(ServerError, match=rf"/v1/completions: (not JSON|usage\..*{field_name} )"):
        _complete(hostile, SMALL)


@SETTINGS
@given(
    usage=st.one_of(
        JSON_NOT_OBJECT, st.builds(lambda d: {"prompt_tokens_details": d}, JSON_NOT_OBJECT)
    )
)
def test_a_usage_of_another_shape_is_a_named_error(hostile: HostileServer, usage: Any) -> None:
    hostile.behaviour.usage = usage
    with pytest.raises(ServerError, match=r"/v1/completions: usage(\.prompt_tokens_details)? is"):
        _complete(hostile, SMALL)


@pytest.mark.parametrize(
    ("models", "fault"),
    [
        (b"[]", "/v1/models: the answer is not a JSON object"),
        (b"5", "/v1/models: the answer is not a JSON object"),
        (b'{"data": [{"id": "m"}, 3]}', r"/v1/models: data\[1\] is not a JSON object"),
        (b'{"data": [{"id": {"a": 1}}]}', r"data\[0\].id is not a model name"),
        (b'{"data": [{"id": "m", "max_model_len": -5}]}', "max_model_len -5 is not a whole"),
        (b'{"data": [{"id": "m", "max_model_len": 1e400}]}', "max_model_len inf is not a whole"),
        (b'{"data": [{"id": "m", "max_model_len": true}]}', "max_model_len True is not a whole"),
        (b"[" * 100_000, "not JSON"),
    ],
)
def test_a_models_answer_of_another_shape_is_a_named_error(
    hostile: HostileServer, models: bytes, fault: str
) -> None:
    hostile.behaviour.models = models
    with pytest.raises(ServerError, match=fault):
        _complete(hostile, SMALL)


@pytest.mark.parametrize(
    ("labels", "fault"),
    [
        ('block_size="99999999999999999999"', "cache_config_info block_size"),
        ('block_size="\u00b2"', "cache_config_info block_size '\u00b2' is not"),
        ('num_gpu_blocks="-3"', "cache_config_info num_gpu_blocks"),
        ('kv_cache_memory_bytes="0"', "cache_config_info kv_cache_memory_bytes"),
        ('gpu_memory_utilization="nan"', "cache_config_info gpu_memory_utilization"),
        ('gpu_memory_utilization="7"', "cache_config_info gpu_memory_utilization"),
    ],
)
def test_a_cache_config_number_out_of_range_is_a_named_error(
    hostile: HostileServer, labels: str, fault: str
) -> None:
    hostile.behaviour.metrics = ("vllm:cache_config_info{" + labels + "} 1.0\n").encode()
    with pytest.raises(ServerError, match=fault):
        _complete(hostile, SMALL)


def test_a_correct_server_is_measured(hostile: HostileServer) -> None:
    c = _complete(hostile, SMALL)
    assert (c.prompt_tokens, c.completion_tokens, c.cached_tokens) == (4, 4, 0)
    assert len(c.itl_s) == 3 and c.ttft_s > 0


# ------------------------------------------------------------ the command line, whole

CLI_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("drip", {"stream": "drip"}, "no whole answer within 0.5 s"),
    ("keepalive", {"stream": "keepalive"}, "no whole answer within 0.5 s"),
    ("endless tokens", {"stream": "endless_tokens"}, "token chunks streamed"),
    ("error body", {"stream": "error_endless"}, "/v1/completions:"),
    ("models array", {"models": b"[1]"}, "not a JSON object"),
    ("chunk array", {"stream": "bad_chunk", "chunk": b"data: [1, 2]\n\n"}, "not a JSON object"),
    (
        "negative cached",
        {"usage": {"prompt_tokens_details": {"cached_tokens": -(10**12)}}},
        "cached_tokens -1000000000000 is not a whole number",
    ),
    (
        "cached past the prompt",
        {"usage": {"prompt_tokens_details": {"cached_tokens": 10**12}}},
        "cached_tokens 1000000000000 is not a whole number",
    ),
    ("usage array", {"usage": [1]}, "usage is not a JSON object"),
    ("version array", {"version": b"[1, 2]"}, "/version: the answer is not a JSON object"),
]


@pytest.mark.parametrize(
    ("setting", "fault"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES]
)
def test_the_cli_exits_2_with_one_line_and_writes_nothing(
    hostile: HostileServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    setting: dict[str, Any],
    fault: str,
) -> None:
    for name, value in setting.items():
        setattr(hostile.behaviour, name, value)
    out = tmp_path / "p.json"
    argv = ["calibrate", "--server", hostile.url, "--quick", "-q", "--request-timeout", "0.5"]
    code = main([*argv, "-o", str(out)])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("prefixkv: error: ") and "Traceback" not in err
    assert fault in err and hostile.url in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["http://[::1", "ftp://127.0.0.1/", "127.0.0.1:8000", "http://"])
def test_a_url_that_is_not_http_is_one_line(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["calibrate", "--server", url, "-q", "-o", str(tmp_path / "p.json")])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "prefixkv: error: " in err
    assert list(tmp_path.iterdir()) == []


def test_rounds_of_a_correct_server_are_pooled_into_one_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--rounds 2`` calibrates twice and pools the two. The server is the mock whose
    ``/metrics`` gives fixed engine times (an instant HTTP server would leave the fit
    nothing but the client's jitter, and the profile could come out all zero)."""
    import httpx
    from test_serving_path import MetricsServer

    from prefixkv.adapters.lab.sim import server_calibration

    real = server_calibration.calibrate_server
    calls: list[str] = []

    def on_the_mock(url: str, **kwargs: Any) -> Any:
        calls.append(url)
        engine = ServedEngine(url, transport=httpx.MockTransport(MetricsServer()))
        return real(url, engine=engine, **kwargs)

    monkeypatch.setattr(server_calibration, "calibrate_server", on_the_mock)
    out = tmp_path / "p.json"
    argv = ["calibrate", "--server", "http://fake", "--quick", "-q", "--rounds", "2"]
    assert main([*argv, "-o", str(out)]) == 0, capsys.readouterr().err
    said, _ = capsys.readouterr()
    assert calls == ["http://fake"] * 2
    assert "2 of 2 rounds kept" in said
    rounds = json.loads(out.read_text())["fit"]["rounds"]
    assert (rounds["count"], rounds["kept"], len(rounds["per_round"])) == (2, 2, 2)


def test_rounds_without_a_server_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["calibrate", "--rounds", "2", "-q", "-o", str(tmp_path / "p.json")])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "--rounds goes with --server" in err
    assert list(tmp_path.iterdir()) == []
