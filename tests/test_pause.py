"""Issue 30: a person in the loop, in process (real turns, real SQLite, the model a stand-in): a
call that needs approval waits durably (``approval_requested`` under the cursor, the turn row
waiting); approved it runs once, refused the model hears the reason verbatim, a deadline denies
it; answers are idempotent, a different one or one after the turn ended is 409, an unknown call
404; two answers at once store one; an interrupt ends a paused turn; a restart resumes it;
``ask_user`` asks a question whose answer (or the next message) is the tool's result."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from agentik import Config, open_runtime
from agentik.agent import LocalAgent, LocalConversation
from agentik.errors import ConflictError, NotFoundError, StorageError
from agentik.llm.base import ToolSpec
from agentik.testing import FunctionLlm
from agentik.tools.base import FunctionTools
from agentik.wire import (
    ApprovalAnswer,
    ApprovalRequest,
    CommonEvent,
    Cursor,
    InputAnswer,
    InputRequest,
    ToolCallSpec,
    ToolItem,
    WorkingItem,
)
from tests.conftest import engine_url
from tests.test_disk_full import Refusal
from tests.test_runtime import is_type, take_until

DELETE = ToolCallSpec(call_id="c1", name="delete_file", arguments='{"path": "a.txt"}')


class Tool:
    """A tool that counts its runs."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.tools = FunctionTools()
        self.tools.add(self.delete_file, name="delete_file", parameters={
            "type": "object", "properties": {"path": {"type": "string"}}})

    def delete_file(self, path: str) -> str:
        self.runs.append(path)
        return f"deleted {path}"


def model(*calls: ToolCallSpec, said: str = "") -> FunctionLlm:
    """Calls ``calls`` on a turn's first round (after the text ``said``); then answers with
    what its tools said."""

    def reply(messages: list[WorkingItem], tools: list[ToolSpec]) -> Any:
        results = [m.content for m in messages if isinstance(m, ToolItem)]
        if isinstance(messages[-1], ToolItem):
            return "tools said: " + " | ".join(results)
        return [said, *calls] if said else list(calls)

    return FunctionLlm(reply)


#: on the suite's engine (``conftest.ENGINE``: SQLite, then PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")


def cfg(db_path: str, **kw: Any) -> Config:
    return Config(db_path=db_path, database_url=engine_url(), **{"approval": ("delete_*",), **kw})


async def until(agent: LocalAgent, cid: str, after: Cursor, stop: Callable[[CommonEvent], bool]
                ) -> list[CommonEvent]:
    return await take_until(agent.outbox.conversation_events(after, cid), stop)


async def paused(agent: LocalAgent, text: str = "delete a.txt"
                 ) -> tuple[LocalConversation, list[CommonEvent]]:
    conv = await agent.create_conversation()
    cursor = await agent.outbox.current_cursor()
    await conv.send(text)
    seen = await until(agent, conv.id, cursor, is_type("approval_requested", "input_requested"))
    return conv, seen


def answer_text(events: list[CommonEvent]) -> str:
    body = events[-2].event.record.message.content[0].body  # type: ignore[union-attr]
    assert isinstance(body, str)
    return body


