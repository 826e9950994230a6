"""Issue 28: a conversation's agent and its own instructions are stored with it (schema version 6),
on both engines: in its record as created, read, listed, renamed (every copy of the row a
PostgreSQL batch plans carries them on) and after a reopen; a version-5 database is brought over
with its conversations belonging to ``default``."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import trio

from agentik.storage import ops
from agentik.storage.migrations import apply_migrations
from agentik.storage.pg import schema as pg_schema
from agentik.storage.pg.writer import PgWriter
from agentik.storage.sqlite import schema as sqlite_schema
from agentik.storage.sqlite.writer import Writer
from agentik.wire import ConversationRecord, Created
from tests.conftest import StorageTarget
from tests.test_storage import open_storage


def _create(cid: str, agent: str, instructions: str | None) -> ops.CreateConversation:
    return ops.CreateConversation(conversation_id=cid, title=None, is_temporal=False,
                                  system_prompt=instructions or "the agent's",
                                  agent=agent, instructions=instructions)


def _owner(record: ConversationRecord | None) -> tuple[str, str | None]:
    assert record is not None
    return record.agent, record.instructions


async def test_a_conversation_keeps_its_agent_and_instructions(target: StorageTarget) -> None:
    with trio.fail_after(30):
        async with open_storage(target) as storage:
            cursor = storage.hub.current_cursor()
            made = await storage.write(_create("c1", "support", "Be brief."))
            await storage.write(_create("c2", "coder", None))
            assert _owner(made) == ("support", "Be brief.")
            created = []
            async for batch in storage.hub.stream(cursor):
                created += [s.event.event for s in batch if isinstance(s.event.event, Created)]
                if len(created) == 2:
                    break
            assert [(e.conversation.agent, e.conversation.instructions) for e in created] == [
                ("support", "Be brief."), ("coder", None)]
            renamed = await storage.write(ops.RenameConversation(conversation_id="c1", title="t"))
            assert _owner(renamed) == ("support", "Be brief.")  # a copy of the row keeps them
            assert _owner(await storage.reader.get_conversation("c2")) == ("coder", None)
        async with open_storage(target) as storage:  # reopened: read back, and a fresh writer
            assert _owner(await storage.reader.get_conversation("c1")) == ("support", "Be brief.")
            listed = await storage.reader.list_conversations(0, 10)
            assert {c.id: c.agent for c in listed} == {"c1": "support", "c2": "coder"}
            renamed = await storage.write(ops.RenameConversation(conversation_id="c2", title="u"))
            assert _owner(renamed) == ("coder", None)  # the row as loaded carries them too


def test_a_version_5_sqlite_file_is_brought_over(tmp_path: Path) -> None:
    path = str(tmp_path / "v5.db")
    conn = sqlite3.connect(path, isolation_level=None)
    apply_migrations(
        conn.execute, 0, latest=5, migrations={k: sqlite_schema.MIGRATIONS[k] for k in range(1, 6)},
        initial=[("INSERT INTO meta VALUES ('epoch', 'e5')", ()),
                 ("INSERT INTO meta VALUES ('next_seq', '2')", ()),
                 ("INSERT INTO meta VALUES ('schema_version', '5')", ())],
        set_version="", error=sqlite3.DatabaseError)
    conn.execute("INSERT INTO conversation VALUES ('old', 'kept', 0, 100.0, 100.0, 1)")
    conn.close()
    assert sqlite_schema.SCHEMA_VERSION >= 6  # and on to the latest
    w = Writer(path, synchronous="OFF", outbox_cap=1000, outbox_ttl=3600.0)
    try:
        q = w.conn.execute
        assert q("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
            str(sqlite_schema.SCHEMA_VERSION),)
        assert q("SELECT id, title, agent, instructions FROM conversation").fetchall() == [
            ("old", "kept", "default", None)]
        result = w.commit_batch([_create("new", "support", "x")])
        assert _owner(result.results[0]) == ("support", "x")
    finally:
        w.close()


def test_a_version_5_postgres_schema_is_brought_over(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn, conn.transaction():
        apply_migrations(
            conn.execute, 0, latest=5,
            migrations={k: pg_schema.MIGRATIONS[k] for k in range(1, 6)},
            initial=[("INSERT INTO meta VALUES ('epoch', 'e5')", ()),
                     ("INSERT INTO meta VALUES ('schema_version', '5')", ()),
                     ("INSERT INTO counter VALUES (1, 1)", ())],
            set_version="", error=psycopg.DatabaseError)
        conn.execute("INSERT INTO conversation VALUES ('old', 'kept', false, 100, 100, 1)")
    assert pg_schema.SCHEMA_VERSION >= 6  # and on to the latest
    w = PgWriter(pg_url, outbox_cap=1000, outbox_ttl=3600.0)
    try:
        q = w.conn.execute
        assert q("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            str(pg_schema.SCHEMA_VERSION),)
        assert q("SELECT id, title, agent, instructions FROM conversation").fetchall() == [
            ("old", "kept", "default", None)]
        result = w.commit_batch([_create("new", "support", "x"),
                                 ops.RenameConversation(conversation_id="old", title="t")])
        assert _owner(result.results[0]) == ("support", "x")
        assert _owner(result.results[1]) == ("default", None)
    finally:
        w.close()
