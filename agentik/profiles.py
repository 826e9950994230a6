"""Agent profiles: the agents file (``AGENTIK_AGENTS``, TOML) parsed and checked, pure.

A profile is what one named agent of the server is: its instructions (system prompt), its backend
and model, its generation settings, the tools it may use and its busy policy. With no agents file
the server has one profile, ``default``, made from the process-wide settings (so nothing changes
for a server without one). docs/AGENTS.md says what each field means.

:func:`parse_profiles` checks everything it can without I/O and reports every mistake at once,
one line each naming the agent and the field (:class:`AgentsFileError`); the caller passes in what
needs the outside world: the names of the MCP servers in ``mcp.json``, the environment (the key
variables), and whether a path is a file.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
import tomllib
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from agentik.config import APPROVAL_WORDS, BUSY_POLICIES, Approval, Config
from agentik.errors import ConfigError, NotFoundError

#: the variable naming the agents file
VARIABLE = "AGENTIK_AGENTS"
#: the id of the one agent of a server without an agents file
DEFAULT_AGENT = "default"
BACKENDS = ("openai", "litert")
#: an agent id appears in URLs (/a2a/{id}, /agentik/agents/{id})
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_FIELDS = frozenset({
    "name", "description", "instructions", "backend", "base_url", "api_key_env", "model",
    "model_path", "max_output_tokens", "temperature", "context_window", "mcp_servers", "tools",
    "default", "busy_policy", "approval", "approval_timeout", "ask_user",
})
#: the name of the built-in tool that asks the person a question (``ask_user = true``)
ASK_USER = "ask_user"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Profile:
    """One agent of the server. ``mcp_servers``/``tools`` None: every one; () : none."""

    id: str
    name: str
    description: str
    instructions: str
    backend: str
    base_url: str | None
    model: str
    model_path: str | None
    #: the key read from ``api_key_env`` at start-up (never shown)
    api_key: str | None = dataclasses.field(default=None, repr=False)
    max_output_tokens: int = 0
    temperature: float | None = None
    context_window: int = 0
    mcp_servers: tuple[str, ...] | None = None
    tools: tuple[str, ...] | None = None
    busy_policy: str = "queue"
    #: which calls wait for a person's approval (:func:`needs_approval`)
    approval: Approval = "never"
    #: seconds a paused turn waits for its answer (0: for ever)
    approval_timeout: float = 0.0
    #: the model may ask the person a question (the built-in ``ask_user`` tool)
    ask_user: bool = False

    def needs_approval(self, tool: str) -> bool:
        return needs_approval(self.approval, tool)

    def llm_config(self, base: Config) -> Config:
        """``base`` with this agent's backend settings: what its backend is made from. Agents
        whose backend settings are equal get equal configs (they share one backend)."""
        return base.replace(
            llm_backend=self.backend, openai_base_url=self.base_url, openai_api_key=self.api_key,
            openai_model=self.model, litert_model_path=self.model_path,
            max_output_tokens=self.max_output_tokens,
            litert_max_output_tokens=self.max_output_tokens or base.litert_max_output_tokens,
            temperature=self.temperature, context_window=self.context_window,
            system_prompt="",  # not a backend setting: keeps equal backends equal
        )

    def allows_tool(self, name: str, server: str | None) -> bool:
        """Whether this agent may use the tool ``name`` of MCP ``server`` (None: of none)."""
        if self.mcp_servers is not None and server not in self.mcp_servers:
            return False
        if self.tools is not None:
            return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.tools)
        return True


@dataclasses.dataclass(frozen=True)
class Profiles:
    """The server's agents in file order; ``default`` is the id of the default one."""

    agents: tuple[Profile, ...]
    default: str

    def __post_init__(self) -> None:
        assert any(p.id == self.default for p in self.agents), self.default

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.agents]

    def get(self, agent_id: str | None) -> Profile:
        """The agent ``agent_id`` (None: the default one). Raises NotFoundError naming the known
        ids."""
        wanted = self.default if agent_id is None else agent_id
        for profile in self.agents:
            if profile.id == wanted:
                return profile
        raise NotFoundError(f"agent {wanted!r} not found; the agents are: {', '.join(self.ids)}")


def needs_approval(approval: Approval, tool: str) -> bool:
    """Whether a call of ``tool`` (its full name as the model sees it, ``server__tool``) waits
    for a person's approval under the policy ``approval``. The built-in ``ask_user`` never does:
    it is a question to that person already."""
    if tool == ASK_USER and approval != "always":
        return False
    if isinstance(approval, str):
        return approval == "always"
    return any(fnmatch.fnmatchcase(tool, pattern) for pattern in approval)


