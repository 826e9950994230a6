"""PostgreSQL schema (the SQLite tables of ``schema.py``, same names and columns) plus what a
cluster needs, created in the connection's schema (``options=-csearch_path=…`` isolates a
deployment or a test).

- ``meta``: epoch (a random id made with the schema, the same for every node), schema_version.
- ``counter``: ONE row; ``v`` is the head (the highest committed offset). Every commit bumps it in
  the same statement that inserts its rows, so the next writer waits on the row lock until the
  previous commit is visible: offsets are dense and in commit order across nodes (a SEQUENCE is
  not: it hands out numbers before commit).
- ``turn.seq``: the offset of the turn's user message (start-up recovery closes turns in order).
- ``nodes`` / ``conv_owner``: the lease table of conversation ownership (one live actor per
  conversation in the cluster), fenced: a write carries the fence it was granted.

The DDL runs under a transaction-level advisory lock keyed by the schema name, so nodes starting
together create it once.
"""

from __future__ import annotations

import secrets
from typing import Any

import psycopg

from agentik.storage.migrations import apply_migrations

SCHEMA_VERSION = 9

_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE counter (id INTEGER PRIMARY KEY CHECK (id = 1), v BIGINT NOT NULL);
CREATE TABLE conversation (
    id TEXT PRIMARY KEY,
    title TEXT,
    is_temporal BOOLEAN NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    seq BIGINT NOT NULL
);
CREATE INDEX conversation_by_update ON conversation (updated_at DESC, id);
CREATE TABLE message (
    seq BIGINT PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL,
    type TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    payload BYTEA NOT NULL
);
CREATE INDEX message_by_conversation ON message (conversation_id, seq);
CREATE TABLE working_memory (
    id BIGSERIAL PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    order_idx INTEGER NOT NULL,
    source_message_id TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    payload BYTEA NOT NULL
);
CREATE INDEX working_memory_by_conversation ON working_memory (conversation_id, order_idx);
CREATE TABLE turn (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    state TEXT NOT NULL,
    seq BIGINT NOT NULL
);
CREATE INDEX turn_by_conversation ON turn (conversation_id);
CREATE TABLE outbox (
    "offset" BIGINT PRIMARY KEY,
    conversation_id TEXT,
    kind TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    payload BYTEA NOT NULL
);
CREATE INDEX outbox_by_conversation ON outbox (conversation_id, "offset");
CREATE INDEX outbox_by_time ON outbox (created_at);
CREATE TABLE nodes (
    node_id TEXT PRIMARY KEY,
    addr TEXT,
    heartbeat_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE conv_owner (
    conversation_id TEXT PRIMARY KEY,
    node_id TEXT NOT NULL,
    fence BIGINT NOT NULL
);
CREATE INDEX conv_owner_by_node ON conv_owner (node_id);
"""

_V2 = """
CREATE TABLE a2a_task (
    id TEXT PRIMARY KEY,
    context_id TEXT NOT NULL,
    conversation_id TEXT,
    state TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    first_seq BIGINT NOT NULL,
    seq BIGINT NOT NULL,
    payload BYTEA NOT NULL
);
CREATE INDEX a2a_task_by_first_seq ON a2a_task (first_seq);
CREATE INDEX a2a_task_by_context ON a2a_task (context_id, first_seq);
CREATE INDEX a2a_task_by_state ON a2a_task (state);
"""

_V3 = """
CREATE TABLE idempotency_key (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    result_id TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX idempotency_key_by_expiry ON idempotency_key (expires_at);
"""

#: a conversation's A2A tasks are deleted with it
_V4 = """
CREATE INDEX a2a_task_by_conversation ON a2a_task (conversation_id);
"""

#: fewer index entries an event (issue 17's durable rate): the TTL trim finds its bound in one
#: mark a batch (``outbox_mark``: the batch's last offset and its time; every outbox row of a batch
#: has the batch's time) instead of an index entry an outbox row, and a turn's primary key leads
#: with its conversation, so one index serves a conversation's turns and a turn by id. Existing
#: outbox rows get their marks here (one a distinct time: the newest offset of that time).
_V5 = """
CREATE TABLE outbox_mark ("offset" BIGINT PRIMARY KEY, created_at DOUBLE PRECISION NOT NULL);
CREATE INDEX outbox_mark_by_time ON outbox_mark (created_at);
INSERT INTO outbox_mark SELECT max("offset"), created_at FROM outbox GROUP BY created_at;
DROP INDEX outbox_by_time;
ALTER TABLE turn DROP CONSTRAINT turn_pkey;
DROP INDEX turn_by_conversation;
ALTER TABLE turn ADD PRIMARY KEY (conversation_id, id);
"""

# A conversation belongs to an agent (docs/AGENTS.md); as SQLite's v6.
_V6 = """
ALTER TABLE conversation ADD COLUMN agent TEXT NOT NULL DEFAULT 'default';
ALTER TABLE conversation ADD COLUMN instructions TEXT;
"""

#: users (docs/USERS.md): who created each conversation (kept after its deletion, so a replay
#: knows whose its events were), and model tokens per user and UTC day; as SQLite's v7
_V7 = """
CREATE TABLE conversation_user (
    conversation_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL
);
CREATE INDEX conversation_user_by_user ON conversation_user (user_id, conversation_id);
CREATE TABLE user_usage (
    user_id TEXT NOT NULL,
    day TEXT NOT NULL,
    tokens BIGINT NOT NULL,
    PRIMARY KEY (user_id, day)
);
"""

#: webhook subscriptions with their progress, and their delivery logs (docs/WEBHOOKS.md); as
#: SQLite's v8
_V8 = """
CREATE TABLE webhook (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    events TEXT NOT NULL,
    agent TEXT,
    conversation_id TEXT,
    task_id TEXT,
    secret TEXT NOT NULL,
    source TEXT NOT NULL,
    config BYTEA,
    created_at DOUBLE PRECISION NOT NULL,
    "after" BIGINT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    failing_since DOUBLE PRECISION
);
CREATE INDEX webhook_by_task ON webhook (task_id);
CREATE TABLE webhook_delivery (
    n BIGSERIAL PRIMARY KEY,
    webhook_id TEXT NOT NULL,
    "offset" BIGINT NOT NULL,
    type TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    status INTEGER,
    error TEXT,
    at DOUBLE PRECISION NOT NULL
);
CREATE INDEX webhook_delivery_by_webhook ON webhook_delivery (webhook_id, n);
"""

#: the branch points of each conversation (docs/PROTOCOL.md "Branches"): whether one has any
#: (``queries.branched``, asked by every ``messages`` page) is one index probe, not a scan of its
#: journal; only branch points are in it, so a send's insert does not touch it
_V9 = """
CREATE INDEX message_branch_point ON message (conversation_id) WHERE type = 'branch_point';
"""

#: version -> script that brings a schema from version-1 to version
MIGRATIONS: dict[int, str] = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5, 6: _V6, 7: _V7, 8: _V8,
                              9: _V9}


def migrate(conn: psycopg.Connection[Any]) -> str:
    """Create or upgrade the tables in the connection's schema, in one transaction; returns the
    schema name. Raises psycopg.Error (or DatabaseError for a schema newer than this code)."""
    with conn.transaction():
        row = conn.execute("SELECT current_schema()").fetchone()
        if row is None or row[0] is None:
            raise psycopg.DatabaseError("the connection has no current schema (check search_path)")
        schema = str(row[0])
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('agentik:' || current_schema()))")
        has_meta = conn.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() "
            "AND table_name = 'meta'"
        ).fetchone()
        version = 0
        if has_meta:
            got = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = int(got[0]) if got else 0
        apply_migrations(
            conn.execute, version, latest=SCHEMA_VERSION, migrations=MIGRATIONS,
            initial=[("INSERT INTO meta VALUES ('epoch', %s)", (secrets.token_hex(8),)),
                     ("INSERT INTO meta VALUES ('schema_version', %s)", (str(SCHEMA_VERSION),)),
                     ("INSERT INTO counter VALUES (1, 0)", ())],
            set_version="UPDATE meta SET value = %s WHERE key = 'schema_version'",
            error=psycopg.DatabaseError,
        )
    return schema


def channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of one schema (channels are per database, not per schema)."""
    return f"agentik_{schema}"[:63]
