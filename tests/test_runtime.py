"""The runtime end to end, in-process, real SQLite. The model is agentik.testing's FunctionLlm /
ScriptedLlm where the backend is not the subject (fast, deterministic); the openai backend against
the scripted server where it is (connection failures, a killed process)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable

import pytest
import trio
import trio.testing

import agentik
from agentik import Config, open_runtime
from agentik.errors import ConversationFailedError, LlmResponseError, MailboxFullError, NotFoundError
from agentik.llm.base import ToolSpec, UsageDelta
from agentik.testing import Delta, FunctionLlm, ScriptedLlm
from agentik.tools.base import FunctionTools
from agentik.wire import (
    AssistantItem,
    AssistantMessage,
    CommonEvent,
    Cursor,
    Error,
    SystemItem,
    Text,
    ToolCall,
    ToolCallSpec,
    ToolItem,
    ToolResult,
    UserItem,
    UserMessage,
    WorkingItem,
)
from tests.conftest import engine_url
from tests.scripted_openai import Hang, ScriptedOpenAI

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

SYSTEM = SystemItem(text="You are a test assistant.")


@pytest.fixture
def cfg(db_path: str, engine: str | None) -> Config:
    """A config for runs with a test double as the model (no model server)."""
    return Config(db_path=db_path, system_prompt=SYSTEM.text, database_url=engine)


def user_text(messages: list[WorkingItem]) -> str:
    last = messages[-1]
    assert isinstance(last, UserItem) and isinstance(last.content[0], Text)
    return last.content[0].body


def echo(messages: list[WorkingItem], tools: list[ToolSpec]) -> str:
    return "echo: " + user_text(messages)


def said(text: str) -> UserItem:
    return UserItem(content=[Text(text)])


def answered(text: str) -> AssistantItem:
    return AssistantItem(content=[Text(text)])


async def take_until(
    it: AsyncIterator[CommonEvent], stop: Callable[[CommonEvent], bool], seconds: float = 10
) -> list[CommonEvent]:
    out: list[CommonEvent] = []
    with trio.fail_after(seconds):
        async for ev in it:
            out.append(ev)
            if stop(ev):
                return out
    return out


async def watch(
    nursery: trio.Nursery, it: AsyncIterator[CommonEvent], stop: Callable[[CommonEvent], bool]
) -> list[CommonEvent]:
    """Start consuming ``it`` in a task and return once it is subscribed (async generators
    subscribe on their first step); the list fills as events arrive."""
    out: list[CommonEvent] = []

    async def run() -> None:
        out.extend(await take_until(it, stop))

    nursery.start_soon(run)
    await trio.testing.wait_all_tasks_blocked()
    return out


def is_type(*names: str) -> Callable[[CommonEvent], bool]:
    return lambda ev: ev.type in names


def nth(name: str, n: int) -> Callable[[CommonEvent], bool]:
    """Stop at the ``n``-th event of type ``name``."""
    seen = 0

    def stop(ev: CommonEvent) -> bool:
        nonlocal seen
        seen += ev.type == name
        return seen == n

    return stop


async def run_turn(agent: agentik.LocalAgent, conv: agentik.LocalConversation, text: str,
                   ) -> list[CommonEvent]:
    """Send and return the conversation's durable events up to and including Touched."""
    cursor = await agent.outbox.current_cursor()
    await conv.send(text)
    return await take_until(agent.outbox.conversation_events(cursor, conv.id), is_type("touched"))


async def test_plain_turn_online_and_durable_events(cfg: Config) -> None:
    llm = ScriptedLlm(["Hello", " there", "!", UsageDelta(prompt_tokens=12, completion_tokens=3)])
    async with open_runtime(cfg, llm=llm) as agent:
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        online = agent.online_outbox.online_events(conv.id)
        async with trio.open_nursery() as n:
            seen = await watch(n, online, is_type("end"))
            message_id = await conv.send("hi")
        assert [e.type for e in seen] == ["working", "start_response", "append_text",
                                          "append_text", "append_text", "end"]
        assert all(e.cursor is None for e in seen)
        durable = await take_until(agent.outbox.conversation_events(cursor, conv.id),
                                   is_type("touched"))
        assert [e.type for e in durable] == ["user_message", "assistant_message", "touched"]
        offsets = [e.cursor.offset for e in durable if e.cursor]
        assert offsets == sorted(offsets) and len(set(offsets)) == 3
        assert durable[0].event.record.id == message_id  # type: ignore[union-attr]
        answer = durable[1].event.record.message  # type: ignore[union-attr]
        assert isinstance(answer, AssistantMessage)
        assert answer.content == [Text("Hello there!")]
        assert answer.tokens is not None and (answer.tokens.prompt, answer.tokens.completion) == (12, 3)
        messages = await conv.get_messages()
        assert [type(m.message) for m in messages] == [UserMessage, AssistantMessage]
        # the record seq equals the event offset
        assert [m.seq for m in messages] == offsets[:2]
        snap = await agent.chat_snapshot(conv.id)
        assert snap.cursor.offset >= offsets[-1] and snap.conversation.seq == offsets[-1]
        assert llm.requests[0][0] == [SYSTEM, said("hi")]


