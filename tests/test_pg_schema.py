"""The PostgreSQL schema's upgrade from version 4 (an index entry a row for the TTL trim and a
turn's conversation) to 5 (a mark a batch, a turn keyed by its conversation): nothing stored is
lost, the TTL trim still removes exactly the expired prefix, and open turns are still found and
closed."""

from __future__ import annotations

import psycopg

from agentik.storage import ops
from agentik.storage.migrations import apply_migrations
from agentik.storage.pg.schema import MIGRATIONS, SCHEMA_VERSION
from agentik.storage.pg.writer import PgWriter
from agentik.wire import Text, UserMessage


def _version_4(url: str) -> None:
    """A schema as agentik 4 left it: conversation c1 with two batches' outbox rows (offsets 1-2
    at t=100, 3-5 at t=200) and an open turn."""
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        apply_migrations(
            conn.execute, 0, latest=4, migrations={k: MIGRATIONS[k] for k in range(1, 5)},
            initial=[("INSERT INTO meta VALUES ('epoch', 'e4')", ()),
                     ("INSERT INTO meta VALUES ('schema_version', '4')", ()),
                     ("INSERT INTO counter VALUES (1, 5)", ())],
            set_version="", error=psycopg.DatabaseError)
        conn.execute("INSERT INTO conversation VALUES ('c1', NULL, false, 100, 200, 5)")
        for offset, at in [(1, 100.0), (2, 100.0), (3, 200.0), (4, 200.0), (5, 200.0)]:
            conn.execute("INSERT INTO outbox VALUES (%s, 'c1', 'conversation', %s, '\\x00')",
                         (offset, at))
        conn.execute("INSERT INTO turn VALUES ('m5', 'c1', 'running', 5)")


def _user(mid: str) -> ops.AppendUserMessage:
    return ops.AppendUserMessage(conversation_id="c1", message_id=mid,
                                 message=UserMessage(content=[Text(body="hi")]))


def test_version_4_schema_upgrades_keeping_rows_and_the_ttl_trim(pg_url: str) -> None:
    assert SCHEMA_VERSION >= 5  # and on to the latest
    _version_4(pg_url)
    now = [250.0]
    w = PgWriter(pg_url, outbox_cap=1000, outbox_ttl=100.0, clock=lambda: now[0])
    try:
        assert w.epoch == "e4" and w.next_seq == 6
        q = w.conn.execute
        assert q("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION),)
        # v7: conversations made before users have none (admins reach them), no usage yet
        assert q("SELECT count(*) FROM conversation_user").fetchone() == (0,)
        assert q("SELECT count(*) FROM user_usage").fetchone() == (0,)
        # each stored batch time got the mark of its newest offset
        assert q('SELECT "offset", created_at FROM outbox_mark ORDER BY 1').fetchall() == [
            (2, 100.0), (5, 200.0)]
        assert q("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
                 "AND tablename IN ('outbox', 'turn') ORDER BY 1").fetchall() == [
            ("outbox_by_conversation",), ("outbox_pkey",), ("turn_pkey",)]

        # t=250, TTL 100: the batch of t=100 (offsets 1-2) goes, the one of t=200 stays
        w.commit_batch([_user("m6")])
        assert q('SELECT min("offset") FROM outbox').fetchone() == (3,)
        assert q('SELECT "offset" FROM outbox_mark ORDER BY 1').fetchall() == [(5,), (6,)]
        assert w.oldest == 3

        # the turn stored by version 4 is running, the new one queued: recovery closes the
        # first, by (conversation, id), and leaves the second for the conversation's next actor
        result = w.commit_batch([ops.RecoverTurns(conversation_id="c1", message="lost",
                                                  code="interrupted")])
        assert result.results == [[("c1", "m5")]]
        assert q("SELECT id, state FROM turn").fetchall() == [("m6", "queued")]
        recovered = w.next_seq - 1  # the recovery batch's last offset (t=250)

        # t=355, cutoff 255: both batches of t=250 are older, the new one stays
        now[0] = 355.0
        w.commit_batch([_user("m9")])
        assert q('SELECT min("offset") FROM outbox').fetchone() == (recovered + 1,)
        assert q('SELECT "offset" FROM outbox_mark').fetchall() == [(recovered + 1,)]
        assert w.oldest == recovered + 1
        # v8: no webhook subscriptions yet; one is stored with its progress and its log
        assert q("SELECT count(*) FROM webhook").fetchone() == (0,)
        spec = ops.WebhookSpec(id="h", url="http://127.0.0.1:9/", events=("turn.failed",),
                               secret="whsec_AAAA")
        line = ops.WebhookAttempt(offset=1, type="turn.failed", attempt=1, outcome="failed")
        assert w.commit_batch([ops.PutWebhook(spec=spec, after=0), ops.WebhookProgress(
            webhook_id="h", after=0, attempts=1, log=(line,))]).results == [True, True]
        assert q('SELECT "after", attempts FROM webhook').fetchone() == (0, 1)
        assert q("SELECT count(*) FROM webhook_delivery").fetchone() == (1,)
    finally:
        w.close()
