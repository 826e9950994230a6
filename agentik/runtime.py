"""open_runtime(): the root supervisor, above the actors and the in-process Agent API.

Start order: the agents (the agents file, each agent's backend loaded: once per distinct backend)
-> storage (and its hub) -> start-up recovery -> tools -> registry. Shutdown runs the
other way round: the registry's nursery is cancelled first and awaited, so every running turn
stores its terminal record while storage is still up; only then is storage stopped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import trio

from agentik import tracing
from agentik.actors.deps import AgentDeps, Deps
from agentik.actors.registry import Registry
from agentik.agent import LocalAgent
from agentik.agent_webhooks import Webhooks
from agentik.cluster import Peers
from agentik.config import Config
from agentik.errors import ConfigError, LlmError
from agentik.llm.base import LiteLlm, ModelHealth, Surveyed
from agentik.profiles import AgentsFileError, Profile, Profiles, parse_profiles, single
from agentik.storage import ops
from agentik.storage.actor import Storage, run_storage
from agentik.tools.base import AllowedTools, NoTools, ToolRegistry

log = logging.getLogger(__name__)


def make_llm(config: Config) -> LiteLlm:
    """The backend named by ``config.llm_backend``. Raises ConfigError."""
    if config.llm_backend == "openai":
        from agentik.llm.openai import OpenAiLlm

        return OpenAiLlm.from_config(config)
    if config.llm_backend == "litert":
        try:
            from agentik.llm.litert import LiteRtLlm
        except ImportError as exc:
            raise ConfigError("AGENTIK_LLM_BACKEND", f"the litert backend is not available: {exc}") from exc
        return LiteRtLlm.from_config(config)
    raise ConfigError("AGENTIK_LLM_BACKEND", f"unknown backend {config.llm_backend!r}")


async def _close_last(owned: list[LiteLlm]) -> None:
    for backend in owned:
        await backend.aclose()
    if tracing.enabled():  # the last spans reach the collector before the process ends
        await trio.to_thread.run_sync(tracing.flush)


@asynccontextmanager
async def open_runtime(
    config: Config | None = None,
    *,
    llm: LiteLlm | None = None,
    tools: ToolRegistry | None = None,
) -> AsyncIterator[LocalAgent]:
    """Run agentik in-process: ``async with open_runtime(cfg) as agent``.

    ``llm`` and ``tools`` override the configured backends and tool registry (an embedding
    program can bring its own, e.g. :class:`agentik.testing.FunctionLlm`): a given ``llm``
    answers for every agent and is not closed here; each agent sees its allowed part of
    ``tools``. Raises ConfigError (AgentsFileError: the agents file) or StorageError at start-up.
    """
    config = config or Config.from_env()
    tracing.setup(endpoint=config.trace_endpoint, content=config.trace_content)
    profiles = await load_profiles(config)
    llms, owned = await open_backends(config, profiles) if llm is None else (
        dict.fromkeys(profiles.ids, llm), [])
    try:
        async with _unwrap_single(), trio.open_nursery() as root:
            # Storage runs shielded and is stopped explicitly, last: when the caller is
            # cancelled, the actors' shielded cleanup still needs it to store their turns'
            # terminal records.
            storage_scope = trio.CancelScope(shield=True)
            storage: Storage = await root.start(partial(_run_storage, config, storage_scope))
            try:
                await _recover(storage)
                the_tools = tools if tools is not None else await _start_tools(config, root)
                models = await _models_health(config, profiles, llms, llm is not None, root)
                deps = Deps(config=config, storage=storage, profiles=profiles,
                            agents=_agents(profiles, llms, the_tools), tools=the_tools,
                            models=models)
                peers = _peers(config, storage)  # clients of the other cluster nodes, closed last
                try:
                    async with trio.open_nursery() as actors:
                        registry = Registry(deps, actors)
                        await actors.start(registry.run_wakeups)  # deadlines of parked pauses
                        if storage.leases is not None:  # a cluster node stops its own actors
                            storage.leases.on_stop = registry.stop
                            # ... and runs the queued turns of a conversation its sweeper took
                            storage.leases.on_claimed = registry.resume
                        # accepted messages a dead process left queued are answered
                        actors.start_soon(registry.resume_queued)
                        agent = LocalAgent(deps, registry, peers, await _webhooks(deps, actors))
                        try:
                            yield agent
                        finally:
                            agent.mark_closed()
                            actors.cancel_scope.cancel()
                finally:
                    with trio.CancelScope(shield=True):
                        await peers.aclose()
            finally:
                # Whatever ends the runtime (the caller leaving, a start-up error, a cancel),
                # storage stops last.
                storage_scope.cancel()
                root.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await _close_last(owned)


def _peers(config: Config, storage: Storage) -> Peers:
    """The clients of the other cluster nodes; a request relayed to one that stops heartbeating
    ends (``Peers.while_live``)."""
    peers = Peers(config)
    if storage.leases is not None:
        peers.live = storage.leases.node_live
    return peers


async def _webhooks(deps: Deps, actors: trio.Nursery) -> Webhooks:
    """The subscriptions, their deliveries started in the actors' nursery (so they end before
    storage does). Raises ConfigError (the webhooks file)."""
    hooks = Webhooks(deps.storage, deps.config, frozenset(deps.profiles.ids))
    await actors.start(hooks.start)
    return hooks


async def load_profiles(config: Config) -> Profiles:
    """The server's agents: the agents file's (``config.agents_path``), checked against mcp.json
    and the environment, else the one ``default`` agent. Raises ConfigError (AgentsFileError
    naming each mistake's agent and field)."""
    path = config.agents_path
    if not path:
        return single(config)
    try:
        text = await trio.Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AgentsFileError([f"cannot read {path!r}: {exc}"]) from None
    servers: list[str] | None = None
    if config.mcp_config:
        from agentik.tools.config import load_mcp_config

        servers = list(await load_mcp_config(config.mcp_config))
    return parse_profiles(text, config, mcp_servers=servers, env=os.environ,
                          is_file=os.path.isfile, base_dir=Path(path).parent)


async def open_backends(
    config: Config, profiles: Profiles
) -> tuple[dict[str, LiteLlm], list[LiteLlm]]:
    """Each agent's backend, loaded, and the distinct backends (to close): agents with equal
    backend settings share one (two LiteRT agents on one file load it once). Raises
    ConfigError naming the agent whose backend cannot be made."""
    made: dict[Config, LiteLlm] = {}
    by_agent: dict[str, LiteLlm] = {}
    try:
        for profile in profiles.agents:
            settings = profile.llm_config(config)
            if settings not in made:
                try:
                    made[settings] = await _open_llm(settings)
                except ConfigError as exc:
                    if config.agents_path:
                        raise AgentsFileError([f"agent {profile.id!r}: {exc}"]) from exc
                    raise
            by_agent[profile.id] = made[settings]
    except BaseException:
        with trio.CancelScope(shield=True):
            for backend in made.values():
                await backend.aclose()
        raise
    return by_agent, list(made.values())


def _agents(
    profiles: Profiles, llms: Mapping[str, LiteLlm], tools: ToolRegistry
) -> dict[str, AgentDeps]:
    def allowed(profile: Profile) -> ToolRegistry:
        if profile.mcp_servers is None and profile.tools is None:
            return tools
        return AllowedTools(tools, profile.allows_tool)

    return {p.id: AgentDeps(p, llms[p.id], allowed(p)) for p in profiles.agents}


async def _open_llm(config: Config) -> LiteLlm:
    """The configured backend, loaded. An embedded engine loads at start-up: a corrupt model
    file stops the server now instead of failing the first turn, and the context window is
    known from the start. Raises ConfigError."""
    the_llm = make_llm(config)
    load = getattr(the_llm, "load", None)
    if load is not None:
        try:
            await load()
        except LlmError as exc:
            await the_llm.aclose()
            raise ConfigError("AGENTIK_LITERT_MODEL_PATH", str(exc)) from exc
    return the_llm


def model_configured(config: Config) -> bool:
    """False for the openai backend with neither a server URL nor a key: the default, OpenAI's
    API, is not asked without a key."""
    return config.llm_backend != "openai" or bool(config.openai_base_url or config.openai_api_key)


#: the start-up warning when no model is configured (the default, OpenAI's API, needs a key)
NO_MODEL = (
    "no model configured: set OPENAI_BASE_URL and OPENAI_MODEL for an OpenAI-compatible server "
    "(e.g. OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_MODEL=llama3.2 for Ollama), "
    "OPENAI_API_KEY for OpenAI's API, or AGENTIK_LLM_BACKEND=litert and "
    "AGENTIK_LITERT_MODEL_PATH for the embedded engine; `agentik check` tests the model"
)
#: seconds between two questions to the model's server: while it answers, while it does not
RECHECK_ANSWERING, RECHECK_SILENT = 60.0, 10.0
#: the longest start-up waits for the first answer (so the window the server names budgets the
#: first turn); a server that takes longer is asked on in the background
FIRST_SURVEY_WAIT = 1.0


async def _models_health(
    config: Config, profiles: Profiles, llms: Mapping[str, LiteLlm], given: bool,
    nursery: trio.Nursery,
) -> dict[str, ModelHealth]:
    """Agent id -> whether its model answers (/readyz), each distinct backend asked now and
    then in ``nursery`` (agents sharing one share its health); a given backend (``given``) is
    asked too when it can be."""
    healths: dict[str, ModelHealth] = {}
    by_backend: dict[int, ModelHealth] = {}
    for profile in profiles.agents:
        the_llm = llms[profile.id]
        model = by_backend.get(id(the_llm))
        if model is None:
            model = by_backend[id(the_llm)] = ModelHealth()
            if not model_configured(profile.llm_config(config)) and not given:
                # said once the runtime has started: a start-up failure stays one line
                log.warning(NO_MODEL)
                model.error, model.checked = NO_MODEL, True  # nothing to ask
            elif isinstance(the_llm, Surveyed):
                await nursery.start(_watch_model, the_llm, model)
        healths[profile.id] = model
    return healths


async def _watch_model(
    llm: Surveyed, health: ModelHealth, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Ask the model's server whether it answers, now and then, for ``/readyz``; started once
    the first answer is in (at most :data:`FIRST_SURVEY_WAIT`)."""
    first = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_survey_loop, llm, health, first)
        with trio.move_on_after(FIRST_SURVEY_WAIT):
            await first.wait()
        task_status.started()


async def _survey_loop(llm: Surveyed, health: ModelHealth, first: trio.Event) -> None:
    while True:
        error = await llm.survey()
        if error is not None and (error != health.error or not health.checked):
            log.warning("the model does not answer: %s (turns fail until it does; "
                        "`agentik check` tests the settings)", error)
        elif error is None and health.error is not None:
            log.info("the model answers again")
        health.error, health.checked = error, True
        first.set()
        await trio.sleep(RECHECK_SILENT if error else RECHECK_ANSWERING)


async def _run_storage(
    config: Config, scope: trio.CancelScope, task_status: trio.TaskStatus[Storage]
) -> None:
    with scope:
        await run_storage(
            config.db_path,
            database_url=config.database_url,
            node_id=config.node_id,
            lease_ttl=config.lease_ttl,
            node_url=config.node_url,
            db_timeout=config.db_timeout,
            synchronous=config.sqlite_synchronous,
            outbox_cap=config.outbox_cap,
            outbox_ttl=config.outbox_ttl,
            max_batch=config.max_batch,
            subscriber_buffer=config.subscriber_buffer,
            task_status=task_status,
        )


async def _recover(storage: Storage) -> None:
    """Start-up: temporary conversations go, turns a dead process left running get their Error
    (its queued ones run once the registry is up: ``Registry.resume_queued``)."""
    purged = await storage.write(ops.PurgeTemporary())
    recovered = await storage.recover_turns(ops.RecoverTurns())
    if purged or recovered:
        log.info("start-up: %d temporary conversations removed, %d interrupted turns closed",
                 purged, len(recovered))


async def _start_tools(config: Config, nursery: trio.Nursery) -> ToolRegistry:
    """The configured tools. MCP servers connect in the background: start-up never waits on a
    slow or broken server (its state shows on /agentik/tools). A malformed config file raises
    ConfigError here and stops start-up."""
    if not config.mcp_config:
        return NoTools()
    from agentik.tools.mcp import run_mcp_registry

    registry: ToolRegistry = await nursery.start(partial(run_mcp_registry, config))
    return registry


@asynccontextmanager
async def _unwrap_single() -> AsyncIterator[None]:
    """Nurseries wrap every error in an ExceptionGroup. When exactly one error escapes (a start-up
    StorageError, or the caller's own exception from the ``async with`` body), re-raise it bare so
    callers can catch what they expect."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