async def test_approved_the_tool_runs_once_and_the_model_answers(db_path: str) -> None:
    tool = Tool()
    async with open_runtime(cfg(db_path), llm=model(DELETE), tools=tool.tools) as agent:
        conv, seen = await paused(agent)
        assert [e.type for e in seen] == ["user_message", "tool_call", "approval_requested"]
        request = seen[-1].event.record.message  # type: ignore[union-attr]
        assert request == ApprovalRequest(call_id="c1", tool="delete_file",
                                          arguments='{"path": "a.txt"}', deadline=None,
                                          turn_id=seen[0].event.record.id)  # type: ignore[union-attr]
        assert seen[-1].cursor is not None  # durable, under the cursor
        await trio.testing.wait_all_tasks_blocked()
        assert tool.runs == []  # waits
        record = await conv.approve("c1")
        assert record.message == ApprovalAnswer(call_id="c1", approve=True,
                                                turn_id=request.turn_id)
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        assert [e.type for e in rest] == ["approval_given", "tool_result", "assistant_message",
                                          "touched"]
        assert answer_text(rest) == "tools said: deleted a.txt"
        assert tool.runs == ["a.txt"]
        assert await conv.approve("c1") == record  # the same answer again: the stored one
        with pytest.raises(ConflictError):
            await conv.approve("c1", approve=False)  # another one
        with pytest.raises(NotFoundError):
            await conv.approve("nope")
        with pytest.raises(ConflictError):
            await conv.answer("c1", "yes")  # an approval is not a question
        assert tool.runs == ["a.txt"]


async def test_refused_the_model_hears_the_reason_verbatim(db_path: str) -> None:
    tool = Tool()
    async with open_runtime(cfg(db_path), llm=model(DELETE), tools=tool.tools) as agent:
        conv, seen = await paused(agent)
        await conv.approve("c1", approve=False, reason="keep a.txt, it is my thesis")
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        assert [e.type for e in rest] == ["approval_given", "tool_failed", "assistant_message",
                                          "touched"]
        assert answer_text(rest) == (
            "tools said: the user refused this call: keep a.txt, it is my thesis")
        assert tool.runs == []


async def test_a_passed_deadline_denies_the_call(db_path: str) -> None:
    tool = Tool()
    config = cfg(db_path, approval_timeout=0.2)
    async with open_runtime(config, llm=model(DELETE), tools=tool.tools) as agent:
        conv, seen = await paused(agent)
        deadline = seen[-1].event.record.message.deadline  # type: ignore[union-attr]
        assert deadline is not None and deadline > seen[-1].event.record.created_at  # type: ignore[union-attr]
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        given = rest[0].event.record.message  # type: ignore[union-attr]
        assert given == ApprovalAnswer(call_id="c1", approve=False, reason="no answer came in time",
                                       timed_out=True, turn_id=given.turn_id)
        assert answer_text(rest) == "tools said: the call was denied: no answer came in time"
        with pytest.raises(ConflictError):  # too late, whatever it says
            await conv.approve("c1")
        with pytest.raises(ConflictError):
            await conv.approve("c1", approve=False, reason="no answer came in time")
        assert tool.runs == []


async def test_an_interrupt_ends_a_paused_turn_and_a_later_answer_is_409(db_path: str) -> None:
    tool = Tool()
    async with open_runtime(cfg(db_path), llm=model(DELETE), tools=tool.tools) as agent:
        conv, seen = await paused(agent)
        assert await conv.interrupt()
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        assert [e.type for e in rest] == ["tool_failed", "assistant_message", "interrupted",
                                          "touched"]
        with pytest.raises(ConflictError, match="its turn has ended"):
            await conv.approve("c1")
        assert tool.runs == []


async def test_two_answers_at_once_store_one_and_run_the_tool_once(db_path: str) -> None:
    tool = Tool()
    async with open_runtime(cfg(db_path), llm=model(DELETE), tools=tool.tools) as agent:
        conv, seen = await paused(agent)
        results: dict[int, object] = {}

        async def answer(i: int, approve: bool) -> None:
            try:
                results[i] = await conv.approve("c1", approve=approve)
            except ConflictError as exc:
                results[i] = exc

        async with trio.open_nursery() as n:
            for i, approve in enumerate((True, False, True, False)):
                n.start_soon(answer, i, approve)
        won = [r for r in results.values() if not isinstance(r, ConflictError)]
        assert len(won) == 2 and won[0] == won[1]  # the winner's twin gets the same record
        yes = won[0].message.approve  # type: ignore[attr-defined]
        assert isinstance(results[1 if yes else 0], ConflictError)
        assert isinstance(results[3 if yes else 2], ConflictError)
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        assert [e.type for e in rest].count("approval_given") == 1
        assert tool.runs == (["a.txt"] if yes else [])


