"""A running OpenAI-compatible server as the simulator sees it: streamed completions
timed from the client, and what the server says about itself.

A request is a streamed ``POST /v1/completions`` of token ids, greedy, ``ignore_eos``
(so it decodes exactly ``max_tokens``) with ``include_usage`` (the prefix-cache hit is
``usage.prompt_tokens_details.cached_tokens``). The block size, KV pool and version come
from ``/version``, ``/v1/models`` and vLLM's ``vllm:cache_config_info``.
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

__all__ = ["Completion", "ServedEngine", "ServerError", "ServerInfo"]


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What a server says about itself (fields it does not say are 0 or empty);
    ``engine`` is ``"vllm"`` when ``/version`` answers as vLLM's does."""

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
        """KV bytes per token (``None``: unknown)."""
        tokens = self.kv_cache_tokens
        if not tokens or not self.kv_cache_memory_bytes:
            return None
        return self.kv_cache_memory_bytes // tokens


@dataclass(frozen=True, slots=True)
class Completion:
    """One streamed completion as the client saw it: sent at ``sent_s`` (its monotonic
    clock), first token ``ttft_s`` later, then gaps ``itl_s``; ``cached_tokens`` is
    ``None`` where the server does not report it."""

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
    """The labels of vLLM's ``vllm:cache_config_info`` gauge in ``/metrics`` text."""
    m = _CACHE_INFO.search(metrics_text)
    return dict(_LABEL.findall(m.group("labels"))) if m else {}


_DIGITS = re.compile(r"[0-9]{1,20}")

# Beyond these ranges a server's number is a fault, not a measurement.
MAX_TOKENS = 2**31 - 1
_MAX_BLOCK_SIZE = 2**20
_MAX_BLOCKS = 2**40
_MAX_POOL_BYTES = 2**60
_MAX_NAME = 1024  # characters of a model id or version
_EXTRA_TOKEN_CHUNKS = 8  # chunks past max_tokens still taken (a closing finish-reason chunk)


class ServedEngine:
    """An OpenAI-compatible completions server, timed from the client.

    Every request has one deadline and a byte budget (``limits``), and every number the
    server sends is range-checked: a misbehaving server is a :class:`ServerError`.

    Args:
        url: the server's base URL (``http://127.0.0.1:8000``).
        model: the model to ask for (default: the first ``/v1/models`` lists).
        limits: each request's deadline and byte budgets.
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
        """A client for this server (``async with``), asking for uncompressed answers."""
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
            ServerError: ``/v1/models`` lists no model or answers another shape, a
                number out of range, an answer past its deadline or byte budget.
        """
        where = f"{self.url}/v1/models"
        status, body = await self._get(client, "/v1/models")
        if status != 200:
            raise ServerError(f"{where}: HTTP {status}: {_text(body)}")
        models = json_object(parse_json(body, where), where, "the answer")
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
        status, body = await self._get(client, "/metrics")
        cache = parse_cache_config(body.decode("utf-8", "replace") if status == 200 else "")
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
        where = f"{self.url}{path}"

        async def get() -> tuple[int, bytes]:
            async with client.stream("GET", path) as r:
                return r.status_code, await read_body(r, self.limits, where)

        return await within(self.limits, where, get())

    async def complete(
        self,
        client: httpx.AsyncClient,
        prompt: Sequence[int],
        max_tokens: int,
        on_token: Callable[[int], object] | None = None,
    ) -> Completion:
        """Send one streamed completion of ``prompt`` (token ids), decoding exactly
        ``max_tokens``, and time it; ``on_token`` gets the count of token chunks so far.

        Raises:
            ServerError: a refused request, a broken stream, no token or too many, the
                deadline or byte budget passed, a bad chunk or usage number.
        """
        where = f"{self.url}/v1/completions"
        body = {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,  # decode exactly max_tokens
            "stream": True,
            "stream_options": {"include_usage": True},
        }
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
        await within(self.limits, where, stream())
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
    """Append a token chunk's arrival to ``times`` (at most ``most``); its usage, if any."""
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
