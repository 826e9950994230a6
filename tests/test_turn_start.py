"""A message sent to an idle conversation is stored with its turn's start, in one commit
(``ops.AppendUserMessage.start``, issue 13); a message that has to wait for another turn is not:
its item enters working memory when its turn starts, after the other turn's answer."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from agentik import Config, open_runtime
from agentik.errors import BusyError, NotFoundError
from agentik.llm.base import ToolSpec
from agentik.storage import ops
from agentik.storage.sqlite.writer import Writer
from agentik.testing import FunctionLlm
from agentik.wire import AssistantItem, AssistantMessage, SystemItem, Text, UserItem, UserMessage, WorkingItem
from tests.test_runtime import run_turn

SYSTEM = SystemItem(text="You are a test assistant.")


def said(text: str) -> UserItem:
    return UserItem(content=[Text(text)])


def answered(text: str) -> AssistantItem:
    return AssistantItem(content=[Text(text)])


def echo(messages: list[WorkingItem], tools: list[ToolSpec]) -> str:
    last = messages[-1]
    assert isinstance(last, UserItem) and isinstance(last.content[0], Text)
    return "echo: " + last.content[0].body


@pytest.fixture
def cfg(db_path: str) -> Config:
    return Config(db_path=db_path, system_prompt=SYSTEM.text)


class _Ops:
    """Every op written, in order (``Writer.commit_batch`` wrapped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.batches: list[list[ops.AnyOp]] = []
        commit = Writer.commit_batch

        def recording(writer: Writer, batch: list[ops.AnyOp]) -> Any:
            self.batches.append(list(batch))
            return commit(writer, batch)

        monkeypatch.setattr(Writer, "commit_batch", recording)

    def of(self, cid: str) -> list[ops.AnyOp]:
        return [op for b in self.batches for op in b if getattr(op, "conversation_id", 0) == cid]


async def test_a_turn_of_an_idle_conversation_starts_in_its_messages_commit(
    cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = _Ops(monkeypatch)
    async with open_runtime(cfg, llm=FunctionLlm(echo)) as agent:
        conv = await agent.create_conversation()
        for text in ["one", "two"]:  # the second: the actor's copy of memory is loaded
            await trio.testing.wait_all_tasks_blocked()  # the actor is back in its mailbox loop
            await run_turn(agent, conv, text)
        storage = agent._deps.storage
        memory = [item for _, item in await storage.reader.working_memory(conv.id)]
        assert memory == [SYSTEM, said("one"), answered("echo: one"), said("two"),
                          answered("echo: two")]
        kinds = [type(op).__name__ for op in written.of(conv.id)]
        assert kinds == ["CreateConversation", "AppendUserMessage", "FinishTurn",
                         "AppendUserMessage", "FinishTurn"], "a StartTurn commit per turn"
        starts = [op.start for op in written.of(conv.id) if isinstance(op, ops.AppendUserMessage)]
        assert starts == [said("one"), said("two")]
        # and the model saw each question once, in order (the actor's copy is in step)
        await trio.testing.wait_all_tasks_blocked()
        await run_turn(agent, conv, "three")
        memory = [item for _, item in await storage.reader.working_memory(conv.id)]
        assert memory[-2:] == [said("three"), answered("echo: three")]


async def test_a_message_that_waits_for_a_running_turn_starts_after_its_answer(
    cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = _Ops(monkeypatch)
    gate, entered = trio.Event(), trio.Event()

    async def slow(messages: list[WorkingItem], tools: list[ToolSpec]) -> str:
        if not entered.is_set():
            entered.set()
            await gate.wait()
        return echo(messages, tools)

    async with open_runtime(cfg, llm=FunctionLlm(slow)) as agent:
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        await conv.send("running")
        with trio.fail_after(10):
            await entered.wait()
        await conv.send("queued")  # stored while the first turn runs
        gate.set()
        await touched(agent, cursor, conv.id, 2)
        memory = [item for _, item in
                  await agent._deps.storage.reader.working_memory(conv.id)]
    assert memory == [SYSTEM, said("running"), answered("echo: running"), said("queued"),
                      answered("echo: queued")]
    queued = [op for op in written.of(conv.id) if isinstance(op, ops.AppendUserMessage)][1]
    assert queued.start is None
    assert any(isinstance(op, ops.StartTurn) for op in written.of(conv.id))


async def touched(agent: Any, cursor: Any, cid: str, n: int) -> None:
    """Until the conversation's ``n``-th Touched (every turn's ending ends with one)."""
    seen = 0
    with trio.fail_after(10):
        async for ev in agent.outbox.conversation_events(cursor, cid):
            seen += ev.type == "touched"
            if seen == n:
                return


async def test_two_sends_at_once_to_an_idle_conversation_start_one_after_the_other(
    cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both sends run before the actor does (the first turn was handed to it, the mailbox looks
    empty): only the first may start with its message."""
    written = _Ops(monkeypatch)
    async with open_runtime(cfg, llm=FunctionLlm(echo)) as agent:
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conv.send, "a")
            nursery.start_soon(conv.send, "b")
        await touched(agent, cursor, conv.id, 2)
        memory = [item for _, item in
                  await agent._deps.storage.reader.working_memory(conv.id)]
    users = [m for m in memory if isinstance(m, UserItem)]
    first = users[0]
    second = users[1]
    assert memory == [SYSTEM, first, answered("echo: " + first.content[0].body),  # type: ignore[union-attr]
                      second, answered("echo: " + second.content[0].body)]  # type: ignore[union-attr]
    starts = [op.start for op in written.of(conv.id) if isinstance(op, ops.AppendUserMessage)]
    assert starts[0] is not None and starts[1] is None


def test_the_writer_stores_the_start_with_the_message(tmp_path: Any) -> None:
    """SQLite: the item enters working memory and the turn row is running, in the message's
    transaction; a replayed idempotency key stores neither again."""
    writer = Writer(str(tmp_path / "w.db"), synchronous="NORMAL", outbox_cap=1000,
                    outbox_ttl=3600.0)
    try:
        created = writer.commit_batch([ops.CreateConversation(
            conversation_id="c", title=None, is_temporal=False, system_prompt="sys")])
        assert not isinstance(created.results[0], Exception)
        key = ops.Idempotency(key="k", fingerprint="f", ttl=60.0)
        message = UserMessage(content=[Text("hi")])
        op = ops.AppendUserMessage(conversation_id="c", message_id="m", message=message,
                                   idempotency=key, start=said("hi"))
        result = writer.commit_batch([op])
        assert [e.event.type for e in result.events] == ["user_message"]  # no seq for the start
        again = writer.commit_batch([msgspec.structs.replace(op, message_id="m2")])
        assert isinstance(again.results[0], ops.Replayed)
        conn = writer.conn
        rows = conn.execute("SELECT order_idx, source_message_id FROM working_memory "
                            "WHERE conversation_id='c' ORDER BY order_idx").fetchall()
        assert rows == [(1, None), (2, "m")]
        assert conn.execute("SELECT id, state FROM turn").fetchall() == [("m", "running")]
        missing = writer.commit_batch([ops.AppendUserMessage(
            conversation_id="nope", message_id="x", message=message, start=said("hi"))])
        assert isinstance(missing.results[0], NotFoundError)
        assert conn.execute("SELECT COUNT(*) FROM working_memory").fetchone()[0] == 2
    finally:
        writer.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Any) -> dict[str, Any]:
    if request.param == "sqlite":
        return {"path": str(tmp_path / "s.db")}
    return {"path": "unused.db", "database_url": request.getfixturevalue("pg_url"),
            "node_id": "n1"}


async def test_both_engines_store_the_start_with_the_message(engine: dict[str, Any]) -> None:
    from functools import partial

    from agentik.storage.actor import Storage, run_storage

    async with trio.open_nursery() as nursery:
        st: Storage = await nursery.start(partial(run_storage, **engine))
        await st.write(ops.CreateConversation(conversation_id="c", title=None, is_temporal=False,
                                              system_prompt="sys"))
        key = ops.Idempotency(key="k", fingerprint="f", ttl=60.0)
        message = UserMessage(content=[Text("hi")])
        op = ops.AppendUserMessage(conversation_id="c", message_id="m", message=message,
                                   idempotency=key, start=said("hi"))
        head = st.hub.current_cursor().offset
        record = await st.write(op)
        assert record.seq == head + 1 == st.hub.current_cursor().offset  # the start takes no seq
        assert isinstance(await st.write(msgspec.structs.replace(op, message_id="m2")),
                          ops.Replayed)
        with pytest.raises(NotFoundError):
            await st.write(msgspec.structs.replace(op, conversation_id="gone", idempotency=None))
        # a later turn's items come after it
        await st.write(ops.FinishTurn(conversation_id="c", turn_id="m",
                                      assistant=("a", AssistantMessage(content=[Text("yo")])),
                                      item=answered("yo")))
        items = await st.reader.working_memory("c")
        assert [item for _, item in items] == [SystemItem(text="sys"), said("hi"), answered("yo")]
        nursery.cancel_scope.cancel()


async def test_a_second_send_in_the_same_tick_to_an_idle_conversation_is_busy(cfg: Config) -> None:
    """The first send's turn went straight to the waiting actor (the mailbox looks empty), before
    the actor ran: a second send at once still finds the conversation busy, so ``reject``
    refuses it (it was accepted and queued)."""
    async with open_runtime(cfg, llm=FunctionLlm(echo)) as agent:
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        outcomes: list[object] = []

        async def send(text: str) -> None:
            try:
                outcomes.append(await conv.send(text, on_busy="reject"))
            except BusyError as exc:
                outcomes.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "a")
            nursery.start_soon(send, "b")
        await touched(agent, cursor, conv.id, 1)
        assert sorted(type(o).__name__ for o in outcomes) == ["BusyError", "str"], outcomes
        memory = await agent._deps.storage.reader.working_memory(conv.id)
        assert len([item for _, item in memory if isinstance(item, UserItem)]) == 1
