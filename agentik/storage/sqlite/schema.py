"""SQLite schema and migrations, keyed by ``meta.schema_version``.

Tables:
- ``meta``: epoch (random id made with the database), schema_version, next_seq (the one counter).
- ``conversation``: one row per conversation; ``seq`` is the offset of its last change.
- ``message``: the journal, append-only; ``seq`` equals the outbox offset of its event.
- ``working_memory``: what the model sees, ordered by ``order_idx``; compaction rewrites it.
- ``turn``: turns that were accepted and have not reached a terminal record yet. A row left here at
  start-up means the process died mid-turn; start-up closes it with an Error record.
- ``outbox``: durable events by offset; trimmed from the oldest end only, so the retained offsets are
  always one contiguous range.
- ``a2a_task`` (v2): A2A tasks (docs/A2A.md). ``payload`` is the A2A Task JSON; ``first_seq`` is the
  offset of the task's first event, ``seq`` of its last change (both from the one counter).
- ``a2a_task_by_conversation`` (v4): a conversation's tasks are deleted with it.
- ``idempotency_key`` (v3): Idempotency-Keys of writes (``ops.Idempotency``), stored in the
  write's transaction; ``result_id`` is what the first write returned; rows past ``expires_at``
  are ignored and deleted by later writes.
- ``outbox_mark`` (v5): one row per batch that stored events, (the offset of its last event, its
  ``created_at``): every outbox row of a batch has the batch's time, so the newest outbox row
  older than a cutoff is the newest mark older than it, which is where the TTL trim finds its
  bound (one index insert a batch instead of ``outbox_by_time``'s one an event). Marks are
  trimmed with the outbox (those at or below its new oldest - 1).
- ``turn`` (v5): keyed by (conversation_id, id), WITHOUT ROWID (one B-tree instead of the
  table, its id index and ``turn_by_conversation``: every turn look-up names its conversation);
  ``seq`` is the offset of the turn's user message (start-up recovery closes turns in order).
- ``conversation.agent``, ``conversation.instructions`` (v6): the agent a conversation belongs to
  and the instructions given at its creation in place of its agent's (NULL: its agent's).
- ``conversation_user`` (v7, docs/USERS.md): the user who created each conversation, written with
  it and kept after its deletion (a replay still knows whose its events were).
- ``user_usage`` (v7): model tokens (prompt + completion as reported) per user and UTC day, added
  by the write that stores a turn's answer.
- ``webhook`` (v8, docs/WEBHOOKS.md): subscriptions (the admin routes', the settings file's, A2A
  push configs) with their progress: ``after`` (every event up to it is done), ``attempts`` at
  the next one, ``next_at`` (its next attempt), ``failing_since`` (its first failed attempt).
- ``webhook_delivery`` (v8): each subscription's delivery log (its newest lines).
- ``message_branch_point`` (v9): a partial index of the journal's branch points (docs/PROTOCOL.md
  "Branches"), by conversation: whether a conversation has any is one probe.
"""

from __future__ import annotations

import secrets
import sqlite3

from agentik.storage.migrations import apply_migrations

SCHEMA_VERSION = 9

