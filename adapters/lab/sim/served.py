"""A running OpenAI-compatible server as the simulator sees it: streamed completions
timed from the client, and what the server says about itself.

One request is ``POST /v1/completions`` with the prompt as token ids (so a server run
with ``--skip-tokenizer-init`` serves it), ``temperature 0``, ``ignore_eos`` (so it
decodes exactly ``max_tokens``, as ``vllm bench serve`` does) and ``stream`` with
``include_usage``: the time to the first streamed token is the TTFT, the gaps between
later ones the inter-token latencies, and ``usage.prompt_tokens_details.cached_tokens``
the prefix-cache hit (vLLM with ``--enable-prompt-tokens-details``). The server's
block size, KV pool and version come from ``/version``, ``/v1/models`` and vLLM's
``/metrics`` (``vllm:cache_config_info``). HTTP is httpx's (the ``calibrate`` extra).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ServerError
from .http_limits import (
    RequestLimits,
    json_object,
    parse_json,
    read_body,
    server_fraction,
    server_int,
    sse_data,
    within,
)

if TYPE_CHECKING:
    import httpx

__all__ = ["Completion", "ServedEngine", "ServerError", "ServerInfo", "parse_cache_config"]


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What a server says about itself (fields it does not say are empty).

    Attributes:
        url: its base URL.
        model: the served model's id.
        engine: ``"vllm"`` when ``/version`` answers as vLLM's does, else ``""``.
        engine_version: the version it reports.
        max_model_len: the longest sequence it serves (0: unknown).
        block_size: its KV block size in tokens (0: unknown).
        num_gpu_blocks: its KV pool in blocks (0: unknown).
        kv_cache_memory_bytes: the pool's bytes (0: unknown).
        gpu_memory_utilization: its ``--gpu-memory-utilization`` (``""``: unknown).
    """

    url: str
    model: str
    engine: str = ""
    engine_version: str = ""
    max_model_len: int = 0
    block_size: int = 0
    num_gpu_blocks: int = 0
    kv_cache_memory_bytes: int = 0
    gpu_memory_utilization: str = ""

    @property
    def kv_cache_tokens(self) -> int:
        """The pool in tokens (0: unknown)."""
        return self.block_size * self.num_gpu_blocks

    @property
    def kv_bytes_per_token(self) -> int | None:
        """KV bytes per token, from the pool's bytes and tokens (``None``: unknown)."""
        tokens = self.kv_cache_tokens
        if not tokens or not self.kv_cache_memory_bytes:
            return None
        return self.kv_cache_memory_bytes // tokens


@dataclass(frozen=True, slots=True)
class Completion:
    """One streamed completion as the client saw it.

    Attributes:
        sent_s: when the request was sent (the client's monotonic clock).
        ttft_s: seconds from sending to the first streamed token.
        itl_s: seconds between consecutive streamed tokens after the first.
        prompt_tokens: the prompt's length as the server counted it.
        completion_tokens: tokens generated.
        cached_tokens: prompt tokens served from its prefix cache (``None``: not
            reported; vLLM needs ``--enable-prompt-tokens-details``).
    """

    sent_s: float
    ttft_s: float
    itl_s: list[float] = field(repr=False)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None

    @property
    def latency_s(self) -> float:
        """Seconds from sending to the last token."""
        return self.ttft_s + math.fsum(self.itl_s)


_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_cache_config(metrics_text: str) -> dict[str, str]:
    """The labels of vLLM's ``vllm:cache_config_info`` gauge in ``/metrics`` text
    (``block_size``, ``num_gpu_blocks``, ``kv_cache_memory_bytes``, ...); empty
    when the gauge is absent."""
    m = _CACHE_INFO.search(metrics_text)
    return dict(_LABEL.findall(m.group("labels"))) if m else {}


_DIGITS = re.compile(r"[0-9]{1,20}")

# The ranges a server's numbers must fall in: beyond them a number is a fault, not a
# measurement (a profile fitted to it would describe no machine).
MAX_TOKENS = 2**31 - 1
"""Most tokens of one sequence a server may report (prompt, cached, context length)."""
_MAX_BLOCK_SIZE = 2**20
_MAX_BLOCKS = 2**40
_MAX_POOL_BYTES = 2**60
_MAX_NAME = 1024
"""Most characters of a model id or version."""
_EXTRA_TOKEN_CHUNKS = 8
"""Streamed chunks with choices beyond ``max_tokens`` that are still taken as tokens
(a closing chunk that carries only a finish reason)."""


