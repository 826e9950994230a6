"""Reliability: kill -9 under load, a stalled subscriber, a full or read-only database.

The default run is bounded (a few kill rounds); ``AGENTIK_LONG=1`` runs the long form (100 kill
rounds). No test here asserts on timing: throughput figures live in ``python -m benchmarks``.
"""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import gc
import os
import random
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import msgspec
import pytest
import trio

from agentik.storage.sqlite.writer import Writer
from benchmarks.serverproc import ServerProcess, spawn_server
from tests.diskutil import fill_disk, small_tmpfs
from tests.scripted_openai import Reply, ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    allow_error_logs,
    client,
    config,
    make_config,
    no_error_logs,
    open_sse,
    openai,
    serve_app,
    server,
    tcp_send_buffer_max,
)

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

LONG = os.environ.get("AGENTIK_LONG") == "1"
KILL_ROUNDS = 100 if LONG else 3
TERMINAL = ("assistant_message", "error")


# --- helpers -------------------------------------------------------------------------------------


async def create(client: httpx2.AsyncClient) -> str:
    response = await client.post("/agentik/conversations", json={})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def text(body: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "body": body}]}


async def journal(client: httpx2.AsyncClient) -> list[dict[str, Any]]:
    """Every journal record, paged by seq."""
    out: list[dict[str, Any]] = []
    after = 0
    for _ in range(10_000):
        response = await client.get("/agentik/journal", params={"after_seq": after, "limit": 1000})
        assert response.status_code == 200, response.text
        page = response.json()
        out.extend(page)
        if len(page) < 1000:
            return out
        after = page[-1]["seq"]
    raise AssertionError("journal did not end")


@dataclass
class EventLog:
    """Durable events seen by one consumer of ``/agentik/events``, checked as they arrive:
    offsets strictly increase by exactly one (the outbox is contiguous), never repeat."""

    epoch: str = ""
    last: int = 0
    events: dict[int, dict[str, Any]] = field(default_factory=dict)
    gaps: int = 0  # 410 answers (allowed: the client must resync), never a silent gap

    @property
    def cursor(self) -> str:
        return f"{self.epoch}:{self.last}"

    def add(self, data: str) -> None:
        common = msgspec.json.decode(data)
        cursor = common["cursor"]
        assert cursor["epoch"] == self.epoch, cursor
        offset = cursor["offset"]
        assert offset == self.last + 1, f"gap or duplicate: {self.last} then {offset}"
        self.last = offset
        self.events[offset] = common["event"]


async def follow(client: httpx2.AsyncClient, log: EventLog, *, until: int | None = None) -> None:
    """Read ``/agentik/events`` from ``log.cursor`` into ``log`` until offset ``until`` (or until the
    connection breaks). A 410 resyncs to the current head and is counted."""
    try:
        async with client.stream("GET", "/agentik/events", params={"after": log.cursor},
                                 timeout=httpx2.Timeout(30.0)) as response:
            if response.status_code == 410:
                log.gaps += 1
                body = msgspec.json.decode(await response.aread())
                log.last = int(body["error"]["current"].split(":")[1])
                return
            assert response.status_code == 200, (response.status_code, await response.aread())
            if until is not None and log.last >= until:
                return
            data: list[str] = []
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    data.append(line[6:])
                elif line == "" and data:
                    log.add("\n".join(data))
                    data = []
                    if until is not None and log.last >= until:
                        return
    except (httpx2.TransportError, httpx2.StreamError):
        return  # the server died under us: the caller resumes from log.cursor


async def head(client: httpx2.AsyncClient) -> tuple[str, int]:
    current = (await client.get("/agentik/cursor")).json()["current"]
    epoch, offset = current.split(":")
    return epoch, int(offset)


