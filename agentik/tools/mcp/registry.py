"""The ToolRegistry of a set of MCP servers: one :class:`McpConnection` per server, the names the
model sees (``SERVER__TOOL``) mapped back to (server, tool), the servers' status."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from agentik import metrics
from agentik.config import Config
from agentik.errors import ConfigError, ToolError
from agentik.llm.base import ToolSpec
from agentik.tools.base import ToolOutcome
from agentik.tools.config import VARIABLE, ServerConfig, load_mcp_config
from agentik.tools.mcp.connection import McpConnection, ServerState, Timing
from agentik.tools.mcp.convert import tool_function_name, tool_spec

__all__ = ["McpRegistry", "run_mcp_registry"]


class McpRegistry:
    """The ToolRegistry of a set of MCP servers; run it with :meth:`run` (or
    :func:`run_mcp_registry`). ``specs``/``call``/``status`` are safe from any task."""

    def __init__(
        self,
        servers: Mapping[str, ServerConfig],
        *,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        connect_timeout: float = 30.0,
        ping_interval: float = 30.0,
    ) -> None:
        """The keyword arguments are those of :class:`agentik.tools.mcp.connection.Timing`."""
        timing = Timing(
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            connect_timeout=connect_timeout,
            ping_interval=ping_interval,
        )
        self._servers = {
            name: McpConnection(name, cfg, timing, self._rebuild) for name, cfg in servers.items()
        }
        #: mapped name -> (server, MCP tool name), for every tool known, connected or not
        self._names: dict[str, tuple[McpConnection, str]] = {}
        self._specs: list[ToolSpec] = []
        self._changed = trio.Event()
        self._rebuild()

    # ToolRegistry ---------------------------------------------------------------------------

    def specs(self) -> Sequence[ToolSpec]:
        """The tools of every connected server, as the model sees them."""
        return self._specs

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Call a tool by its mapped name. An error result of the tool is a ToolOutcome with
        ``is_error=True``. Raises ToolError for an unknown name, a server that is not connected,
        and any protocol or connection failure (see :meth:`McpConnection.call_tool`)."""
        target = self._names.get(name)
        if target is None:
            raise ToolError(f"unknown tool {name!r}")
        server, tool = target
        try:
            outcome = await server.call_tool(tool, arguments)
        except ToolError:
            metrics.TOOL_CALLS.labels(server.name, "failed").inc()
            raise
        metrics.TOOL_CALLS.labels(server.name, "error" if outcome.is_error else "ok").inc()
        return outcome

    def server_of(self, name: str) -> str | None:
        """The MCP server of the tool the model knows as ``name`` (None: no such tool)."""
        target = self._names.get(name)
        return None if target is None else target[0].name

    # status ---------------------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """JSON-ready state of every server, in config order (served on GET /agentik/tools):
        ``{"name", "transport": "stdio"|"http", "state", "error", "tools", "retries"}``.
        ``tools`` are the names the model sees (empty while not connected); ``error`` is the last
        failure (kept while retrying, cleared once connected); ``retries`` counts reconnection
        attempts since start-up."""
        by_server: dict[str, list[str]] = {}
        for spec in self._specs:
            by_server.setdefault(self._names[spec.name][0].name, []).append(spec.name)
        return [
            {
                "name": s.name,
                "transport": s.transport,
                "state": s.state,
                "error": s.error,
                "tools": by_server.get(s.name, []),
                "retries": s.retries,
            }
            for s in self._servers.values()
        ]

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds; it is re-checked after every state or tool-list change
        (for tests and for callers that want to wait for a server)."""
        while not predicate():
            await self._changed.wait()

    def server_state(self, name: str) -> ServerState:
        """Raises KeyError for a name not in the config."""
        return self._servers[name].state

    # running --------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[McpRegistry] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise every server until cancelled; ``task_status.started(self)`` comes at once,
        before any server has connected. On cancellation every session is closed properly
        (stdio children stopped and reaped, HTTP sessions deleted), each within CLEANUP_TIMEOUT.
        Never raises anything but Cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                for server in self._servers.values():
                    nursery.start_soon(server.supervise, name=f"mcp server {server.name}")
                task_status.started(self)
                try:
                    await trio.sleep_forever()
                finally:
                    # Connections are shielded from the outer cancellation (see
                    # McpConnection._connect_once): end each one from the inside so it can
                    # close properly.
                    for server in self._servers.values():
                        server.stop()
        finally:
            self._rebuild()

    def _rebuild(self) -> None:
        """Recompute names and specs after any change and wake ``wait_until`` callers."""
        names: dict[str, tuple[McpConnection, str]] = {}
        specs: list[ToolSpec] = []
        for server in self._servers.values():
            for tool in server.tools:
                public = tool_function_name(server.name, tool.name, names.keys())
                names[public] = (server, tool.name)
                if server.session is not None:
                    specs.append(tool_spec(public, tool))
        self._names = names
        self._specs = specs
        self._changed.set()
        self._changed = trio.Event()


async def run_mcp_registry(
    config: Config,
    *,
    backoff_initial: float = 0.5,
    backoff_max: float = 30.0,
    connect_timeout: float = 30.0,
    ping_interval: float = 30.0,
    task_status: trio.TaskStatus[McpRegistry] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Parse ``config.mcp_config`` and run an :class:`McpRegistry` until cancelled.

    Raises ConfigError (before ``task_status.started``) when the variable is unset, the file
    cannot be read (the message names the path) or is malformed (it names the server and the
    field). Then ``task_status.started(registry)`` is called at once: start-up never waits for a
    server. The keyword arguments are those of :class:`McpRegistry`.
    """
    if not config.mcp_config:
        raise ConfigError(VARIABLE, "not set")
    servers = await load_mcp_config(config.mcp_config)
    registry = McpRegistry(
        servers,
        backoff_initial=backoff_initial,
        backoff_max=backoff_max,
        connect_timeout=connect_timeout,
        ping_interval=ping_interval,
    )
    await registry.run(task_status=task_status)
