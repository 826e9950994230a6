"""``agentik check``: validate a configuration without serving (docs/CONFIG.md).

One line per item, ``ok`` or ``failed`` and why: the settings, the database (there and
writable), the model (the openai endpoint lists its models or answers a one-token request; the
litert engine loads the model file), each MCP server (started, its tools listed). With an agents
file (docs/AGENTS.md): the file (one line per mistake), each agent's model, and the tools each
agent may use (a ``tools`` pattern that matches no tool of a connected server fails). The users
file (a line for each mistake) and the JWKS (read and parsed; docs/USERS.md). The exit status
is 0 only when every item is usable, 2 when one failed for a bad setting (a value, or an extra
the setting needs that is not installed), else 1.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from agentik.config import Config
from agentik.errors import AgentikError, ConfigError
from agentik.profiles import AgentsFileError, Profiles

#: seconds each item may take (a model or MCP server that does not answer is a failure)
ITEM_TIMEOUT = 30.0


@dataclass(frozen=True)
class Item:
    name: str
    ok: bool
    detail: str
    #: failed for a bad setting (ConfigError): fixed by changing a setting or installing an extra
    bad_setting: bool = False

    def line(self) -> str:
        return f"{'ok' if self.ok else 'failed':<6} {self.name}: {self.detail}"


async def run_checks(config: Config, emit: Callable[[Item], None]) -> int:
    """Check everything, calling ``emit`` with each item as it is known; the exit status (see
    the module docstring)."""
    items = [Item("config", True, _describe(config))]
    emit(items[0])
    profiles = await _profiles(config, items, emit)
    models = [("model", config)] if not config.agents_path or profiles is None else [
        (f"agent {p.id} model", p.llm_config(config)) for p in profiles.agents]
    for name, check, settings in [("database", _database, config),
                                  *((n, _model, s) for n, s in models)]:
        item = await _timed(name, check, settings)
        items.append(item)
        emit(item)
    mcp_items, status = await _mcp(config)
    if config.agents_path and profiles is not None:
        mcp_items += _agent_tools(profiles, status)
    for item in [*mcp_items, *await _users(config), *await _webhooks(config, profiles)]:
        items.append(item)
        emit(item)
    if all(item.ok for item in items):
        return 0
    return 2 if any(item.bad_setting for item in items) else 1


def _describe(config: Config) -> str:
    backend = config.llm_backend
    model = (config.litert_model_path or "(no model file)") if backend == "litert" else (
        f"{config.openai_model} at {config.openai_base_url or 'the OpenAI API'}")
    return f"read; backend {backend} ({model})"


async def _timed(name: str, check: Callable[[Config], object], config: Config) -> Item:
    try:
        with trio.fail_after(ITEM_TIMEOUT):
            detail = await check(config)  # type: ignore[misc]
    except trio.TooSlowError:
        return Item(name, False, f"no answer within {ITEM_TIMEOUT:g} s")
    except ConfigError as exc:
        return Item(name, False, str(exc), bad_setting=True)
    except AgentikError as exc:
        return Item(name, False, str(exc))
    except Exception as exc:  # a check must report, never crash
        return Item(name, False, f"{type(exc).__name__}: {exc}")
    return Item(name, True, str(detail))


async def _profiles(
    config: Config, items: list[Item], emit: Callable[[Item], None]
) -> Profiles | None:
    """The agents (the agents file's, else the one default); None after reporting its
    mistakes, one item each."""
    from agentik.runtime import load_profiles

    try:
        profiles = await load_profiles(config)
    except AgentsFileError as exc:
        failed = [Item("agents", False, line, bad_setting=True) for line in exc.problems]
    except ConfigError as exc:  # mcp.json, read to check the agents' servers
        failed = [Item("agents", False, str(exc), bad_setting=True)]
    else:
        if config.agents_path:
            ok = Item("agents", True, f"{len(profiles.agents)} agent(s): "
                      f"{', '.join(profiles.ids)}; default {profiles.default}")
            items.append(ok)
            emit(ok)
        return profiles
    for item in failed:
        items.append(item)
        emit(item)
    return None


def _agent_tools(profiles: Profiles, status: list[dict[str, Any]]) -> list[Item]:
    """The tools each agent may use among those of the connected servers; a ``tools`` pattern
    matching none of them fails (a typo, or a server that did not connect)."""
    offered = [(t, s["name"]) for s in status if s["state"] == "connected" for t in s["tools"]]
    items = []
    for profile in profiles.agents:
        allowed = [t for t, server in offered if profile.allows_tool(t, server)]
        unmatched = [p for p in profile.tools or () if not any(
            fnmatch.fnmatchcase(t, p) for t in allowed)]
        name = f"agent {profile.id} tools"
        if unmatched:
            items.append(Item(name, False, f"no tool matches {', '.join(map(repr, unmatched))}"))
        else:
            items.append(Item(name, True, f"{len(allowed)} tool(s)" + (
                f": {', '.join(allowed)}" if allowed else "")))
    return items


async def _database(config: Config) -> str:
    from agentik.storage.check import check_database

    return await trio.to_thread.run_sync(check_database, config)


async def _model(config: Config) -> str:
    from agentik.runtime import NO_MODEL, make_llm, model_configured

    if not model_configured(config):  # OpenAI's API is not asked without a key
        raise ConfigError("OPENAI_BASE_URL", NO_MODEL)
    if config.llm_backend == "openai":
        from agentik.llm.openai import OpenAiLlm

        llm = OpenAiLlm.from_config(config.replace(llm_timeout=min(config.llm_timeout, 10.0),
                                                   llm_max_retries=0))
        try:
            return await llm.probe()
        finally:
            await llm.aclose()
    engine = make_llm(config)
    try:
        load = getattr(engine, "load", None)
        if load is not None:
            await load()
        window = engine.context_window
        return f"{config.litert_model_path}: loaded" + (
            f", context window {window} tokens" if window else "")
    finally:
        await engine.aclose()


async def _mcp(config: Config) -> tuple[list[Item], list[dict[str, Any]]]:
    """One item per configured MCP server: started (or reached) and its tools listed; and the
    servers' status."""
    if not config.mcp_config:
        return [], []
    from agentik.tools.config import load_mcp_config
    from agentik.tools.mcp import run_mcp_registry

    # Read the file first: its error raised inside the nursery below would leave it wrapped in
    # an exception group (a traceback instead of this line).
    try:
        await load_mcp_config(config.mcp_config)
    except ConfigError as exc:  # a missing or malformed mcp.json
        return [Item("mcp", False, str(exc), bad_setting=True)], []
    async with trio.open_nursery() as nursery:
        registry = await nursery.start(run_mcp_registry, config)
        names = [s["name"] for s in registry.status()]
        with trio.move_on_after(ITEM_TIMEOUT):
            await registry.wait_until(lambda: all(
                registry.server_state(n) != "connecting" for n in names))
        status = registry.status()
        nursery.cancel_scope.cancel()
    items = []
    for server in status:
        name = f"mcp {server['name']}"
        if server["state"] == "connected":
            tools = ", ".join(server["tools"]) or "no tools"
            items.append(Item(name, True, f"{len(server['tools'])} tool(s): {tools}"))
        else:
            why = server["error"] or f"still {server['state']} after {ITEM_TIMEOUT:g} s"
            items.append(Item(name, False, why))
    return items, status


async def _users(config: Config) -> list[Item]:
    """The users file (a failed line for each mistake) and the JWKS, when set."""
    from agentik.users import UsersFileError, load_users
    from agentik.web.jwt_auth import fetch_key_set

    items: list[Item] = []
    if config.users_file:
        try:
            users = load_users(config.users_file)
        except UsersFileError as exc:
            items += [Item("users", False, problem, bad_setting=True) for problem in exc.problems]
        else:
            admins = sum(p.is_admin for p in users.principals.values())
            items.append(Item("users", True, f"{config.users_file}: {len(users.principals)} "
                                             f"user(s), {admins} admin(s)"))
    if config.jwt_jwks:
        try:
            with trio.fail_after(ITEM_TIMEOUT):
                keys = await fetch_key_set(config.jwt_jwks)
        except trio.TooSlowError:
            items.append(Item("jwks", False, f"no answer within {ITEM_TIMEOUT:g} s"))
        except ConfigError as exc:
            items.append(Item("jwks", False, str(exc), bad_setting=True))
        else:
            kids = ", ".join(str(k.kid) for k in keys.keys)
            items.append(Item("jwks", True, f"{config.jwt_jwks}: {len(keys.keys)} key(s): {kids}"))
    return items


async def _webhooks(config: Config, profiles: Profiles | None) -> list[Item]:
    """The webhooks file (AGENTIK_WEBHOOKS, docs/WEBHOOKS.md), when set: each mistake named."""
    from agentik.webhooks import WebhooksFileError, parse_file

    path = config.webhooks_file
    if not path:
        return []
    try:
        text = await trio.Path(path).read_text(encoding="utf-8")
        specs = parse_file(text, None if profiles is None else dict.fromkeys(profiles.ids))
    except (OSError, UnicodeDecodeError, WebhooksFileError) as exc:
        return [Item("webhooks", False, f"{path}: {exc}", bad_setting=True)]
    return [Item("webhooks", True, f"{path}: {len(specs)} subscription(s)")]
