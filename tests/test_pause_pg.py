"""Issue 30 on a PostgreSQL cluster of two real nodes (``hypercorn -k trio agentik.web:app``): the
answers sent to the node that does not hold a waiting turn are forwarded to the one that does;
the node holding it is SIGKILLed; the sweep that ends a lost node's
running turns leaves the waiting one waiting, an approval sent to the other node completes it
(same call id), and the real MCP tool ran exactly once (counted in a file)."""

from __future__ import annotations

import json
import sys
from contextlib import aclosing
from pathlib import Path

import httpx2
import pytest
import trio

from agentik.client.http import AgentikAgent
from agentik.errors import ConflictError, NotFoundError, RuntimeClosedError, StorageError
from agentik.wire import CommonEvent, Error, ToolResult
from tests.scripted_openai import Reply, ScriptedOpenAI, ToolCalls
from tests.test_pg_nodes import TAKEOVER_LIMIT, cluster

TOOLBOX = str(Path(__file__).parent / "mcp_servers" / "toolbox.py")


async def tools_ready(url: str) -> None:
    """Until the node's model sees the toolbox's tools (its MCP server connects in the
    background; a separate process: ask until it says so)."""
    with trio.fail_after(30):
        async with httpx2.AsyncClient(base_url=url, timeout=2.0) as client:
            while True:
                info = (await client.get("/agentik")).json()
                if "toolbox__tally" in info["capabilities"]["tools"]:
                    return
                await trio.sleep(0.05)


async def test_a_waiting_turn_is_taken_over_and_answered_on_the_other_node(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {"toolbox": {
        "command": sys.executable, "args": [TOOLBOX]}}}))
    counter = str(tmp_path / "tally.txt")
    env = {"AGENTIK_MCP_CONFIG": str(mcp), "AGENTIK_APPROVAL": "toolbox__tally"}
    scripted.push(ToolCalls([("t1", "toolbox__tally", json.dumps({"path": counter}))]),
                  Reply("counted"))
    async with cluster(pg_url, scripted, tmp_path, env=env) as (a, b):
        await tools_ready(a.url)
        await tools_ready(b.url)
        ca, cb = AgentikAgent("ca", a.url), AgentikAgent("cb", b.url)
        try:
            conv = await ca.create_conversation()  # a owns it
            cursor = await ca.outbox.current_cursor()
            await conv.send("count once")
            with trio.fail_after(30):
                async with aclosing(ca.outbox.conversation_events(cursor, conv.id)) as stream:
                    async for ev in stream:
                        if ev.type == "approval_requested":
                            break
            # while a lives, an answer sent to b is forwarded to a, its errors too
            with pytest.raises(ConflictError):
                await cb.answer(conv.id, "t1", "not a question")
            with pytest.raises(NotFoundError):
                await cb.approve(conv.id, "nope")
            await a.kill()
            # b answers once it owns the conversation (its sweeper takes it over, or the
            # answer's own cold load does once a's lease has run out); until then: 503
            with trio.fail_after(TAKEOVER_LIMIT + 10):
                while True:
                    try:
                        answer = await cb.approve(conv.id, "t1")
                        break
                    except (StorageError, RuntimeClosedError):  # a does not answer: 503
                        await trio.sleep(0.2)
            assert answer.message.approve  # type: ignore[union-attr]
            events: list[CommonEvent] = []
            with trio.fail_after(30):
                async with aclosing(cb.outbox.conversation_events(cursor, conv.id)) as stream:
                    async for ev in stream:
                        events.append(ev)
                        if ev.type == "touched":
                            break
            assert [e.type for e in events] == [
                "user_message", "tool_call", "approval_requested", "approval_given",
                "tool_result", "assistant_message", "touched"]
            assert not any(isinstance(getattr(getattr(e.event, "record", None), "message", None),
                                      Error) for e in events)  # no "interrupted: node lost"
            result = events[4].event.record.message  # type: ignore[union-attr]
            assert isinstance(result, ToolResult) and json.loads(result.content)["count"] == 1
            assert (await trio.Path(counter).read_text()).count("\n") == 1
            assert await cb.approve(conv.id, "t1") == answer  # the same answer, on b
        finally:
            await ca.close()
            await cb.close()