def check_history(records: list[dict[str, Any]], log: EventLog, acked: set[str]) -> None:
    """What must hold after every restart."""
    seqs = [r["seq"] for r in records]
    assert seqs == sorted(set(seqs)), "journal seqs must strictly increase"
    by_id = {r["id"]: r for r in records}
    users = {r["id"] for r in records if r["message"]["type"] == "user_message"}
    missing = acked - users
    assert not missing, f"{len(missing)} acknowledged messages lost: {sorted(missing)[:5]}"
    ended = {r["message"].get("turn_id") for r in records if r["message"]["type"] in TERMINAL}
    open_turns = users - ended
    assert not open_turns, f"turns without a terminal record: {sorted(open_turns)[:5]}"
    # Every stored record was announced on the stream, at its own offset, with the same id.
    for r in records:
        event = log.events.get(r["seq"])
        assert event is not None, f"record at seq {r['seq']} never seen on the stream"
        assert event["record"]["id"] == r["id"], (event, r)
    for offset, event in log.events.items():
        record = event.get("record")
        if record is not None and "message" in record:
            assert record["id"] in by_id, f"event {offset} announces a record that is not stored"


# --- kill -9 under load ----------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_kill9_under_load_loses_nothing_acknowledged(
    tmp_path: Path, openai: ScriptedOpenAI, engine: str, request: pytest.FixtureRequest
) -> None:
    """Senders and an SSE reader hammer a subprocess server; it is SIGKILLed at a random moment
    (seeded), restarted on the same database, and after each restart: every 202-acknowledged
    message is stored, every turn gets a terminal record (the queued ones are answered after the
    restart), the event stream resumes from the old
    cursor with no gap and no duplicate (or answers 410, counted), and every stored record was
    announced at its seq."""
    rng = random.Random(20261130)
    openai.callable_default = lambda body: Reply(
        ["Sure", ", ", "here ", "is ", "an ", "answer."], chunk_delay=rng.uniform(0, 0.02)
    )
    acked: set[str] = set()
    log = EventLog()
    db = str(tmp_path / "kill.db")
    env = {"AGENTIK_MAILBOX_SIZE": "64"}
    if engine == "postgres":  # the same rounds on PostgreSQL; a fixed node id, as a restarted
        # node with one closes its own dead incarnation's turns at start-up
        env |= {"AGENTIK_DATABASE_URL": request.getfixturevalue("pg_url"),
                "AGENTIK_NODE_ID": "kill-node"}
    async with spawn_server(db, openai_base_url=openai.base_url, env=env) as srv:
        async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as client:
            log.epoch, log.last = await head(client)
            cids = [await create(client) for _ in range(4)]
        for round_ in range(KILL_ROUNDS):
            with trio.fail_after(60):
                await _load_then_kill(srv, rng, cids, acked, log, round_)
                await srv.start()
                async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as client:
                    # the turns the killed process had queued run now: wait for their answers
                    await _wait_all_turns(client)
                    epoch, current = await head(client)
                    assert epoch == log.epoch
                    await follow(client, log, until=current)
                    assert log.last == current, (log.last, current)
                    records = await journal(client)
                    check_history(records, log, acked)
    assert acked, "no message was acknowledged: the load did not run"
    # a kill interrupts at most the one running turn of each conversation; the queued ones
    # are answered after the restart
    restarts = [r for r in records if r["message"].get("code") == "restart"]
    assert len(restarts) <= KILL_ROUNDS * len(cids), len(restarts)
    assert log.gaps == 0, "the outbox is large enough here: no cursor should have died"
    print(f"\nkill -9 ({engine}): {KILL_ROUNDS} rounds, {len(acked)} acknowledged messages, "
          f"{len(log.events)} streamed events, {log.gaps} gaps, nothing lost or reused")


async def _load_then_kill(srv: ServerProcess, rng: random.Random, cids: list[str], acked: set[str],
                          log: EventLog, round_: int) -> None:
    kill_after = rng.uniform(0.05, 0.8)
    async with (
        httpx2.AsyncClient(base_url=srv.url, timeout=10) as client,
        trio.open_nursery() as nursery,
    ):

        async def sender(cid: str, who: int) -> None:
            for i in range(10_000):
                try:
                    response = await client.post(f"/agentik/conversations/{cid}/messages",
                                                 json=text(f"r{round_} s{who} m{i}"))
                except httpx2.TransportError:
                    return
                if response.status_code == 202:
                    acked.add(response.json()["message_id"])
                elif response.status_code == 429:
                    await trio.sleep(0.05)
                else:
                    raise AssertionError((response.status_code, response.text))
                await trio.sleep(rng.uniform(0, 0.02))

        nursery.start_soon(follow, client, log)
        for who, cid in enumerate(cids):
            nursery.start_soon(sender, cid, who)
        await trio.sleep(kill_after)
        srv.kill()
        await srv.wait()
        nursery.cancel_scope.cancel()


