"""Issue 11 #5: a store that refuses writes (a full disk or database, a read-only store) never
leaves an accepted turn without its terminal record, and ``/readyz`` says why while it lasts.

The scenario runs on a real server (hypercorn on 127.0.0.1, real database files) three ways: a
real full disk (a 4 MiB tmpfs filled by a file; needs root, else skipped), a full SQLite
database (``PRAGMA max_page_count`` on the writer's connection), and PostgreSQL refusing writes
(``default_transaction_read_only`` on the writer's connection). The backoff of the retries and
of the probe is checked alone under trio's MockClock.
"""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import gc
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
import trio.testing

from agentik.actors import turn as logic
from agentik.errors import NotFoundError, StorageError, StorageUnavailableError
from agentik.llm.base import TextDelta, ToolCallDelta
from agentik.storage import ops
from agentik.storage.actor import probe_while_refused
from agentik.storage.health import Backoff, StorageHealth, retry_until_stored
from agentik.tools.base import ToolOutcome
from agentik.wire import AssistantItem, Text
from tests.diskutil import fill_disk, small_tmpfs
from tests.scripted_openai import Reply, ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    allow_error_logs,
    make_config,
    no_error_logs,
    open_sse,
    openai,
    serve_app,
)

OP = ops.RecoverTurns(conversation_id="c")
TERMINAL = ("assistant_message", "error")


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


# --- the backoff alone (MockClock) ------------------------------------------------------------------


