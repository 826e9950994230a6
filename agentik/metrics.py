"""Prometheus metrics (docs/PROTOCOL.md §3 ``GET /metrics``), made with ``prometheus-client``.

Every metric lives in :data:`REGISTRY`, one per process (a process runs one runtime per database;
tests that start several read differences). The hot path only calls ``inc``/``observe``/``set`` on
objects made here once: a lock-protected float add, no allocation, no label lookup for the
unlabelled ones. Labelled children are cached by prometheus-client after their first use.

A leaf module: it imports nothing of agentik, so every layer may update a metric.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

#: seconds; a turn is a model answer with tool rounds, from a fraction of a second to minutes
_TURN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

TURNS = Counter(
    "agentik_turns", "Turns ended, by outcome (completed, failed, interrupted, cancelled)",
    ["outcome"], registry=REGISTRY,
)
TURN_DURATION = Histogram(
    "agentik_turn_duration_seconds", "Seconds from a turn's start to its end",
    buckets=_TURN_BUCKETS, registry=REGISTRY,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "agentik_time_to_first_token_seconds",
    "Seconds from a turn's start to the first delta the model streamed",
    buckets=_TURN_BUCKETS, registry=REGISTRY,
)
EVENTS_COMMITTED = Counter(
    "agentik_events_committed", "Durable events committed to the outbox", registry=REGISTRY,
)
STORAGE_COMMIT = Histogram(
    "agentik_storage_commit_seconds", "Seconds one group-commit transaction took (worker thread)",
    buckets=_COMMIT_BUCKETS, registry=REGISTRY,
)
STORAGE_BATCH = Histogram(
    "agentik_storage_batch_size", "Write requests committed in one transaction",
    buckets=_BATCH_BUCKETS, registry=REGISTRY,
)
STORAGE_ACCEPTING_WRITES = Gauge(
    "agentik_storage_accepting_writes",
    "1 while storage accepts writes, 0 while it refuses them (then /readyz is 503)",
    registry=REGISTRY,
)
SSE_CONNECTIONS = Gauge(
    "agentik_sse_connections", "Open SSE streams", registry=REGISTRY,
)
WS_CONNECTIONS = Gauge(
    "agentik_ws_connections", "Open WebSocket connections", registry=REGISTRY,
)
LIVE_CONVERSATIONS = Gauge(
    "agentik_live_conversations", "Conversations with a live actor", registry=REGISTRY,
)
LLM_ERRORS = Counter(
    "agentik_llm_errors", "Turns failed by the LLM backend, by error code", ["kind"],
    registry=REGISTRY,
)
TOOL_CALLS = Counter(
    "agentik_tool_calls", "Tool calls by server and outcome (ok, error, failed)",
    ["server", "outcome"], registry=REGISTRY,
)
PAUSES = Counter(
    "agentik_pauses", "Calls that waited for a person, by how they were answered (approved, "
    "refused, timed_out, answered)", ["answer"], registry=REGISTRY,
)
MAILBOX_REJECTIONS = Counter(
    "agentik_mailbox_rejections", "Sends refused because the conversation's mailbox was full",
    registry=REGISTRY,
)
BUSY_REJECTIONS = Counter(
    "agentik_busy_rejections", "Sends refused with on_busy=reject (409 busy)", registry=REGISTRY,
)

# --- a PostgreSQL cluster node (docs/SCALEOUT.md): stay 0 on the single-node SQLite engine ---------------

CLUSTER_LEASES = Gauge(
    "agentik_cluster_leases", "Conversations this node holds the lease of", registry=REGISTRY,
)
CLUSTER_HEARTBEAT = Gauge(
    "agentik_cluster_last_heartbeat_timestamp_seconds",
    "Unix time this node sent its last successful lease heartbeat (its leases run a TTL from it)",
    registry=REGISTRY,
)
CLUSTER_HEARTBEAT_FAILURES = Counter(
    "agentik_cluster_heartbeat_failures", "Lease heartbeats that failed or timed out",
    registry=REGISTRY,
)
CLUSTER_TAKEOVERS = Counter(
    "agentik_cluster_takeovers", "Conversations this node took over from a dead node",
    registry=REGISTRY,
)
CLUSTER_ACTOR_STOPS = Counter(
    "agentik_cluster_actor_stops",
    "Local actors stopped by ownership: no_heartbeat (the node could not heartbeat in time), "
    "fenced_out (a write was refused by its fence)", ["reason"], registry=REGISTRY,
)
CLUSTER_FORWARDED = Counter(
    "agentik_cluster_forwarded", "Commands forwarded to the node that owns their conversation",
    registry=REGISTRY,
)
CLUSTER_FEED_GAPS = Counter(
    "agentik_cluster_feed_gaps",
    "Times the outbox was trimmed past this node's feed cursor (its live streams were cut off "
    "and report the gap)", registry=REGISTRY,
)


def exposition() -> tuple[bytes, str]:
    """The text exposition of every metric and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST

# --- webhooks (docs/WEBHOOKS.md) ------------------------------------------------------------------

WEBHOOK_DELIVERIES = Counter(
    "agentik_webhook_deliveries",
    "Webhook and A2A push attempts by outcome (delivered, failed: retried, gave_up: retry time "
    "over, lost: events the outbox trimmed before they were sent)",
    ["outcome"], registry=REGISTRY,
)
WEBHOOK_LAG = Gauge(
    "agentik_webhook_lag_seconds",
    "Seconds the oldest undelivered event of any subscription has been failing (0: none is)",
    registry=REGISTRY,
)
