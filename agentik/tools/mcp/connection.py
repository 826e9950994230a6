"""One configured MCP server and its connection: :class:`McpConnection` owns the server's state
(state, last error, retries, the open session, the last tool list, the tail of its stderr) and
supervises it: connect, ``initialize``, ``tools/list``, keep the session open, re-list on
``notifications/tools/list_changed``, ping HTTP servers; on failure wait out an exponential
backoff and connect again. It tells its owner about every change through ``on_change``."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import mcp_types
import trio
from mcp.client.session import ClientRequestContext, ClientSession, IncomingMessage

from agentik.errors import ToolError
from agentik.tools.base import CALL_META, ELICIT, Elicit, ToolOutcome
from agentik.tools.config import ServerConfig, StdioServerConfig
from agentik.tools.mcp.convert import describe, outcome_from_result
from agentik.tools.mcp.transport import WatchedReadStream, open_transport

__all__ = ["CLEANUP_TIMEOUT", "STDERR_TAIL", "McpConnection", "ServerState", "Timing"]

log = logging.getLogger(__name__)

#: connecting: first attempt running · connected · failed: the last attempt failed or the
#: connection was lost, waiting out the backoff · retrying: a later attempt running
ServerState = Literal["connecting", "connected", "failed", "retrying"]

#: seconds the shielded close of one connection may take (stdio: stop and reap the process;
#: HTTP: the DELETE that ends the server's session)
CLEANUP_TIMEOUT = 3.0
#: lines of a server's stderr kept for its status error
STDERR_TAIL = 20
_MAX_TOOL_PAGES = 100
_CLIENT_INFO = mcp_types.Implementation(name="agentik", version="0.1.0")

T = TypeVar("T")


@dataclass(frozen=True)
class Timing:
    """``backoff_initial`` doubles after each consecutive failure up to ``backoff_max``; a
    connection that stayed up ``backoff_max`` seconds resets it. ``connect_timeout`` bounds
    ``initialize`` + ``tools/list`` (and each later list or ping). HTTP servers are pinged every
    ``ping_interval`` seconds so a server that went away is noticed without waiting for a call (a
    stdio server's exit is noticed at once)."""

    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    connect_timeout: float = 30.0
    ping_interval: float = 30.0


def _nothing() -> None:
    return None


class McpConnection:
    """A configured server, supervised by :meth:`supervise` until :meth:`stop`."""

    def __init__(
        self, name: str, config: ServerConfig, timing: Timing, on_change: Callable[[], None]
    ) -> None:
        self.name = name
        self.config = config
        self.state: ServerState = "connecting"
        #: the last failure (kept while retrying, cleared once connected)
        self.error: str | None = None
        #: reconnection attempts since start-up
        self.retries = 0
        #: the open session while connected, else None (calls fail fast with "not connected")
        self.session: ClientSession | None = None
        #: the last tool list the server gave (kept while disconnected so names stay stable)
        self.tools: list[mcp_types.Tool] = []
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL)
        self._timing = timing
        self._on_change = on_change
        self._connected_since: float | None = None
        self._refresh = trio.Event()
        self._stopping = False
        #: ends the running connection from the inside (set while one runs)
        self._stop_current: Callable[[], None] = _nothing
        #: the calls in flight whose turn can ask a person (:meth:`_elicit`): (call id, ask,
        #: the scope its questions are asked in, cancelled when the call ends)
        self._asking: list[tuple[str | None, Elicit, trio.CancelScope]] = []

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if isinstance(self.config, StdioServerConfig) else "http"

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Call ``tool`` on the open session. Raises ToolError when not connected and for any
        protocol or connection failure (the MCP error, or the connection dropping during the
        call). Cancellation propagates and leaves the session usable: the SDK tells the server
        the request was cancelled."""
        session = self.session
        if session is None:
            detail = f": {self.error}" if self.error else ""
            raise ToolError(f"server {self.name!r} is not connected{detail}")
        failure: str | None = None
        result: mcp_types.CallToolResult | None = None
        meta, ask = CALL_META.get(), ELICIT.get()
        asking = None if ask is None else ((meta or {}).get("agentik/call_id"), ask,
                                           trio.CancelScope())
        if asking is not None:
            self._asking.append(asking)
        try:
            # (with traces on, the SDK puts the current span, the tool call's, in the request's
            # _meta as the MCP conventions say: the server continues the trace)
            result = await session.call_tool(tool, arguments, meta=meta)  # type: ignore[arg-type]
        except* Exception as group:
            # MCPError (an error answer, "Connection closed"), transport errors (which the SDK
            # delivers as exception groups), a malformed result: the turn goes on with ToolFailed.
            failure = describe(group)
        finally:
            if asking is not None:  # a question it left open is cancelled
                self._asking.remove(asking)
                asking[2].cancel()
        if failure is not None or result is None:
            raise ToolError(f"tool {tool!r} of server {self.name!r} failed: {failure}")
        return outcome_from_result(result)

    def stop(self) -> None:
        """End the connection from the inside (it closes properly, within CLEANUP_TIMEOUT) and
        do not reconnect: :meth:`supervise` returns."""
        self._stopping = True
        self._stop_current()

    def _set(self, state: ServerState, error: str | None = None) -> None:
        self.state = state
        self.error = error
        self._on_change()

    async def supervise(self) -> None:
        """Connect, and reconnect after each failure, until :meth:`stop`. Never raises but
        Cancelled: a bug here must not take the runtime down with it (this server stops, the
        rest go on)."""
        try:
            await self._reconnect_forever()
        except Exception as exc:
            log.exception("supervising MCP server %r crashed", self.name)
            self.session = None
            self._set("failed", f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self.session = None

    async def _reconnect_forever(self) -> None:
        failures = 0
        last_error: str | None = None
        while True:
            self.stderr_tail.clear()
            error: str
            try:
                await self._connect_once()
                error = "the server closed the connection"
            except* Exception as group:
                error = describe(group)
            if self._stopping:
                return
            if self.stderr_tail:
                error += " | stderr: " + " / ".join(list(self.stderr_tail)[-5:])
            up_since, self._connected_since = self._connected_since, None
            backoff_max = self._timing.backoff_max
            if up_since is not None and trio.current_time() - up_since >= backoff_max:
                failures = 0  # it ran fine for a good while: retry soon, as after a first failure
            failures += 1
            delay = min(backoff_max, self._timing.backoff_initial * 2 ** (failures - 1))
            self.session = None
            self._set("failed", error)
            # A server that stays down fails the same way every time: say it loudly once.
            level = logging.INFO if error == last_error and up_since is None else logging.WARNING
            last_error = error
            log.log(level, "MCP server %r (%s): %s; retrying in %.3g s",
                    self.name, self.transport, error, delay)
            await trio.sleep(delay)
            self.retries += 1
            self._set("retrying", error)

    async def _connect_once(self) -> None:
        """One connection, from spawn/connect to close. Returns when the server ends the
        connection or :meth:`stop` is called; raises (often an exception group) when connecting
        or the session fails.

        The whole connection runs in a shielded scope. A cancel from outside would reach the
        transport's own tasks at once (the HTTP transport's DELETE, the stdio reader) and no
        shield raised at teardown could take that back. Instead :meth:`stop` cancels only
        ``body`` (the handshake and the wait), and every teardown runs under ``guard`` with a
        CLEANUP_TIMEOUT deadline.
        """
        self._refresh = trio.Event()
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
            self._stop_current = stop
            try:
                async with trio.open_nursery() as pipes:
                    try:
                        transport = open_transport(
                            self.name, self.config, self.stderr_tail, pipes, stderr_done
                        )
                        await self._serve(transport, body, begin_cleanup)
                    finally:
                        begin_cleanup()
                        if isinstance(self.config, StdioServerConfig):
                            # The process is gone by now: let the reader take its last stderr
                            # lines (the reason it died) before they are reported. Bounded: a
                            # grandchild could still hold the pipe open.
                            with trio.move_on_after(0.5):
                                await stderr_done.wait()
                        pipes.cancel_scope.cancel()
            finally:
                self._stop_current = _nothing
        # The shield kept an outer cancellation out until now: let it in.
        await trio.lowlevel.checkpoint_if_cancelled()

    async def _serve(
        self,
        transport: AbstractAsyncContextManager[tuple[Any, Any]],
        body: trio.CancelScope,
        begin_cleanup: Callable[[], None],
    ) -> None:
        closed = trio.Event()
        async with transport as (read, write):
            session = ClientSession(
                WatchedReadStream(read, closed),
                write,
                message_handler=self._on_message,
                elicitation_callback=self._elicit,
                client_info=_CLIENT_INFO,
            )
            async with session:
                try:
                    with body:
                        await self._use(session, closed)
                finally:
                    # No new call may start on a session that is going away.
                    self.session = None
                    self._on_change()
                    begin_cleanup()

    async def _use(self, session: ClientSession, closed: trio.Event) -> None:
        timeout = self._timing.connect_timeout
        tools = await _timed(timeout, "initialize and tools/list", _initialize(session))
        self.session = session
        self.tools = tools
        self._connected_since = trio.current_time()
        self._set("connected")
        log.info("MCP server %r (%s) connected: %d tools", self.name, self.transport, len(tools))
        async with trio.open_nursery() as tasks:
            tasks.start_soon(self._refresh_tools, session)
            if self.transport == "http":
                tasks.start_soon(self._ping, session)
            # The SDK's dispatcher stops reading when the transport ends (a stdio child exited,
            # the HTTP transport failed): that is this connection's end.
            await closed.wait()
            tasks.cancel_scope.cancel()

    async def _elicit(self, context: ClientRequestContext, params: mcp_types.ElicitRequestParams
                      ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        """An elicitation (docs/TOOLS.md): the server asks for a structured answer during a call;
        the call's turn asks its person (a pause, ``input_requested`` with the schema) and the
        answer goes back: accept with its content, decline, or cancel (the deadline passed,
        the call or its turn ended). Which call asks: the one whose ``agentik/call_id`` the
        request's ``_meta`` names, else the only call in flight that can ask; none (or several)
        is an error answer. A URL-mode elicitation is declined (never shown)."""
        named = (params.meta or {}).get("agentik/call_id") if params.meta else None
        asking = [a for a in self._asking if named is None or a[0] == named]
        if len(asking) != 1:
            why = "no call of this server can ask a person now" if not asking else \
                "several calls are in flight: name the call in _meta agentik/call_id"
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=why)
        if not isinstance(params, mcp_types.ElicitRequestFormParams):
            return mcp_types.ElicitResult(action="decline")
        _, ask, scope = asking[0]
        with scope:
            answer = await ask(params.message, dict(params.requested_schema))
            return mcp_types.ElicitResult(action=answer.action, content=answer.content)
        return mcp_types.ElicitResult(action="cancel")  # the call ended first

    async def _on_message(self, message: IncomingMessage) -> None:
        # Runs in the session's own task: only flag the refresh, never call the session from here.
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._refresh.set()
        elif isinstance(message, Exception):
            log.warning("MCP server %r: transport error: %s", self.name, describe(message))
        await trio.lowlevel.checkpoint()

    async def _refresh_tools(self, session: ClientSession) -> None:
        """Re-list the tools after each list_changed; a failure ends the connection (retried)."""
        while True:
            await self._refresh.wait()
            self._refresh = trio.Event()  # a notice arriving while we list triggers another pass
            tools = await _timed(self._timing.connect_timeout, "tools/list", _list_tools(session))
            self.tools = tools
            self._on_change()
            log.info("MCP server %r: tool list changed: %d tools", self.name, len(tools))

    async def _ping(self, session: ClientSession) -> None:
        while True:
            await trio.sleep(self._timing.ping_interval)
            await _timed(self._timing.connect_timeout, "ping", session.send_ping())


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
