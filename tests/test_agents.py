"""Issue 28: several agents in one server. Two agents on two scripted OpenAI-compatible servers
(the real openai SDK), one with the tools of one real MCP server (of two), one without: each
conversation is answered by its own agent's model, with its own instructions, generation
settings and tools only, also after a restart (SQLite here; PostgreSQL nodes in
test_agents_pg.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import agentik
from agentik import Config, open_runtime
from agentik.errors import NotFoundError
from agentik.tools.base import AllowedTools
from agentik.tools.mcp import McpRegistry
from agentik.wire import AssistantMessageEvent, ToolFailed, ToolResultEvent
from tests.scripted_openai import Reply, ScriptedOpenAI, ToolCalls, open_scripted_openai
from tests.test_runtime import is_type, take_until
from tests.test_tools_mcp import stdio_entry, write_config

WAIT = 30


@pytest.fixture
async def models() -> AsyncIterator[tuple[ScriptedOpenAI, ScriptedOpenAI]]:
    async with open_scripted_openai() as a, open_scripted_openai() as b:
        yield a, b


def agents_file(tmp_path: Path, a: ScriptedOpenAI, b: ScriptedOpenAI) -> str:
    path = tmp_path / "agents.toml"
    path.write_text(f"""
[agents.support]
name = "Support"
description = "Answers questions about orders"
instructions = "You are support."
base_url = "{a.base_url}"
model = "model-a"
max_output_tokens = 64
temperature = 0.2
mcp_servers = ["toolbox"]

[agents.coder]
name = "Coder"
instructions = "You are coder."
base_url = "{b.base_url}"
model = "model-b"
tools = []
default = true
""")
    return str(path)


def two_agents(tmp_path: Path, a: ScriptedOpenAI, b: ScriptedOpenAI, **changes: Any) -> Config:
    mcp = write_config(tmp_path, {"toolbox": stdio_entry(), "other": stdio_entry()})
    return Config(db_path=str(tmp_path / "agentik.db"), llm_max_retries=0, llm_timeout=10.0,
                  mcp_config=mcp, agents_path=agents_file(tmp_path, a, b), **changes)


async def connected(agent: agentik.LocalAgent) -> None:
    """Once both MCP servers are connected."""
    registry = agent.tools
    assert isinstance(registry, McpRegistry)
    with trio.fail_after(WAIT):
        await registry.wait_until(
            lambda: len({s.name.split("__")[0] for s in registry.specs()}) == 2)


@asynccontextmanager
async def running(config: Config) -> AsyncIterator[agentik.LocalAgent]:
    """The runtime once both MCP servers are connected."""
    async with open_runtime(config) as agent:
        await connected(agent)
        yield agent


async def turn(agent: agentik.LocalAgent, conversation_id: str, text: str) -> list[Any]:
    """Send ``text`` and return the conversation's durable events until its Touched."""
    cursor = await agent.outbox.current_cursor()
    await agent.send(conversation_id, text)
    events = await take_until(agent.outbox.conversation_events(cursor, conversation_id),
                              is_type("touched"), WAIT)
    return [ev.event for ev in events]


def tool_names(request: dict[str, Any]) -> list[str]:
    return sorted(t["function"]["name"] for t in request.get("tools", []))


