"""What every route module shares: the app's :class:`WebState`, ``state()`` to reach it from a
request, the web logger, and the JSON / error / access-log helpers.

The route modules (``http``, ``sse``, ``ws``) import from here, never from ``app`` (which imports
them to assemble the app), so the web package has no import cycle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import trio
from quart import Response, current_app, g

from agentik.errors import AgentikError, RuntimeClosedError, UnauthorizedError, http_status
from agentik.users import Principal
from agentik.web import logsafe
from agentik.web.errors import detail_of, headers_of
from agentik.web.types import ErrorBody
from agentik.wire import encode

if TYPE_CHECKING:
    from agentik.agent import LocalAgent
    from agentik.config import Config
    from agentik.llm.base import LiteLlm
    from agentik.tools.base import ToolRegistry
    from agentik.web.auth import Authenticator

log = logging.getLogger("agentik.web")
access_log = logging.getLogger("agentik.web.access")

JSON = "application/json"


@dataclass(eq=False)
class WebState:
    """Everything the routes need, on ``app.agentik``."""

    config: Config | None
    llm: LiteLlm | None
    tools: ToolRegistry | None
    #: seconds of silence before an SSE heartbeat comment / a WebSocket ping frame
    heartbeat: float
    on_fatal: Callable[[BaseException], None]
    #: catch SIGTERM in a hypercorn worker (see agentik.web.process.watch_sigterm)
    handle_sigterm: bool = True
    #: the process is the server's own: tune its garbage collector once started
    #: (``Config.gc_threshold``, ``process.tune_gc``)
    tune_gc: bool = False
    #: log a start-up failure here (False: the embedding server, ``agentik serve``, prints it as
    #: its one line from ``startup_error``)
    report_startup: bool = True
    #: why the runtime could not start (set before start-up fails)
    startup_error: BaseException | None = None
    agent: LocalAgent | None = None
    #: who a request's token is (set at start-up, once the settings are read)
    authenticator: Authenticator | None = None
    #: set when the runtime died while serving (the server is on its way out)
    died: BaseException | None = None
    stopping: bool = False
    #: set by after_serving: the runtime holder leaves open_runtime's body normally, which
    #: shuts the runtime down in order (turns end while storage is still up)
    stop_requested: trio.Event = field(default_factory=trio.Event)
    runtime_started: bool = False
    runtime_done: trio.Event = field(default_factory=trio.Event)
    exit_after_stop: bool = False
    open_streams: int = 0
    _streams_changed: trio.Event = field(default_factory=trio.Event)
    #: services that run beside the routes for as long as the runtime is open (the A2A
    #: facade): each is ``await nursery.start(service, agent)``-ed once the runtime is up, and
    #: cancelled before the runtime closes
    services: list[Callable[..., Any]] = field(default_factory=list)

    def require_agent(self) -> LocalAgent:
        """The running agent. Raises RuntimeClosedError (503) before start-up or after shutdown."""
        if self.agent is None:
            raise RuntimeClosedError("the runtime is not running")
        return self.agent

    @property
    def secrets(self) -> Sequence[str]:
        """The configured tokens, masked wherever a request's text is logged."""
        return () if self.config is None else self.config.tokens

    @property
    def cfg(self) -> Config:
        if self.config is None:
            raise RuntimeClosedError("the runtime is not running")
        return self.config

    # Open SSE / WebSocket streams, so tests (and /healthz) can see that a disconnect released
    # everything.
    def stream_opened(self) -> None:
        self.open_streams += 1
        self._changed()

    def stream_closed(self) -> None:
        self.open_streams -= 1
        self._changed()

    def _changed(self) -> None:
        self._streams_changed.set()
        self._streams_changed = trio.Event()

    async def wait_open_streams(self, n: int) -> None:
        """Wait until exactly ``n`` streams are open."""
        while self.open_streams != n:
            await self._streams_changed.wait()


def principal() -> Principal:
    """The principal of the current HTTP request (set by the app's auth hook). Fails closed: a
    request that passed no auth has none, and gets a 401."""
    found = g.get("agentik_principal")
    if not isinstance(found, Principal):
        raise UnauthorizedError("authentication required")
    return found


def scope() -> str | None:
    """Whose conversations the current request reaches: None (all) for an admin, else the
    user's id (the Agent API's ``user=``)."""
    who = principal()
    return None if who.is_admin else who.user


class _HasState(Protocol):
    agentik: WebState


def state() -> WebState:
    """The WebState of the app serving the current request."""
    return cast(_HasState, current_app).agentik


def json_response(
    obj: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(encode(obj), status=status, headers=headers, content_type=JSON)


def error_response(exc: AgentikError) -> Response:
    return json_response(ErrorBody(error=detail_of(exc)), http_status(exc), headers_of(exc))


def log_request(
    method: str,
    path: str,
    query: bytes,
    status: int,
    client_id: str | None,
    started: float | None,
    secrets: Sequence[str] = (),
) -> None:
    """One access-log line per request. What came from the request is escaped and secret values
    are masked (``agentik.web.logsafe``: ``secrets`` are the configured tokens); the Authorization
    header is never logged."""
    target = logsafe.safe_text(path, secrets)
    if query:
        target += "?" + logsafe.safe_query(query.decode("latin-1"), secrets)
    duration = None if started is None else round(1000 * (time.perf_counter() - started), 1)
    elapsed = "" if duration is None else f" {duration:.1f}ms"
    client = logsafe.safe_text((client_id or "-")[:64], secrets)
    # the fields again for AGENTIK_LOG_FORMAT=json (agentik.web.logjson), already made safe
    extra = {"method": method, "path": target, "status": status, "duration_ms": duration,
             "client_id": client}
    access_log.info("%s %s %d client=%s%s", method, target, status, client, elapsed, extra=extra)
