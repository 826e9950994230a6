"""Issue 28 on a PostgreSQL cluster: two nodes (real ``hypercorn agentik.web:app`` processes)
with one agents file of two agents on two scripted models. Conversations made on one node are
answered by their own agent (model, instructions, tools) on the other node once the first has
stopped: the agent is read from the stored conversation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from agentik.client import AgentikAgent
from tests.scripted_openai import Reply, ScriptedOpenAI, open_scripted_openai
from tests.test_agents import agents_file
from tests.test_pg_nodes import TTL, cluster
from tests.test_tools_mcp import stdio_entry, write_config

pytestmark = pytest.mark.usefixtures("pg_url")


@pytest.fixture
async def models() -> AsyncIterator[tuple[ScriptedOpenAI, ScriptedOpenAI]]:
    async with open_scripted_openai() as a, open_scripted_openai() as b:
        yield a, b


async def answered(client: AgentikAgent, conversation_id: str, text: str) -> None:
    """Send ``text`` and wait for its answer's durable record."""
    cursor = await client.outbox.current_cursor()
    await client.send(conversation_id, text)
    with trio.fail_after(60):
        stream = client.outbox.conversation_events(cursor, conversation_id)
        async with aclosing(stream):
            async for ev in stream:
                if ev.type == "assistant_message":
                    return


async def tools_connected(url: str, agent_id: str) -> list[str]:
    """The agent's tools once its MCP server is connected on the node at ``url``."""
    async with httpx2.AsyncClient(base_url=url, timeout=5) as http:
        with trio.fail_after(60):
            while True:  # another process: ask until its server is connected
                tools: list[str] = (await http.get(f"/agentik/agents/{agent_id}")).json()["tools"]
                if tools:
                    return tools
                await trio.sleep(0.1)


async def lease_expired(pg_url: str, node: str) -> None:
    """Until ``node``'s heartbeat is older than the lease TTL: another node may claim its
    conversations."""
    import psycopg

    with trio.fail_after(30):
        while True:  # another process's lease in the database: ask until it is out of date
            with psycopg.connect(pg_url) as conn:
                row = conn.execute(
                    "SELECT now() - heartbeat_at > make_interval(secs => %s) FROM nodes "
                    "WHERE node_id = %s", (TTL, node)).fetchone()
            if row is None or row[0]:
                return
            await trio.sleep(0.2)


def tool_names(request: dict[str, Any]) -> list[str]:
    return sorted(t["function"]["name"] for t in request.get("tools", []))


async def test_each_conversation_keeps_its_agent_on_another_node(
    pg_url: str, tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    a, b = models
    env = {"AGENTIK_AGENTS": agents_file(tmp_path, a, b),
           "AGENTIK_MCP_CONFIG": write_config(tmp_path, {"toolbox": stdio_entry(),
                                                         "other": stdio_entry()})}
    async with cluster(pg_url, a, tmp_path, env=env) as (first, second):
        c1 = AgentikAgent("c1", first.url)
        try:
            support = await c1.create_conversation(agent="support")
            coder = await c1.create_conversation(instructions="Be terse.")  # the default: coder
            a.push(Reply("A once"))
            b.push(Reply("B once"))
            await answered(c1, support.id, "one")
            await answered(c1, coder.id, "two")
        finally:
            await c1.close()
        await first.stop()
        await lease_expired(pg_url, first.name)  # the second node then loads them from storage

        support_tools = await tools_connected(second.url, "support")
        c2 = AgentikAgent("c2", second.url)
        try:
            assert (await c2.get_conversation(support.id)).agent == "support"  # type: ignore[union-attr]
            a.push(Reply("A again"))
            b.push(Reply("B again"))
            await answered(c2, support.id, "three")
            await answered(c2, coder.id, "four")
        finally:
            await c2.close()
    assert [r["model"] for r in a.requests] == ["model-a", "model-a"]
    assert [r["model"] for r in b.requests] == ["model-b", "model-b"]
    assert a.requests[-1]["messages"][0] == {"role": "system", "content": "You are support."}
    assert a.requests[-1]["messages"][-1]["content"] == "three"
    assert tool_names(a.requests[-1]) == sorted(support_tools)
    assert support_tools and all(t.startswith("toolbox__") for t in support_tools)
    assert b.requests[-1]["messages"][0]["content"] == "Be terse."
    assert b.requests[-1]["messages"][-1]["content"] == "four" and "tools" not in b.requests[-1]