async def test_a_restart_leaves_the_turn_waiting_and_an_answer_then_completes_it(
        db_path: str) -> None:
    tool = Tool()
    llm = model(DELETE, said="Deleting it. ")
    async with open_runtime(cfg(db_path), llm=llm, tools=tool.tools) as agent:
        conv, _ = await paused(agent)
    async with open_runtime(cfg(db_path), llm=llm, tools=tool.tools) as agent:
        later = await agent.outbox.current_cursor()
        again = await agent.get_conversation(conv.id)
        assert again is not None
        await again.approve("c1")
        rest = await until(agent, conv.id, later, is_type("touched"))
        assert [e.type for e in rest] == ["approval_given", "tool_result", "assistant_message",
                                          "touched"]  # no "interrupted by restart" error
        # the answer keeps what the user saw before the restart too, as an unbroken turn's does
        assert answer_text(rest) == "Deleting it. tools said: deleted a.txt"
        assert tool.runs == ["a.txt"]


ASK = ToolCallSpec(call_id="q1", name="ask_user",
                   arguments='{"question": "Which file?", "choices": ["a.txt", "b.txt"]}')


async def test_ask_user_asks_and_the_answer_is_the_tools_result(db_path: str) -> None:
    llm = model(ASK)
    async with open_runtime(cfg(db_path, approval="never", ask_user=True), llm=llm) as agent:
        conv, seen = await paused(agent, "clean up")
        assert [t.name for t in llm.requests[0][1]] == ["ask_user"]  # offered to the model
        request = seen[-1].event.record.message  # type: ignore[union-attr]
        assert request == InputRequest(call_id="q1", question="Which file?",
                                       choices=["a.txt", "b.txt"], turn_id=request.turn_id)
        record = await conv.answer("q1", "b.txt")
        assert record.message == InputAnswer(call_id="q1", text="b.txt", turn_id=request.turn_id)
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        assert [e.type for e in rest] == ["input_given", "tool_result", "assistant_message",
                                          "touched"]
        assert answer_text(rest) == "tools said: b.txt"
        # the next message sent while a question waits is its answer
        cursor = await agent.outbox.current_cursor()
        await conv.send("clean up again")
        seen = await until(agent, conv.id, cursor, is_type("input_requested"))
        call_id = seen[-1].event.record.message.call_id  # type: ignore[union-attr]
        assert call_id != "q1"  # the model reused its id: agentik's own now
        answer_id = await conv.send("a.txt")  # the answer's record, not a user message
        (record,) = [r for r in await conv.get_messages(limit=1000) if r.id == answer_id]
        assert record.message == InputAnswer(call_id=call_id, text="a.txt",
                                             turn_id=record.message.turn_id)  # type: ignore[union-attr]
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        assert [e.type for e in rest] == ["input_given", "tool_result", "assistant_message",
                                          "touched"]
        assert answer_text(rest) == "tools said: b.txt | a.txt"


async def passivated(agent: LocalAgent, cid: str) -> None:
    """Until the conversation's actor is passivated: it exits, and the registry forgot it."""
    handle = agent._registry.live[cid]
    with trio.fail_after(10):
        await handle.exited.wait()
    assert cid not in agent._registry.live


async def test_a_waiting_turn_survives_passivation_and_an_answer_loads_it_again(
        db_path: str) -> None:
    """An actor idle while its turn waits is passivated (no task per waiting turn); the
    answer cold-loads the conversation, whose new actor resumes the turn from storage."""
    tool = Tool()
    config = cfg(db_path, idle_timeout=0.05)
    async with open_runtime(config, llm=model(DELETE), tools=tool.tools) as agent:
        conv, seen = await paused(agent)
        await passivated(agent, conv.id)
        await conv.approve("c1")
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        assert [e.type for e in rest] == ["approval_given", "tool_result", "assistant_message",
                                          "touched"]
        assert tool.runs == ["a.txt"]


