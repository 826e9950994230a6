"""Several StorageActors ("nodes", each with its own connections, feed and hub) on one real
PostgreSQL schema: one counter for the cluster, every node sees every event once and in order,
NOTIFY is only a hint (a lost listener or notification costs at most the timer), a cursor from
one node resumes on another."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import psycopg
import pytest
import trio
import trio.testing

from agentik import metrics
from agentik.cluster import Peers
from agentik.config import Config
from agentik.errors import (
    ConfigError,
    LeaseLostError,
    NotFoundError,
    NotOwnerError,
    OutboxGapError,
    RuntimeClosedError,
    StorageUnavailableError,
)
from agentik.runtime import open_runtime
from agentik.storage import ops
from agentik.storage.actor import Storage, run_storage
from agentik.storage.pg import schema as pg_schema
from agentik.storage.types import StoredEvent
from agentik.testing import ScriptedLlm
from agentik.wire import AppendText, Cursor, Text, UserItem, UserMessage, event_type
from tests.conftest import PG_BASE_URL

_nodes = iter(range(1_000_000))


@asynccontextmanager
async def node(url: str, **kw: object) -> AsyncIterator[Storage]:
    """A node: its own StorageActor, connections, feed, leases and hub."""
    kw.setdefault("node_id", f"node-{next(_nodes)}")
    async with trio.open_nursery() as nursery:
        storage: Storage = await nursery.start(
            partial(run_storage, "unused.db", database_url=url, **kw)  # type: ignore[arg-type]
        )
        yield storage
        nursery.cancel_scope.cancel()


def send(cid: str, mid: str, *, running: bool = False) -> ops.AppendUserMessage:
    """A user message; its turn queued, or ``running`` (started with it)."""
    return ops.AppendUserMessage(conversation_id=cid, message_id=mid,
                                 message=UserMessage(content=[Text(body=mid)]),
                                 start=UserItem(content=[Text(body=mid)]) if running else None)


async def create(st: Storage, cid: str) -> None:
    await st.write(ops.CreateConversation(conversation_id=cid, title=None, is_temporal=False,
                                          system_prompt="s"))


async def read_offsets(st: Storage, after: int, n: int) -> list[int]:
    out: list[int] = []
    with trio.fail_after(20):
        async for batch in st.hub.stream(Cursor(epoch=st.epoch, offset=after)):
            out.extend(ev.offset for ev in batch)
            if len(out) >= n:
                return out
    return out


async def test_two_nodes_one_counter_every_event_on_every_node_in_order(pg_url: str) -> None:
    async with node(pg_url) as a, node(pg_url) as b:
        assert a.epoch == b.epoch  # one epoch for the cluster
        for st, cid in [(a, "a1"), (b, "b1"), (a, "a2"), (b, "b2")]:
            await create(st, cid)  # each node writes to the conversations it owns
        per_writer = 150
        total = 4 + 4 * per_writer
        seen: dict[str, list[int]] = {}

        async def reader(name: str, st: Storage) -> None:
            seen[name] = await read_offsets(st, 0, total)

        async def writer(st: Storage, w: int) -> None:
            prefix = "a" if st is a else "b"
            for i in range(per_writer):
                await st.write(send(f"{prefix}{1 + i % 2}", f"w{w}-{i}"))

        async with trio.open_nursery() as n:
            n.start_soon(reader, "a", a)
            n.start_soon(reader, "b", b)
            for w in range(4):
                n.start_soon(writer, a if w % 2 else b, w)
        assert seen["a"] == seen["b"] == list(range(1, total + 1))
        # the state rows carry the same offsets as the events, whichever node wrote them
        journal = await a.reader.journal(None, 0, None, 10_000)
        assert len(journal) == 4 * per_writer
        outbox = await a.reader.outbox_page(0, None, "conversation", 10_000)
        assert sorted(r.seq for r in journal) == [ev.offset for ev in outbox[2]]
        # every event was published on each node by its feed, its own commits included
        assert a.hub.current_cursor() == b.hub.current_cursor() == Cursor(epoch=a.epoch, offset=total)


async def test_leases_route_refuse_and_fence(pg_url: str) -> None:
    async with node(pg_url, node_url="http://a.example") as a, node(pg_url) as b:
        assert a.leases is not None and b.leases is not None
        await create(a, "c1")  # the creating node owns it (fence 1)
        assert await a.leases.claim("c1") == 1
        with pytest.raises(NotOwnerError) as info:
            await b.write(send("c1", "m1"))  # not b's: refused in the commit statement
        assert (info.value.node_id, info.value.addr) == (a.leases.node_id, "http://a.example")
        with pytest.raises(NotOwnerError):
            await b.leases.claim("c1")  # a is live
        # a stale fence (another node claimed c1 while a was frozen, say) refuses a's write,
        # stores nothing of it, and drops a's lease
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE conv_owner SET node_id = %s, fence = fence + 1", (b.leases.node_id,))
        head = a.hub.current_cursor().offset
        with pytest.raises(LeaseLostError):
            await a.write(send("c1", "late"))
        assert "c1" not in a.leases.fences
        assert await a.reader.journal_count("c1", 0) == 0
        assert (await a.reader.outbox_page(0, None, None, 100))[1] == head  # no offset taken
        await b.write(send("c1", "m2"))  # b's lease is good now (unfenced but its own)


async def test_dead_node_conversation_is_claimed_and_its_turn_closed(pg_url: str) -> None:
    async with node(pg_url, lease_ttl=1.0) as b:
        async with node(pg_url, lease_ttl=1.0) as a:
            await create(a, "c1")
            await a.leases.claim("c1")
            await a.write(send("c1", "question", running=True))  # a running turn
            await a.write(send("c1", "queued"))  # accepted behind it
        # a is gone (no heartbeat any more): within the TTL b's sweeper claims c1 and stores the
        # running turn's terminal record; the queued one stays for b's actor to run
        got: list[str] = []
        with trio.fail_after(10):
            async for ev in b.hub.events(Cursor(epoch=b.epoch, offset=2)):
                got.append(event_type(ev.event))
                if got[-1] == "error":
                    record = ev.event.record  # type: ignore[union-attr]
                    assert record.message.message == "interrupted: node lost"
                    break
        assert got[:2] == ["user_message", "error"] and b.leases.fences.get("c1") == 2
        assert b.leases.stats["takeovers"] == 1
        queued = await b.reader.queued_turns("c1")
        assert [(turn_id, m.content) for turn_id, m in queued] == [  # type: ignore[union-attr]
            ("queued", [Text(body="queued")])]
        await b.write(send("c1", "next"))  # and b serves it now


async def test_acknowledged_write_is_in_the_local_hub(pg_url: str) -> None:
    """As with SQLite: once ``write`` returns, the node's hub has published the event."""
    async with node(pg_url) as a:
        await create(a, "c1")
        record = await a.write(send("c1", "m1"))
        assert a.hub.current_cursor().offset == record.seq == 2