# --- a stalled subscriber ------------------------------------------------------------------------


async def test_stalled_subscriber_does_not_cost_others_an_event(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    """A subscriber that connects and then reads nothing, while more than its socket buffers and
    its hub buffer of events are written: the healthy subscriber gets every event in order; the
    stalled one, once it reads again, gets every event too (it fell back to the stored outbox),
    exactly once and in order."""
    cfg = make_config(tmp_path, openai, subscriber_buffer=64)
    title = "t" * 16_000
    # More bytes than the kernel buffers of the stalled connection can hold (its receiver never
    # reads, so its receive window stays near the default), and far more events than its hub
    # buffer: the server must cut it off and let it catch up from the store later.
    renames = max(200, 2 * (tcp_send_buffer_max() + 1_000_000) // len(title))
    async with (
        serve_app(cfg) as srv,
        httpx2.AsyncClient(base_url=srv.url, timeout=30,
                           limits=httpx2.Limits(max_connections=None)) as client,
    ):
        cid = await create(client)
        epoch, start = await head(client)
        healthy = EventLog(epoch=epoch, last=start)
        with trio.fail_after(120):
            async with open_sse(client, "/agentik/events", after=f"{epoch}:{start}") as stalled:
                async with trio.open_nursery() as nursery:

                    async def writer(w: int) -> None:
                        for i in range(w, renames, 16):
                            response = await client.patch(f"/agentik/conversations/{cid}",
                                                          json={"title": f"{i} {title}"})
                            assert response.status_code == 200, response.text

                    for w in range(16):
                        nursery.start_soon(writer, w)
                    # The healthy subscriber reads live, alongside the writers.
                    nursery.start_soon(partial(follow, client, healthy, until=start + renames))
                _, end = await head(client)
                assert end - start == renames
                assert healthy.last == end
                # The stalled one was cut off from live delivery (hub buffer overflow), so the
                # writer never waited for it.
                assert srv.hub.subscriber_count == 0
                # Only now does the stalled subscriber read.
                late = EventLog(epoch=epoch, last=start)
                while late.last < end:
                    frame = await stalled.next_event()
                    late.add(frame.data)
                assert late.events.keys() == healthy.events.keys()


# --- a full disk -----------------------------------------------------------------------------------


async def test_disk_full_fails_clearly_keeps_acknowledged_and_recovers(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    """Through HTTP, on a database in a 4 MiB tmpfs: once the disk is full, sends fail with a
    clear 503 ``storage`` error (never a 500, never a false 202) while reads keep working and
    /readyz answers 503; after space is freed, without a restart, every accepted turn has its
    terminal record within 10 s, /readyz is 200, sends and turns work again; nothing
    acknowledged is lost, also across a kill -9 and restart; the event stream has no gap."""
    openai.callable_default = lambda body: Reply("fine " * 20)
    with small_tmpfs(tmp_path / "mnt", "4m") as mnt:
        db = str(mnt / "full.db")
        acked: set[str] = set()
        async with (
            spawn_server(db, openai_base_url=openai.base_url, log_path=str(tmp_path / "srv.log"),
                         env={"AGENTIK_SQLITE_SYNCHRONOUS": "NORMAL"}) as srv,
            httpx2.AsyncClient(base_url=srv.url, timeout=10) as client,
        ):
            with trio.fail_after(90):
                epoch, start = await head(client)
                log = EventLog(epoch=epoch, last=start)
                cid = await create(client)
                # A turn that completes before the disk fills.
                response = await client.post(f"/agentik/conversations/{cid}/messages",
                                             json=text("before"))
                assert response.status_code == 202
                acked.add(response.json()["message_id"])
                await _wait_turns_done(client, cid, 1)

                fill_disk(mnt / "filler")
                refused: list[dict[str, Any]] = []
                for i in range(500):  # WAL pages already allocated absorb a few writes
                    response = await client.post(f"/agentik/conversations/{cid}/messages",
                                                 json=text(f"during {i} " + "x" * 4000))
                    assert response.status_code in (202, 503), (response.status_code, response.text)
                    if response.status_code == 202:
                        acked.add(response.json()["message_id"])
                    else:
                        refused.append(response.json())
                        if len(refused) >= 3:
                            break
                assert refused, "the disk never filled up"
                assert all(r["error"]["code"] == "storage" for r in refused), refused
                assert "full" in refused[0]["error"]["message"].lower(), refused[0]
                # Reads still work; readiness says why writes do not.
                assert (await client.get(f"/agentik/conversations/{cid}")).status_code == 200
                ready = await client.get("/readyz")
                assert ready.status_code == 503 and "full" in ready.json()["reasons"][0], ready.text

                # The cause goes away: the service recovers without a restart, and every
                # accepted turn gets its terminal record within 10 s (issue 11 #5).
                (mnt / "filler").unlink()
                with trio.fail_after(10):
                    await _wait_all_turns(client)
                    await _wait_ready(client)  # the writer's probe notices the space (no traffic)
                response = await client.post(f"/agentik/conversations/{cid}/messages",
                                             json=text("after"))
                assert response.status_code == 202, response.text
                acked.add(response.json()["message_id"])
                await _wait_assistant(client, cid, response.json()["message_id"])
                await follow(client, log, until=(await head(client))[1])
                check_history(await journal(client), log, acked)

            # Durable across a crash too.
            await srv.restart()
            with trio.fail_after(60):
                await follow(client, log, until=(await head(client))[1])
                check_history(await journal(client), log, acked)


async def _wait_turns_done(client: httpx2.AsyncClient, cid: str, n: int) -> None:
    while True:
        response = await client.get(f"/agentik/conversations/{cid}/messages",
                                    params={"limit": 1000})
        done = [m for m in response.json() if m["message"]["type"] in TERMINAL]
        if len(done) >= n:
            return
        await trio.sleep(0.05)


async def _wait_ready(client: httpx2.AsyncClient) -> None:
    while True:
        if (await client.get("/readyz")).status_code == 200:
            return
        await trio.sleep(0.05)  # polling a route: a subprocess server has no event to wait on


async def _wait_assistant(client: httpx2.AsyncClient, cid: str, turn_id: str) -> None:
    while True:
        response = await client.get(f"/agentik/conversations/{cid}/messages",
                                    params={"limit": 1000})
        for m in response.json():
            if m["message"]["type"] == "assistant_message" and m["message"]["turn_id"] == turn_id:
                return
        await trio.sleep(0.05)


# --- a read-only database --------------------------------------------------------------------------


def _writers() -> list[Writer]:
    return [o for o in gc.get_objects() if isinstance(o, Writer)]


@pytest.mark.sqlite_only  # a read-only database file
async def test_read_only_database_fails_clearly_and_recovers(
    tmp_path: Path, openai: ScriptedOpenAI, allow_error_logs: None
) -> None:
    """The writer connection made read-only (``PRAGMA query_only``: a read-only remount is refused
    while the database is open, and agentik has no hook for it): sends answer 503 ``storage``,
    reads work, nothing is half-written; back to read-write, sends work again, no gap."""
    openai.callable_default = lambda body: Reply("ok")
    async with (
        serve_app(make_config(tmp_path, openai)) as srv,
        httpx2.AsyncClient(base_url=srv.url, timeout=10) as client,
    ):
        with trio.fail_after(60):
            epoch, start = await head(client)
            log = EventLog(epoch=epoch, last=start)
            cid = await create(client)
            (writer,) = [w for w in _writers() if w.conn is not None]
            writer.conn.execute("PRAGMA query_only = 1")
            try:
                response = await client.post(f"/agentik/conversations/{cid}/messages",
                                             json=text("refused"))
                assert response.status_code == 503, response.text
                assert response.json()["error"]["code"] == "storage"
                assert "readonly" in response.json()["error"]["message"].replace("-", "")
                response = await client.post("/agentik/conversations", json={})
                assert response.status_code == 503, response.text
                assert (await client.get(f"/agentik/conversations/{cid}")).status_code == 200
            finally:
                writer.conn.execute("PRAGMA query_only = 0")
            response = await client.post(f"/agentik/conversations/{cid}/messages", json=text("ok"))
            assert response.status_code == 202, response.text
            acked = {response.json()["message_id"]}
            await _wait_assistant(client, cid, response.json()["message_id"])
            await follow(client, log, until=(await head(client))[1])
            check_history(await journal(client), log, acked)


# --- a chaos proxy between consumers and the server -------------------------------------------------


async def test_chaos_proxy_every_consumer_ends_with_the_server_history(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    """Consumers of ``/agentik/events`` behind a TCP proxy that delays, splits, truncates and cuts
    connections (seeded): each reconnects from the cursor of its last complete frame, and each
    ends with exactly the server's event history: same offsets, same events, no gap, no
    duplicate (checked as frames arrive)."""
    from tests.tcp_proxy import Faults, open_tcp_proxy

    openai.callable_default = lambda body: Reply(["All ", "good ", "here."], chunk_delay=0.002)
    consumers = 3
    async with (
        serve_app(make_config(tmp_path, openai)) as srv,
        httpx2.AsyncClient(base_url=srv.url, timeout=10) as direct,
    ):
        port = int(srv.url.rsplit(":", 1)[1])
        faults = Faults(seed=6, cut_probability=0.03, max_cuts=60 if LONG else 25, truncate=True,
                        delay=(0.0, 0.002), chunk_size=700)
        async with open_tcp_proxy("127.0.0.1", port, faults=faults) as proxy:
            epoch, start = await head(direct)
            logs = [EventLog(epoch=epoch, last=start) for _ in range(consumers)]
            with trio.fail_after(120):
                async with (
                    httpx2.AsyncClient(base_url=proxy.url, timeout=5) as via_proxy,
                    trio.open_nursery() as readers,
                ):

                    async def consume(log: EventLog) -> None:
                        while True:
                            await follow(via_proxy, log)
                            await trio.sleep(0.01)

                    for log in logs:
                        readers.start_soon(consume, log)
                    cids = [await create(direct) for _ in range(3)]
                    for i in range(60 if LONG else 20):
                        for cid in cids:
                            response = await direct.post(f"/agentik/conversations/{cid}/messages",
                                                         json=text(f"message {i}"))
                            assert response.status_code in (202, 429), response.text
                        await trio.sleep(0.01)
                    for cid in cids:
                        await _wait_turns_done(direct, cid, 1)
                    await _wait_all_turns(direct)
                    _, end = await head(direct)
                    for log in logs:
                        await _caught_up(log, end)
                    readers.cancel_scope.cancel()
            assert proxy.cuts > 0, "the proxy cut nothing: the test did not test anything"
            truth = EventLog(epoch=epoch, last=start)
            await follow(direct, truth, until=end)
            assert truth.last == end
            for log in logs:
                assert log.gaps == 0
                assert log.events == truth.events


async def _caught_up(log: EventLog, end: int) -> None:
    """Until the consumer's log reaches offset ``end`` (bounded by the caller's fail_after)."""
    for _ in range(100_000):
        if log.last >= end:
            return
        await trio.sleep(0.02)
    raise AssertionError("the consumer never caught up")


async def _wait_all_turns(client: httpx2.AsyncClient) -> None:
    """Until every user message in the journal has a terminal record."""
    while True:
        records = await journal(client)
        users = {r["id"] for r in records if r["message"]["type"] == "user_message"}
        ended = {r["message"].get("turn_id") for r in records if r["message"]["type"] in TERMINAL}
        if users <= ended:
            return
        await trio.sleep(0.05)
