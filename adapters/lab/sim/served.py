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

import itertools
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import SimError

if TYPE_CHECKING:
    import httpx

__all__ = ["Completion", "ServedEngine", "ServerError", "ServerInfo", "parse_cache_config"]


class ServerError(SimError):
    """The server cannot be reached, refused a request, or answered something else
    than an OpenAI-compatible completion stream."""


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


def _int(value: str) -> int:
    return int(value) if value.isdigit() else 0


class ServedEngine:
    """An OpenAI-compatible completions server, timed from the client.

    Args:
        url: the server's base URL (``http://127.0.0.1:8000``).
        model: the model to ask for (default: the first ``/v1/models`` lists).
        timeout_s: seconds before one request is given up.
        transport: an httpx transport (tests pass ``httpx.MockTransport``).

    Raises:
        ServerError: the server does not answer.
    """

    def __init__(
        self,
        url: str,
        model: str | None = None,
        *,
        timeout_s: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.transport = transport

    def client(self) -> httpx.AsyncClient:
        """A client for this server (use as ``async with``)."""
        import httpx

        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
        return httpx.AsyncClient(
            base_url=self.url, timeout=self.timeout_s, transport=self.transport, limits=limits
        )

    async def info(self, client: httpx.AsyncClient) -> ServerInfo:
        """Model, engine version, block size and KV pool, as far as the server says.

        Raises:
            ServerError: ``/v1/models`` does not answer or lists no model.
        """
        import httpx

        models = await self._get_json(client, "/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise ServerError(f"{self.url}/v1/models lists no model: {models!r:.200}")
        entry = data[0]
        if self.model is not None:
            entry = next((d for d in data if d.get("id") == self.model), {})
            if not entry:
                listed = ", ".join(str(d.get("id")) for d in data)
                raise ServerError(f"{self.url} serves no model {self.model!r} (it has {listed})")
        self.model = str(entry.get("id"))
        max_len = entry.get("max_model_len")
        version, engine = "", ""
        try:
            v = await self._get_json(client, "/version")
            if isinstance(v, dict) and isinstance(v.get("version"), str):
                version, engine = v["version"], "vllm"
        except ServerError:
            pass
        cache: dict[str, str] = {}
        try:  # /metrics is optional: without it the pool is unknown
            r = await client.get("/metrics")
            if r.status_code == 200:
                cache = parse_cache_config(r.text)
        except httpx.HTTPError:
            cache = {}
        return ServerInfo(
            url=self.url,
            model=self.model,
            engine=engine,
            engine_version=version,
            max_model_len=max_len if isinstance(max_len, int) else 0,
            block_size=_int(cache.get("block_size", "")),
            num_gpu_blocks=_int(cache.get("num_gpu_blocks", "")),
            kv_cache_memory_bytes=_int(cache.get("kv_cache_memory_bytes", "")),
            gpu_memory_utilization=cache.get("gpu_memory_utilization", ""),
        )

    async def _get_json(self, client: httpx.AsyncClient, path: str) -> Any:
        import httpx

        try:
            r = await client.get(path)
            r.raise_for_status()
            return r.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ServerError(f"{self.url}{path}: {type(exc).__name__}: {exc}") from None

    async def complete(
        self, client: httpx.AsyncClient, prompt: Sequence[int], max_tokens: int
    ) -> Completion:
        """Send one streamed completion of ``prompt`` (token ids), decoding exactly
        ``max_tokens``, and time it.

        Raises:
            ServerError: a refused request, a broken stream, no token streamed.
        """
        import httpx

        body = {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        times: list[float] = []
        usage: dict[str, Any] = {}
        sent = time.perf_counter()
        try:
            async with client.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    raise ServerError(f"{self.url}: HTTP {r.status_code}: {text[:300]}")
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if chunk.get("choices"):
                        times.append(time.perf_counter())
                    if chunk.get("usage"):
                        usage = chunk["usage"]
        except (httpx.HTTPError, ValueError) as exc:
            raise ServerError(f"{self.url}: {type(exc).__name__}: {exc}") from None
        if not times:
            raise ServerError(f"{self.url}: the stream held no token")
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return Completion(
            sent_s=sent,
            ttft_s=times[0] - sent,
            itl_s=[b - a for a, b in itertools.pairwise(times)],
            prompt_tokens=int(usage.get("prompt_tokens", len(prompt))),
            completion_tokens=int(usage.get("completion_tokens", len(times))),
            cached_tokens=cached if isinstance(cached, int) else None,
        )