async def test_own_commits_are_published_as_stored_and_counted(pg_url: str) -> None:
    """A node publishes its own batch as its writer returned it (no read back) when nothing came
    before it: the events its hub hands out are byte for byte what a reader decodes from the
    outbox, and they count in agentik_events_committed as on SQLite."""
    async with node(pg_url) as a:
        assert a.feed is not None
        await create(a, "c1")
        own = a.feed.stats["own"]
        committed = metrics.EVENTS_COMMITTED._value.get()
        live: list[StoredEvent] = []
        async with trio.open_nursery() as n:
            async def watch() -> None:
                async for batch in a.hub.stream(Cursor(epoch=a.epoch, offset=1)):
                    live.extend(batch)
                    if len(live) == 5:
                        return
            n.start_soon(watch)
            await trio.testing.wait_all_tasks_blocked()
            for i in range(5):
                await a.write(send("c1", f"m{i}"))
        stored = (await a.reader.outbox_page(1, None, None, 100))[2]
        assert [(e.offset, e.raw) for e in live] == [(e.offset, e.raw) for e in stored]
        assert [e.offset for e in live] == [2, 3, 4, 5, 6]
        assert a.feed.stats["own"] - own == 5
        assert metrics.EVENTS_COMMITTED._value.get() - committed == 5


