"""AGENTIK_DB_TIMEOUT: a database that holds a lock agentik needs, or stops answering, makes
writes fail after the timeout (the store refuses writes for now, /readyz says why, the probe
brings it back), never leaves a caller waiting forever (issue 17; both engines)."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import psycopg
import pytest
import trio

from agentik.errors import StorageUnavailableError
from agentik.storage import ops
from agentik.storage.actor import Storage
from tests.test_pg_cluster import create, node, send


async def _refused_then_back(st: Storage, cid: str, release: Callable[[], object], *,
                             within: float, match: str, late: ops.AnyOp | None = None) -> None:
    """A write fails with StorageUnavailableError matching ``match`` in ``within`` seconds and the
    store is reported refusing; after ``release()`` the probe makes it writable again with no
    write, and the next write is stored."""
    started = time.monotonic()
    with trio.fail_after(within + 10), pytest.raises(StorageUnavailableError, match=match):
        await st.write(late or send(cid, "late"))
    assert time.monotonic() - started < within + 5
    assert not st.health.writable and st.health.error is not None
    assert re.search(match, st.health.error)  # /readyz reports the reason
    release()
    with trio.fail_after(30):
        await st.health.wait_writable()
    await st.write(send(cid, "after"))


async def test_pg_a_lock_held_by_another_session_fails_the_write_after_the_timeout(
        pg_url: str) -> None:
    async with node(pg_url, db_timeout=1.0) as a:
        await create(a, "c1")
        blocker = psycopg.connect(pg_url)
        try:
            # an operator's open transaction on the one counter row every commit bumps
            blocker.execute("SELECT 1 FROM counter WHERE id = 1 FOR UPDATE")
            await _refused_then_back(a, "c1", blocker.rollback, within=1.0,
                                     match="lock timeout|statement timeout")
        finally:
            blocker.close()
        # the refused write stored nothing; the later one is there
        assert await a.reader.journal_count("c1", 0) == 1


@pytest.mark.parametrize("waiting", ["prepare", "commit", "read"])
async def test_pg_a_server_that_stops_answering_fails_the_write_and_is_dropped(
        pg_url: str, waiting: str) -> None:
    """A stopped server process runs no statement timer: the writer gives up on its answer,
    whatever it waits for: the statement's PREPARE (nothing of the batch was sent), the commit
    itself (its outcome is then unknown), or a read the batch needs first (an Idempotency-Key)."""
    prepared = waiting == "commit"
    async with node(pg_url, db_timeout=1.0) as a:
        await create(a, "c1")
        if waiting != "prepare":
            await a.write(send("c1", "m0"))  # the same statement, prepared on this connection
        backend = a.feed.writer.backend_pid  # type: ignore[union-attr]
        os.kill(backend, signal.SIGSTOP)
        resumed = False

        def resume() -> None:
            nonlocal resumed
            os.kill(backend, signal.SIGCONT)
            resumed = True

        match = "whether it was stored is unknown" if prepared else "nothing stored"
        late = send("c1", "late")
        if waiting == "read":
            late = msgspec.structs.replace(late, idempotency=ops.Idempotency(
                key="k1", fingerprint="f", ttl=3600.0))
        try:
            # twice the timeout without an answer (pg_connect.answer_within), then given up
            await _refused_then_back(a, "c1", resume, within=2.0, late=late,
                                     match=match + ": the database did not answer within 2 s")
        finally:
            if not resumed:
                os.kill(backend, signal.SIGCONT)
        assert a.feed.writer.backend_pid != backend  # type: ignore[union-attr]
        count = await a.reader.journal_count("c1", 0)
        if prepared:  # the stopped statement may commit once resumed: stored once at most
            assert count - 2 in (0, 1)
        else:
            assert count == (1 if waiting == "prepare" else 2)


async def test_sqlite_another_process_holding_the_file_lock_fails_the_write(
        tmp_path: Path) -> None:
    from functools import partial

    from agentik.storage.actor import run_storage

    path = str(tmp_path / "a.db")
    async with trio.open_nursery() as nursery:
        st: Storage = await nursery.start(partial(run_storage, path, db_timeout=0.5))
        await create(st, "c1")
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another program writing to the file
            await _refused_then_back(st, "c1", other.rollback, within=0.5, match="locked")
        finally:
            other.close()
        assert await st.reader.journal_count("c1", 0) == 1
        nursery.cancel_scope.cancel()
