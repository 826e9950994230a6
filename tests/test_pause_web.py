"""Issue 30 on the native front doors, over a real hypercorn on 127.0.0.1: the answer routes
(200 with the stored answer, the same again, 409, 404, 400), the WebSocket's ``approve`` and
``answer`` commands, and the Python HTTP client (typed events, ``conversation.approve`` /
``conversation.answer``)."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
import trio
from trio_websocket import open_websocket_url

from agentik.client import AgentikAgent
from agentik.errors import ConflictError, NotFoundError
from agentik.wire import ApprovalAnswer, ApprovalRequested, InputRequested
from tests.scripted_openai import ScriptedOpenAI
from tests.test_pause import ASK, DELETE, Tool, model
from tests.test_web_ops import scrape
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    WsClient,
    make_config,
    no_error_logs,
    open_sse,
    openai,
    serve_app,
)

#: on the suite's engine (``conftest.ENGINE``: SQLite, then PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")


async def test_the_answer_routes(tmp_path: Path, openai: ScriptedOpenAI) -> None:
    tool = Tool()
    config = make_config(tmp_path, openai, approval=("delete_*",))
    async with serve_app(config, model(DELETE), tool.tools) as server, \
            httpx2.AsyncClient(base_url=server.url, timeout=10) as client:
        with trio.fail_after(30):
            before = await scrape(client)
            cid = (await client.post("/agentik/conversations")).json()["id"]
            base = f"/agentik/conversations/{cid}"
            cursor = (await client.get("/agentik/cursor")).json()["current"]
            async with open_sse(client, f"{base}/events", after=cursor) as stream:
                await client.post(f"{base}/messages",
                                  json={"content": [{"type": "text", "body": "go"}]})
                asked = (await stream.until("approval_requested"))[-1]
                request = asked.json()["event"]["record"]["message"]
                assert request == {"type": "approval_request", "call_id": "c1",
                                   "tool": "delete_file", "arguments": '{"path": "a.txt"}',
                                   "deadline": None, "turn_id": request["turn_id"]}
                bad = await client.post(f"{base}/approvals/c1", json={"approve": "yes"})
                assert bad.status_code == 400 and "approve" in bad.json()["error"]["message"]
                assert (await client.post(f"{base}/approvals/zz", json={"approve": True})
                        ).status_code == 404
                assert (await client.post("/agentik/conversations/nope/approvals/c1",
                                          json={"approve": True})).status_code == 404
                ok = await client.post(f"{base}/approvals/c1",
                                       json={"approve": False, "reason": "no"})
                assert ok.status_code == 200
                assert ok.json()["message"] == {
                    "type": "approval_answer", "call_id": "c1", "approve": False, "reason": "no",
                    "timed_out": False, "turn_id": request["turn_id"]}
                again = await client.post(f"{base}/approvals/c1",
                                          json={"approve": False, "reason": "no"})
                assert again.status_code == 200 and again.json() == ok.json()
                other = await client.post(f"{base}/approvals/c1", json={"approve": True})
                assert other.status_code == 409 and other.json()["error"]["code"] == "conflict"
                await stream.until("touched")
            # after the turn: the same answer still 200, another 409
            assert (await client.post(f"{base}/approvals/c1", json={"approve": False,
                                                                    "reason": "no"})).json() == ok.json()
            assert (await client.post(f"{base}/inputs/c1", json={"text": "x"})).status_code == 409
            assert tool.runs == []
            after = await scrape(client)
            refused = ("agentik_pauses_total", (("answer", "refused"),))
            assert after[refused] - before.get(refused, 0.0) == 1  # once, however often sent


async def test_websocket_approve_and_answer(tmp_path: Path, openai: ScriptedOpenAI) -> None:
    tool = Tool()
    config = make_config(tmp_path, openai, approval=("delete_*",), ask_user=True)
    async with serve_app(config, model(ASK, DELETE), tool.tools) as server:
        with trio.fail_after(30):
            async with open_websocket_url(server.ws_url) as socket:
                ws = WsClient(socket)
                cid = (await ws.call("create"))["result"]["id"]
                await ws.call("subscribe", id="s", stream="conversation", conversation_id=cid)
                await ws.call("send", conversation_id=cid,
                              content=[{"type": "text", "body": "clean up"}])
                seen = await ws.events("s", "approval_requested")
                assert [e["event"]["type"] for e in seen][-2:] == [
                    "input_requested", "approval_requested"]
                early = await ws.call("approve", conversation_id=cid, call_id="c1", approve=True)
                assert early["result"]["message"]["approve"] is True  # taken before its turn
                answered = await ws.call("answer", conversation_id=cid, call_id="q1",
                                         text="a.txt")
                assert answered["result"]["message"]["text"] == "a.txt"
                wrong = await ws.call("answer", conversation_id=cid, call_id="c1", text="x")
                assert wrong["error"]["code"] == "conflict"
                rest = await ws.events("s", "touched")
                assert [e["event"]["type"] for e in rest] == [
                    "approval_given", "input_given", "tool_result", "tool_result",
                    "assistant_message", "touched"]
                assert tool.runs == ["a.txt"]


async def test_the_python_client_approves_and_answers(tmp_path: Path,
                                                      openai: ScriptedOpenAI) -> None:
    tool = Tool()
    config = make_config(tmp_path, openai, approval="always", ask_user=True)
    async with serve_app(config, model(DELETE, ASK), tool.tools) as server, \
            AgentikAgent("t", server.url) as agent:
        with trio.fail_after(30):
            conv = await agent.create_conversation()
            cursor = await agent.outbox.current_cursor()
            await conv.send("go")
            waiting: dict[str, object] = {}
            async for event in agent.outbox.conversation_events(cursor, conv.id):
                if isinstance(event.event, ApprovalRequested | InputRequested):
                    waiting[event.type] = event.event.record.message
                if len(waiting) == 2:
                    break
            record = await conv.approve("c1", approve=True)
            assert isinstance(record.message, ApprovalAnswer) and record.message.approve
            assert await conv.approve("c1") == record
            try:
                await conv.approve("c1", approve=False)
                raise AssertionError("a different answer was taken")
            except ConflictError:
                pass
            try:
                await conv.answer("nope", "x")
                raise AssertionError("an unknown call was answered")
            except NotFoundError:
                pass
            answer = await conv.answer("q1", "b.txt")
            assert answer.message.text == "b.txt"  # type: ignore[union-attr]
            types = []
            async for event in agent.outbox.conversation_events(cursor, conv.id):
                types.append(event.type)
                if event.type == "touched":
                    break
            assert types[-6:] == ["approval_given", "tool_result", "input_given", "tool_result",
                                  "assistant_message", "touched"]
            assert tool.runs == ["a.txt"]