async def test_lost_listener_and_lost_notifications_cost_at_most_the_timer(pg_url: str) -> None:
    async with node(pg_url) as a, node(pg_url) as b:
        await create(a, "c1")
        assert b.feed is not None
        got: list[int] = []

        async def reader() -> None:
            got.extend(await read_offsets(b, 0, 301))

        async with trio.open_nursery() as n:
            n.start_soon(reader)
            for i in range(300):
                await a.write(send("c1", f"m{i}"))
                if i == 100:
                    # kill b's listener backend: notifications sent while it reconnects are lost
                    pid = b.feed.listener_pid
                    assert pid is not None
                    with psycopg.connect(PG_BASE_URL, autocommit=True) as admin:
                        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        assert got == list(range(1, 302))
        assert b.feed.stats["reconnects"] >= 1


async def test_timer_delivers_without_any_notification(pg_url: str) -> None:
    """A commit made with no NOTIFY at all (as if the hint were lost) reaches the other node's
    hub through its feed, by the 1 s timer."""
    async with node(pg_url) as a, node(pg_url) as b:
        await create(a, "c1")
        await read_offsets(b, 0, 1)
        published = trio.Event()
        publish = b.hub.publish

        def observe(events: list[StoredEvent], oldest: int, head: int) -> None:
            publish(events, oldest, head)
            if any(ev.offset == 2 for ev in events):
                published.set()

        b.hub.publish = observe  # type: ignore[method-assign]
        notifies = b.feed.stats["notifies"]
        # a foreign commit that notifies nobody: the same counter rule, written by hand
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                'WITH c AS (UPDATE counter SET v = v + 1 RETURNING v) '
                'INSERT INTO outbox ("offset", conversation_id, kind, created_at, payload) '
                "SELECT c.v, 'c1', 'agent', 0, p.payload FROM c, "
                '(SELECT payload FROM outbox WHERE "offset" = 1) p'
            )
        # the 1 s timer wakes the feed: bounded, but no latency asserted (a loaded machine)
        with trio.fail_after(10):
            await published.wait()
        assert b.feed.stats["notifies"] == notifies  # no hint came: the timer delivered it
        assert b.hub.current_cursor().offset == 2


async def test_cursor_from_one_node_resumes_on_the_other(pg_url: str) -> None:
    async with node(pg_url) as a, node(pg_url) as b:
        await create(a, "c1")
        await create(b, "c2")
        for i in range(5):
            await a.write(send("c1", f"m{i}"))
        cursor = a.hub.current_cursor()  # b's feed may not be there yet: still not "ahead"
        for i in range(3):
            await b.write(send("c2", f"n{i}"))
        events = []
        with trio.fail_after(10):
            async for ev in b.hub.events(cursor):
                events.append(ev)
                if len(events) == 3:
                    break
        assert [e.cursor.offset for e in events] == [8, 9, 10]  # type: ignore[union-attr]
        assert [e.event.record.id for e in events] == ["n0", "n1", "n2"]  # type: ignore[union-attr]
        # the stored payloads carry their real offsets, in the cursor and in the record
        assert all(e.event.record.seq == e.cursor.offset for e in events)  # type: ignore[union-attr]


async def test_refusal_takes_no_offset_on_postgres(pg_url: str) -> None:
    async with node(pg_url) as a:
        await create(a, "c1")

        async def bad() -> None:
            with pytest.raises(NotFoundError):
                await a.write(send("missing", "x"))

        async with trio.open_nursery() as n:
            n.start_soon(bad)
            for i in range(5):
                n.start_soon(a.write, send("c1", f"m{i}"))
        journal = await a.reader.journal(None, 0, None, 100)
        assert sorted(r.seq for r in journal) == [2, 3, 4, 5, 6]
        assert a.hub.current_cursor().offset == 6


def test_scaleout_settings() -> None:
    cfg = Config.from_env({"AGENTIK_DATABASE_URL": "postgresql://u@h/db", "AGENTIK_NODE_ID": "n1",
                           "AGENTIK_LEASE_TTL": "2.5"})
    assert (cfg.database_url, cfg.node_id, cfg.lease_ttl) == ("postgresql://u@h/db", "n1", 2.5)
    # what the start-up log calls the database: the URL in use, never its password
    assert cfg.database == "postgresql://u@h/db"
    secret = Config.from_env({"AGENTIK_DATABASE_URL":
                              "postgresql://u:s3cret@h:5432/db?password=s3cret&sslmode=require"})
    assert secret.database == "postgresql://u:***@h:5432/db?password=***&sslmode=require"
    assert Config.from_env({"AGENTIK_DB_PATH": "/x/a.db"}).database == "/x/a.db"
    for name, bad in [("AGENTIK_DATABASE_URL", "mysql://x"), ("AGENTIK_LEASE_TTL", "0")]:
        with pytest.raises(ConfigError) as info:
            Config.from_env({name: bad})
        assert info.value.variable == name


