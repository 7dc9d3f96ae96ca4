"""What a KV-aware router embeds: cluster indexes, load tracking, routing policies, event feeds.

A router in front of N engine replicas asks, for each request, "how many leading
blocks of this prompt does each worker cache, and how loaded is it?", then lets a
policy choose. :class:`Router` holds the pieces: a cluster index fed by the replicas'
KV events (or by its own decisions), a :class:`LoadTracker` that books each routed
request at once, and a :class:`RoutingPolicy`. A real engine's ZeroMQ event stream is
connected with :func:`subscribe`; a stream carried by other calls (Ray, a simulation)
with :class:`StreamTracker`. See ``README.md`` beside this file.

Nothing here imports the measuring bench (``prefixkv.adapters.lab``), which drives the
same router over simulated replicas; ZeroMQ loads only when :func:`subscribe` runs.
"""

from .approx import ApproxIndex
from .block_tree import RadixBlockIndex
from .cluster_index import ChainedHashIndex, ClusterIndex
from .errors import ClusterError, ClusterSettingsError, NoReplicaError, UnknownPolicyError
from .event_feed import subscribe
from .keys import HashScheme, RouteKeys, Worker
from .load import LoadTracker, WorkerLoad
from .policies import POLICIES, make_cluster_index, make_policy
from .router import Decision, Router, RouteRequest
from .routing import (
    CostModel,
    PolicySpec,
    RouteContext,
    RoutingPolicy,
    parse_policies,
    parse_policy,
)
from .stream_tracker import Dump, SeqBatch, StreamTracker

__all__ = [
    "POLICIES",
    "ApproxIndex",
    "ChainedHashIndex",
    "ClusterError",
    "ClusterIndex",
    "ClusterSettingsError",
    "CostModel",
    "Decision",
    "Dump",
    "HashScheme",
    "LoadTracker",
    "NoReplicaError",
    "PolicySpec",
    "RadixBlockIndex",
    "RouteContext",
    "RouteKeys",
    "RouteRequest",
    "Router",
    "RoutingPolicy",
    "SeqBatch",
    "StreamTracker",
    "UnknownPolicyError",
    "Worker",
    "WorkerLoad",
    "make_cluster_index",
    "make_policy",
    "parse_policies",
    "parse_policy",
    "subscribe",
]
