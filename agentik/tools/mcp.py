"""MCP tools (SPEC §8): the servers of a Claude-Desktop ``mcp.json`` as one ToolRegistry.

``run_mcp_registry(config)`` parses ``AGENTIK_MCP_CONFIG`` (a malformed or missing file raises
ConfigError before anything starts), hands back an :class:`McpRegistry` at once and then
supervises one task per server: connect (stdio child process or streamable HTTP), ``initialize``,
``tools/list``, keep the session open; a server that fails to start, dies or stops answering is
logged, shown in :meth:`McpRegistry.status` and reconnected with exponential backoff, without
blocking the others or start-up. ``notifications/tools/list_changed`` re-lists that server's tools.

The model sees each tool as ``SERVER__TOOL``, sanitised to OpenAI's function-name rule
``^[a-zA-Z0-9_-]{1,64}$`` (other characters become ``_``; a name too long or already taken is cut
and given a short hash suffix), so names from different servers never collide.

Security
--------
- Processes are started only from the ``command``/``args`` of the operator's config file, as an
  argument list handed to the SDK's process spawner: never through a shell, so nothing in them is
  shell-interpreted. The child gets the SDK's small inherited environment (HOME, LOGNAME, PATH,
  SHELL, TERM, USER) plus the entry's ``env``, not agentik's own (API keys, tokens).
- HTTP servers are contacted only at the ``url`` of the config file, with its ``headers`` (which may
  hold credentials); the SDK follows redirects only within that origin. Nothing the model or a
  client sends can name a command, a URL or a server that is not in the file.
- The model only chooses among the tools the servers listed, by their mapped names; its arguments
  are passed to the server as JSON data.
- Tool descriptions, schemas and results are untrusted data from the server. Results are turned
  into text and passed to the model and the journal (the turn loop caps their size); agentik never
  evaluates, executes or renders them. Non-text blocks are only summarised, never decoded.
- A server's stderr is read into agentik's log (DEBUG, logger ``agentik.tools.mcp``) and the last
  lines of it into the status error, bounded in size.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Container, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar

import httpx2
import mcp_types
import msgspec
import trio
from mcp.client.session import ClientSession, IncomingMessage
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from agentik.config import Config
from agentik.errors import ConfigError, ToolError
from agentik.llm.base import ToolSpec
from agentik.tools.base import ToolOutcome
from agentik.tools.config import (
    VARIABLE,
    HttpServerConfig,
    ServerConfig,
    StdioServerConfig,
    load_mcp_config,
)

__all__ = [
    "McpRegistry",
    "ServerState",
    "outcome_from_result",
    "run_mcp_registry",
    "tool_function_name",
]

log = logging.getLogger(__name__)

#: connecting: first attempt running · connected · failed: the last attempt failed or the
#: connection was lost, waiting out the backoff · retrying: a later attempt running
ServerState = Literal["connecting", "connected", "failed", "retrying"]

#: seconds the shielded close of one connection may take (stdio: stop and reap the process;
#: HTTP: the DELETE that ends the server's session)
CLEANUP_TIMEOUT = 3.0
#: lines of a server's stderr kept for its status error
STDERR_TAIL = 20
_STDERR_LINE_MAX = 500
_MAX_TOOL_PAGES = 100
_NAME_MAX = 64
_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
_CLIENT_INFO = mcp_types.Implementation(name="agentik", version="0.1.0")

T = TypeVar("T")


def _nothing() -> None:
    return None


@dataclass(eq=False)
class _Server:
    name: str
    config: ServerConfig
    state: ServerState = "connecting"
    error: str | None = None
    retries: int = 0
    #: the open session while connected, else None (calls fail fast with "not connected")
    session: ClientSession | None = None
    #: the last tool list the server gave (kept while disconnected so names stay stable)
    tools: list[mcp_types.Tool] = field(default_factory=list)
    connected_since: float | None = None
    refresh: trio.Event = field(default_factory=trio.Event)
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL))
    #: ends the running connection from the inside (set while one runs)
    stop: Callable[[], None] = _nothing

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if isinstance(self.config, StdioServerConfig) else "http"


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
        """``backoff_initial`` doubles after each consecutive failure up to ``backoff_max``; a
        connection that stayed up ``backoff_max`` seconds resets it. ``connect_timeout`` bounds
        ``initialize`` + ``tools/list``. HTTP servers are pinged every ``ping_interval`` seconds
        so a server that went away is noticed without waiting for a call (a stdio server's exit
        is noticed at once)."""
        self._servers = {name: _Server(name=name, config=cfg) for name, cfg in servers.items()}
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._connect_timeout = connect_timeout
        self._ping_interval = ping_interval
        #: mapped name -> (server, MCP tool name), for every tool known, connected or not
        self._names: dict[str, tuple[_Server, str]] = {}
        self._specs: list[ToolSpec] = []
        self._changed = trio.Event()
        self._stopping = False
        self._rebuild()

    # ToolRegistry ---------------------------------------------------------------------------

    def specs(self) -> Sequence[ToolSpec]:
        """The tools of every connected server, as the model sees them."""
        return self._specs

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Call a tool by its mapped name. An error result of the tool is a ToolOutcome with
        ``is_error=True``. Raises ToolError for an unknown name, a server that is not connected,
        and any protocol or connection failure (the MCP error, or the connection dropping during
        the call). Cancellation (interrupt, timeout) propagates and leaves the session usable: the
        SDK tells the server the request was cancelled."""
        target = self._names.get(name)
        if target is None:
            raise ToolError(f"unknown tool {name!r}")
        server, tool = target
        session = server.session
        if session is None:
            detail = f": {server.error}" if server.error else ""
            raise ToolError(f"server {server.name!r} is not connected{detail}")
        failure: str | None = None
        result: mcp_types.CallToolResult | None = None
        try:
            result = await session.call_tool(tool, arguments)
        except* Exception as group:
            # MCPError (an error answer, "Connection closed"), transport errors (which the SDK
            # delivers as exception groups), a malformed result: the turn goes on with ToolFailed.
            failure = _describe(group)
        if failure is not None or result is None:
            raise ToolError(f"tool {tool!r} of server {server.name!r} failed: {failure}")
        return outcome_from_result(result)

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
                    nursery.start_soon(self._guard, server, name=f"mcp server {server.name}")
                task_status.started(self)
                try:
                    await trio.sleep_forever()
                finally:
                    # Connections are shielded from the outer cancellation (see _connect_once):
                    # end each one from the inside so it can close properly.
                    self._stopping = True
                    for server in self._servers.values():
                        server.stop()
        finally:
            for server in self._servers.values():
                server.session = None
            self._rebuild()

    async def _guard(self, server: _Server) -> None:
        try:
            await self._supervise(server)
        except Exception as exc:
            # A bug here must not take the runtime down with it: this server stops, the rest go on.
            log.exception("supervising MCP server %r crashed", server.name)
            server.session = None
            server.state = "failed"
            server.error = f"internal error: {type(exc).__name__}: {exc}"
            self._rebuild()

    async def _supervise(self, server: _Server) -> None:
        failures = 0
        last_error: str | None = None
        while True:
            server.stderr_tail.clear()
            error: str
            try:
                await self._connect_once(server)
                error = "the server closed the connection"
            except* Exception as group:
                error = _describe(group)
            if self._stopping:
                return
            if server.stderr_tail:
                error += " | stderr: " + " / ".join(list(server.stderr_tail)[-5:])
            up_since, server.connected_since = server.connected_since, None
            if up_since is not None and trio.current_time() - up_since >= self._backoff_max:
                failures = 0  # it ran fine for a good while: retry soon, as after a first failure
            failures += 1
            delay = min(self._backoff_max, self._backoff_initial * 2 ** (failures - 1))
            server.session = None
            server.state = "failed"
            server.error = error
            self._rebuild()
            # A server that stays down fails the same way every time: say it loudly once.
            level = logging.INFO if error == last_error and up_since is None else logging.WARNING
            last_error = error
            log.log(level, "MCP server %r (%s): %s; retrying in %.3g s",
                    server.name, server.transport, error, delay)
            await trio.sleep(delay)
            server.retries += 1
            server.state = "retrying"
            self._rebuild()

    async def _connect_once(self, server: _Server) -> None:
        """One connection, from spawn/connect to close. Returns when the server ends the
        connection or the registry stops; raises (often an exception group) when connecting or
        the session fails.

        The whole connection runs in a shielded scope. A cancel from outside would reach the
        transport's own tasks at once (the HTTP transport's DELETE, the stdio reader) and no
        shield raised at teardown could take that back. Instead ``run`` calls ``server.stop()``,
        which cancels only ``body`` (the handshake and the wait), and every teardown runs under
        ``guard`` with a CLEANUP_TIMEOUT deadline.
        """
        server.refresh = trio.Event()
        stderr_done = trio.Event()
        with trio.CancelScope(shield=True) as guard:
            body = trio.CancelScope()

            def begin_cleanup() -> None:
                guard.deadline = min(guard.deadline, trio.current_time() + CLEANUP_TIMEOUT)

            def stop() -> None:
                body.cancel()
                begin_cleanup()

            if self._stopping:
                return
            server.stop = stop
            try:
                async with trio.open_nursery() as pipes:
                    try:
                        transport = self._open_transport(server, pipes, stderr_done)
                        await self._serve(server, transport, body, begin_cleanup)
                    finally:
                        begin_cleanup()
                        if isinstance(server.config, StdioServerConfig):
                            # The process is gone by now: let the reader take its last stderr
                            # lines (the reason it died) before they are reported. Bounded: a
                            # grandchild could still hold the pipe open.
                            with trio.move_on_after(0.5):
                                await stderr_done.wait()
                        pipes.cancel_scope.cancel()
            finally:
                server.stop = _nothing
        # The shield kept an outer cancellation out until now: let it in.
        await trio.lowlevel.checkpoint_if_cancelled()

    async def _serve(
        self,
        server: _Server,
        transport: AbstractAsyncContextManager[tuple[Any, Any]],
        body: trio.CancelScope,
        begin_cleanup: Callable[[], None],
    ) -> None:
        closed = trio.Event()
        async with transport as (read, write):
            session = ClientSession(
                _WatchedReadStream(read, closed),
                write,
                message_handler=partial(self._on_message, server),
                client_info=_CLIENT_INFO,
            )
            async with session:
                try:
                    with body:
                        await self._use(server, session, closed)
                finally:
                    # No new call may start on a session that is going away.
                    server.session = None
                    self._rebuild()
                    begin_cleanup()

    async def _use(self, server: _Server, session: ClientSession, closed: trio.Event) -> None:
        tools = await _timed(self._connect_timeout, "initialize and tools/list", _initialize(session))
        server.session = session
        server.tools = tools
        server.state = "connected"
        server.error = None
        server.connected_since = trio.current_time()
        self._rebuild()
        log.info("MCP server %r (%s) connected: %d tools", server.name, server.transport, len(tools))
        async with trio.open_nursery() as tasks:
            tasks.start_soon(self._refresh_tools, server, session)
            if server.transport == "http":
                tasks.start_soon(self._ping, session)
            # The SDK's dispatcher stops reading when the transport ends (a stdio child exited,
            # the HTTP transport failed): that is this connection's end.
            await closed.wait()
            tasks.cancel_scope.cancel()

    def _open_transport(
        self, server: _Server, pipes: trio.Nursery, stderr_done: trio.Event
    ) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        cfg = server.config
        if isinstance(cfg, StdioServerConfig):
            return _stdio_transport(server, cfg, pipes, stderr_done)
        stderr_done.set()  # no stderr to read
        return _http_transport(cfg)

    async def _on_message(self, server: _Server, message: IncomingMessage) -> None:
        # Runs in the session's own task: only flag the refresh, never call the session from here.
        if isinstance(message, mcp_types.ToolListChangedNotification):
            server.refresh.set()
        elif isinstance(message, Exception):
            log.warning("MCP server %r: transport error: %s", server.name, _describe(message))
        await trio.lowlevel.checkpoint()

    async def _refresh_tools(self, server: _Server, session: ClientSession) -> None:
        """Re-list the tools after each list_changed; a failure ends the connection (retried)."""
        while True:
            await server.refresh.wait()
            server.refresh = trio.Event()  # a notice arriving while we list triggers another pass
            tools = await _timed(self._connect_timeout, "tools/list", _list_tools(session))
            server.tools = tools
            self._rebuild()
            log.info("MCP server %r: tool list changed: %d tools", server.name, len(tools))

    async def _ping(self, session: ClientSession) -> None:
        while True:
            await trio.sleep(self._ping_interval)
            await _timed(self._connect_timeout, "ping", session.send_ping())

    def _rebuild(self) -> None:
        """Recompute names and specs after any change and wake ``wait_until`` callers."""
        names: dict[str, tuple[_Server, str]] = {}
        specs: list[ToolSpec] = []
        for server in self._servers.values():
            for tool in server.tools:
                public = tool_function_name(server.name, tool.name, names.keys())
                names[public] = (server, tool.name)
                if server.session is not None:
                    specs.append(ToolSpec(
                        name=public,
                        description=tool.description or tool.title or "",
                        parameters=dict(tool.input_schema or {"type": "object", "properties": {}}),
                    ))
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


