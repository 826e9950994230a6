"""The conversation actor's copy of its working memory (agentik.actors.memory, issue 13): read
from storage once per actor, then kept in step with the actor's own writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import agentik
from agentik.actors.memory import WorkingMemory
from agentik.errors import LlmResponseError, StorageError
from agentik.llm.base import ToolSpec
from agentik.storage import ops
from agentik.storage.reads import Reads
from agentik.testing import FunctionLlm, Reply
from agentik.wire import SummaryItem, Text, ToolCallSpec, ToolItem, UserItem, WorkingItem


def reply(messages: list[WorkingItem], tools: list[ToolSpec]) -> Reply:
    last = messages[-1]
    if isinstance(last, ToolItem):
        return f"it is {last.content}"
    assert isinstance(last, UserItem)
    text = last.content[0].body  # type: ignore[union-attr]
    if text == "add":
        return [ToolCallSpec(call_id="c1", name="add", arguments='{"a": 2, "b": 3}')]
    if text == "fail":
        raise LlmResponseError("the model failed")
    return "ok"


async def test_read_once_per_actor_and_kept_in_step_with_its_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memories: list[WorkingMemory] = []
    reads: list[str] = []
    init, read = WorkingMemory.__init__, Reads.working_memory

    def counting_init(self: WorkingMemory, *args: Any) -> None:
        init(self, *args)
        memories.append(self)

    async def counting_read(self: Reads[Any], conversation_id: str) -> Any:
        reads.append(conversation_id)
        return await read(self, conversation_id)

    monkeypatch.setattr(WorkingMemory, "__init__", counting_init)
    monkeypatch.setattr(Reads, "working_memory", counting_read)
    tools = agentik.FunctionTools()
    tools.add(lambda a, b: a + b, name="add")
    llm = FunctionLlm(reply)
    config = agentik.Config(db_path=str(tmp_path / "a.db"))
    with trio.fail_after(20):
        async with agentik.open_runtime(config, llm=llm, tools=tools) as agent:
            conv = await agent.create_conversation()
            storage = agent._deps.storage
            # a tool round, a failed turn (its session is dropped: the next one is opened from
            # the copy), plain turns
            for text in ["add", "fail", "plain", "add", "plain"]:
                after = storage.hub.current_cursor()
                await conv.send(text)
                async for ev in agent.outbox.conversation_events(after, conv.id):
                    if ev.type == "touched":  # every turn's ending ends with it
                        break
                (memory,) = memories
                stored = await read(storage.reader, conv.id)
                assert await memory.items() == stored
            # the model saw the stored history when its session was reopened after the failure
            reopened = next(messages for messages, _ in llm.requests
                            if isinstance(messages[-1], UserItem)
                            and messages[-1].content == [Text(body="plain")])
            assert reopened == [item for _, item in stored][: len(reopened)]
        # created here: its working memory (the system prompt) was known, never read
        assert reads == [], "a created conversation's working memory was read"
        async with agentik.open_runtime(config, llm=llm, tools=tools) as agent:
            # cold-loaded: read once, then kept in step
            cold = await agent.get_conversation(conv.id)
            assert cold is not None
            storage = agent._deps.storage
            for text in ["plain", "add"]:
                after = storage.hub.current_cursor()
                await cold.send(text)
                async for ev in agent.outbox.conversation_events(after, conv.id):
                    if ev.type == "touched":
                        break
                await trio.testing.wait_all_tasks_blocked()  # the actor took its answer's item
                assert await memories[-1].items() == await read(storage.reader, conv.id)
    assert len(memories) == 2
    assert reads == [conv.id], "working memory was read again"


class _Storage:
    """A storage stand-in: ``reader.working_memory`` returns ``rows``; ``write`` fails when
    told to."""

    def __init__(self, rows: list[tuple[int, WorkingItem]]) -> None:
        self.rows = rows
        self.reads = 0
        self.fail = False
        self.reader = self

    async def working_memory(self, conversation_id: str) -> list[tuple[int, WorkingItem]]:
        self.reads += 1
        return list(self.rows)

    async def write_until_stored(self, op: ops.AnyOp) -> None:
        if self.fail:
            raise StorageError("disk full")


async def test_rewrites_and_failed_writes_drop_the_copy() -> None:
    user = UserItem(content=[Text(body="q")])
    storage = _Storage([(1, user)])
    memory = WorkingMemory(storage, "c")  # type: ignore[arg-type]
    assert await memory.items() == [(1, user)]
    await memory.write(ops.StartTurn(conversation_id="c", turn_id="t", item=user))
    assert await memory.items() == [(1, user), (2, user)]
    assert storage.reads == 1
    for op in [
        ops.Compact(conversation_id="c", before_order_idx=2, summary=SummaryItem(text="s"),
                    dropped=1),
        ops.FinishTurn(conversation_id="c", turn_id="t", forget_from=2),
    ]:
        await memory.write(op)
        await memory.items()
    assert storage.reads == 3
    storage.fail = True
    with pytest.raises(StorageError):
        await memory.write(ops.StartTurn(conversation_id="c", turn_id="t", item=user))
    await memory.items()
    assert storage.reads == 4
    # a FinishTurn without an answer stores no item (the writers' rule)
    storage.fail = False
    await memory.write(ops.FinishTurn(conversation_id="c", turn_id="t", item=user))
    assert await memory.items() == [(1, user)]