async def test_online_events_reach_the_other_nodes_once(pg_url: str) -> None:
    """Token deltas are never stored; the node running the turn relays them (NOTIFY) so a live
    stream on any node gets them, and its own subscribers get them once."""
    async with node(pg_url) as a, node(pg_url) as b:
        await create(a, "c1")
        got: dict[str, list[str]] = {"a": [], "b": []}
        subscribed = 0
        all_in = trio.Event()

        async def watch(name: str, st: Storage) -> None:
            nonlocal subscribed
            stream = st.hub.online_events("c1")
            task = stream.__anext__()  # registers the subscriber, then waits
            subscribed += 1
            if subscribed == 2:
                all_in.set()
            ev = await task
            while True:
                got[name].append(ev.event.text)  # type: ignore[union-attr]
                if len(got[name]) == 50:
                    await stream.aclose()
                    return
                ev = await stream.__anext__()

        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                n.start_soon(watch, "a", a)
                n.start_soon(watch, "b", b)
                await all_in.wait()
                await trio.testing.wait_all_tasks_blocked()
                for i in range(50):
                    a.hub.publish_online("c1", AppendText(text=f"t{i}"))
        assert got["a"] == got["b"] == [f"t{i}" for i in range(50)]
        assert b.online.stats["received"] == 50 and a.online.stats["dropped"] == 0


class _FakePeer:
    def __init__(self, name: str, addr: str, token: str | None) -> None:
        self.name, self.addr, self.token, self.closed = name, addr, token, False

    async def close(self) -> None:
        self.closed = True


async def test_forwarding_keeps_one_client_per_peer_and_the_runtime_closes_them(
    pg_url: str, tmp_path: object
) -> None:
    made: list[_FakePeer] = []

    def factory(name: str, addr: str, token: str | None) -> _FakePeer:
        made.append(_FakePeer(name, addr, token))
        return made[-1]

    peers = Peers(Config(tokens=("t1", "t2"), node_id="n1"), factory=factory)  # type: ignore[arg-type]

    async def call(owner: object) -> object:
        return owner

    to_a = NotOwnerError("x", node_id="a", addr="http://a")
    forwarded = metrics.CLUSTER_FORWARDED._value.get()
    first = await peers.forward(to_a, call)
    assert await peers.forward(to_a, call) is first  # the same client: its pool is reused
    other = await peers.forward(NotOwnerError("x", node_id="b", addr="http://b"), call)
    assert other is not first and [(m.addr, m.token) for m in made] == [
        ("http://a", "t1"), ("http://b", "t1")]
    with pytest.raises(NotOwnerError):  # an owner with no URL: the 503 goes to the caller
        await peers.forward(NotOwnerError("x", node_id="c", addr=None), call)
    assert metrics.CLUSTER_FORWARDED._value.get() - forwarded == 3  # the three that went
    await peers.aclose()
    assert all(m.closed for m in made)
    with pytest.raises(RuntimeClosedError):
        await peers.forward(to_a, call)
    # the runtime makes one Peers for its life and closes it at shutdown
    cfg = Config(db_path=f"{tmp_path}/unused.db", database_url=pg_url, node_id="n-rt")
    async with open_runtime(cfg, llm=ScriptedLlm(["hi"])) as agent:
        kept = agent.peers
        kept.client("http://a")
    assert kept._closed and not kept._clients