async def test_resume_after_runtime_restart(cfg: Config) -> None:
    llm = FunctionLlm(echo)
    async with open_runtime(cfg, llm=llm) as agent:
        conv = await agent.create_conversation()
        start = await agent.outbox.current_cursor()
        await run_turn(agent, conv, "one")
        middle = await agent.outbox.current_cursor()
    async with open_runtime(cfg, llm=llm) as agent:
        assert (await agent.outbox.current_cursor()) == middle
        conv2 = await agent.get_conversation(conv.id)
        assert conv2 is not None
        await run_turn(agent, conv2, "two")
        # a cursor from before the restart resumes with every event, no gap, no duplicate
        events = await take_until(agent.outbox.events(start), lambda e: e.cursor == middle)
        assert [e.cursor.offset for e in events if e.cursor] == list(
            range(start.offset + 1, middle.offset + 1))
        after = await take_until(agent.outbox.events(middle), is_type("touched"))
        assert [e.type for e in after] == ["user_message", "assistant_message", "touched"]
        # the model got the history stored before the restart
        assert llm.requests[-1][0] == [SYSTEM, said("one"), answered("echo: one"), said("two")]


async def test_interrupt_mid_stream_keeps_what_was_seen(cfg: Config) -> None:
    closed = trio.Event()

    async def never_finishes() -> AsyncIterator[Delta]:
        try:
            yield "Partial "
            await trio.sleep_forever()
            yield "never"
        finally:
            closed.set()

    llm = ScriptedLlm(never_finishes(), "fine")
    async with open_runtime(cfg, llm=llm) as agent:
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        async with trio.open_nursery() as n:
            seen = await watch(n, agent.online_outbox.online_events(conv.id), is_type("end"))
            async with trio.open_nursery() as n2:
                first = await watch(n2, agent.online_outbox.online_events(conv.id),
                                    is_type("append_text"))
                await conv.send("tell me")
            assert first[-1].event.text == "Partial "  # type: ignore[union-attr]
            assert await conv.interrupt() is True
        assert seen[-1].type == "end"
        durable = await take_until(agent.outbox.conversation_events(cursor, conv.id),
                                   is_type("touched"))
        assert [e.type for e in durable] == ["user_message", "assistant_message", "interrupted",
                                             "touched"]
        partial = durable[1].event.record.message  # type: ignore[union-attr]
        assert isinstance(partial, AssistantMessage) and partial.interrupted
        assert partial.content == [Text("Partial ")]
        assert closed.is_set()  # the cancelled stream was closed at once
        assert await conv.interrupt() is False  # nothing running now
        # the conversation goes on in a new session, and the model sees what the user saw
        await run_turn(agent, conv, "again")
        assert llm.sessions == 2
        assert llm.requests[-1][0] == [SYSTEM, said("tell me"), answered("Partial "), said("again")]


