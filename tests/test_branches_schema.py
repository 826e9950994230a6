"""Issue 32's schema change (v9, both engines): an index of the journal's branch points, so
whether a conversation has any (asked by every ``messages`` page) is one probe, not a scan of
its journal. A database of version 8, with a branch point already stored (version 8 stored them
too, unindexed), is brought to 9 whole and answers as before."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import psycopg
import trio

from agentik.storage.actor import Storage, run_storage
from agentik.storage.migrations import apply_migrations
from agentik.storage.pg import schema as pg_schema
from agentik.storage.sqlite import queries as sqlite_queries
from agentik.storage.sqlite import schema as sqlite_schema
from tests.conftest import StorageTarget

_POINT = b'{"type":"branch_point","kind":"switch","message_id":"m1"}'
_USER = b'{"type":"user_message","content":[]}'
_ROWS = [(1, "m1", "c1", "user_message", _USER), (2, "p1", "c1", "branch_point", _POINT),
         (3, "m2", "c2", "user_message", _USER)]


def _version_8_sqlite(path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    apply_migrations(
        conn.execute, 0, latest=8, migrations={k: sqlite_schema.MIGRATIONS[k] for k in range(1, 9)},
        initial=[("INSERT INTO meta VALUES ('epoch', 'e8')", ()),
                 ("INSERT INTO meta VALUES ('next_seq', '4')", ()),
                 ("INSERT INTO meta VALUES ('schema_version', '8')", ())],
        set_version="", error=sqlite3.DatabaseError)
    for cid in ("c1", "c2"):
        conn.execute("INSERT INTO conversation (id, is_temporal, created_at, updated_at, seq) "
                     "VALUES (?, 0, 1.0, 1.0, 3)", (cid,))
    conn.executemany("INSERT INTO message VALUES (?, ?, ?, ?, 1.0, ?)", _ROWS)
    conn.close()


def _version_8_pg(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        apply_migrations(
            conn.execute, 0, latest=8, migrations={k: pg_schema.MIGRATIONS[k] for k in range(1, 9)},
            initial=[("INSERT INTO meta VALUES ('epoch', 'e8')", ()),
                     ("INSERT INTO meta VALUES ('schema_version', '8')", ()),
                     ("INSERT INTO counter VALUES (1, 3)", ())],
            set_version="", error=psycopg.DatabaseError)
        for cid in ("c1", "c2"):
            conn.execute("INSERT INTO conversation (id, is_temporal, created_at, updated_at, seq) "
                         "VALUES (%s, false, 1.0, 1.0, 3)", (cid,))
        for row in _ROWS:
            conn.execute("INSERT INTO message VALUES (%s, %s, %s, %s, 1.0, %s)", row)


@asynccontextmanager
async def opened(target: StorageTarget) -> AsyncIterator[Storage]:
    async with trio.open_nursery() as nursery:
        storage: Storage = await nursery.start(
            partial(run_storage, target.path, database_url=target.url))
        yield storage
        nursery.cancel_scope.cancel()


async def test_a_version_8_database_gets_the_branch_point_index(target: StorageTarget) -> None:
    assert sqlite_schema.SCHEMA_VERSION == pg_schema.SCHEMA_VERSION == 9
    if target.url is None:
        _version_8_sqlite(target.path)
    else:
        _version_8_pg(target.url)
    with trio.fail_after(30):
        async with opened(target) as st:
            assert await st.reader.branched("c1") and not await st.reader.branched("c2")
            assert [r.id for r in await st.reader.journal("c1", 0, None, 10)] == ["m1", "p1"]
    if target.url is None:
        conn = sqlite3.connect(target.path)
        try:
            assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() \
                == ("9",)
            plan = " ".join(str(r) for r in conn.execute(
                "EXPLAIN QUERY PLAN SELECT 1 FROM message WHERE conversation_id='c1' "
                "AND type='branch_point' LIMIT 1"))
            assert "message_branch_point" in plan, plan
            assert sqlite_queries.branched(conn, "c1")
        finally:
            conn.close()
    else:
        with psycopg.connect(target.url) as conn:
            assert conn.execute("SELECT value FROM meta WHERE key='schema_version'"
                                ).fetchone() == ("9",)
            assert conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = "
                                "'message_branch_point'").fetchone() is not None
