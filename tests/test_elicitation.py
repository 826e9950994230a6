"""Issue 30: an MCP elicitation is a pause (docs/TOOLS.md, "Questions from a tool server"): a
real MCP server (tests/mcp_servers/toolbox.py ``book``) asks for a structured answer during a
call; the turn stores an ``input_requested`` with the schema, the answer route's ``{"data": ...}``
goes back to the server as accept with its content, a text answer as decline, a deadline that
passes as cancel; a turn stopped while its tool waits for the answer ends like any running turn
(the MCP request cannot outlive the process): a clear ending, and a late answer is a 409."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from agentik import Config, open_runtime
from agentik.agent import LocalAgent
from agentik.errors import ConflictError
from agentik.llm.base import ToolSpec
from agentik.testing import FunctionLlm
from agentik.wire import (
    AssistantMessage,
    CommonEvent,
    Cursor,
    Error,
    InputRequest,
    ToolCallSpec,
    ToolItem,
    WorkingItem,
)
from tests.conftest import engine_url
from tests.test_runtime import is_type, take_until

pytestmark = pytest.mark.usefixtures("engine")

TOOLBOX = str(Path(__file__).parent / "mcp_servers" / "toolbox.py")
BOOK = ToolCallSpec(call_id="b1", name="toolbox__book", arguments='{"city": "Oslo"}')


def model() -> FunctionLlm:
    def reply(messages: list[WorkingItem], tools: list[ToolSpec]) -> Any:
        if isinstance(messages[-1], ToolItem):
            return "the tool said: " + messages[-1].content
        return [BOOK]

    return FunctionLlm(reply)


def config(tmp_path: Path, **kw: Any) -> Config:
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {"toolbox": {
        "command": sys.executable, "args": [TOOLBOX]}}}))
    return Config(db_path=str(tmp_path / "a.db"), database_url=engine_url(),
                  mcp_config=str(mcp), **kw)


async def asked(agent: LocalAgent, cid: str, after: Cursor) -> tuple[InputRequest, CommonEvent]:
    events = await take_until(agent.outbox.conversation_events(after, cid),
                              is_type("input_requested"), seconds=30)
    request = events[-1].event.record.message  # type: ignore[union-attr]
    assert isinstance(request, InputRequest)
    return request, events[-1]


async def answer_text(agent: LocalAgent, cid: str, after: Cursor | None) -> str:
    assert after is not None
    events = await take_until(agent.outbox.conversation_events(after, cid),
                              is_type("assistant_message"), seconds=30)
    message = events[-1].event.record.message  # type: ignore[union-attr]
    assert isinstance(message, AssistantMessage)
    return message.content[0].body  # type: ignore[union-attr,no-any-return]


async def test_accepted_declined_and_cancelled(tmp_path: Path) -> None:
    async with open_runtime(config(tmp_path, approval_timeout=3600), llm=model()) as agent:
        with trio.fail_after(60):
            await agent.tools.wait_until(lambda: bool(agent.tools.specs()))
            conv = await agent.create_conversation()
            answers: list[Callable[[str], Any]] = [
                lambda call_id: conv.answer(call_id, data={"nights": 3, "late": True}),
                lambda call_id: conv.answer(call_id, "no thanks"),
            ]
            said = []
            for answer in answers:
                cursor = await agent.outbox.current_cursor()
                await conv.send("book Oslo")
                request, event = await asked(agent, conv.id, cursor)
                assert request.question == "How many nights in Oslo?"
                assert request.schema["properties"]["nights"]["type"] == "integer"
                assert request.tool is None and request.call_id.startswith("elicit_")
                record = await answer(request.call_id)
                assert record.message.call_id == request.call_id
                said.append(await answer_text(agent, conv.id, event.cursor))
            assert said == ["the tool said: booked 3 nights in Oslo, late=True",
                            "the tool said: not booked: decline"]


async def test_a_deadline_cancels_and_a_stopped_turn_ends_clearly(tmp_path: Path) -> None:
    async with open_runtime(config(tmp_path, approval_timeout=0.5), llm=model()) as agent:
        with trio.fail_after(60):
            await agent.tools.wait_until(lambda: bool(agent.tools.specs()))
            conv = await agent.create_conversation()
            cursor = await agent.outbox.current_cursor()
            await conv.send("book Oslo")
            _, event = await asked(agent, conv.id, cursor)
            assert await answer_text(agent, conv.id, event.cursor) == \
                "the tool said: not booked: cancel"
    cfg = config(tmp_path)
    async with open_runtime(cfg, llm=model()) as agent:
        with trio.fail_after(60):
            await agent.tools.wait_until(lambda: bool(agent.tools.specs()))
            conv = await agent.create_conversation()
            cursor = await agent.outbox.current_cursor()
            await conv.send("book Oslo")
            request, _ = await asked(agent, conv.id, cursor)
            cid = conv.id
    async with open_runtime(cfg, llm=model()) as agent:  # the question died with the process
        with trio.fail_after(60):
            conv = await agent.get_conversation(cid)
            assert conv is not None
            records = await conv.get_messages()
            ending = records[-1].message  # the turn has ended, with an error saying why
            assert isinstance(ending, Error), records
            with pytest.raises(ConflictError):
                await conv.answer(request.call_id, data={"nights": 1})