class AgentsFileError(ConfigError):
    """The agents file has mistakes: ``problems`` holds one line each (agent, field, what)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(VARIABLE, "; ".join(problems))
        self.problems = problems

    def __str__(self) -> str:
        return "\n".join(f"{VARIABLE}: {line}" for line in self.problems)


def default_profile(config: Config) -> Profile:
    """The one agent of a server without an agents file: today's process-wide settings."""
    backend_output = (config.litert_max_output_tokens or config.max_output_tokens
                      if config.llm_backend == "litert" else config.max_output_tokens)
    return Profile(
        id=DEFAULT_AGENT, name=config.agent_name, description=config.agent_description,
        instructions=config.system_prompt, backend=config.llm_backend,
        base_url=config.openai_base_url, api_key=config.openai_api_key, model=config.openai_model,
        model_path=config.litert_model_path, max_output_tokens=backend_output,
        temperature=config.temperature, context_window=config.context_window,
        busy_policy=config.busy_policy, approval=config.approval,
        approval_timeout=config.approval_timeout, ask_user=config.ask_user,
    )


def single(config: Config) -> Profiles:
    return Profiles((default_profile(config),), DEFAULT_AGENT)


def parse_profiles(
    text: str,
    config: Config,
    *,
    mcp_servers: Collection[str] | None,
    env: Mapping[str, str],
    is_file: Callable[[str], bool],
    base_dir: Path,
) -> Profiles:
    """The agents of an agents file's ``text``. Unset fields take the process-wide settings of
    ``config``; a relative ``model_path`` is relative to ``base_dir`` (the file's folder).
    ``mcp_servers``: the servers of mcp.json (None: no mcp.json). Raises AgentsFileError with
    every mistake found."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AgentsFileError([f"not valid TOML: {exc}"]) from None
    problems: list[str] = [f"unknown top-level key {key!r} (only [agents.<id>] tables)"
                           for key in data if key != "agents"]
    agents = data.get("agents")
    if not isinstance(agents, dict) or not agents:
        problems.append("no agent: add at least one [agents.<id>] table")
        raise AgentsFileError(problems)
    profiles: list[Profile] = []
    defaults: list[str] = []
    for agent_id, table in agents.items():
        checker = _Checker(agent_id, problems)
        if not _ID.fullmatch(agent_id):
            checker.bad(None, "an agent id is 1-64 letters, digits, '-' or '_' (it goes in URLs)")
        if not isinstance(table, dict):
            checker.bad(None, "must be a table ([agents.<id>])")
            continue
        profile = _profile(checker, agent_id, table, config, mcp_servers, env, is_file, base_dir)
        if table.get("default") is True:
            defaults.append(agent_id)
        if profile is not None:
            profiles.append(profile)
    if len(defaults) > 1:
        problems.append(f"agents {', '.join(map(repr, defaults))}: field 'default': "
                        "at most one agent may be the default")
    if problems:
        raise AgentsFileError(problems)
    return Profiles(tuple(profiles), defaults[0] if defaults else profiles[0].id)


class _Checker:
    """Reads one agent's fields, noting each mistake as one line."""

    def __init__(self, agent_id: str, problems: list[str]) -> None:
        self.agent_id = agent_id
        self.problems = problems
        self.ok = True

    def bad(self, field: str | None, message: str) -> None:
        where = f"agent {self.agent_id!r}" + ("" if field is None else f": field {field!r}")
        self.problems.append(f"{where}: {message}")
        self.ok = False

    def get(self, table: Mapping[str, Any], field: str, kind: type | tuple[type, ...],
            what: str) -> Any:
        value = table.get(field)
        if value is None:
            return None
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            self.bad(field, f"must be {what}, got {_toml_type(value)}")
            return None
        return value

    def text(self, table: Mapping[str, Any], field: str) -> str | None:
        value: str | None = self.get(table, field, str, "a string")
        return value

    def names(self, table: Mapping[str, Any], field: str) -> tuple[str, ...] | None:
        value = self.get(table, field, list, "a list of strings")
        if value is None:
            return None
        if not all(isinstance(v, str) and v for v in value):
            self.bad(field, "must be a list of non-empty strings")
            return None
        return tuple(value)