async def test_each_agent_answers_with_its_own_model_instructions_and_tools(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    a, b = models
    config = two_agents(tmp_path, a, b)
    async with running(config) as agent:
        listed = agent.agents()
        assert [e.id for e in listed.agents] == ["support", "coder"] and listed.default == "coder"
        support_entry = agent.get_agent("support")
        assert support_entry.name == "Support" and support_entry.tools
        assert all(t.startswith("toolbox__") for t in support_entry.tools)
        assert agent.get_agent("coder").tools == []
        with pytest.raises(NotFoundError, match="the agents are: support, coder"):
            await agent.create_conversation(agent="nobody")

        support = await agent.create_conversation(agent="support")
        coder = await agent.create_conversation()  # the default agent
        terse = await agent.create_conversation(agent="coder", instructions="Be terse.")
        assert (support.agent, coder.agent, terse.agent) == ("support", "coder", "coder")
        assert terse.record.instructions == "Be terse." and coder.record.instructions is None

        a.push(ToolCalls([("c1", "toolbox__echo", '{"text": "hi"}')]), Reply("done A"))
        data = await turn(agent, support.id, "q1")
        results = [d.record.message for d in data if isinstance(d, ToolResultEvent)]
        assert [(r.name, r.content, r.is_error) for r in results] == [  # type: ignore[union-attr]
            ("toolbox__echo", "hi", False)], data
        first = a.requests[0]
        assert (first["model"], first["messages"][0]) == (
            "model-a", {"role": "system", "content": "You are support."})
        assert (first["temperature"], first["max_completion_tokens"]) == (0.2, 64)
        assert tool_names(first) == sorted(support_entry.tools)  # toolbox's, none of "other"
        assert len(a.requests) == 2 and not b.requests

        # coder: no tools offered, and a call the model makes up anyway is not run
        b.push(ToolCalls([("c2", "toolbox__echo", '{"text": "x"}')]), Reply("done B"))
        data = await turn(agent, coder.id, "q2")
        failed = [d for d in data if isinstance(d, ToolFailed)]
        assert failed and "unknown tool 'toolbox__echo'" in failed[0].record.message.content, data  # type: ignore[union-attr]
        first = b.requests[0]
        assert (first["model"], first["messages"][0]["content"]) == ("model-b", "You are coder.")
        assert "tools" not in first and "temperature" not in first
        b.push(Reply("ok"))
        await turn(agent, terse.id, "q3")
        assert b.requests[-1]["messages"][0]["content"] == "Be terse."
        assert len(a.requests) == 2

        snapshot = await agent.chat_snapshot(support.id)
        assert snapshot.conversation.agent == "support"
        listing = await agent.conversations_snapshot()
        assert {c.id: c.agent for c in listing.conversations} == {
            support.id: "support", coder.id: "coder", terse.id: "coder"}

    # after a restart every conversation is still answered by its own agent
    async with running(config) as agent:
        a.push(Reply("again A"))
        await turn(agent, support.id, "q4")
        assert a.requests[-1]["model"] == "model-a" and len(a.requests) == 3
        assert tool_names(a.requests[-1]) == sorted(support_entry.tools)
        b.push(Reply("again B"))
        await turn(agent, terse.id, "q5")
        assert b.requests[-1]["messages"][0]["content"] == "Be terse."
        assert (await agent.get_conversation(terse.id)).record.agent == "coder"  # type: ignore[union-attr]


async def test_agents_with_the_same_backend_share_it(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    a, _ = models
    path = tmp_path / "agents.toml"
    path.write_text(f'[agents.one]\nbase_url = "{a.base_url}"\ninstructions = "one"\n'
                    f'[agents.two]\nbase_url = "{a.base_url}"\ninstructions = "two"\n'
                    f'tools = ["*__echo"]\n')
    config = Config(db_path=str(tmp_path / "agentik.db"), agents_path=str(path),
                    mcp_config=write_config(tmp_path, {"toolbox": stdio_entry()}))
    async with open_runtime(config) as agent:
        deps = agent._deps
        assert deps.agents["one"].llm is deps.agents["two"].llm  # one backend, one client
        assert deps.agents["one"].tools is deps.tools  # no allow-list: the whole registry
        assert isinstance(deps.agents["two"].tools, AllowedTools)


async def test_an_unknown_agent_is_a_404_naming_the_known_ones(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    import httpx2

    from tests.webutil import serve_app

    a, b = models
    config = two_agents(tmp_path, a, b)
    async with serve_app(config) as server, httpx2.AsyncClient(base_url=server.url) as http:
        listed = (await http.get("/agentik/agents")).json()
        assert listed["default"] == "coder"
        assert [x["card_url"] for x in listed["agents"]] == [
            "/a2a/support/.well-known/agent-card.json", "/a2a/coder/.well-known/agent-card.json"]
        one = await http.get("/agentik/agents/coder")
        assert one.status_code == 200 and one.json()["tools"] == []
        for response in (await http.get("/agentik/agents/nobody"),
                         await http.post("/agentik/conversations", json={"agent": "nobody"})):
            assert response.status_code == 404, response.text
            assert response.json()["error"]["message"] == (
                "agent 'nobody' not found; the agents are: support, coder")
        made = await http.post("/agentik/conversations",
                               json={"agent": "support", "instructions": "Be brief."})
        assert made.status_code == 201
        assert (made.json()["agent"], made.json()["instructions"]) == ("support", "Be brief.")
        assert json.loads((await http.get("/agentik/conversations")).text)[
            "conversations"][0]["agent"] == "support"
        from tests.test_web_ws import connect

        async with connect(server) as ws:
            made_ws = await ws.call("create", agent="coder", instructions="ws")
            assert (made_ws["result"]["agent"], made_ws["result"]["instructions"]) == (
                "coder", "ws")
            refused = await ws.call("create", agent="nobody")
            assert refused["type"] == "error" and refused["error"]["code"] == "not_found"


async def test_the_openai_front_door_has_a_model_per_agent(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    import httpx2

    from tests.webutil import serve_app

    a, b = models
    async with serve_app(two_agents(tmp_path, a, b)) as server, httpx2.AsyncClient(
            base_url=server.url, timeout=30) as http:
        listed = (await http.get("/v1/models")).json()
        assert [m["id"] for m in listed["data"]] == ["support", "coder"]
        a.push(Reply("from A"))
        answer = await http.post("/v1/chat/completions", json={
            "model": "support", "messages": [{"role": "user", "content": "hi"}], "store": True})
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "from A"
        assert a.requests[-1]["messages"][0]["content"] == "You are support." and not b.requests
        cid = answer.headers["X-Agentik-Conversation-Id"]
        assert (await http.get(f"/agentik/conversations/{cid}")).json()["agent"] == "support"
        other = await http.post("/v1/chat/completions", headers={
            "X-Agentik-Conversation-Id": cid}, json={
            "model": "coder", "messages": [{"role": "user", "content": "hi"}]})
        assert other.status_code == 409, other.text
        assert "belongs to the model (agent) 'support'" in other.json()["error"]["message"]


async def test_litert_agents_load_each_model_file_once(tmp_path: Path) -> None:
    """Two agents on one file (same settings) share one engine; an agent on another file has
    its own; each file is loaded once, at start-up, and each agent's turn runs on its own."""
    from tests.models import MODELS, TINY

    other = MODELS / "tiny-random-serve.litertlm"
    pytest.importorskip("litert_lm")
    if not (TINY.is_file() and other.is_file()):
        pytest.skip(f"needs the test models {TINY} and {other}")
    from agentik.llm.litert import LiteRtLlm

    path = tmp_path / "agents.toml"
    path.write_text(f'[agents.one]\nbackend = "litert"\nmodel_path = "{TINY}"\n'
                    f'max_output_tokens = 4\n'
                    f'[agents.two]\nbackend = "litert"\nmodel_path = "{TINY}"\n'
                    f'max_output_tokens = 4\ninstructions = "two"\n'
                    f'[agents.three]\nbackend = "litert"\nmodel_path = "{other}"\n'
                    f'max_output_tokens = 4\n')
    config = Config(db_path=str(tmp_path / "agentik.db"), agents_path=str(path))
    async with open_runtime(config) as agent:
        parts = agent._deps.agents
        one, two, three = parts["one"].llm, parts["two"].llm, parts["three"].llm
        assert one is two and one is not three
        assert isinstance(one, LiteRtLlm) and isinstance(three, LiteRtLlm)
        assert (one.model_path, three.model_path) == (str(TINY), str(other))
        assert one.loaded and three.loaded  # at start-up
        engines = (one.engine, three.engine)
        for agent_id in ("two", "three"):
            conv = await agent.create_conversation(agent=agent_id)
            data = await turn(agent, conv.id, "hi")
            assert any(type(d).__name__ == "AssistantMessageEvent" for d in data), data
        assert (one.engine, three.engine) == engines  # no engine was made again


async def test_each_agent_has_its_own_context_window(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    """The window an agent's compaction and budgets use is its own: a message too big for one
    agent's window fails there (context_window) and is answered by the other agent."""
    a, _ = models
    path = tmp_path / "agents.toml"
    path.write_text(f'[agents.small]\nbase_url = "{a.base_url}"\ncontext_window = 256\n'
                    f'max_output_tokens = 32\n[agents.big]\nbase_url = "{a.base_url}"\n')
    config = Config(db_path=str(tmp_path / "agentik.db"), agents_path=str(path),
                    llm_max_retries=0)
    long = "word " * 600
    async with open_runtime(config) as agent:
        small = await agent.create_conversation(agent="small")
        big = await agent.create_conversation(agent="big")
        cursor = await agent.outbox.current_cursor()
        await agent.send(small.id, long)
        events = await take_until(agent.outbox.conversation_events(cursor, small.id),
                                  is_type("error"), WAIT)
        error = events[-1].event.record.message  # type: ignore[union-attr]
        assert error.code == "context_window", error  # type: ignore[union-attr]
        assert not a.requests  # refused before asking the model
        data = await turn(agent, big.id, long)
        assert any(isinstance(d, AssistantMessageEvent) for d in data), data
        assert len(a.requests) == 1 and "max_completion_tokens" not in a.requests[0]


async def test_readyz_names_the_agent_whose_model_does_not_answer(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    import httpx2

    from tests.webutil import serve_app

    a, _ = models
    path = tmp_path / "agents.toml"
    path.write_text(f'[agents.up]\nbase_url = "{a.base_url}"\n'
                    '[agents.down]\nbase_url = "http://127.0.0.1:9/v1"\n')
    config = Config(db_path=str(tmp_path / "agentik.db"), agents_path=str(path),
                    llm_max_retries=0, llm_timeout=5.0)
    async with serve_app(config) as server, httpx2.AsyncClient(base_url=server.url) as http:
        with trio.fail_after(WAIT):
            while server.agent.model_error is None:  # noqa: ASYNC110 - the survey runs on its own
                await trio.sleep(0.05)
        ready = (await http.get("/readyz")).json()
    assert ready["status"] == "degraded" and not ready["model_reachable"], ready
    (reason,) = [r for r in ready["reasons"] if "model" in r]
    assert "agent 'down'" in reason and "agent 'up'" not in reason, reason


async def test_a_conversation_of_an_agent_no_longer_configured_is_answered_by_the_default(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = models
    path = tmp_path / "agents.toml"
    path.write_text(f'[agents.old]\nbase_url = "{a.base_url}"\ninstructions = "old one"\n')
    config = Config(db_path=str(tmp_path / "agentik.db"), agents_path=str(path),
                    llm_max_retries=0)
    async with open_runtime(config) as agent:
        conv = await agent.create_conversation(agent="old")
        other = await agent.create_conversation(agent="old")
    path.write_text(f'[agents.new]\nbase_url = "{b.base_url}"\n')
    async with open_runtime(config) as agent:
        data = await turn(agent, conv.id, "still there?")
        assert any(isinstance(d, AssistantMessageEvent) for d in data), data
        assert (await agent.get_conversation(conv.id)).agent == "old"  # type: ignore[union-attr]
        await turn(agent, other.id, "and you?")  # its agent is said to be gone once, not twice
    assert not a.requests and b.requests[-1]["messages"][0]["content"] == "old one"
    assert caplog.text.count("belongs to agent 'old', which is not configured") == 1
