"""The live fleet's servers: N ``vllm serve`` processes publishing KV events.

Each server is native vLLM (its own prefix cache, ``sha256_cbor`` block hashes,
block size 32, a 1 GiB CPU KV pool), publishes KV events to
``tcp://127.0.0.1:<port>`` (vLLM's PUB socket connects there: the router's subscriber,
or a :class:`~fault_relay.FaultRelay`, binds it) and keeps a replay socket; all start
at once, and all stop, whatever happens.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fault_relay import FaultRelay
from vllm_server import ServeConfig, VLLMServer, free_port

from prefixkv.adapters.events.transport import ZmqEventSubscriber
from prefixkv.adapters.router import Router, subscribe

__all__ = ["BLOCK_SIZE", "COUNTERS", "HASH_ALGO", "LiveFleet"]

BLOCK_SIZE = 32
"""The servers' ``--block-size`` (vLLM's CPU attention wants a multiple of 32)."""
HASH_ALGO = "sha256_cbor"
"""The servers' ``--prefix-caching-hash-algo``, the router's too."""
COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


@dataclass
class LiveFleet:
    """N ``vllm serve`` processes with KV events (and, for faults, a relay each).

    Args:
        vllm: the ``vllm`` executable.
        model: the model directory.
        num_servers: how many.
        log_dir: where their logs go.
    """

    vllm: str
    model: str
    num_servers: int
    log_dir: Path
    servers: list[VLLMServer] = field(default_factory=list)
    relays: list[FaultRelay] = field(default_factory=list)
    relay_ports: list[int] = field(default_factory=list)
    tokenizer: str | None = None
    counter_base: dict[int, dict[str, float]] = field(default_factory=dict)

    def start(self, timeout: float) -> float:
        """Start every server at once; the seconds it took. Stops all on a failure."""
        for _ in range(self.num_servers):
            config = ServeConfig(
                self.vllm,
                self.model,
                max_model_len=4096,
                hash_algo=HASH_ALGO,
                tokenizer=self.tokenizer,
                kv_events_port=free_port(),
                kv_events_replay_port=free_port(),
                env={"VLLM_SERVER_DEV_MODE": "1"},  # /reset_prefix_cache between runs
            )
            self.servers.append(VLLMServer(config, self.log_dir, start_timeout=timeout))
        errors: list[BaseException] = []

        def start(server: VLLMServer) -> None:
            try:
                server.start()
            except BaseException as e:  # reported below, once all are stopped
                errors.append(e)

        t0 = time.monotonic()
        threads = [threading.Thread(target=start, args=(s,)) for s in self.servers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.stop()
            raise errors[0]
        return time.monotonic() - t0

    def stop(self) -> None:
        """Stop the relays and every server."""
        for relay in self.relays:
            relay.close()
        self.relays.clear()
        for server in self.servers:
            server.stop()

    def events_endpoint(self, replica: int) -> str:
        """Where the server's PUB socket connects (its subscriber or relay binds it)."""
        return f"tcp://127.0.0.1:{self.servers[replica].config.kv_events_port}"

    def replay_endpoint(self, replica: int) -> str:
        """The server's replay (ROUTER) socket."""
        return f"tcp://127.0.0.1:{self.servers[replica].config.kv_events_replay_port}"

    def insert_relays(self) -> None:
        """Put a :class:`FaultRelay` between each server and the router's subscribers."""
        if self.relays:
            return
        for r in range(self.num_servers):
            port = free_port()
            self.relays.append(
                _retry(lambda r=r, port=port: FaultRelay(self.events_endpoint(r), _tcp(port)))
            )
            self.relay_ports.append(port)

    def subscribe(self, router: Router, replica: int) -> ZmqEventSubscriber:
        """Feed ``replica``'s stream into ``router``: bound where the server connects,
        or connected to its relay."""
        replay = self.replay_endpoint(replica)
        if self.relays:
            return subscribe(
                router, replica, _tcp(self.relay_ports[replica]), replay_endpoint=replay
            )
        return _retry(
            lambda: subscribe(
                router, replica, self.events_endpoint(replica), replay_endpoint=replay, bind=True
            )
        )

    def reset(self) -> None:
        """Empty every server's prefix cache, and have it publish that.

        vLLM queues the reset's ``AllBlocksCleared`` and publishes it with the next
        scheduler step's events: an idle server would hold it back, and a router
        replaying the stream would still see the blocks of the run before. A one-token
        request (no full block: nothing stored) makes that step.
        """
        for server in self.servers:
            server.reset_prefix_cache()
            server.stream([3], 1)

    def restart(self, replica: int) -> None:
        """Stop and start a server (same ports, empty cache, events from seq 0),
        keeping its counters so far (the new process counts from 0)."""
        server = self.servers[replica]
        base = self.counter_base.setdefault(replica, {})
        for k, v in self._counters(server).items():
            base[k] = base.get(k, 0.0) + v
        server.stop()
        server.start()

    def counters(self) -> list[dict[str, float]]:
        """Each server's prefix-cache and request counters (over its restarts)."""
        out = []
        for r, server in enumerate(self.servers):
            now = self._counters(server)
            base = self.counter_base.get(r, {})
            out.append({k: v + base.get(k, 0.0) for k, v in now.items()})
        return out

    @staticmethod
    def _counters(server: VLLMServer) -> dict[str, float]:
        m = server.metrics()
        return {k: m.get(k, 0.0) for k in (*COUNTERS, "vllm:request_success_total")}


def _tcp(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


def _retry(make: Any, tries: int = 20) -> Any:
    """``make()``, again while the address is still held by a socket just closed."""
    for attempt in range(tries):
        try:
            return make()
        except Exception:
            if attempt == tries - 1:
                raise
            time.sleep(0.25)
    raise AssertionError("unreachable")
