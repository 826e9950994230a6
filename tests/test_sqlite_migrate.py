"""Schema version 5 (issue 13, durable rate): an existing version-4 database file is brought over
with nothing lost: the outbox rows as they were, one mark for each of their times (the TTL trim
then finds the bound ``outbox_by_time`` gave), the open turns keyed by their conversation with
the offset of their message (start-up recovery closes the running one, and the queued ones
run in the order they came)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agentik.storage import ops
from agentik.storage.sqlite.queries import queued_turns
from agentik.storage.sqlite.schema import MIGRATIONS, SCHEMA_VERSION
from agentik.storage.sqlite.writer import Writer
from agentik.wire import ErrorEvent
from tests.test_storage_batch import _send

#: offset -> created_at of the old outbox: batches sharing a time, the clock going back once
_TIMES = {1: 100.0, 2: 100.0, 3: 105.0, 4: 105.0, 5: 103.0, 6: 110.0, 7: 110.0, 8: 120.0}


def _version_4_file(path: str) -> None:
    """A database as version 4 of the schema made it, with rows in every table v5 changes."""
    conn = sqlite3.connect(path, isolation_level=None)
    for version in range(1, 5):
        for statement in MIGRATIONS[version].split(";"):
            if statement.strip():
                conn.execute(statement)
    conn.execute("INSERT INTO meta VALUES ('epoch', 'e4'), ('next_seq', '9'), "
                 "('schema_version', '4')")
    conn.execute("INSERT INTO conversation VALUES ('c1', NULL, 0, 100.0, 105.0, 4)")
    conn.execute("INSERT INTO conversation VALUES ('c2', NULL, 0, 100.0, 103.0, 5)")
    for seq, mid, cid in ((2, "m1", "c1"), (4, "m2", "c1"), (5, "m3", "c2")):
        conn.execute("INSERT INTO message VALUES (?, ?, ?, 'user', 100.0, ?)",
                     (seq, mid, cid, b'{"type":"user_message","content":[]}'))
    # in the order they came (rowid), as the old writer inserted them
    conn.executemany("INSERT INTO turn (id, conversation_id, state) VALUES (?, ?, ?)",
                     [("m1", "c1", "running"), ("m2", "c1", "queued"), ("m3", "c2", "queued")])
    for offset, created in _TIMES.items():
        conn.execute('INSERT INTO outbox VALUES (?, ?, ?, ?, ?)',
                     (offset, "c1", "agent", created, f'{{"n":{offset}}}'.encode()))
    conn.close()


def test_a_version_4_file_is_brought_over_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "v4.db")
    _version_4_file(path)
    now = [114.5]
    assert SCHEMA_VERSION >= 5  # and on to the latest
    w = Writer(path, synchronous="OFF", outbox_cap=1000, outbox_ttl=10.0, clock=lambda: now[0])
    try:
        conn = w.conn
        assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
            str(SCHEMA_VERSION),)
        # v7: conversations made before users have none (admins reach them), no usage yet
        assert conn.execute("SELECT count(*) FROM conversation_user").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM user_usage").fetchone() == (0,)
        assert (w.epoch, w.next_seq, w.oldest) == ("e4", 9, 1)
        outbox = conn.execute('SELECT "offset", created_at, payload FROM outbox ORDER BY "offset"')
        assert [(o, t, bytes(p)) for o, t, p in outbox] == [
            (o, t, f'{{"n":{o}}}'.encode()) for o, t in _TIMES.items()]
        assert conn.execute('SELECT "offset", created_at FROM outbox_mark ORDER BY "offset"'
                            ).fetchall() == [(2, 100.0), (4, 105.0), (5, 103.0), (7, 110.0),
                                             (8, 120.0)]
        assert conn.execute('SELECT conversation_id, id, state, seq FROM turn ORDER BY seq'
                            ).fetchall() == [("c1", "m1", "running", 2), ("c1", "m2", "queued", 4),
                                             ("c2", "m3", "queued", 5)]
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert not indexes & {"outbox_by_time", "turn_by_conversation"}
        assert conn.execute("SELECT count(*) FROM message").fetchone() == (3,)

        # t=114.5, TTL 10: the cutoff 104.5 drops up to offset 5 (t=103, after the 105s: the
        # prefix up to the newest row older than the cutoff), as outbox_by_time's bound did
        result = w.commit_batch([_send("c1", "m4")])
        assert (result.oldest, result.head) == (6, 9)
        assert [r[0] for r in conn.execute('SELECT "offset" FROM outbox ORDER BY "offset"')] == [
            6, 7, 8, 9]
        assert [r[0] for r in conn.execute('SELECT "offset" FROM outbox_mark ORDER BY "offset"')
                ] == [7, 8, 9]

        # the running turn is closed; the queued ones stay for their conversation's next
        # actor, in the order they came, the migrated ones first
        result = w.commit_batch([ops.RecoverTurns(message="restarted", code="restart")])
        assert result.results == [[("c1", "m1")]]
        closed = [ev.event.event.record.message.turn_id for ev in result.events
                  if isinstance(ev.event.event, ErrorEvent)]
        assert closed == ["m1"]
        assert [t for t, _ in queued_turns(conn, "c1")] == ["m2", "m4"]
        assert [t for t, _ in queued_turns(conn, "c2")] == ["m3"]
        # v8: no webhook subscriptions yet; one is stored with its progress and its log
        assert conn.execute("SELECT count(*) FROM webhook").fetchone() == (0,)
        spec = ops.WebhookSpec(id="h", url="http://127.0.0.1:9/", events=("turn.failed",),
                               secret="whsec_AAAA")
        line = ops.WebhookAttempt(offset=1, type="turn.failed", attempt=1, outcome="failed")
        assert w.commit_batch([ops.PutWebhook(spec=spec, after=0), ops.WebhookProgress(
            webhook_id="h", after=0, attempts=1, log=(line,))]).results == [True, True]
        assert conn.execute('SELECT "after", attempts FROM webhook').fetchone() == (0, 1)
        assert conn.execute("SELECT count(*) FROM webhook_delivery").fetchone() == (1,)
    finally:
        w.close()
    w = Writer(path, synchronous="OFF", outbox_cap=1000, outbox_ttl=10.0, clock=lambda: now[0])
    try:  # reopened: nothing to migrate, the oldest time read from the marks
        assert (w.oldest, w._oldest_time) == (6, 110.0)
    finally:
        w.close()