class ServedEngine:
    """An OpenAI-compatible completions server, timed from the client.

    Every request has one overall deadline and a byte budget (``limits``), and every
    number the server sends is range-checked: a server that streams forever, drips a
    byte at a time, answers the wrong JSON shape or reports a negative cached-token
    count is a :class:`ServerError`, never a hang or a profile of nonsense.

    Args:
        url: the server's base URL (``http://127.0.0.1:8000``).
        model: the model to ask for (default: the first ``/v1/models`` lists).
        limits: each request's deadline and byte budgets (default
            ``RequestLimits()``: 300 s, 64 MiB).
        transport: an httpx transport (tests pass ``httpx.MockTransport``).

    Raises:
        ServerError: ``url`` is not an ``http://`` or ``https://`` URL.
    """

    def __init__(
        self,
        url: str,
        model: str | None = None,
        *,
        limits: RequestLimits | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        import httpx

        self.url = url.rstrip("/")
        try:
            parsed = httpx.URL(self.url)
        except (httpx.InvalidURL, TypeError, ValueError) as exc:
            raise ServerError(f"{url!r} is not a URL: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ServerError(f"{url!r} is not an http:// or https:// URL with a host")
        self.model = model
        self.limits = RequestLimits() if limits is None else limits
        self.transport = transport

    def client(self) -> httpx.AsyncClient:
        """A client for this server (use as ``async with``); it asks for answers
        uncompressed, so the byte budget counts what the answer holds."""
        import httpx

        pool = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
        return httpx.AsyncClient(
            base_url=self.url,
            timeout=self.limits.deadline_s,
            transport=self.transport,
            limits=pool,
            headers={"Accept-Encoding": "identity"},
        )

    async def info(self, client: httpx.AsyncClient) -> ServerInfo:
        """Model, engine version, block size and KV pool, as far as the server says.

        Raises:
            ServerError: ``/v1/models`` does not answer, lists no model or answers
                another shape; a number out of range in ``/v1/models`` or in vLLM's
                ``cache_config_info``; any answer past its deadline or byte budget.
        """
        where = f"{self.url}/v1/models"
        models = json_object(await self._get_json(client, "/v1/models"), where, "the answer")
        data = models.get("data")
        if not isinstance(data, list) or not data:
            raise ServerError(f"{where} lists no model: {models!r:.200}")
        for k, d in enumerate(data):
            entry = json_object(d, where, f"data[{k}]")
            name = entry.get("id")
            if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME:
                raise ServerError(f"{where}: data[{k}].id is not a model name: {name!r:.80}")
        entry = data[0]
        if self.model is not None:
            entry = next((d for d in data if d["id"] == self.model), {})
            if not entry:
                listed = ", ".join(d["id"] for d in data[:20])
                raise ServerError(f"{self.url} serves no model {self.model!r} (it has {listed})")
        self.model = str(entry["id"])
        max_len = entry.get("max_model_len")
        if max_len is not None:
            max_len = server_int(max_len, where, "max_model_len", 1, MAX_TOKENS)
        version, engine = "", ""
        status, body = await self._get(client, "/version")  # optional: vLLM's
        if status == 200 and body.lstrip()[:1] in (b"{", b"["):
            v = json_object(
                parse_json(body, f"{self.url}/version"), f"{self.url}/version", "the answer"
            )
            if isinstance(v.get("version"), str):
                version, engine = v["version"][:_MAX_NAME], "vllm"
        cache = parse_cache_config(await self._get_text(client, "/metrics"))
        return ServerInfo(
            url=self.url,
            model=self.model,
            engine=engine,
            engine_version=version,
            max_model_len=max_len or 0,
            block_size=self._label(cache, "block_size", _MAX_BLOCK_SIZE),
            num_gpu_blocks=self._label(cache, "num_gpu_blocks", _MAX_BLOCKS),
            kv_cache_memory_bytes=self._label(cache, "kv_cache_memory_bytes", _MAX_POOL_BYTES),
            gpu_memory_utilization=self._fraction(cache, "gpu_memory_utilization"),
        )

    def _label(self, cache: dict[str, str], name: str, high: int) -> int:
        """A number of vLLM's ``cache_config_info`` (0: absent or ``None``)."""
        value = cache.get(name, "")
        if value in ("", "None"):
            return 0
        number: object = int(value) if _DIGITS.fullmatch(value) else value
        return server_int(number, f"{self.url}/metrics", f"cache_config_info {name}", 1, high)

    def _fraction(self, cache: dict[str, str], name: str) -> str:
        value = cache.get(name, "")
        if value in ("", "None"):
            return ""
        return server_fraction(value, f"{self.url}/metrics", f"cache_config_info {name}")

    async def _get(self, client: httpx.AsyncClient, path: str) -> tuple[int, bytes]:
        """``(status, body)`` of ``GET path``, within the deadline and byte budget."""
        import httpx

        where = f"{self.url}{path}"

        async def get() -> tuple[int, bytes]:
            async with client.stream("GET", path) as r:
                return r.status_code, await read_body(r, self.limits, where)

        try:
            return await within(self.limits, where, get())
        except httpx.HTTPError as exc:
            raise ServerError(f"{where}: {type(exc).__name__}: {exc}") from None

    async def _get_json(self, client: httpx.AsyncClient, path: str) -> Any:
        status, body = await self._get(client, path)
        where = f"{self.url}{path}"
        if status != 200:
            raise ServerError(f"{where}: HTTP {status}: {_text(body)}")
        return parse_json(body, where)

    async def _get_text(self, client: httpx.AsyncClient, path: str) -> str:
        """The text of an optional endpoint (``""`` when it answers no 200)."""
        status, body = await self._get(client, path)
        return body.decode("utf-8", "replace") if status == 200 else ""

    def _completion_body(self, prompt: Sequence[int], max_tokens: int) -> dict[str, Any]:
        """A streamed, greedy completion decoding exactly ``max_tokens``, with usage."""
        return {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    async def complete(
        self,
        client: httpx.AsyncClient,
        prompt: Sequence[int],
        max_tokens: int,
        on_token: Callable[[int], object] | None = None,
    ) -> Completion:
        """Send one streamed completion of ``prompt`` (token ids), decoding exactly
        ``max_tokens``, and time it; ``on_token`` is called with the number of token
        chunks read so far as each one arrives.

        Raises:
            ServerError: a refused request, a broken stream, no token streamed, more
                tokens than asked, the deadline or byte budget passed, a chunk that is
                not a JSON object, a usage number out of range (``cached_tokens``
                beyond the prompt, ``completion_tokens`` beyond ``max_tokens``).
        """
        import httpx

        where = f"{self.url}/v1/completions"
        body = self._completion_body(prompt, max_tokens)
        times: list[float] = []
        usage: dict[str, Any] = {}
        most = max_tokens + _EXTRA_TOKEN_CHUNKS

        async def stream() -> None:
            nonlocal usage
            async with client.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    text = _text(await read_body(r, self.limits, where))
                    raise ServerError(f"{where}: HTTP {r.status_code}: {text}")
                async with contextlib.aclosing(sse_data(r, self.limits, where)) as events:
                    async for data in events:
                        if data == "[DONE]":
                            break
                        read = len(times)
                        got = _take_chunk(data, where, times, most, max_tokens)
                        usage = usage if got is None else got
                        if on_token is not None and len(times) > read:
                            on_token(len(times))

        sent = time.perf_counter()
        try:
            await within(self.limits, where, stream())
        except httpx.HTTPError as exc:
            raise ServerError(f"{where}: {type(exc).__name__}: {exc}") from None
        if not times:
            raise ServerError(f"{where}: the stream held no token")
        return Completion(
            sent_s=sent,
            ttft_s=times[0] - sent,
            itl_s=[b - a for a, b in itertools.pairwise(times)],
            **_usage(usage, len(prompt), max_tokens, len(times), where),
        )


def _take_chunk(
    data: str, where: str, times: list[float], most: int, max_tokens: int
) -> dict[str, Any] | None:
    """One streamed chunk: a token chunk's arrival is appended to ``times`` (at most
    ``most`` of them); returns the chunk's usage, if it has one."""
    chunk = json_object(parse_json(data, where), where, "a streamed chunk")
    choices = chunk.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise ServerError(f"{where}: choices is not a JSON array: {data:.80}")
    if choices:
        times.append(time.perf_counter())
        if len(times) > most:
            raise ServerError(
                f"{where}: more than {most:,} token chunks streamed for max_tokens {max_tokens:,}"
            )
    if chunk.get("usage") is None:
        return None
    return json_object(chunk["usage"], where, "usage")


def _usage(
    usage: dict[str, Any], num_prompt: int, max_tokens: int, streamed: int, where: str
) -> dict[str, Any]:
    """The usage numbers of one completion, range-checked against what was sent."""
    prompt = usage.get("prompt_tokens", num_prompt)
    completion = usage.get("completion_tokens", streamed)
    details = usage.get("prompt_tokens_details")
    cached = None
    if details is not None:
        cached = json_object(details, where, "usage.prompt_tokens_details").get("cached_tokens")
    return {
        "prompt_tokens": server_int(prompt, where, "usage.prompt_tokens", 1, MAX_TOKENS),
        "completion_tokens": server_int(
            completion, where, "usage.completion_tokens", 0, max_tokens
        ),
        "cached_tokens": None
        if cached is None
        else server_int(cached, where, "usage.prompt_tokens_details.cached_tokens", 0, num_prompt),
    }


def _text(body: bytes, limit: int = 300) -> str:
    return " ".join(body[: limit * 4].decode("utf-8", "replace").split())[:limit]
