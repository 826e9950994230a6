"""PostgreSQL out of reach for a while (every connection of a node cut, new ones refused, as when
the database restarts or the network between them fails): the node's writes fail at once with
StorageUnavailableError (503) instead of waiting, it reports why, nothing of it crashes, and
once the database is back it stores again and its feed delivers everything, its own events and
the other node's, once each and in order (issue 17)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import psycopg
import psycopg_pool.base
import pytest
import trio

from agentik.errors import StorageError, StorageUnavailableError
from agentik.storage import ops
from tests.tcp_proxy import open_tcp_proxy
from tests.test_pg_cluster import create, node, read_offsets, send


async def test_a_node_cut_off_from_the_database_refuses_writes_then_catches_up(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the read pool's reconnect backoff doubles without a cap (1, 2, 4, 8 s ...): a long outage
    # leaves it a long wait after the database is back; made long at once here
    monkeypatch.setattr(psycopg_pool.base.AttemptWithBackoff, "INITIAL_DELAY", 60.0)
    host_port = "127.0.0.1:5432"
    assert host_port in pg_url
    async with open_tcp_proxy("127.0.0.1", 5432) as proxy:
        through = pg_url.replace(host_port, f"127.0.0.1:{proxy.port}")
        async with node(through, db_timeout=2.0, lease_ttl=3.0) as a, node(pg_url) as b:
            await create(a, "ca")
            await create(b, "cb")
            await a.write(send("ca", "a0"))
            assert (await read_offsets(a, 0, 3))[-1] == 3

            proxy.refuse = True  # the database is gone for node a
            await proxy.cut_all()
            for i in range(3):  # each write fails at once, none waits for the database
                with trio.fail_after(10), pytest.raises(StorageUnavailableError):
                    await a.write(send("ca", f"lost{i}"))
                await b.write(send("cb", f"b{i}"))  # the other node goes on
            assert not a.health.writable and a.health.error is not None
            started = trio.current_time()
            with trio.fail_after(10), pytest.raises(StorageError, match="read failed"):
                await a.reader.journal_count("ca", 0)  # a read fails too, as soon
            assert trio.current_time() - started < 2.0 + 1.0  # AGENTIK_DB_TIMEOUT, not 30 s
            feed = a.feed
            assert feed is not None
            feed.wake()
            for _ in range(200):  # the feed's read fails the same way: the node outlives it
                if feed.stats["read_failures"]:
                    break
                await trio.sleep(0.05)
            else:
                pytest.fail("the feed never tried to read during the outage")

            proxy.refuse = False  # back
            with trio.fail_after(30):
                await a.health.wait_writable()  # the probe, no write needed
            # reads at once too, although the read pool's next reconnect attempt is a minute away
            with trio.fail_after(2.0 + 3.0):
                assert await a.reader.journal_count("ca", 0) == 1
            await a.write(send("ca", "a1"))
            # 1 ca, 2 cb, 3 a0, 4..6 b0..b2, 7 a1: every one on node a, once, in order
            assert await read_offsets(a, 0, 7) == list(range(1, 8))
            assert await read_offsets(b, 0, 7) == list(range(1, 8))
            assert await b.reader.journal_count("ca", 0) == 2  # the refused ones: none
            assert proxy.connections > 1  # it did reconnect through the proxy


async def test_a_commit_cut_off_in_flight_is_settled_before_the_retry(pg_url: str) -> None:
    """The connection breaks while a commit waits in the server (here on a lock): its outcome
    is unknown to the node, and its server session may still commit it. Before the node plans
    anything again it ends that session, so a retry of the same write with the same
    Idempotency-Key is stored once, never beside the first one."""
    async with open_tcp_proxy("127.0.0.1", 5432) as proxy:
        through = pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
        async with node(through, db_timeout=5.0) as a:
            await create(a, "c1")
            key = ops.Idempotency(key="k1", fingerprint="f", ttl=3600.0)
            first = msgspec.structs.replace(send("c1", "first"), idempotency=key)
            retry = msgspec.structs.replace(send("c1", "retry"), idempotency=key)
            await a.write(msgspec.structs.replace(send("c1", "m0"), idempotency=ops.Idempotency(
                key="k0", fingerprint="f", ttl=3600.0)))  # the keyed statement, prepared
            writer = a.feed.writer  # type: ignore[union-attr]
            with psycopg.connect(pg_url) as blocker, psycopg.connect(pg_url,
                                                                     autocommit=True) as watch:
                blocker.execute("SELECT 1 FROM counter WHERE id = 1 FOR UPDATE")
                async with trio.open_nursery() as nursery:
                    failed = trio.Event()

                    async def write_first() -> None:
                        with pytest.raises(StorageUnavailableError,
                                           match="whether it was stored is unknown"):
                            await a.write(first)
                        failed.set()

                    nursery.start_soon(write_first)
                    await _waits_on_a_lock(watch, lambda: writer.backend_pid)
                    stale = writer.backend_pid
                    await proxy.cut_all()  # its commit is in the server, waiting on the lock
                    with trio.fail_after(10):
                        await failed.wait()
                    retried = trio.Event()

                    async def write_retry() -> None:
                        await a.write(retry)
                        retried.set()

                    nursery.start_soon(write_retry)
                    await _waits_on_a_lock(watch, lambda: writer.backend_pid, other_than=stale)
                    # the stale session is gone before the retry was planned
                    assert not watch.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                             (stale,)).fetchall()
                    blocker.rollback()
                    with trio.fail_after(10):
                        await retried.wait()
            bodies = [r[0] for r in user_bodies(pg_url)]
            assert sorted(b for b in bodies if b in ("first", "retry")) == ["retry"]


async def _waits_on_a_lock(watch: psycopg.Connection[object], pid: Callable[[], int],
                           other_than: int | None = None) -> None:
    """Until the writer's session (``pid()``, once it is not ``other_than``) waits on a lock."""
    for _ in range(1000):
        if pid() != other_than and watch.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                (pid(),)).fetchall():
            return
        await trio.sleep(0.01)
    pytest.fail("the writer's session never waited on the lock")


def user_bodies(url: str) -> list[tuple[str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT payload FROM message WHERE type = 'user_message'").fetchall()
    return [(msgspec.json.decode(bytes(p))["content"][0]["body"],) for (p,) in rows]
