"""Issue 28: the clients of a server with several agents: the Python client's ``agents()``,
``get_agent()`` and ``create_conversation(agent=...)``; ``agentik chat`` asks which agent a new
conversation is for (a real process, lines from a pipe) and shows each conversation's agent."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from agentik.client import AgentikAgent
from agentik.errors import NotFoundError
from tests.scripted_openai import ScriptedOpenAI, open_scripted_openai
from tests.test_agents import two_agents
from tests.webutil import no_error_logs, serve_app  # noqa: F401 - fixture used by name

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def models() -> AsyncIterator[tuple[ScriptedOpenAI, ScriptedOpenAI]]:
    async with open_scripted_openai() as a, open_scripted_openai() as b:
        yield a, b


async def test_the_python_client_lists_agents_and_creates_for_one(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    a, b = models
    with trio.fail_after(60):
        async with serve_app(two_agents(tmp_path, a, b)) as srv, AgentikAgent("t", srv.url) as client:
            listed = await client.agents()
            assert [e.id for e in listed.agents] == ["support", "coder"]
            assert listed.default == "coder"
            assert (await client.get_agent("support")).name == "Support"
            with pytest.raises(NotFoundError, match="the agents are: support, coder"):
                await client.get_agent("nobody")
            with pytest.raises(NotFoundError, match="the agents are: support, coder"):
                await client.create_conversation(agent="nobody")
            conv = await client.create_conversation(agent="support", instructions="Be brief.")
            assert (conv.agent, conv.record.instructions) == ("support", "Be brief.")
            assert (await client.create_conversation()).agent == "coder"


async def test_agentik_chat_asks_which_agent_a_new_conversation_is_for(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    a, b = models
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AGENTIK_TOKEN", None)
    with trio.fail_after(60):
        async with serve_app(two_agents(tmp_path, a, b)) as srv:
            proc = await trio.run_process(
                [sys.executable, "-m", "agentik.cli", "chat", "--url", srv.url],
                stdin=b"1\nhello support\n/list\n1\n", capture_stdout=True,
                capture_stderr=True, check=False, cwd=str(ROOT), env=env)
            listed = await srv.agent.conversations_snapshot()
    out = proc.stdout.decode()
    assert proc.returncode == 0, (out, proc.stderr)
    assert "Agents:" in out and "1) Support: Answers questions about orders" in out, out
    assert "2) Coder  (default)" in out, out
    assert "agent: echo: hello support" in out, out
    assert "<support>" in out, out  # /list shows each conversation's agent
    assert [c.agent for c in listed.conversations] == ["support"]
    assert len(a.requests) == 1 and not b.requests


async def test_agentik_chat_with_one_agent_asks_nothing(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    from agentik import Config

    a, _ = models
    config = Config(db_path=str(tmp_path / "agentik.db"), openai_base_url=a.base_url,
                    openai_api_key="x", llm_max_retries=0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AGENTIK_TOKEN", None)
    with trio.fail_after(60):
        async with serve_app(config) as srv:
            proc = await trio.run_process(
                [sys.executable, "-m", "agentik.cli", "chat", "--url", srv.url],
                stdin=b"hi\n", capture_stdout=True, capture_stderr=True, check=False,
                cwd=str(ROOT), env=env)
    out = proc.stdout.decode()
    assert proc.returncode == 0 and "agent: echo: hi" in out, (out, proc.stderr)
    assert "Agents:" not in out and "pick an agent" not in out, out


async def test_agentik_check_checks_every_agent_model_and_tools(
    tmp_path: Path, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    from tests.test_cli_check import run
    from tests.test_web_lifespan import env_for

    a, b = models
    config = two_agents(tmp_path, a, b)
    assert config.agents_path is not None and config.mcp_config is not None
    env = env_for(tmp_path, AGENTIK_AGENTS=config.agents_path, AGENTIK_MCP_CONFIG=config.mcp_config)
    code, out = await run(["check"], env, tmp_path)
    lines = {line.split(":")[0].split(None, 1)[1]: line for line in out.strip().splitlines()}
    assert code == 0, out
    assert lines["agents"].startswith("ok") and "support, coder; default coder" in out, out
    assert lines["agent support model"].startswith("ok") and a.base_url.rstrip("/") in out, out
    assert lines["agent coder model"].startswith("ok") and b.base_url.rstrip("/") in out, out
    assert lines["agent support tools"].startswith("ok") and "toolbox__echo" in out, out
    assert "other__" not in lines["agent support tools"], out
    assert lines["agent coder tools"] == "ok     agent coder tools: 0 tool(s)", out

    # a pattern that matches no tool fails, as does an agents file with mistakes (exit 2)
    agents = trio.Path(config.agents_path)
    await agents.write_text((await agents.read_text()).replace('mcp_servers = ["toolbox"]',
                                                               'tools = ["toolbox__ech"]'))
    code, out = await run(["check"], env, tmp_path)
    assert code == 1, out
    assert "failed agent support tools: no tool matches 'toolbox__ech'" in out, out
    await agents.write_text('[agents.x]\nbackend = "ollama"\n')
    code, out = await run(["check"], env, tmp_path)
    assert code == 2, out
    assert "failed agents: agent 'x': field 'backend': unknown backend 'ollama'" in out, out
