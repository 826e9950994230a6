"""A turn's ending cut off with its commit in flight (issue 17): every turn ends with exactly one
terminal record. The connection breaks while the ending's commit statement waits in the server
(on the counter's lock, held by another session), so the node answers
StorageOutcomeUnknownError; ``write_until_stored`` retries the op rechecked (``ops.rechecked``).
Whether that first statement committed (the lock released before its session was ended) or
not (the node's next connection ended the session first), the retry leaves exactly one copy:
it finds the first one and returns it, or stores it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio

from agentik.errors import StorageOutcomeUnknownError
from agentik.storage import ops
from agentik.storage import queries as q
from agentik.storage.actor import Storage
from agentik.wire import AssistantItem, AssistantMessage, MessageRecord, Text, ToolItem, ToolResult
from tests.tcp_proxy import open_tcp_proxy
from tests.test_pg_cluster import create, node, send
from tests.test_pg_outage import _waits_on_a_lock


def answer(cid: str, turn_id: str, message_id: str) -> ops.FinishTurn:
    return ops.FinishTurn(
        conversation_id=cid, turn_id=turn_id, item=AssistantItem(content=[Text(body=message_id)]),
        assistant=(message_id, AssistantMessage(content=[Text(body=message_id)])))


def tool_result(cid: str, message_id: str) -> ops.AppendToolResult:
    return ops.AppendToolResult(
        conversation_id=cid, message_id=message_id,
        result=ToolResult(call_id=message_id, name="t", content="42"),
        item=ToolItem(call_id=message_id, name="t", content="42"))


def _count(watch: psycopg.Connection[Any], sql: str, *args: object) -> int:
    row = watch.execute(sql, args).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row[0])


async def _cut_in_flight(st: Storage, proxy: Any, pg_url: str, op: ops.AnyOp, *,
                         committed: bool) -> Any:
    """Write ``op`` (retried until stored) with its first commit cut off in the server; the
    first statement commits (``committed``) or is ended unfinished. Returns the write's result."""
    writer = st.feed.writer
    seen: list[BaseException] = []
    failed, stored_it = trio.Event(), trio.Event()
    result: list[Any] = []
    original = st.write

    async def write(o: ops.AnyOp) -> Any:  # each attempt, as write_until_stored makes them
        try:
            return await original(o)
        except BaseException as exc:
            seen.append(exc)
            failed.set()
            raise

    st.write = write  # type: ignore[method-assign,assignment]
    with psycopg.connect(pg_url) as blocker, psycopg.connect(pg_url, autocommit=True) as watch:
        blocker.execute("SELECT 1 FROM counter WHERE id = 1 FOR UPDATE")
        async with trio.open_nursery() as nursery:

            async def store() -> None:
                result.append(await st.write_until_stored(op))
                stored_it.set()

            nursery.start_soon(store)
            await _waits_on_a_lock(watch, lambda: writer.backend_pid)
            stale = writer.backend_pid
            proxy.refuse = True  # no retry gets through before the stale session is settled
            await proxy.cut_all()
            with trio.fail_after(10):
                await failed.wait()
            assert isinstance(seen[0], StorageOutcomeUnknownError)
            gone = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
            stored = "SELECT count(*) FROM message WHERE id = ANY(%s)"
            ids = list(ops.journal_ids(op))  # type: ignore[arg-type]
            if committed:
                blocker.rollback()  # the cut statement runs and commits, its client gone
                for _ in range(1000):
                    if not _count(watch, gone, stale):
                        break
                    await trio.sleep(0.01)
                assert _count(watch, stored, ids) == len(ids)  # the first attempt is stored
                proxy.refuse = False
            else:
                proxy.refuse = False
                # the retry's statement waits on the lock: the stale session was ended first
                await _waits_on_a_lock(watch, lambda: writer.backend_pid, other_than=stale)
                assert not _count(watch, gone, stale)
                assert _count(watch, stored, ids) == 0  # the first attempt never will be
                blocker.rollback()
            with trio.fail_after(20):
                await stored_it.wait()
    del st.write
    return result[0]


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not_committed"])
async def test_an_answer_cut_off_in_flight_is_the_turn_s_one_terminal_record(
        pg_url: str, committed: bool) -> None:
    async with open_tcp_proxy("127.0.0.1", 5432) as proxy:
        through = pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
        async with node(through, db_timeout=5.0) as a:
            await create(a, "c1")
            await a.write(send("c1", "m0"))
            await a.write(answer("c1", "m0", "a0"))  # the ending's statement, prepared
            await a.write(send("c1", "m1"))
            result = await _cut_in_flight(a, proxy, pg_url, answer("c1", "m1", "a1"),
                                          committed=committed)
            # what a first success returns: the answer's record, as stored
            assert [r.id for r in result] == ["a1"] and isinstance(result[0], MessageRecord)
            journal = await a.reader.run(q.get_messages, "c1", 0, 0, 100)
            assert [(m.id, type(m.message).__name__) for m in journal] == [
                ("m0", "UserMessage"), ("a0", "AssistantMessage"),
                ("m1", "UserMessage"), ("a1", "AssistantMessage")]
            assert result == [journal[3]]
            with psycopg.connect(pg_url) as conn:
                assert _count(conn, "SELECT count(*) FROM turn") == 0
                # the turn's ending once in the outbox: one answer event, one touched
                assert _count(conn, "SELECT count(*) FROM outbox WHERE convert_from(payload, "
                              "'UTF8') LIKE '%%\"a1\"%%'") == 1
            assert (await a.reader.run(q.working_memory, "c1"))[-1][1] == AssistantItem(
                content=[Text(body="a1")])
            assert len(await a.reader.run(q.working_memory, "c1")) == 3  # system, a0, a1


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not_committed"])
async def test_a_tool_result_cut_off_in_flight_is_stored_once(
        pg_url: str, committed: bool) -> None:
    async with open_tcp_proxy("127.0.0.1", 5432) as proxy:
        through = pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
        async with node(through, db_timeout=5.0) as a:
            await create(a, "c1")
            await a.write(send("c1", "m0"))
            await a.write(tool_result("c1", "r0"))  # the statement, prepared
            result = await _cut_in_flight(a, proxy, pg_url, tool_result("c1", "r1"),
                                          committed=committed)
            journal = await a.reader.run(q.get_messages, "c1", 0, 0, 100)
            assert [m.id for m in journal] == ["m0", "r0", "r1"]
            assert result == journal[2]
            memory = await a.reader.run(q.working_memory, "c1")
            assert [type(item).__name__ for _, item in memory] == [
                "SystemItem", "ToolItem", "ToolItem"]
