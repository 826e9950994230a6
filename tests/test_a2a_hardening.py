"""The A2A facade under hostile or careless clients (issue 26, point 8), against the real server
with the scripted model: a task cancelled while its message waits never runs; JSON-RPC ids
too large to echo are refused with id null; an agent's message is not user input; a huge or
control-character contextId creates nothing; pageSize 0 is invalid."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import msgspec
import pytest
import trio
from a2a.types import a2a_pb2 as pb
from trio_websocket import open_websocket_url

from agentik import open_runtime
from agentik.client.http import AgentikAgent
from agentik.config import Config
from agentik.wire import AssistantMessage, AssistantMessageEvent
from tests.scripted_openai import Hang, Reply, ScriptedOpenAI
from tests.test_a2a import V1, a2a_server, message
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    WsClient,
    make_config,
    no_error_logs,
    open_sse,
    openai,
    serve_app,
)

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

@pytest.fixture
def config(tmp_path: Path, openai: ScriptedOpenAI) -> Config:
    return make_config(tmp_path, openai)


async def post(http: httpx2.AsyncClient, body: bytes) -> dict[str, Any]:
    response = await http.post("/a2a", content=body,
                               headers={**V1, "Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def test_a_task_cancelled_while_its_message_waits_never_runs(
    config: Config, openai: ScriptedOpenAI
) -> None:
    openai.push(Hang(text_before="first "), Reply("third answer"))
    immediately = {"returnImmediately": True}
    async with a2a_server(config) as (_, rpc):
        first = (await rpc.call("SendMessage", {"message": message(
            "first message", contextId="queue"), "configuration": immediately}))["task"]
        (conv,) = (await rpc.http.get("/agentik/conversations")).json()["conversations"]
        epoch = (await rpc.http.get("/agentik")).json()["id"]
        async with open_sse(rpc.http, f"/agentik/conversations/{conv['id']}/events",
                            after=f"{epoch}:0") as stream:
            with trio.fail_after(10):
                await stream.until("user_message")  # the first turn is running (it hangs)
            second = (await rpc.call("SendMessage", {"message": message(
                "second message", message_id="m2", contextId="queue"),
                "configuration": immediately}))["task"]
            with trio.fail_after(10):
                await stream.until("user_message")  # the second is stored, and waits
            canceled = await rpc.call("CancelTask", {"id": second["id"]}, pb.Task)
            assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
            # The first turn ends; the withdrawn second one ends without a model round.
            ended = await rpc.call("CancelTask", {"id": first["id"]}, pb.Task)
            assert ended["status"]["state"] == "TASK_STATE_CANCELED"
            third = await rpc.call("SendMessage", {"message": message(
                "third message", message_id="m3", contextId="queue")})
            assert third["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        asked = [str(r["messages"]) for r in openai.requests]
        assert len(asked) == 2 and "first message" in asked[0], asked
        assert "third message" in asked[1] and "second message" not in asked[1], asked
        again = await rpc.call("GetTask", {"id": second["id"]}, pb.Task)
        assert again["status"]["state"] == "TASK_STATE_CANCELED"
        # The journal keeps the second message and its empty interrupted answer, stored when
        # it was cancelled (before the first turn's end), so a restart cannot bring it back.
        journal = (await rpc.http.get(f"/agentik/conversations/{conv['id']}/messages")).json()
        kinds = [(m["message"]["type"], m["message"].get("interrupted", False)) for m in journal]
        assert kinds == [("user_message", False), ("user_message", False),
                         ("assistant_message", True), ("assistant_message", True),
                         ("user_message", False), ("assistant_message", False)], kinds
        withdrawn, first_answer = journal[2]["message"], journal[3]["message"]
        assert withdrawn["turn_id"] == journal[1]["id"] and withdrawn["content"] == []
        assert first_answer["turn_id"] == journal[0]["id"]


async def test_jsonrpc_ids_too_large_to_echo_are_refused_with_id_null(config: Config) -> None:
    async with a2a_server(config) as (_, rpc):
        for raw_id in [b"9" * 400, b"-" + b"9" * 400, b'"' + b"x" * 1_000_000 + b'"',
                       b'"' + b"x" * 257 + b'"', b"9223372036854775808", b"1.5", b"true",
                       b"{}", b"[]"]:
            answer = await post(rpc.http, b'{"jsonrpc": "2.0", "id": ' + raw_id
                                + b', "method": "GetTask", "params": {"id": "x"}}')
            assert answer["id"] is None and answer["error"]["code"] == -32600, answer
            assert len(str(answer)) < 500
        for good in ["x" * 256, 9223372036854775807, -9223372036854775808, 0, None]:
            answer = await post(rpc.http, msgspec.json.encode({"jsonrpc": "2.0", "id": good,
                                                       "method": "GetTask", "params": {"id": "x"}}))
            assert answer["id"] == good and answer["error"]["code"] == -32001, answer


async def test_an_agent_message_is_not_user_input(config: Config, openai: ScriptedOpenAI) -> None:
    async with a2a_server(config) as (_, rpc):
        error = await rpc.error("SendMessage", {"message": {
            **message("I am the agent"), "role": "ROLE_AGENT"}}, -32602)
        assert "ROLE_USER" in error["message"]
        assert (await rpc.http.get("/agentik/conversations")).json()["conversations"] == []
    assert openai.requests == []


async def test_bad_context_and_task_ids_create_nothing(
    config: Config, openai: ScriptedOpenAI
) -> None:
    async with a2a_server(config) as (_, rpc):
        for field, value in [("contextId", "c" * 100_000), ("contextId", "a\x00b"),
                             ("contextId", "line\nbreak"), ("contextId", "\u2028"),
                             ("taskId", "t" * 100_000), ("messageId", "m" * 100_000),
                             ("messageId", "m\x1b[31m")]:
            error = await rpc.error("SendMessage", {"message": message(
                "hello", **{field: value})}, -32602)
            assert f"message.{field}" in error["message"] and value not in error["message"]
        for method in ("GetTask", "CancelTask", "SubscribeToTask"):
            error = await rpc.error(method, {"id": "t" * 1_000_000}, -32602)
            assert len(error["message"]) < 200
        await rpc.error("ListTasks", {"contextId": "c" * 100_000}, -32602)
        assert (await rpc.http.get("/agentik/conversations")).json()["conversations"] == []
        listed = await rpc.call("ListTasks", {})
        assert listed["tasks"] == []
        # At the limit, the id is a context like any other.
        openai.push(Reply("hi"))
        done = await rpc.call("SendMessage", {"message": message("hello", contextId="c" * 256)})
        assert done["task"]["contextId"] == "c" * 256
    assert len(openai.requests) == 1


async def test_page_size_zero_is_invalid(config: Config) -> None:
    async with a2a_server(config) as (_, rpc):
        for size in (0, -1, 101):
            error = await rpc.error("ListTasks", {"pageSize": size}, -32602)
            assert "pageSize" in error["message"]
        for params in ({}, {"pageSize": 1}, {"pageSize": 100}):
            assert (await rpc.call("ListTasks", params))["tasks"] == []


async def test_a_withdrawn_turn_does_not_come_back_after_a_restart(
    config: Config, openai: ScriptedOpenAI
) -> None:
    """The withdrawal is durable at once: a restart while the turn ahead of it runs (start-up
    runs the queued turns it finds open) does not run it."""
    openai.push(Hang(text_before="first "))
    async with open_runtime(config) as agent:
        conv = await agent.create_conversation()
        await conv.send("first message")
        with trio.fail_after(10):
            await openai.wait_requests(1)
        second = await conv.send("second message")
        assert await agent.cancel_turn(conv.id, second)
        journal = await agent.journal.list(conversation_id=conv.id)
        ends = [r.message for r in journal if isinstance(r.message, AssistantMessage)]
        assert [(a.turn_id, a.interrupted, a.content) for a in ends] == [(second, True, [])]
        assert await agent.cancel_turn(conv.id, second)  # again: still withdrawn, no new record
        assert len(await agent.journal.list(conversation_id=conv.id)) == len(journal)
    openai.push(Reply("third answer"))
    async with open_runtime(config) as agent:
        conv2 = await agent.get_conversation(conv.id)
        assert conv2 is not None
        events = agent.outbox.conversation_events(await agent.outbox.current_cursor(), conv.id)
        await conv2.send("third message")
        with trio.fail_after(20):
            async for ce in events:
                if isinstance(ce.event, AssistantMessageEvent):
                    break
    asked = [str(r["messages"]) for r in openai.requests]
    assert len(asked) == 2 and "third message" in asked[1] and "second message" not in asked[1]


async def test_the_interrupt_route_cancels_one_turn_queued_or_running(
    config: Config, openai: ScriptedOpenAI
) -> None:
    """``POST …/interrupt {turn_id}`` (the client's ``cancel_turn``, what a cluster node
    forwards to a conversation's owner) withdraws a queued turn and interrupts a running one."""
    openai.push(Hang(text_before="first "), Reply("third answer"))
    async with (serve_app(config) as server, AgentikAgent("t", server.url) as client,
                httpx2.AsyncClient(base_url=server.url, timeout=10) as http):
        conv = await client.create_conversation()
        epoch = (await client.outbox.current_cursor()).epoch
        async with open_sse(http, f"/agentik/conversations/{conv.id}/events",
                            after=f"{epoch}:0") as stream:
            first = await conv.send("first message")
            with trio.fail_after(10):
                await openai.wait_requests(1)
            second = await conv.send("second message")
            assert await client.cancel_turn(conv.id, second)  # queued: withdrawn, ended now
            answers = [m.message for m in await client.journal.list(conversation_id=conv.id)
                       if isinstance(m.message, AssistantMessage)]
            assert [(a.turn_id, a.interrupted) for a in answers] == [(second, True)]
            assert await client.cancel_turn(conv.id, first)  # running: interrupted
            third = await conv.send("third message")
            with trio.fail_after(20):
                ended: list[str] = []
                while third not in ended:
                    frame = await stream.until("assistant_message")
                    ended.append(msgspec.json.decode(frame[-1].data)["event"]["record"][
                        "message"]["turn_id"])
            assert not await client.cancel_turn(conv.id, first)  # ended: nothing to cancel
            bad = await http.post(f"/agentik/conversations/{conv.id}/interrupt",
                                  json={"turn_id": 5})
            assert bad.status_code == 400
            # The WebSocket's interrupt takes a turn_id too.
            async with open_websocket_url(server.ws_url) as raw:
                ws = WsClient(raw)
                with trio.fail_after(10):
                    done = await ws.call("interrupt", conversation_id=conv.id, turn_id=first)
                    assert done["type"] == "reply" and done["result"] == {"interrupted": False}
                    gone = await ws.call("interrupt", conversation_id="nope", turn_id=first)
                    assert gone["type"] == "error" and gone["error"]["code"] == "not_found"
    asked = [str(r["messages"]) for r in openai.requests]
    assert len(asked) == 2 and "second message" not in asked[1], asked
