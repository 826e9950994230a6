"""Issue 28: one A2A agent card per agent, resolved with the official a2a-sdk, each with its own
JSON-RPC URL answered by its own agent's model; the unprefixed card and endpoint stay the default
agent's; a context belongs to the agent it was started with."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import trio
from a2a.types import a2a_pb2 as pb

from tests.scripted_openai import Reply, ScriptedOpenAI, open_scripted_openai
from tests.test_agents import connected, two_agents
from tests.webutil import no_error_logs, serve_app  # noqa: F401 - fixture used by name

V1 = {"A2A-Version": "1.0"}


@pytest.fixture
async def models() -> AsyncIterator[tuple[ScriptedOpenAI, ScriptedOpenAI]]:
    async with open_scripted_openai() as a, open_scripted_openai() as b:
        yield a, b


def _ask(url: str, text: str, context_id: str) -> tuple[Any, str]:
    """a2a-sdk's client, in this worker thread: resolve the card at ``url``, send ``text``; the
    card and the answer's text."""
    from a2a.client import A2ACardResolver, ClientConfig, create_client

    async def go() -> tuple[Any, str]:
        async with httpx.AsyncClient(headers=V1, timeout=30) as http:
            card = await A2ACardResolver(http, url).get_agent_card()
            client = await create_client(card, ClientConfig(streaming=False, httpx_client=http))
            (reply,) = [event async for event in client.send_message(pb.SendMessageRequest(
                message=pb.Message(message_id=f"m-{text}", role=pb.ROLE_USER,
                                   context_id=context_id, parts=[pb.Part(text=text)])))]
            assert reply.task.status.state == pb.TASK_STATE_COMPLETED, reply
            return card, reply.task.status.message.parts[0].text

    return asyncio.run(go())


async def test_each_agent_has_its_card_and_endpoint(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    a, b = models
    async with serve_app(two_agents(tmp_path, a, b)) as server:
        await connected(server.agent)
        a.push(Reply("support here"))
        b.push(Reply("coder here"), Reply("default here"))
        with trio.fail_after(60):
            card, text = await trio.to_thread.run_sync(
                _ask, f"{server.url}/a2a/support", "hi support", "ctx-s")
            assert (card.name, card.description) == ("Support", "Answers questions about orders")
            assert card.supported_interfaces[0].url == f"{server.url}/a2a/support"
            assert {s.id for s in card.skills} > {"chat", "tool:toolbox__echo"}
            assert text == "support here"
            assert a.requests[-1]["messages"][0]["content"] == "You are support."
            card, text = await trio.to_thread.run_sync(
                _ask, f"{server.url}/a2a/coder", "hi coder", "ctx-c")
            assert card.name == "Coder" and [s.id for s in card.skills] == ["chat"]
            assert card.supported_interfaces[0].url == f"{server.url}/a2a/coder"
            assert text == "coder here" and b.requests[-1]["model"] == "model-b"
            # the unprefixed card and endpoint: the default agent's (coder)
            card, text = await trio.to_thread.run_sync(_ask, server.url, "hi", "ctx-d")
            assert card.name == "Coder" and card.supported_interfaces[0].url == f"{server.url}/a2a"
            assert text == "default here" and len(a.requests) == 1

        async with httpx2.AsyncClient(base_url=server.url, headers=V1, timeout=10) as http:
            assert (await http.get("/a2a/nobody/.well-known/agent-card.json")).status_code == 404
            nobody = await http.post("/a2a/nobody", json={
                "jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}})
            assert nobody.status_code == 404
            # ctx-s belongs to support: its messages to coder's endpoint are refused
            refused = await http.post("/a2a/coder", json={
                "jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {"message": {
                    "messageId": "m-x", "role": "ROLE_USER", "contextId": "ctx-s",
                    "parts": [{"text": "hi"}]}}})
            error = refused.json()["error"]
            assert error["code"] == -32602, error
            assert error["message"] == (
                "context 'ctx-s' belongs to agent 'support': send its messages to /a2a/support")
            listed = (await http.get("/agentik/conversations")).json()["conversations"]
            assert sorted(c["agent"] for c in listed) == ["coder", "coder", "support"]


async def test_each_card_is_public_and_each_endpoint_needs_the_token(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    a, b = models
    async with serve_app(two_agents(tmp_path, a, b, tokens=("secret",))) as server:
        async with httpx2.AsyncClient(base_url=server.url, headers=V1, timeout=10) as http:
            card = await http.get("/a2a/support/.well-known/agent-card.json")
            assert card.status_code == 200 and card.json()["name"] == "Support"
            assert card.json()["securityRequirements"], card.json()  # it says a token is needed
            call = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
            assert (await http.post("/a2a/support", json=call)).status_code == 401
            assert (await http.get("/agentik/agents")).status_code == 401
            authed = await http.post("/a2a/support", json=call,
                                     headers={"Authorization": "Bearer secret"})
            assert authed.status_code == 200 and authed.json()["error"]["code"] == -32001