async def test_llm_failure_then_a_working_turn(cfg: Config) -> None:
    def model(messages: list[WorkingItem], tools: list[ToolSpec]) -> str:
        if user_text(messages) == "first":
            raise LlmResponseError("model exploded")
        return "recovered"

    llm = FunctionLlm(model)
    async with open_runtime(cfg, llm=llm) as agent:
        conv = await agent.create_conversation()
        async with trio.open_nursery() as n:
            ended = await watch(n, agent.online_outbox.online_events(conv.id), is_type("end"))
            events = await run_turn(agent, conv, "first")
        assert [e.type for e in events] == ["user_message", "error", "touched"]
        error = events[1].event.record.message  # type: ignore[union-attr]
        assert isinstance(error, Error) and error.code == "llm_response"
        assert error.message == "model exploded"
        assert [e.type for e in ended] == ["working", "end"]
        events = await run_turn(agent, conv, "second")
        assert [e.type for e in events] == ["user_message", "assistant_message", "touched"]
        # the Error is in the journal but not in working memory: the model never sees it
        assert llm.requests[-1][0] == [SYSTEM, said("first"), said("second")]
        assert [type(m.message) for m in await conv.get_messages()] == [
            UserMessage, Error, UserMessage, AssistantMessage]


async def test_unreachable_llm_ends_turn_with_error(db_path: str) -> None:
    with trio.socket.socket() as s:  # a port nobody listens on
        await s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = Config(db_path=db_path, openai_base_url=f"http://127.0.0.1:{port}/v1", llm_max_retries=0,
                 database_url=engine_url())
    async with open_runtime(cfg) as agent:
        conv = await agent.create_conversation()
        events = await run_turn(agent, conv, "hello?")
        assert [e.type for e in events] == ["user_message", "error", "touched"]
        assert events[1].event.record.message.code == "llm_connection"  # type: ignore[union-attr]


def crashes_on_request(messages: list[WorkingItem], tools: list[ToolSpec]) -> str:
    """A user message "crash!" raises a bug-like exception inside the turn (what a defect in our
    own code would look like to the supervisor)."""
    if user_text(messages) == "crash!":
        raise RuntimeError("simulated defect")
    return echo(messages, tools)


async def test_actor_crash_is_contained_and_restarted(cfg: Config) -> None:
    cfg = cfg.replace(restart_limit=2, restart_period=60)
    async with open_runtime(cfg, llm=FunctionLlm(crashes_on_request)) as agent:
        a = await agent.create_conversation()
        b = await agent.create_conversation()
        events = await run_turn(agent, a, "crash!")
        assert [e.type for e in events] == ["user_message", "error", "touched"]
        assert events[1].event.record.message.code == "crash"  # type: ignore[union-attr]
        # the other conversation never noticed
        events_b = await run_turn(agent, b, "hello b")
        assert [e.type for e in events_b] == ["user_message", "assistant_message", "touched"]
        # the crashed one was restarted from working memory and works
        events = await run_turn(agent, a, "hello a")
        assert events[1].event.record.message.content == [Text("echo: hello a")]  # type: ignore[union-attr]
        # a crash loop stops at the limit
        await run_turn(agent, a, "crash!")
        await run_turn(agent, a, "crash!")
        with pytest.raises(ConversationFailedError):
            await a.send("anyone?")
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(ConversationFailedError):  # it stays failed for restart_period
            await a.send("anyone?")
        events_b = await run_turn(agent, b, "still fine")
        assert events_b[1].type == "assistant_message"


async def test_cold_load_after_passivation_gives_same_history(cfg: Config) -> None:
    llm = FunctionLlm(echo)
    async with open_runtime(cfg.replace(idle_timeout=0.2), llm=llm) as agent:
        conv = await agent.create_conversation()
        await run_turn(agent, conv, "one")
        await run_turn(agent, conv, "two")
        warm_history = llm.requests[-1][0]
        sessions = llm.sessions
        # (on a loaded machine the actor may already be gone: the idle timer is real time)
        handle = agent._registry.live.get(conv.id)
        if handle is not None:
            with trio.fail_after(10):
                await handle.exited.wait()  # passivated after idle_timeout
        assert conv.id not in agent._registry.live
        await run_turn(agent, conv, "three")
        assert llm.sessions == sessions + 1  # a cold load: a new session
        assert llm.requests[-1][0] == [*warm_history, answered("echo: two"), said("three")]