_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE conversation (
    id TEXT PRIMARY KEY,
    title TEXT,
    is_temporal INTEGER NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    seq INTEGER NOT NULL
);
CREATE INDEX conversation_by_update ON conversation (updated_at DESC, id);
CREATE TABLE message (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL,
    type TEXT NOT NULL,
    created_at REAL NOT NULL,
    payload BLOB NOT NULL
);
CREATE INDEX message_by_conversation ON message (conversation_id, seq);
CREATE TABLE working_memory (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    order_idx INTEGER NOT NULL,
    source_message_id TEXT,
    created_at REAL NOT NULL,
    payload BLOB NOT NULL
);
CREATE INDEX working_memory_by_conversation ON working_memory (conversation_id, order_idx);
CREATE TABLE turn (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    state TEXT NOT NULL
);
CREATE INDEX turn_by_conversation ON turn (conversation_id);
CREATE TABLE outbox (
    "offset" INTEGER PRIMARY KEY,
    conversation_id TEXT,
    kind TEXT NOT NULL,
    created_at REAL NOT NULL,
    payload BLOB NOT NULL
);
CREATE INDEX outbox_by_conversation ON outbox (conversation_id, "offset");
CREATE INDEX outbox_by_time ON outbox (created_at);
"""

_V2 = """
CREATE TABLE a2a_task (
    id TEXT PRIMARY KEY,
    context_id TEXT NOT NULL,
    conversation_id TEXT,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    first_seq INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    payload BLOB NOT NULL
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
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX idempotency_key_by_expiry ON idempotency_key (expires_at);
"""

_V4 = """
CREATE INDEX a2a_task_by_conversation ON a2a_task (conversation_id);
"""

# The marks of an existing outbox: the newest offset of each created_at (what one mark a batch
# gives when every batch has its own time, and the same bounds when two share one). The turns
# keep their rows, in the order of their messages (the offset recovery orders them by).
_V5 = """
CREATE TABLE outbox_mark ("offset" INTEGER PRIMARY KEY, created_at REAL NOT NULL);
CREATE INDEX outbox_mark_by_time ON outbox_mark (created_at);
INSERT INTO outbox_mark ("offset", created_at)
    SELECT MAX("offset"), created_at FROM outbox GROUP BY created_at;
DROP INDEX outbox_by_time;
CREATE TABLE turn_v5 (
    conversation_id TEXT NOT NULL,
    id TEXT NOT NULL,
    state TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, id)
) WITHOUT ROWID;
INSERT INTO turn_v5 (conversation_id, id, state, seq)
    SELECT t.conversation_id, t.id, t.state,
           COALESCE((SELECT m.seq FROM message m WHERE m.id = t.id), 0)
    FROM turn t;
DROP TABLE turn;
ALTER TABLE turn_v5 RENAME TO turn;
"""

# A conversation belongs to an agent (docs/AGENTS.md); those made before agents existed belong to
# the one agent a server without an agents file has.
_V6 = """
ALTER TABLE conversation ADD COLUMN agent TEXT NOT NULL DEFAULT 'default';
ALTER TABLE conversation ADD COLUMN instructions TEXT;
"""

_V7 = """
CREATE TABLE conversation_user (
    conversation_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX conversation_user_by_user ON conversation_user (user_id, conversation_id);
CREATE TABLE user_usage (
    user_id TEXT NOT NULL,
    day TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    PRIMARY KEY (user_id, day)
) WITHOUT ROWID;
"""

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
    config BLOB,
    created_at REAL NOT NULL,
    "after" INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL DEFAULT 0,
    failing_since REAL
);
CREATE INDEX webhook_by_task ON webhook (task_id);
CREATE TABLE webhook_delivery (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id TEXT NOT NULL,
    "offset" INTEGER NOT NULL,
    type TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    status INTEGER,
    error TEXT,
    at REAL NOT NULL
);
CREATE INDEX webhook_delivery_by_webhook ON webhook_delivery (webhook_id, n);
"""

#: the branch points of each conversation (docs/PROTOCOL.md "Branches"): whether one has any
#: (``queries.branched``, asked by every ``messages`` page) is one index probe, not a scan of its
#: journal; only branch points are in it, so a send's insert does not touch it
_V9 = """
CREATE INDEX message_branch_point ON message (conversation_id) WHERE type = 'branch_point';
"""

#: version -> script that brings a database from version-1 to version
MIGRATIONS: dict[int, str] = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5, 6: _V6, 7: _V7, 8: _V8,
                              9: _V9}


def migrate(conn: sqlite3.Connection) -> None:
    """Create or upgrade the schema in one transaction. Raises sqlite3.Error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        has_meta = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        version = 0
        if has_meta:
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row else 0
        apply_migrations(
            conn.execute, version, latest=SCHEMA_VERSION, migrations=MIGRATIONS,
            initial=[("INSERT INTO meta VALUES ('epoch', ?)", (secrets.token_hex(8),)),
                     ("INSERT INTO meta VALUES ('next_seq', '1')", ()),
                     ("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))],
            set_version="UPDATE meta SET value=? WHERE key='schema_version'",
            error=sqlite3.DatabaseError,
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