def test_backoff_doubles_up_to_its_cap() -> None:
    delays = Backoff(initial=0.05, maximum=1.0).delays()
    assert [next(delays) for _ in range(8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


async def test_retry_backs_off_and_wakes_when_writes_are_accepted(
    clock: trio.testing.MockClock, allow_error_logs: None
) -> None:
    """Attempts follow the backoff while refused; the store accepting writes again (here at
    t=10, between two attempts) wakes the retry at once, not at its next delay."""
    health = StorageHealth()
    attempts: list[float] = []
    broken = True

    async def write(op: ops.AnyOp) -> str:
        attempts.append(trio.current_time())
        if broken:
            health.refused("database or disk is full")
            raise StorageUnavailableError("database or disk is full")
        return "stored"

    async def space_returns() -> None:
        nonlocal broken
        await trio.sleep(10.0)
        broken = False
        health.accepted()

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(space_returns)
        assert await retry_until_stored(write, health, OP) == "stored"
    times = [round(t - start, 6) for t in attempts]
    assert times[:6] == [0.0, 0.05, 0.15, 0.35, 0.75, 1.55]  # 0.05 doubling ...
    assert times[6] == 2.55 and times[-2] == 9.55  # ... capped at 1 s ...
    assert times[-1] == 10.0  # ... and woken by the recovery itself


async def test_retry_ends_on_cancel_and_on_errors_that_retrying_cannot_fix(
    clock: trio.testing.MockClock, allow_error_logs: None
) -> None:
    health = StorageHealth()
    calls: list[float] = []

    async def refused(op: ops.AnyOp) -> None:
        calls.append(trio.current_time())
        health.refused("read-only")
        raise StorageUnavailableError("read-only")

    with trio.move_on_after(0.3) as scope:
        await retry_until_stored(refused, health, OP)
    assert scope.cancelled_caught and len(calls) == 3  # t=0, 0.05, 0.15; cancelled in a wait

    for error in (NotFoundError("gone"), StorageError("UNIQUE constraint failed")):
        calls.clear()

        async def fails(op: ops.AnyOp, error: Exception = error) -> None:
            calls.append(trio.current_time())
            raise error

        with pytest.raises(type(error)):
            await retry_until_stored(fails, health, OP)
        assert len(calls) == 1


async def test_the_idle_writer_probes_with_backoff_until_writes_are_accepted(
    clock: trio.testing.MockClock, allow_error_logs: None
) -> None:
    """With no write coming, a store that refuses writes is probed at the backoff's delays; a
    write arriving meanwhile starts the backoff over; probing stops once a probe succeeds, and
    starts again at the next refusal."""
    health = StorageHealth()
    health.refused("database or disk is full")
    probes: list[float] = []
    writes = trio.Event()
    start = trio.current_time()

    async def activity() -> None:
        nonlocal writes
        writes = trio.Event()
        await writes.wait()

    async def probe() -> None:
        probes.append(round(trio.current_time() - start, 6))
        if 3.0 <= trio.current_time() - start < 19.0 or trio.current_time() - start > 19.7:
            health.accepted()
        else:
            health.refused("database or disk is full")

    async def write_at(t: float) -> None:
        await trio.sleep_until(start + t)
        writes.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe_while_refused, health, activity, probe)
        await write_at(0.5)
        await trio.sleep_until(start + 19.0)
        assert health.writable
        # 0.05, 0.1, 0.2 from the start; the write at 0.5 starts over: 0.05, 0.1, 0.2, 0.4,
        # 0.8, 1.0; the probe at 3.05 succeeds and none follow while writes are accepted
        assert probes == [0.05, 0.15, 0.35, 0.55, 0.65, 0.85, 1.25, 2.05, 3.05]
        health.refused("database or disk is full")  # at 19.0: a write was refused again
        await trio.sleep_until(start + 20.0)
        assert probes[9:] == [19.05, 19.15, 19.35, 19.75] and health.writable
        nursery.cancel_scope.cancel()


# --- a turn cut while the store refused one of its writes (pure turn logic) ----------------------


def _round_with_calls() -> tuple[logic.TurnState, logic.RunTools]:
    s = logic.TurnState(conversation_id="c", turn_id="t")
    logic.new_round(s)
    for delta in (TextDelta("Looking. "), ToolCallDelta(index=0, id="a", name="f"),
                  ToolCallDelta(index=1, id="b", name="g")):
        logic.apply_delta(s, delta)
    step = logic.after_round(s, max_tool_rounds=8)
    assert isinstance(step, logic.RunTools)
    return s, step


def test_calls_not_stored_leave_no_result_and_keep_the_round_text() -> None:
    """The round's calls were never stored (an interrupt during their retry): the ending
    stores no ToolFailed for them and keeps the round's text in working memory itself."""
    s, _ = _round_with_calls()
    logic.calls_not_stored(s)
    (finish,) = logic.end(s, logic.Interrupted())
    assert isinstance(finish, ops.FinishTurn)
    assert finish.item == AssistantItem(content=[Text(body="Looking. ")])


def test_a_result_not_stored_makes_its_call_pending_again() -> None:
    s, step = _round_with_calls()
    result = logic.tool_result(s, step.calls[0], ToolOutcome(content="1"), 100)
    logic.tool_done(s, result)  # made, then cut before it was stored
    logic.result_not_stored(s, step.calls[0])
    logic.result_not_stored(s, step.calls[0])  # twice changes nothing
    *closed, _ = logic.end(s, logic.Interrupted())
    assert [op.result.call_id for op in closed] == ["a", "b"]  # type: ignore[union-attr]


# --- ways for a store to refuse writes --------------------------------------------------------------


def _sqlite_writer(db_dir: Path) -> Any:
    """The running server's SQLite Writer (the test reaches it through ``gc``, as agentik has
    no hook for this): the one whose open connection is on a file in ``db_dir``."""
    from agentik.storage.sqlite.writer import Writer

    found = []
    for o in gc.get_objects():
        if isinstance(o, Writer):
            try:
                path = o.conn.execute("PRAGMA database_list").fetchone()[2]
            except sqlite3.ProgrammingError:
                continue  # closed
            if Path(path).parent == db_dir:
                found.append(o)
    (writer,) = found
    return writer


def _pg_writer() -> Any:
    from agentik.storage.pg.writer import PgWriter

    (writer,) = [o for o in gc.get_objects() if isinstance(o, PgWriter) and not o.conn.closed]
    return writer


@dataclass
class Refusal:
    """``refuse()`` makes the store refuse writes, ``allow()`` lets it accept them again."""

    name: str
    db_dir: Path
    database_url: str | None = None
    mount: Path | None = None

    def refuse(self) -> None:
        if self.name == "tmpfs":
            assert self.mount is not None
            fill_disk(self.mount / "filler")
        elif self.name == "max_page_count":
            conn = _sqlite_writer(self.db_dir).conn
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            assert free < 8, free  # the turn's answer below needs more new pages than that
            conn.execute(f"PRAGMA max_page_count = {pages}")
        else:
            _pg_writer().conn.execute("SET default_transaction_read_only = on")

    def allow(self) -> None:
        if self.name == "tmpfs":
            assert self.mount is not None
            (self.mount / "filler").unlink()
        elif self.name == "max_page_count":
            _sqlite_writer(self.db_dir).conn.execute("PRAGMA max_page_count = 1073741823")
        else:
            _pg_writer().conn.execute("SET default_transaction_read_only = off")

    @property
    def says(self) -> str:
        return "read-only" if self.name == "postgres" else "full"


@pytest.fixture(params=["tmpfs", "max_page_count", "postgres"])
def refusal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Refusal]:
    if request.param == "tmpfs":
        with small_tmpfs(tmp_path / "mnt", "4m") as mnt:
            yield Refusal("tmpfs", mnt, mount=mnt)
    elif request.param == "max_page_count":
        yield Refusal("max_page_count", tmp_path)
    else:
        yield Refusal("postgres", tmp_path, database_url=request.getfixturevalue("pg_url"))