async def test_concurrent_cold_loads_share_one_actor(cfg: Config) -> None:
    llm = FunctionLlm(echo)
    async with open_runtime(cfg, llm=llm) as agent:
        conv = await agent.create_conversation()
    async with open_runtime(cfg, llm=llm) as agent:
        assert conv.id not in agent._registry.live  # cold: only in storage
        handles = []

        async def load() -> None:
            handles.append(await agent._registry.get(conv.id))

        async with trio.open_nursery() as n:
            for _ in range(3):
                n.start_soon(load)
        assert len(handles) == 3 and handles[0] is not None
        assert all(h is handles[0] for h in handles)
        assert agent._registry.live == {conv.id: handles[0]}
        # and sends racing a cold load go to the one actor, one turn after the other
        cursor = await agent.outbox.current_cursor()
        async with trio.open_nursery() as n:
            n.start_soon(agent.send, conv.id, "a")
            n.start_soon(agent.send, conv.id, "b")
        events = await take_until(agent.outbox.conversation_events(cursor, conv.id),
                                  nth("assistant_message", 2))
        assert [e.type for e in events].count("assistant_message") == 2
        first, second = (user_text(messages) for messages, _ in llm.requests)
        assert llm.requests[1][0][-3:] == [said(first), answered(f"echo: {first}"), said(second)]


async def test_mailbox_full_is_refused_without_storing(cfg: Config) -> None:
    gate = trio.Event()
    entered = trio.Event()

    async def slow(messages: list[WorkingItem], tools: list[ToolSpec]) -> str:
        entered.set()
        await gate.wait()
        return "done"

    async with open_runtime(cfg.replace(mailbox_size=1), llm=FunctionLlm(slow)) as agent:
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        await conv.send("running")
        with trio.fail_after(10):
            await entered.wait()  # the first turn left the mailbox
        await conv.send("queued")
        with pytest.raises(MailboxFullError) as info:
            await conv.send("refused")
        assert info.value.retry_after > 0
        gate.set()
        events = await take_until(agent.outbox.conversation_events(cursor, conv.id),
                                  nth("assistant_message", 2))
        assert [e.type for e in events].count("assistant_message") == 2
        texts = [m.message.content[0].body for m in await conv.get_messages()  # type: ignore[union-attr]
                 if isinstance(m.message, UserMessage)]
        assert texts == ["running", "queued"]


async def test_tool_loop(cfg: Config) -> None:
    tools = FunctionTools()

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    async def hang() -> str:
        await trio.sleep_forever()
        return ""

    tools.add(add, parameters={"type": "object", "properties": {"a": {"type": "integer"},
                                                                "b": {"type": "integer"}}})
    tools.add(hang)
    llm = ScriptedLlm(
        ["Checking. ", ToolCallSpec(call_id="c1", name="add", arguments='{"a": 2, "b": 3}'),
         ToolCallSpec(call_id="c2", name="nope", arguments="{}"),
         ToolCallSpec(call_id="c3", name="add", arguments="{not json"),
         ToolCallSpec(call_id="c4", name="hang", arguments="{}")],
        "It is 5.",
    )
    async with open_runtime(cfg.replace(tool_timeout=0.2), llm=llm, tools=tools) as agent:
        conv = await agent.create_conversation()
        events = await run_turn(agent, conv, "what is 2+3?")
        assert [e.type for e in events] == [
            "user_message", "tool_call", "tool_call", "tool_call", "tool_call",
            "tool_result", "tool_failed", "tool_failed", "tool_failed", "assistant_message",
            "touched"]
        results = [e.event.record.message for e in events if e.type.startswith("tool_")  # type: ignore[union-attr]
                   and isinstance(e.event.record.message, ToolResult)]  # type: ignore[union-attr]
        assert results[0].content == "5"
        assert "unknown tool" in results[1].content
        assert "not valid JSON" in results[2].content
        assert "timed out" in results[3].content
        answer = events[-2].event.record.message  # type: ignore[union-attr]
        assert answer.content == [Text("Checking. It is 5.")]
        # the second round carried the assistant's tool calls and every result
        messages, specs = llm.requests[1]
        assert [spec.name for spec in specs] == ["add", "hang"]
        assert [m.call_id for m in messages if isinstance(m, ToolItem)] == ["c1", "c2", "c3", "c4"]
        calls = [m.message for m in await conv.get_messages() if isinstance(m.message, ToolCall)]
        assert [c.name for c in calls] == ["add", "nope", "add", "hang"]


async def test_tool_round_limit(cfg: Config) -> None:
    tools = FunctionTools()
    tools.add(lambda: "again", name="loop")
    llm = ScriptedLlm(*[[ToolCallSpec(call_id=f"c{i}", name="loop", arguments="{}")]
                        for i in range(3)])
    async with open_runtime(cfg.replace(max_tool_rounds=2), llm=llm, tools=tools) as agent:
        conv = await agent.create_conversation()
        events = await run_turn(agent, conv, "go")
        assert events[-2].type == "error"
        assert events[-2].event.record.message.code == "tool_rounds"  # type: ignore[union-attr]


