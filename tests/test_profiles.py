"""Issue 28: the agents file (AGENTIK_AGENTS) parsed and checked: every mistake one line naming the
agent and the field; no file: one agent ``default`` from the process-wide settings; a bad file
stops ``agentik serve`` with exit status 2 (a real process)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from agentik.config import Config
from agentik.errors import NotFoundError
from agentik.profiles import AgentsFileError, Profiles, needs_approval, parse_profiles, single
from tests.test_web_lifespan import env_for, spawn

BASE = Config(openai_base_url="http://127.0.0.1:1/v1", openai_api_key="base-key",
              openai_model="base-model", system_prompt="base prompt", max_output_tokens=100)

TWO = """
[agents.support]
name = "Support"
description = "Answers questions about orders"
instructions = "You are a support agent."
backend = "openai"
base_url = "http://127.0.0.1:2/v1"
api_key_env = "SUPPORT_KEY"
model = "small"
max_output_tokens = 512
temperature = 0.2
mcp_servers = ["toolbox"]
tools = ["toolbox__*"]
busy_policy = "reject"

[agents.coder]
default = true
tools = []
"""


def parse(text: str, *, servers: list[str] | None = None, files: tuple[str, ...] = (),
          env: dict[str, str] | None = None) -> Profiles:
    return parse_profiles(text, BASE, mcp_servers=servers, env=env or {},
                          is_file=lambda p: p in files, base_dir=Path("/agents"))


def problems(text: str, **kw: object) -> list[str]:
    with pytest.raises(AgentsFileError) as caught:
        parse(text, **kw)  # type: ignore[arg-type]
    return caught.value.problems


def test_two_agents_with_their_settings_and_the_process_defaults() -> None:
    profiles = parse(TWO, servers=["toolbox", "other"], env={"SUPPORT_KEY": "k1"})
    assert profiles.ids == ["support", "coder"] and profiles.default == "coder"
    support, coder = profiles.get("support"), profiles.get(None)
    assert (support.name, support.description) == ("Support", "Answers questions about orders")
    assert (support.instructions, support.backend, support.model) == (
        "You are a support agent.", "openai", "small")
    assert (support.base_url, support.api_key) == ("http://127.0.0.1:2/v1", "k1")
    assert (support.max_output_tokens, support.temperature) == (512, 0.2)
    assert (support.mcp_servers, support.tools, support.busy_policy) == (
        ("toolbox",), ("toolbox__*",), "reject")
    # unset fields: the process-wide settings
    assert (coder.id, coder.name, coder.instructions, coder.model) == (
        "coder", "coder", "base prompt", "base-model")
    assert (coder.base_url, coder.api_key, coder.max_output_tokens) == (
        "http://127.0.0.1:1/v1", "base-key", 100)
    assert coder.tools == () and coder.mcp_servers is None and coder.temperature is None
    # what each agent's backend is made from; equal settings, equal configs (one backend)
    llm = support.llm_config(BASE)
    assert (llm.openai_base_url, llm.openai_api_key, llm.openai_model) == (
        "http://127.0.0.1:2/v1", "k1", "small")
    assert (llm.max_output_tokens, llm.temperature) == (512, 0.2)
    twin = parse(TWO.replace("[agents.coder]", "[agents.twin]\n[agents.coder]"),
                 servers=["toolbox"], env={"SUPPORT_KEY": "k1"})
    assert twin.get("twin").llm_config(BASE) == twin.get("coder").llm_config(BASE)


def test_tool_allow_list() -> None:
    profiles = parse(TWO, servers=["toolbox"], env={"SUPPORT_KEY": "k"})
    support, coder = profiles.get("support"), profiles.get("coder")
    assert support.allows_tool("toolbox__echo", "toolbox")
    assert not support.allows_tool("other__echo", "other")  # another server
    assert not support.allows_tool("echo", None)  # no server at all
    assert not coder.allows_tool("toolbox__echo", "toolbox")  # tools = [] : none
    everything = parse("[agents.a]\n").get("a")
    assert everything.allows_tool("x__y", "x") and everything.allows_tool("f", None)
    named = parse('[agents.a]\ntools = ["*__echo", "add"]\n').get("a")
    assert named.allows_tool("toolbox__echo", "toolbox") and named.allows_tool("add", None)
    assert not named.allows_tool("toolbox__add", "toolbox")


def test_no_file_is_one_default_agent_from_the_settings() -> None:
    profiles = single(BASE.replace(agent_name="helper", busy_policy="interrupt", temperature=0.7))
    assert profiles.ids == ["default"] and profiles.default == "default"
    agent = profiles.get("default")
    assert (agent.name, agent.instructions, agent.model, agent.busy_policy) == (
        "helper", "base prompt", "base-model", "interrupt")
    assert agent.tools is None and agent.mcp_servers is None and agent.temperature == 0.7
    with pytest.raises(NotFoundError, match="agent 'support' not found; the agents are: default"):
        profiles.get("support")


def test_the_first_agent_is_the_default_unless_one_says() -> None:
    assert parse("[agents.b]\n[agents.a]\n").default == "b"


@pytest.mark.parametrize(("text", "line"), [
    ('[agents.a]\nbackend = "ollama"\n',
     "agent 'a': field 'backend': unknown backend 'ollama' (one of: openai, litert)"),
    ('[agents.a]\nbackend = "litert"\nmodel_path = "none.litertlm"\n',
     "agent 'a': field 'model_path': '/agents/none.litertlm' is not a file"),
    ('[agents.a]\nmcp_servers = ["nope"]\n',
     "agent 'a': field 'mcp_servers': 'nope' is not in mcp.json (its servers: toolbox)"),
    ('[agents.a]\ntools = "toolbox__*"\n',
     "agent 'a': field 'tools': must be a list of strings, got a string"),
    ('[agents.a]\ntools = [1]\n', "agent 'a': field 'tools': must be a list of non-empty strings"),
    ('[agents.a]\ntemperature = 3\n', "agent 'a': field 'temperature': must be between 0 and 2"),
    ('[agents.a]\ntemperature = true\n',
     "agent 'a': field 'temperature': must be a number, got a boolean"),
    ('[agents.a]\nmax_output_tokens = -1\n', "agent 'a': field 'max_output_tokens': must be >= 0"),
    ('[agents.a]\napi_key_env = "NOT_SET"\n',
     "agent 'a': field 'api_key_env': the variable 'NOT_SET' is not set"),
    ('[agents.a]\nbusy_policy = "drop"\n', "agent 'a': field 'busy_policy': 'drop' is not one of"),
    ('[agents.a]\nmodle = "x"\n', "agent 'a': field 'modle': unknown field"),
    ('[agents.a]\napproval = "sometimes"\n',
     "agent 'a': field 'approval': 'sometimes' is not always or never"),
    ('[agents.a]\napproval = [""]\n', "agent 'a': field 'approval': must be a list of non-empty"),
    ('[agents.a]\napproval = true\n', "agent 'a': field 'approval': must be a list of strings"),
    ('[agents.a]\napproval_timeout = -1\n',
     "agent 'a': field 'approval_timeout': must be 0 (for ever) to a year"),
    ('[agents.a]\napproval_timeout = "5"\n',
     "agent 'a': field 'approval_timeout': must be a number of seconds, got a string"),
    ('[agents.a]\nask_user = 1\n', "agent 'a': field 'ask_user': must be true or false"),
    ('[agents.a]\nmodel_path = "m.litertlm"\n',
     "agent 'a': field 'model_path': only the litert backend takes a model file"),
    ('[agents."a b"]\n', "agent 'a b': an agent id is 1-64 letters"),
    ('[agents.a]\ndefault = true\n[agents.b]\ndefault = true\n',
     "agents 'a', 'b': field 'default': at most one agent may be the default"),
    ("[agents.a]\n[agents.a]\n", "not valid TOML: Cannot declare ('agents', 'a') twice (at line 2"),
    ("[other]\n", "unknown top-level key 'other'"),
    ("", "no agent: add at least one [agents.<id>] table"),
])
def test_each_mistake_is_one_line_naming_agent_and_field(text: str, line: str) -> None:
    found = problems(text, servers=["toolbox"])
    assert any(p.startswith(line) for p in found), found


def test_every_mistake_is_reported_at_once() -> None:
    found = problems('[agents.a]\nbackend = "x"\n[agents.b]\nmcp_servers = ["y"]\n')
    assert found == [
        "agent 'a': field 'backend': unknown backend 'x' (one of: openai, litert)",
        "agent 'b': field 'mcp_servers': 'y': no MCP server is configured (AGENTIK_MCP_CONFIG)",
    ]
    text = str(AgentsFileError(found))
    assert text.splitlines() == [f"AGENTIK_AGENTS: {p}" for p in found]


def test_a_relative_model_file_is_found_next_to_the_agents_file() -> None:
    profiles = parse('[agents.a]\nbackend = "litert"\nmodel_path = "m.litertlm"\n',
                     files=("/agents/m.litertlm",))
    assert profiles.get("a").model_path == "/agents/m.litertlm"


async def test_serve_stops_on_a_bad_agents_file_one_line_a_mistake(tmp_path: Path) -> None:
    agents = tmp_path / "agents.toml"
    agents.write_text('[agents.support]\nbackend = "ollama"\n'
                      '[agents.coder]\nmcp_servers = ["toolbox"]\n')
    env = env_for(tmp_path, AGENTIK_AGENTS=str(agents))
    async with spawn([sys.executable, "-m", "agentik.cli", "serve", "--port", "0"], env,
                     tmp_path) as p:
        with trio.fail_after(60):
            code = await p.exit_code()
    lines = [line for line in p.output.splitlines() if line.strip()]
    assert code == 2, p.output
    assert lines == [
        "agentik: bad configuration: AGENTIK_AGENTS: agent 'support': field 'backend': "
        "unknown backend 'ollama' (one of: openai, litert)",
        "agentik: bad configuration: AGENTIK_AGENTS: agent 'coder': field 'mcp_servers': "
        "'toolbox': no MCP server is configured (AGENTIK_MCP_CONFIG)",
    ], p.output


def test_approval_policy_of_an_agent_and_of_the_settings() -> None:
    """Issue 30: ``approval`` globs over the full tool name as the model sees it; unset fields take
    AGENTIK_APPROVAL, AGENTIK_APPROVAL_TIMEOUT and AGENTIK_ASK_USER."""
    base = BASE.replace(approval=("*__send",), approval_timeout=30.0, ask_user=True)
    profiles = parse_profiles(
        '[agents.a]\napproval = ["toolbox__delete_*"]\napproval_timeout = 300\nask_user = false\n'
        '[agents.b]\napproval = "always"\n[agents.c]\n',
        base, mcp_servers=None, env={}, is_file=lambda p: False, base_dir=Path("/agents"))
    a, b, c = profiles.get("a"), profiles.get("b"), profiles.get("c")
    assert (a.approval, a.approval_timeout, a.ask_user) == (("toolbox__delete_*",), 300.0, False)
    assert a.needs_approval("toolbox__delete_file") and not a.needs_approval("toolbox__list")
    assert not a.needs_approval("other__delete_file")  # the whole name is matched
    assert b.needs_approval("toolbox__list") and b.needs_approval("ask_user")
    assert (c.approval, c.approval_timeout, c.ask_user) == (("*__send",), 30.0, True)
    assert c.needs_approval("mail__send") and not c.needs_approval("mail__sender")
    default = single(base).get(None)
    assert (default.approval, default.approval_timeout, default.ask_user) == (
        ("*__send",), 30.0, True)
    assert not needs_approval("never", "toolbox__delete_file")
    assert not needs_approval(("*",), "ask_user")  # the question is to the person already