# --- the scenario on a real server ------------------------------------------------------------------


def text(body: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "body": body}]}


async def send(client: httpx2.AsyncClient, cid: str, body: str) -> str | None:
    """The message id of an accepted (202) send; None for a 503 ``storage`` (not accepted)."""
    response = await client.post(f"/agentik/conversations/{cid}/messages", json=text(body))
    assert response.status_code in (202, 503), (response.status_code, response.text)
    if response.status_code == 503:
        assert response.json()["error"]["code"] == "storage", response.text
        return None
    return str(response.json()["message_id"])


@asynccontextmanager
async def live(client: httpx2.AsyncClient, cid: str) -> AsyncIterator[Any]:
    async with open_sse(client, f"/agentik/conversations/{cid}/live") as stream:
        yield stream


async def journal(client: httpx2.AsyncClient, cid: str) -> list[dict[str, Any]]:
    response = await client.get(f"/agentik/conversations/{cid}/messages", params={"limit": 1000})
    assert response.status_code == 200, response.text
    return list(response.json())


async def test_store_refusing_writes_mid_turn_then_accepting_again(
    refusal: Refusal, openai: ScriptedOpenAI, allow_error_logs: None
) -> None:
    """Messages are accepted, a turn is mid-answer, the store starts refusing writes: /readyz
    answers 503 with the database's reason, sends answer 503 ``storage`` (nothing acknowledged
    that is not stored), the turn cannot store its answer and waits. Once the store accepts
    writes again (no restart), within 10 s every accepted message has its terminal record (the
    interrupted turn its whole answer), /readyz is 200, and the next turn works."""
    answer = ["The answer begins. "] + [f"part {i} " + "x" * 2000 + " " for i in range(32)]
    gate = trio.Event()
    openai.push(Reply(answer, gate=gate))
    openai.default = Reply("fine")
    config = make_config(refusal.db_dir, openai, database_url=refusal.database_url)
    async with (
        serve_app(config) as srv,
        httpx2.AsyncClient(base_url=srv.url, timeout=10) as client,
    ):
        with trio.fail_after(60):
            assert (await client.get("/readyz")).json()["status"] == "ready"
            response = await client.post("/agentik/conversations", json={})
            assert response.status_code == 201, response.text
            cid = response.json()["id"]
            acked: list[str] = []
            async with live(client, cid) as stream:
                first = await send(client, cid, "tell me everything")
                assert first is not None
                acked.append(first)
                await stream.until("append_text")  # the turn is mid-answer, held by the gate
            for body in ("queued one", "queued two"):
                queued = await send(client, cid, body)
                assert queued is not None
                acked.append(queued)

            refusal.refuse()
            gate.set()  # the answer arrives and cannot be stored
            health = srv.agent.storage_health
            await health.wait_writable(False)
            ready = await client.get("/readyz")
            assert ready.status_code == 503, ready.text
            body = ready.json()
            assert body["status"] == "not_ready" and body["runtime"] == "running"
            assert body["storage"]["writable"] is False
            assert refusal.says in body["storage"]["error"], body
            assert refusal.says in body["reasons"][0], body
            assert (await client.get("/healthz")).status_code == 200  # liveness is not readiness
            cut = await client.post(f"/agentik/conversations/{cid}/interrupt")
            assert cut.json() == {"interrupted": False}  # its answer is made: it is being stored
            for i in range(3):  # sends: 503 while refused (a small one may still fit: then 202)
                during = await send(client, cid, f"during {i} " + "y" * 4000)
                if during is not None:
                    acked.append(during)
            records = await journal(client, cid)  # reads keep working
            assert not [r for r in records if r["message"]["type"] in TERMINAL]

            await _ends_after_allow(srv, client, cid, refusal, acked, "".join(answer))