async def test_a_changed_tool_list_opens_a_new_session(cfg: Config) -> None:
    """MCP servers change their tools in the background; a session has a fixed tool list."""
    tools = FunctionTools()
    tools.add(lambda: "a", name="first")
    llm = FunctionLlm(echo)
    async with open_runtime(cfg, llm=llm, tools=tools) as agent:
        conv = await agent.create_conversation()
        await run_turn(agent, conv, "one")
        await run_turn(agent, conv, "two")
        assert llm.sessions == 1  # the session is kept across turns
        tools.add(lambda: "b", name="second")
        await run_turn(agent, conv, "three")
        assert llm.sessions == 2
        assert [spec.name for spec in llm.requests[-1][1]] == ["first", "second"]
        # the new session starts from working memory
        assert llm.requests[-1][0] == [SYSTEM, said("one"), answered("echo: one"), said("two"),
                                       answered("echo: two"), said("three")]


async def test_rename_delete_and_temporary(cfg: Config) -> None:
    llm = FunctionLlm(echo)
    async with open_runtime(cfg, llm=llm) as agent:
        keep = await agent.create_conversation(title="first")
        temp = await agent.create_conversation(temp=True)
        assert temp.is_temporal
        cursor = await agent.outbox.current_cursor()
        renamed = await agent.rename_conversation(keep.id, "better")
        assert renamed.title == "better" and renamed.updated_at >= keep.record.updated_at
        await run_turn(agent, keep, "hello")
        snap = await agent.conversations_snapshot()
        assert snap.conversations[0].id == keep.id  # most recently updated first
        assert await agent.delete_conversation(keep.id) is True
        assert await agent.delete_conversation(keep.id) is False
        assert await agent.get_conversation(keep.id) is None
        with pytest.raises(NotFoundError):
            await keep.send("gone?")
        with pytest.raises(NotFoundError):
            await agent.rename_conversation(keep.id, "x")
        assert await agent.journal.count(conversation_id=keep.id) == 0
        agent_events = await take_until(agent.outbox.agent_events(cursor), is_type("deleted"))
        assert [e.type for e in agent_events] == ["renamed", "touched", "deleted"]
        conv_events = await take_until(agent.outbox.conversation_events(cursor, keep.id),
                                       is_type("deleted"))
        assert conv_events[-2].type == "conversation_closing"
        before_restart = await agent.outbox.current_cursor()
    async with open_runtime(cfg, llm=llm) as agent:
        assert await agent.get_conversation(temp.id) is None  # temporary: gone after a restart
        events = await take_until(agent.outbox.agent_events(before_restart), is_type("deleted"))
        assert events[-1].event.conversation_id == temp.id  # type: ignore[union-attr]


async def never_answers(messages: list[WorkingItem], tools: list[ToolSpec]) -> AsyncIterator[Delta]:
    yield "Thinking about"
    await trio.sleep_forever()


async def test_shutdown_mid_turn_ends_it_with_a_terminal_record(cfg: Config) -> None:
    llm = FunctionLlm(never_answers)
    async with open_runtime(cfg, llm=llm) as agent:
        conv = await agent.create_conversation()
        async with trio.open_nursery() as n:
            await watch(n, agent.online_outbox.online_events(conv.id), is_type("append_text"))
            await conv.send("question")
    async with open_runtime(cfg, llm=llm) as agent:
        messages = await agent.journal.list(conversation_id=conv.id)
        kinds = [type(m.message).__name__ for m in messages]
        assert kinds == ["UserMessage", "AssistantMessage", "Error"]
        assert messages[1].message.interrupted  # type: ignore[union-attr]
        assert messages[2].message.code == "cancelled"  # type: ignore[union-attr]


CHILD = textwrap.dedent("""
    import sys, trio, agentik
    async def main():
        cfg = agentik.Config(db_path=sys.argv[1], openai_base_url=sys.argv[2], llm_max_retries=0,
                             database_url=sys.argv[3] or None, node_id=sys.argv[4])
        async with agentik.open_runtime(cfg) as agent:
            conv = await agent.create_conversation()
            online = agent.online_outbox.online_events(conv.id)
            await conv.send("are you there?")
            async for ev in online:
                if ev.type == "append_text":
                    break
            print(conv.id, flush=True)
            await trio.sleep_forever()
    trio.run(main)
""")