# --- names and results ----------------------------------------------------------------------


def tool_function_name(server: str, tool: str, taken: Container[str] = frozenset()) -> str:
    """``server__tool`` made a valid OpenAI function name (``^[a-zA-Z0-9_-]{1,64}$``) that is not
    in ``taken``: invalid characters become ``_``; a name that is too long or taken is cut and
    ends in ``_`` + 8 hex digits of a hash of the original pair."""
    raw = f"{server}__{tool}"
    name = _INVALID_NAME_CHARS.sub("_", raw)
    if len(name) <= _NAME_MAX and name not in taken:
        return name
    digest = hashlib.sha256(raw.encode()).hexdigest()
    attempt = 0
    while True:
        suffix = "_" + digest[:8] + (str(attempt) if attempt else "")
        candidate = name[: _NAME_MAX - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        attempt += 1


def outcome_from_result(result: mcp_types.CallToolResult) -> ToolOutcome:
    """The text blocks joined by newlines (other blocks summarised, e.g.
    ``[image image/png, 1234 bytes]``); the structured content as JSON when there is no block."""
    parts = [_block_text(block) for block in result.content]
    structured = result.structured_content
    content = "\n".join(parts)
    if not parts and structured is not None:
        content = msgspec.json.encode(structured).decode()
    return ToolOutcome(content=content, is_error=bool(result.is_error), structured=structured)


def _block_text(block: Any) -> str:
    match block:
        case mcp_types.TextContent():
            return block.text
        case mcp_types.ImageContent():
            return f"[image {block.mime_type}, {_b64_size(block.data)} bytes]"
        case mcp_types.AudioContent():
            return f"[audio {block.mime_type}, {_b64_size(block.data)} bytes]"
        case mcp_types.ResourceLink():
            return f"[resource link {block.uri}" + (f" {block.name}" if block.name else "") + "]"
        case mcp_types.EmbeddedResource():
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                return resource.text
            mime = f" {resource.mime_type}" if resource.mime_type else ""
            blob = getattr(resource, "blob", "")
            return f"[resource {resource.uri}{mime}, {_b64_size(blob)} bytes]"
        case _:
            return f"[{getattr(block, 'type', type(block).__name__)} content]"


def _b64_size(data: str) -> int:
    """Decoded size of base64 text, without decoding it."""
    data = data.strip()
    return max(0, len(data) * 3 // 4 - data[-2:].count("="))


def _describe(exc: BaseException) -> str:
    """One line for an exception or a (nested) exception group: its distinct leaves."""
    seen: list[str] = []
    for leaf in _leaves(exc):
        text = str(leaf).strip() or type(leaf).__name__
        if type(leaf) is not MCPError and type(leaf).__name__ not in text:
            text = f"{type(leaf).__name__}: {text}"
        if text not in seen:
            seen.append(text)
    return "; ".join(seen)[:2000]


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


async def _timed(seconds: float, what: str, work: Awaitable[T]) -> T:
    """Await ``work``; a server that does not answer in time raises TimeoutError naming it."""
    with trio.move_on_after(seconds) as scope:
        return await work
    assert scope.cancelled_caught
    raise TimeoutError(f"no answer to {what} within {seconds:g} s")


async def _initialize(session: ClientSession) -> list[mcp_types.Tool]:
    result = await session.initialize()
    if result.capabilities.tools is None:
        return []  # a server of prompts or resources only: nothing to list, nothing to offer
    return await _list_tools(session)


async def _list_tools(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_TOOL_PAGES):
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


# --- transports -----------------------------------------------------------------------------


@asynccontextmanager
async def _stdio_transport(
    server: _Server, cfg: StdioServerConfig, nursery: trio.Nursery, stderr_done: trio.Event
) -> AsyncIterator[tuple[Any, Any]]:
    """Spawn the server (argument list, no shell) with its stderr piped into our log."""
    params = StdioServerParameters(
        command=cfg.command, args=list(cfg.args), env=dict(cfg.env) or None, cwd=cfg.cwd
    )
    read_fd, write_fd = os.pipe()
    nursery.start_soon(_read_stderr, server, trio.lowlevel.FdStream(read_fd), stderr_done)
    errlog = os.fdopen(write_fd, "w")
    try:
        async with stdio_client(params, errlog=errlog) as streams:
            # The child holds its own copy now; closing ours lets the reader see EOF when the
            # child exits.
            errlog.close()
            yield streams
    finally:
        errlog.close()


@asynccontextmanager
async def _http_transport(cfg: HttpServerConfig) -> AsyncIterator[tuple[Any, Any]]:
    # The SDK's defaults (30 s, 300 s for reading the long-lived SSE stream), plus the headers.
    client = httpx2.AsyncClient(headers=dict(cfg.headers), timeout=httpx2.Timeout(30.0, read=300.0))
    async with client, streamable_http_client(cfg.url, http_client=client) as streams:
        yield streams


async def _read_stderr(server: _Server, stream: trio.lowlevel.FdStream, done: trio.Event) -> None:
    buffer = b""

    def emit(raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip()[:_STDERR_LINE_MAX]
        if line:
            server.stderr_tail.append(line)
            log.debug("MCP server %r stderr: %s", server.name, line)

    try:
        async with stream:
            while chunk := await stream.receive_some(65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    emit(line)
                if len(buffer) > 65536:  # no newline in sight: do not grow without bound
                    emit(buffer)
                    buffer = b""
            emit(buffer)
    except (trio.ClosedResourceError, OSError):
        pass
    finally:
        done.set()


class _WatchedReadStream:
    """Wraps a transport's read stream and sets ``closed`` once the session stops reading it
    (end of stream, transport failure or the session closing): the SDK has no other signal
    for a connection that ended."""

    def __init__(self, inner: Any, closed: trio.Event) -> None:
        self._inner = inner
        self._closed = closed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)  # e.g. ``last_context`` of the HTTP transport's stream

    async def receive(self) -> Any:
        return await self._inner.receive()

    async def aclose(self) -> None:
        self._closed.set()
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        return await self._inner.__anext__()

    async def __aenter__(self) -> _WatchedReadStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        self._closed.set()
        result: bool | None = await self._inner.__aexit__(*exc_info)
        return result