async def _ends_after_allow(srv: Server, client: httpx2.AsyncClient, cid: str, refusal: Refusal,
                            acked: list[str], answer: str) -> None:
    hub_epoch = srv.hub.epoch
    _, current = (await client.get("/agentik/cursor")).json()["current"].split(":")
    async with open_sse(client, f"/agentik/conversations/{cid}/events",
                        after=f"{hub_epoch}:{current}") as events:
        refusal.allow()
        ended: set[str] = set()
        with trio.fail_after(10):  # issue 11: within 10 s of the store accepting writes
            while not set(acked) <= ended:
                frame = await events.next_event()
                if frame.event in TERMINAL:
                    ended.add(frame.common().event.record.message.turn_id)  # type: ignore[union-attr]
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
    records = await journal(client, cid)
    users = [r["id"] for r in records if r["message"]["type"] == "user_message"]
    assert set(acked) <= set(users), "an acknowledged message was lost"
    answers = {r["message"]["turn_id"]: r["message"] for r in records
               if r["message"]["type"] == "assistant_message"}
    first = answers[acked[0]]  # the turn cut by the refusal kept its whole answer
    assert first["content"][0]["body"] == answer and not first["interrupted"]
    assert all(turn in answers for turn in acked), "every accepted turn ran to its answer"
    after = await send(client, cid, "and now?")  # the next turn works, no restart
    assert after is not None
    with trio.fail_after(10):
        async with live(client, cid) as stream:
            while after not in {r["message"].get("turn_id") for r in await journal(client, cid)
                                if r["message"]["type"] == "assistant_message"}:
                await stream.next_event()
    assert srv.hub.epoch == hub_epoch and not srv.fatal


@pytest.fixture
def refusal_a_delete_cannot_beat(refusal: Refusal) -> Refusal:
    """Skipped in a plain fixture, not in the trio test: pytest-trio reports a skip raised
    inside the test without its reason."""
    if refusal.name == "max_page_count":
        pytest.skip("a delete frees pages, so under max_page_count it may fit and succeed")
    return refusal


async def test_a_conversation_stopped_while_its_end_is_refused_still_gets_it(
    refusal_a_delete_cannot_beat: Refusal, openai: ScriptedOpenAI, allow_error_logs: None
) -> None:
    """The turn's answer cannot be stored and the conversation is deleted meanwhile: its actor
    stops, the delete (a write) answers 503. Once the store accepts writes (no restart), the
    turn still gets its terminal record, its whole answer, within 10 s; the conversation is
    there and its next turn works."""
    refusal = refusal_a_delete_cannot_beat
    answer = ["Begin. "] + [f"part {i} " + "x" * 2000 + " " for i in range(32)]
    gate = trio.Event()
    openai.push(Reply(answer, gate=gate))
    openai.default = Reply("fine")
    config = make_config(refusal.db_dir, openai, database_url=refusal.database_url)
    async with (
        serve_app(config) as srv,
        httpx2.AsyncClient(base_url=srv.url, timeout=10) as client,
    ):
        with trio.fail_after(60):
            cid = (await client.post("/agentik/conversations", json={})).json()["id"]
            async with live(client, cid) as stream:
                first = await send(client, cid, "tell me everything")
                assert first is not None
                await stream.until("append_text")
            refusal.refuse()
            gate.set()
            await srv.agent.storage_health.wait_writable(False)
            deleted = await client.delete(f"/agentik/conversations/{cid}")
            assert deleted.status_code == 503, deleted.text
            assert deleted.json()["error"]["code"] == "storage"
            assert await send(client, cid, "not now") is None  # 503 while it is still closing
            await _ends_after_allow(srv, client, cid, refusal, [first], "".join(answer))


# --- /readyz ---------------------------------------------------------------------------------------