@pytest.fixture(params=["sqlite", "postgres"])
def kill_config(request: pytest.FixtureRequest, config: Config) -> Config:
    """Both engines. On PostgreSQL the restarted node keeps its node id, as a restarted
    deployment does: it then closes its dead incarnation's turns at start-up."""
    if request.param == "sqlite":
        return config.replace(database_url=None)
    return config.replace(database_url=request.getfixturevalue("pg_url"), node_id="killed-node")


async def test_process_killed_mid_turn_gets_terminal_record_on_restart(
    kill_config: Config, scripted: ScriptedOpenAI
) -> None:
    config = kill_config
    scripted.push(Hang(text_before="Let me"))
    with trio.fail_after(60):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", CHILD, config.db_path, scripted.base_url,
             config.database_url or "", config.node_id],
            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        try:
            assert proc.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1024)
                assert chunk, "child exited early"
                line += chunk
        finally:
            proc.kill()  # SIGKILL: no cleanup at all
            await proc.wait()
    conv_id = line.decode().strip()
    async with open_runtime(config) as agent:
        messages = await agent.journal.list(conversation_id=conv_id)
        assert [type(m.message).__name__ for m in messages] == ["UserMessage", "Error"]
        error = messages[1].message
        assert isinstance(error, Error) and error.message == "interrupted by restart"
        assert error.turn_id == messages[0].id
        events = await take_until(
            agent.outbox.conversation_events(Cursor(epoch=agent.id, offset=0), conv_id),
            is_type("touched"))
        assert "error" in [e.type for e in events]



async def test_runtime_cancelled_from_outside_still_closes_turns(cfg: Config) -> None:
    """Cancelling the task that holds the runtime (not leaving its block) must still let running
    turns store their terminal records before storage stops."""
    llm = FunctionLlm(never_answers)
    conv_id = ""
    with trio.CancelScope() as scope:
        async with open_runtime(cfg, llm=llm) as agent:
            conv = await agent.create_conversation()
            conv_id = conv.id
            async with trio.open_nursery() as n:
                await watch(n, agent.online_outbox.online_events(conv.id), is_type("append_text"))
                await conv.send("question")
            scope.cancel()
            await trio.sleep_forever()
    async with open_runtime(cfg, llm=llm) as agent:
        kinds = [type(m.message).__name__ for m in await agent.journal.list(conversation_id=conv_id)]
        assert kinds == ["UserMessage", "AssistantMessage", "Error"]  # closed at shutdown, not restart
        messages = await agent.journal.list(conversation_id=conv_id)
        assert messages[-1].message.code == "cancelled"  # type: ignore[union-attr]


async def test_interrupt_during_a_tool_call_closes_the_call(cfg: Config) -> None:
    tools = FunctionTools()
    started = trio.Event()

    async def slow() -> str:
        started.set()
        await trio.sleep_forever()
        return ""

    tools.add(slow)
    llm = ScriptedLlm(["Working on it. ", ToolCallSpec(call_id="c1", name="slow", arguments="{}")],
                      "ok")
    async with open_runtime(cfg, llm=llm, tools=tools) as agent:
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        await conv.send("go")
        with trio.fail_after(10):
            await started.wait()
        assert await conv.interrupt()
        events = await take_until(agent.outbox.conversation_events(cursor, conv.id),
                                  is_type("touched"))
        assert [e.type for e in events] == ["user_message", "tool_call", "tool_failed",
                                            "assistant_message", "interrupted", "touched"]
        assert events[3].event.record.message.content == [Text("Working on it. ")]  # type: ignore[union-attr]
        await run_turn(agent, conv, "next")
        history = llm.requests[-1][0]
        assert [type(m).__name__ for m in history] == [
            "SystemItem", "UserItem", "AssistantItem", "ToolItem", "UserItem"]
        assert history[2] == AssistantItem(  # said once, not twice
            content=[Text("Working on it. ")],
            tool_calls=[ToolCallSpec(call_id="c1", name="slow", arguments="{}")])
        assert isinstance(history[3], ToolItem) and history[3].call_id == "c1"
