"""agentik.testing: the model stand-ins keep the backend contract and drive real turns."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from agentik.errors import LlmResponseError
from agentik.llm.base import FinishDelta, LlmDelta, ReasoningDelta, TextDelta, ToolCallDelta, ToolSpec
from agentik.testing import Delta, FunctionLlm, ScriptedLlm
from agentik.wire import AssistantItem, SystemItem, Text, ToolCallSpec, ToolItem, UserItem, WorkingItem

README = Path(__file__).resolve().parent.parent / "README.md"


async def round_of(llm: FunctionLlm, content: str | None = "hi") -> list[LlmDelta]:
    conv = await llm.open([SystemItem(text="s")], [ToolSpec(name="f")])
    return [d async for d in conv.send_stream([Text(content)] if content else None)]


async def test_a_str_reply_is_one_text_delta_and_a_finish() -> None:
    llm = FunctionLlm(lambda messages, tools: "hello")
    assert await round_of(llm) == [TextDelta("hello"), FinishDelta("stop")]
    messages, tools = llm.requests[0]
    assert messages == [SystemItem(text="s"), UserItem(content=[Text("hi")])]
    assert tools == [ToolSpec(name="f")]


async def test_deltas_tool_calls_and_the_sessions_own_history() -> None:
    call = ToolCallSpec(call_id="c1", name="f", arguments='{"x": 1}')
    llm = ScriptedLlm([ReasoningDelta("hm"), "Let me see. ", call], "Done.")
    conv = await llm.open([], [])
    first = [d async for d in conv.send_stream([Text("q")])]
    assert first == [ReasoningDelta("hm"), TextDelta("Let me see. "),
                     ToolCallDelta(index=0, id="c1", name="f", arguments='{"x": 1}'),
                     FinishDelta("tool_calls")]
    conv.add_tool_result("c1", "f", "one")
    assert [d async for d in conv.send_stream(None)] == [TextDelta("Done."), FinishDelta("stop")]
    # the second round saw the first round's answer and the tool result, as a backend keeps them
    assert llm.requests[1][0] == [
        UserItem(content=[Text("q")]),
        AssistantItem(content=[Text("Let me see. ")], tool_calls=[call]),
        ToolItem(call_id="c1", name="f", content="one"),
    ]


async def test_async_functions_and_iterators_pace_the_stream() -> None:
    gate = trio.Event()

    async def paced(messages: list[WorkingItem], tools: list[ToolSpec]) -> AsyncIterator[Delta]:
        yield "a"
        await gate.wait()
        yield "b"

    async def fn(messages: list[WorkingItem], tools: list[ToolSpec]) -> AsyncIterator[Delta]:
        return paced(messages, tools)

    conv = await FunctionLlm(fn).open([], [])
    stream = conv.send_stream([Text("x")])
    assert await stream.__anext__() == TextDelta("a")
    gate.set()
    assert [d async for d in stream] == [TextDelta("b"), FinishDelta("stop")]


async def test_a_scripted_llm_out_of_replies_fails_the_round() -> None:
    llm = ScriptedLlm("only one")
    await round_of(llm)
    with pytest.raises(LlmResponseError, match="no reply left"):
        await round_of(llm)