async def test_readyz_is_public_and_a_failed_mcp_server_is_degraded_not_unready(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    """A failed MCP server: 200 ``degraded`` naming it and why (the why only with a token when
    auth is on); the route needs no token, like /healthz."""
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {
        "ghost": {"command": str(tmp_path / "no-such-mcp-server"), "args": []}}}))
    config = make_config(tmp_path, openai, mcp_config=str(mcp), tokens=("s3cret",))
    async with serve_app(config) as srv, httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
        with trio.fail_after(20):
            while True:
                public = await http.get("/readyz")
                assert public.status_code == 200, public.text
                if public.json()["status"] == "degraded":
                    break
                await trio.sleep(0.05)  # polling a route: MCP state has no event a client sees
        body = public.json()
        assert body["tools"] == [{"name": "ghost", "state": body["tools"][0]["state"],
                                  "error": None}], body
        assert body["reasons"] == ["MCP server 'ghost' failed"]
        assert body["storage"] == {"writable": True, "error": None, "since": None}
        full = await http.get("/readyz", headers={"Authorization": "Bearer s3cret"})
        assert full.status_code == 200
        assert "no-such-mcp-server" in full.json()["tools"][0]["error"], full.json()
        assert "no-such-mcp-server" in full.json()["reasons"][0]
        assert (await http.get("/agentik/tools")).status_code == 401  # the API still needs it


async def test_readyz_before_the_runtime_runs(tmp_path: Path, openai: ScriptedOpenAI) -> None:
    from agentik.web.app import create_app

    app = create_app(make_config(tmp_path, openai), handle_sigterm=False)
    response = await app.test_client().get("/readyz")  # no lifespan: the runtime never started
    assert response.status_code == 503
    body = json.loads(await response.get_data())
    assert body["status"] == "not_ready" and body["runtime"] == "starting", body
    assert body["reasons"] == ["the runtime is starting"]


async def test_readiness_returns_without_traffic_once_writes_are_accepted(
    refusal: Refusal, openai: ScriptedOpenAI, allow_error_logs: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One refused send makes /readyz 503; after the store accepts writes again, nothing else
    is sent, and the writer's own probe brings /readyz back to 200 (within 10 s). The outage is
    logged once as an error and once when it ends, not once per refused attempt."""
    caplog.set_level(logging.INFO, logger="agentik.storage")
    config = make_config(refusal.db_dir, openai, database_url=refusal.database_url)
    async with (
        serve_app(config) as srv,
        httpx2.AsyncClient(base_url=srv.url, timeout=10) as client,
    ):
        with trio.fail_after(30):
            response = await client.post("/agentik/conversations", json={})
            assert response.status_code == 201, response.text
            cid = response.json()["id"]
            refusal.refuse()
            assert await send(client, cid, "refused " + "z" * 20_000) is None
            health = srv.agent.storage_health
            while health.refusals < 4:  # the probe keeps failing while the store refuses
                await health.changed()
            assert not health.writable
            assert (await client.get("/readyz")).status_code == 503
            refusal.allow()
        with trio.fail_after(10):
            await srv.agent.storage_health.wait_writable()
        assert (await client.get("/readyz")).json()["status"] == "ready"
    storage_lines = [r for r in caplog.records if r.name.startswith("agentik.storage")
                     and r.levelno >= logging.WARNING]
    assert [r.levelno for r in storage_lines] == [logging.ERROR, logging.WARNING], [
        r.getMessage() for r in storage_lines]


def accepting_writes(exposition: str) -> float:
    """The value of ``agentik_storage_accepting_writes`` in a /metrics answer."""
    from prometheus_client.parser import text_string_to_metric_families

    (value,) = [s.value for family in text_string_to_metric_families(exposition)
                for s in family.samples if s.name == "agentik_storage_accepting_writes"]
    return float(value)


async def test_metrics_gauge_says_whether_storage_accepts_writes(
    tmp_path: Path, openai: ScriptedOpenAI, allow_error_logs: None
) -> None:
    """``agentik_storage_accepting_writes`` on /metrics is 1 while the store accepts writes, 0
    from its first refused write (the SQLite database full), 1 again once its probe succeeds;
    it says what /readyz says."""
    refusal = Refusal("max_page_count", tmp_path)
    async with (
        serve_app(make_config(tmp_path, openai)) as srv,
        httpx2.AsyncClient(base_url=srv.url, timeout=10) as client,
    ):
        with trio.fail_after(30):
            assert accepting_writes((await client.get("/metrics")).text) == 1
            cid = (await client.post("/agentik/conversations", json={})).json()["id"]
            refusal.refuse()
            assert await send(client, cid, "refused " + "z" * 20_000) is None
            assert accepting_writes((await client.get("/metrics")).text) == 0
            assert (await client.get("/readyz")).status_code == 503
            refusal.allow()
        with trio.fail_after(10):
            await srv.agent.storage_health.wait_writable()
        assert accepting_writes((await client.get("/metrics")).text) == 1
        assert (await client.get("/readyz")).status_code == 200
