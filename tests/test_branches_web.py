"""Branches over the front doors (issue 32): the HTTP routes through the Python HTTP client
(``edit``, ``regenerate``, ``switch_branch``, ``fork``, ``siblings``), the WebSocket's commands,
and bad requests answered with clear 4xx; on a real hypercorn, on the suite's engine."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2
import pytest
import trio
from trio_websocket import open_websocket_url

from agentik.client import AgentikAgent
from agentik.wire import Cursor, MessageRecord, Text, UserMessage
from tests.scripted_openai import Echo, ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    WsClient,
    config,
    no_error_logs,
    openai,
    server,
)

pytestmark = pytest.mark.usefixtures("engine")


@asynccontextmanager
async def connect(server: Server) -> AsyncIterator[WsClient]:
    async with open_websocket_url(server.ws_url) as ws:
        yield WsClient(ws)


def texts(records: list[MessageRecord]) -> list[str]:
    out = []
    for r in records:
        content = getattr(r.message, "content", [])
        out.append("".join(c.body for c in content if isinstance(c, Text)))
    return out


async def settle(agent: AgentikAgent, cid: str, after: Cursor, touched: int = 1) -> None:
    """Until the conversation's ``touched``-th Touched after ``after`` (its turns' ends)."""
    seen = 0
    with trio.fail_after(15):
        async for ev in agent.outbox.conversation_events(after, cid):
            seen += ev.type == "touched"
            if seen == touched:
                return


async def test_the_http_client_edits_regenerates_switches_and_forks(
    server: Server, openai: ScriptedOpenAI
) -> None:
    openai.default = Echo(prefix="re ")
    async with AgentikAgent("t", server.url) as agent:
        conv = await agent.create_conversation()
        for text in ("u1", "u2"):
            start = await agent.outbox.current_cursor()
            await conv.send(text)
            await settle(agent, conv.id, start)
        _, a1, u2, _ = await conv.get_messages()
        cursor = await agent.outbox.current_cursor()
        edited = await conv.edit(u2.id, "u2 b")
        await settle(agent, conv.id, cursor)
        assert texts(await conv.get_messages()) == ["u1", "re u1", "u2 b", "re u2 b"]
        cursor = await agent.outbox.current_cursor()
        turn_id = await conv.regenerate(edited)
        await settle(agent, conv.id, cursor)
        listing = await conv.get_messages()
        assert listing[-1].message.turn_id == turn_id  # type: ignore[union-attr]
        assert (listing[-1].siblings, listing[-1].sibling_index) == (2, 1)
        assert [r.id for r in await conv.siblings(edited)] == [u2.id, edited]
        snapshot = await conv.switch_branch(u2.id)
        assert texts(snapshot.messages) == ["u1", "re u1", "u2", "re u2"]
        fork = await conv.fork(a1.id, title="fork")
        assert fork.title == "fork" and texts(await fork.get_messages()) == ["u1", "re u1"]
        assert texts((await agent.chat_snapshot(conv.id)).messages) == texts(snapshot.messages)


async def test_websocket_branch_commands(server: Server, openai: ScriptedOpenAI) -> None:
    openai.default = Echo(prefix="re ")
    agent = server.agent
    conv = await agent.create_conversation()
    cursor = await agent.outbox.current_cursor()
    await conv.send("q")
    async with connect(server) as ws:
        with trio.fail_after(15):
            async for ev in agent.outbox.conversation_events(cursor, conv.id):
                if ev.type == "touched":
                    break
            user, answer = await conv.get_messages()
            cid = conv.id
            edit = await ws.call("edit", conversation_id=cid, message_id=user.id,
                                 content=[{"type": "text", "body": "q2"}])
            assert edit["type"] == "reply", edit
            regen = await ws.call("regenerate", conversation_id=cid, message_id=answer.id)
            assert regen["type"] == "reply", regen
            versions = await ws.call("siblings", conversation_id=cid, message_id=user.id)
            assert [v["id"] for v in versions["result"]] == [user.id, edit["result"]["message_id"]]
            assert versions["result"][1]["sibling_index"] == 1
            switched = await ws.call("branch", conversation_id=cid, message_id=user.id)
            assert switched["result"]["messages"][0]["id"] == user.id
            fork = await ws.call("fork", conversation_id=cid, message_id=user.id, title="f")
            assert fork["result"]["title"] == "f"
            missing = await ws.call("edit", conversation_id=cid, message_id="nope",
                                    content=[{"type": "text", "body": "x"}])
            assert missing["error"]["code"] == "not_found"
            bad = await ws.call("branch", conversation_id=cid)
            assert bad["error"]["code"] == "invalid_input" and "message_id" in bad["error"]["message"]


async def test_bad_branch_requests_are_clear_4xx(server: Server, openai: ScriptedOpenAI) -> None:
    openai.default = Echo(prefix="re ")
    agent = server.agent
    conv = await agent.create_conversation()
    cursor = await agent.outbox.current_cursor()
    await conv.send("q")
    async for ev in agent.outbox.conversation_events(cursor, conv.id):
        if ev.type == "touched":
            break
    user, answer = await conv.get_messages()
    assert isinstance(user.message, UserMessage)
    base = f"/agentik/conversations/{conv.id}"
    async with httpx2.AsyncClient(base_url=server.url, timeout=10) as http:
        text = {"content": [{"type": "text", "body": "x"}]}
        cases = [
            (f"{base}/messages/{answer.id}/edit", text, 400, "not a user message"),
            (f"{base}/messages/nope/edit", text, 404, "nope"),
            (f"{base}/messages/{user.id}/edit", {"content": "x"}, 400, "$.content"),
            (f"{base}/messages/{user.id}/edit", {"content": []}, 400, "must not be empty"),
            (f"{base}/messages/nope/regenerate", None, 404, "nope"),
            (f"{base}/messages/{user.id}/regenerate", {"on_busy": "maybe"}, 400, "$.on_busy"),
            (f"{base}/branch", {"message_id": "nope"}, 404, "nope"),
            (f"{base}/branch", {}, 400, "message_id"),
            (f"{base}/fork", {"message_id": "nope"}, 404, "nope"),
            ("/agentik/conversations/nope/fork", {"message_id": user.id}, 404, "nope"),
            (f"{base}/fork", {"message_id": 3}, 400, "$.message_id"),
        ]
        for path, body, status, fragment in cases:
            response = await http.post(path, json=body) if body is not None else \
                await http.post(path)
            assert response.status_code == status, (path, body, response.text)
            assert fragment in response.json()["error"]["message"], (path, response.text)
        response = await http.get(f"{base}/messages/nope/siblings")
        assert response.status_code == 404
        response = await http.get(f"{base}/messages/{answer.id}/siblings")
        assert response.status_code == 200 and [r["id"] for r in response.json()] == [answer.id]


async def test_the_client_cache_follows_the_current_branch(
    server: Server, openai: ScriptedOpenAI
) -> None:
    """``JournalSync`` keeps its store equal to the current branch: an edit (from another
    client) drops the old version from the cache; a switch back restores it."""
    from agentik.client import BackoffPolicy, InMemoryJournalStore, JournalSync

    openai.default = Echo(prefix="re ")
    async with AgentikAgent("t", server.url) as agent:
        conv = await agent.create_conversation()
        for text in ("u1", "u2"):
            start = await agent.outbox.current_cursor()
            await conv.send(text)
            await settle(agent, conv.id, start)
        store = InMemoryJournalStore()
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                sync = JournalSync(agent, conv.id, store, policy=BackoffPolicy.fixed(0.02))
                await nursery.start(sync.run)
                _, _, u2, _ = await conv.get_messages()
                cursor = await agent.outbox.current_cursor()
                await conv.edit(u2.id, "u2 b")
                await settle(agent, conv.id, cursor)
                await sync.wait_for((await agent.outbox.current_cursor()).offset)
                assert await store.list(conv.id) == await conv.get_messages()
                assert texts(await store.list(conv.id)) == ["u1", "re u1", "u2 b", "re u2 b"]
                await conv.switch_branch(u2.id)
                await sync.wait_for((await agent.outbox.current_cursor()).offset)
                assert texts(await store.list(conv.id)) == ["u1", "re u1", "u2", "re u2"]
                nursery.cancel_scope.cancel()