def _profile(
    c: _Checker,
    agent_id: str,
    table: Mapping[str, Any],
    config: Config,
    mcp_servers: Collection[str] | None,
    env: Mapping[str, str],
    is_file: Callable[[str], bool],
    base_dir: Path,
) -> Profile | None:
    """One agent's profile, or None after noting its mistakes. (Over 60 lines: one check a
    field, in the file's order, reads best in one place.)"""
    for field in table:
        if field not in _FIELDS:
            c.bad(field, f"unknown field (the fields are: {', '.join(sorted(_FIELDS))})")
    backend = c.text(table, "backend") or config.llm_backend
    if backend not in BACKENDS:
        c.bad("backend", f"unknown backend {backend!r} (one of: {', '.join(BACKENDS)})")
    base_url = c.text(table, "base_url")
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        c.bad("base_url", f"{base_url!r} must start with http:// or https://")
    api_key = config.openai_api_key
    key_env = c.text(table, "api_key_env")
    if key_env is not None:
        api_key = env.get(key_env) or None
        if api_key is None:
            c.bad("api_key_env", f"the variable {key_env!r} is not set")
    elif base_url is not None and base_url != config.openai_base_url:
        api_key = None  # another endpoint does not get the default endpoint's key
    model_path = c.text(table, "model_path")
    if backend == "litert":
        if model_path is None and config.litert_model_path is None:
            c.bad("model_path", "the litert backend needs a .litertlm model file")
        path = (base_dir / model_path).expanduser() if model_path else None
        if path is not None and not is_file(str(path)):
            c.bad("model_path", f"{str(path)!r} is not a file")
        model_path = str(path) if path is not None else config.litert_model_path
    elif model_path is not None:
        c.bad("model_path", "only the litert backend takes a model file (this one is openai)")
    max_output = c.get(table, "max_output_tokens", int, "an integer")
    if max_output is not None and max_output < 0:
        c.bad("max_output_tokens", "must be >= 0 (0: a share of the window)")
    window = c.get(table, "context_window", int, "an integer")
    if window is not None and window < 0:
        c.bad("context_window", "must be >= 0 (0: the model's own)")
    temperature = c.get(table, "temperature", (int, float), "a number")
    if temperature is not None and not (math.isfinite(temperature) and 0 <= temperature <= 2):
        c.bad("temperature", f"must be between 0 and 2, got {temperature}")
    servers = c.names(table, "mcp_servers")
    for server in servers or ():
        if mcp_servers is None:
            c.bad("mcp_servers", f"{server!r}: no MCP server is configured (AGENTIK_MCP_CONFIG)")
        elif server not in mcp_servers:
            known = ", ".join(mcp_servers) or "none"
            c.bad("mcp_servers", f"{server!r} is not in mcp.json (its servers: {known})")
    patterns = c.names(table, "tools")
    busy = c.text(table, "busy_policy") or config.busy_policy
    if busy not in BUSY_POLICIES:
        c.bad("busy_policy", f"{busy!r} is not one of {', '.join(BUSY_POLICIES)}")
    c.get(table, "default", bool, "true or false")
    approval = _approval(c, table, config)
    timeout = c.get(table, "approval_timeout", (int, float), "a number of seconds")
    if timeout is not None and not (math.isfinite(timeout) and 0 <= timeout <= 365 * 24 * 3600):
        c.bad("approval_timeout", f"must be 0 (for ever) to a year in seconds, got {timeout}")
    ask_user = c.get(table, "ask_user", bool, "true or false")
    name, description = c.text(table, "name"), c.text(table, "description")
    instructions, model = c.text(table, "instructions"), c.text(table, "model")
    if not c.ok:
        return None
    return Profile(
        id=agent_id, name=name or agent_id, description=description or "",
        instructions=instructions if instructions is not None else config.system_prompt,
        backend=backend, base_url=base_url if base_url is not None else config.openai_base_url,
        api_key=api_key, model=model or config.openai_model,
        model_path=model_path,
        max_output_tokens=max_output if max_output is not None else config.max_output_tokens,
        temperature=config.temperature if temperature is None else float(temperature),
        context_window=window if window is not None else config.context_window,
        mcp_servers=servers, tools=patterns, busy_policy=busy, approval=approval,
        approval_timeout=config.approval_timeout if timeout is None else float(timeout),
        ask_user=config.ask_user if ask_user is None else ask_user,
    )


def _approval(c: _Checker, table: Mapping[str, Any], config: Config) -> Approval:
    """The agent's ``approval``: "always", "never" or a list of patterns (else the setting)."""
    value = table.get("approval")
    if value is None:
        return config.approval
    if isinstance(value, str):
        if value not in APPROVAL_WORDS:
            c.bad("approval", f"{value!r} is not always or never (or a list of patterns)")
        return value
    patterns = c.names(table, "approval")
    return patterns if patterns is not None else "never"


def _toml_type(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)