async def test_the_deadline_of_a_passivated_waiting_turn_still_denies_it(db_path: str) -> None:
    tool = Tool()
    config = cfg(db_path, idle_timeout=0.05, approval_timeout=0.5)
    async with open_runtime(config, llm=model(DELETE), tools=tool.tools) as agent:
        conv, seen = await paused(agent)
        await passivated(agent, conv.id)
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        assert answer_text(rest) == "tools said: the call was denied: no answer came in time"
        assert tool.runs == []


async def test_an_answer_the_store_refuses_leaves_the_pause_open(
        pg_url: str, db_path: str, tmp_path: Path) -> None:
    """Two same answers while the store refuses writes (a read-only PostgreSQL): each gets the
    store's 503, none waits for ever on the other; once writes are accepted again the pause is
    still open and an answer completes the turn."""
    tool = Tool()
    config = Config(db_path=db_path, database_url=pg_url, approval=("delete_*",))
    async with open_runtime(config, llm=model(DELETE), tools=tool.tools) as agent:
        conv, seen = await paused(agent)
        refusal = Refusal("postgres", tmp_path, database_url=pg_url)
        refusal.refuse()
        outcomes: list[object] = []

        async def answer() -> None:
            try:
                outcomes.append(await conv.approve("c1"))
            except StorageError as exc:
                outcomes.append(exc)

        with trio.fail_after(20):
            async with trio.open_nursery() as n:
                n.start_soon(answer)
                n.start_soon(answer)
        assert len(outcomes) == 2 and all(isinstance(o, StorageError) for o in outcomes)
        refusal.allow()
        with trio.fail_after(20):
            await agent.storage_health.wait_writable()
        await conv.approve("c1")
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        assert [e.type for e in rest] == ["approval_given", "tool_result", "assistant_message",
                                          "touched"]
        assert tool.runs == ["a.txt"]


async def test_an_interrupt_ends_a_passivated_waiting_turn(db_path: str) -> None:
    """The actor of a waiting turn was passivated: an interrupt loads it and ends the turn (its
    waiting call gets its failed result), and a later answer is too late."""
    tool = Tool()
    async with open_runtime(cfg(db_path, idle_timeout=0.05), llm=model(DELETE),
                            tools=tool.tools) as agent:
        conv, seen = await paused(agent)
        await passivated(agent, conv.id)
        assert await conv.interrupt()
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        assert [e.type for e in rest] == ["tool_failed", "assistant_message", "interrupted",
                                          "touched"]
        with pytest.raises(ConflictError):
            await conv.approve("c1")
        # cancelling the turn by its id does the same
        conv, seen = await paused(agent)
        await passivated(agent, conv.id)
        assert await agent.cancel_turn(conv.id, seen[0].event.record.id)  # type: ignore[union-attr]
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        assert [e.type for e in rest][-2:] == ["interrupted", "touched"]
        assert tool.runs == []


async def test_a_deadline_outlives_a_restart(db_path: str) -> None:
    """The deadline is stored with the request: after a restart, with nobody answering, the
    call is denied when it passes (start-up loads the waiting conversation)."""
    tool = Tool()
    config = cfg(db_path, approval_timeout=0.5)
    async with open_runtime(config, llm=model(DELETE), tools=tool.tools) as agent:
        conv, seen = await paused(agent)
    deadline = seen[-1].event.record.message.deadline  # type: ignore[union-attr]
    async with open_runtime(config, llm=model(DELETE), tools=tool.tools) as agent:
        rest = await until(agent, conv.id, seen[-1].cursor, is_type("touched"))
        given = rest[0].event.record  # type: ignore[union-attr]
        assert given.message.timed_out and given.created_at >= deadline  # type: ignore[union-attr]
        assert answer_text(rest) == "tools said: the call was denied: no answer came in time"
        assert tool.runs == []