def test_postgres_schema_upgrades_in_place_and_refuses_a_newer_one(pg_url: str) -> None:
    """The one migration rule (``schema.apply_migrations``) on PostgreSQL: a v1 schema is
    brought to the latest version keeping its epoch and counter; a newer one is refused."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for statement in pg_schema.MIGRATIONS[1].split(";"):
            if statement.strip():
                conn.execute(statement)  # type: ignore[call-overload]
        conn.execute("INSERT INTO meta VALUES ('epoch', 'e1'), ('schema_version', '1')")
        conn.execute("INSERT INTO counter VALUES (1, 7)")
        assert pg_schema.migrate(conn)
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert version == (str(pg_schema.SCHEMA_VERSION),)
        assert conn.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone() == ("e1",)
        assert conn.execute("SELECT v FROM counter").fetchone() == (7,)
        conn.execute("SELECT count(*) FROM a2a_task, idempotency_key")  # v2 and v3 tables
        pg_schema.migrate(conn)  # up to date: nothing to do
        conn.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
        with pytest.raises(psycopg.DatabaseError, match="newer than this agentik"):
            pg_schema.migrate(conn)


class _StalledReader:
    """A node's feed reader that waits until ``go`` is set: the node falls behind."""

    def __init__(self, reader: object) -> None:
        self.reader = reader
        self.go = trio.Event()

    async def outbox_page(self, *args: object) -> object:
        await self.go.wait()
        return await self.reader.outbox_page(*args)  # type: ignore[attr-defined]


async def test_trimmed_past_a_nodes_cursor_is_a_gap_on_that_node(pg_url: str) -> None:
    """The outbox cap trims events another node's feed had not read yet: that node's live
    subscribers are cut off and their stream reports the gap (410) instead of skipping; a new
    stream from the oldest retained cursor gets every retained event, in order."""
    gaps = metrics.CLUSTER_FEED_GAPS._value.get()
    async with node(pg_url, outbox_cap=10) as a, node(pg_url, outbox_cap=10) as b:
        assert b.feed is not None
        await create(a, "c1")
        await read_offsets(b, 0, 1)  # b has offset 1
        seen: list[int] = []
        got_gap = trio.Event()

        async def live_on_b() -> None:
            with pytest.raises(OutboxGapError) as info:
                async for batch in b.hub.stream(Cursor(epoch=b.epoch, offset=1)):
                    seen.extend(ev.offset for ev in batch)
            assert info.value.oldest.offset >= 2
            got_gap.set()

        stalled = _StalledReader(b.feed.reader)
        async with trio.open_nursery() as n:
            n.start_soon(live_on_b)
            await trio.testing.wait_all_tasks_blocked()
            b.feed.reader = stalled  # type: ignore[assignment]
            for i in range(30):  # offsets 2..31; the cap keeps 22..31
                await a.write(send("c1", f"m{i}"))
            stalled.go.set()
            with trio.fail_after(10):
                await got_gap.wait()
        # (a page the feed was already reading when it was stalled may have brought a few)
        assert seen == list(range(2, 2 + len(seen))) and len(seen) < 20  # never a skip
        assert b.feed.stats["gaps"] == 1
        assert metrics.CLUSTER_FEED_GAPS._value.get() - gaps == 1
        assert b.hub.current_cursor().offset == 31
        oldest = b.hub.oldest_cursor()
        assert oldest.offset == 21
        assert await read_offsets(b, oldest.offset, 10) == list(range(22, 32))


async def test_a_node_that_cannot_write_is_not_ready_while_the_others_are(pg_url: str) -> None:
    """Readiness (``/readyz`` reads ``Storage.health``) is per node: the node whose database
    session went read-only refuses writes (503, nothing stored) and reports it; the other node
    keeps writing; once the session can write again the node's probe finds it, without traffic."""
    role = f"agentik_{uuid.uuid4().hex[:10]}"
    schema = pg_url.rsplit("%3D", 1)[1]
    admin = psycopg.connect(PG_BASE_URL, autocommit=True)
    try:
        async with node(pg_url) as b:  # makes the tables
            admin.execute(f"CREATE ROLE {role} LOGIN")  # type: ignore[arg-type]
            admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}; "  # type: ignore[arg-type]
                          f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {role}; "
                          f"GRANT ALL ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
            async with node(pg_url.replace("postgres@", f"{role}@", 1)) as a:
                assert a.feed is not None
                await create(a, "ca")
                await create(b, "cb")
                admin.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")  # type: ignore[arg-type]
                # (the 5 s: it returns once the backend is gone, so the next write meets the
                # lost connection, not the old session)
                admin.execute("SELECT pg_terminate_backend(%s, 5000)", (a.feed.writer.backend_pid,))
                with pytest.raises(StorageUnavailableError):  # the lost connection
                    await a.write(send("ca", "a0"))
                with pytest.raises(StorageUnavailableError, match="read-only"):  # reconnected
                    await a.write(send("ca", "a1"))
                assert await a.reader.journal_count("ca", 0) == 0  # nothing stored
                await b.write(send("cb", "b0"))  # the other node is not affected
                assert b.health.writable and not a.health.writable
                assert a.health.error is not None and "read-only" in a.health.error
                admin.execute(f"ALTER ROLE {role} RESET default_transaction_read_only")  # type: ignore[arg-type]
                admin.execute("SELECT pg_terminate_backend(%s, 5000)", (a.feed.writer.backend_pid,))
                with trio.fail_after(30):
                    await a.health.wait_writable()  # the probe, no write needed
                await a.write(send("ca", "a-after"))
    finally:
        if _role_exists(admin, role):
            admin.execute(f"DROP OWNED BY {role}")  # type: ignore[arg-type]
        admin.execute(f"DROP ROLE IF EXISTS {role}")  # type: ignore[arg-type]
        admin.close()


def _role_exists(conn: psycopg.Connection[object], role: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is not None


async def test_a_slow_heartbeat_counts_the_lease_from_when_it_was_sent(pg_url: str) -> None:
    """The database dates a heartbeat by its start (``now()``), so the node counts its lease from
    when it sent it: a heartbeat held up by a lock and answered late leaves the node less time
    than the answer's arrival suggests (counted from the answer, the node would stop its actors
    after another node may already have taken them over)."""
    async with node(pg_url, lease_ttl=30.0) as a:  # no periodic heartbeat during the test
        leases = a.leases
        heartbeat_pid = leases._lines["heartbeat"][1][0].info.backend_pid
        with psycopg.connect(pg_url) as blocker:
            blocker.execute("SELECT 1 FROM nodes WHERE node_id = %s FOR UPDATE", (leases.node_id,))
            done = trio.Event()

            async def beat() -> None:
                await leases._heartbeat()
                done.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(beat)
                with psycopg.connect(pg_url, autocommit=True) as watch:
                    for _ in range(1000):  # until the heartbeat's server process waits on the lock
                        if watch.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s "
                                         "AND wait_event_type = 'Lock'", (heartbeat_pid,)).fetchall():
                            break
                        await trio.sleep(0.01)
                    else:
                        pytest.fail("the heartbeat never waited on the locked row")
                released = trio.current_time()
                blocker.rollback()
                with trio.fail_after(10):
                    await done.wait()
        assert leases.healthy and leases._last_ok < released


async def test_cluster_metrics_follow_heartbeats_leases_and_takeovers(pg_url: str) -> None:
    """``/metrics`` of a node: when it last heartbeat (an alert compares it with the TTL), how
    many conversations it holds, how many it took over from dead nodes."""
    takeovers = metrics.CLUSTER_TAKEOVERS._value.get()
    async with node(pg_url, lease_ttl=1.0) as b:
        started = time.time()
        async with node(pg_url, lease_ttl=1.0) as a:
            assert metrics.CLUSTER_HEARTBEAT._value.get() >= started  # a's first heartbeat
            await create(a, "c1")
            await create(a, "c2")
            await a.leases.claim("c1")
            await a.leases.claim("c2")
            assert metrics.CLUSTER_LEASES._value.get() == 2
            # a running turn: b's sweeper takes c1 over
            await a.write(send("c1", "question", running=True))
        with trio.fail_after(10):
            async for ev in b.hub.events(Cursor(epoch=b.epoch, offset=0)):
                if event_type(ev.event) == "error":
                    break
        assert metrics.CLUSTER_TAKEOVERS._value.get() - takeovers == 1
        assert metrics.CLUSTER_LEASES._value.get() == len(b.leases.fences) == 1
        exposition = metrics.exposition()[0].decode()
        assert "agentik_cluster_leases 1.0" in exposition
        assert "agentik_cluster_last_heartbeat_timestamp_seconds " in exposition
