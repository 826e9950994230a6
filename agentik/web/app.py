"""The Quart-Trio application: ``create_app()`` and its lifespan.

The runtime (``open_runtime``) runs in the app's lifespan nursery: ``before_serving`` starts a task
that enters the runtime and holds it open; ``after_serving`` asks that task to leave the runtime's
``async with`` body and waits until the runtime has closed (running turns get their terminal
events first, then the database is closed).

A runtime that dies while the server is up must not leave hypercorn serving a dead runtime:
hypercorn only logs a failed lifespan task and keeps serving (PITFALLS). So the holder task calls
``on_fatal``: by default it logs and ends the process with status 1 (``os._exit``; the runtime has
already closed the database in its own ``finally``, and a worker of ``hypercorn -k trio`` has no
way to ask hypercorn to stop; its supervisor then exits with that status). ``agentik serve`` and
the tests pass their own ``on_fatal`` that triggers hypercorn's graceful shutdown instead.

SIGTERM: hypercorn's supervisor handles it (graceful shutdown of its workers). A worker that gets
SIGTERM itself (a process-group kill) would die on the spot, so the app catches it there; see
``_watch_sigterm``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import trio
from quart import Response, current_app, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from agentik.actors.runtime import open_runtime
from agentik.config import Config
from agentik.errors import AgentikError, RuntimeClosedError
from agentik.web import auth
from agentik.web.errors import detail_of, error_body, headers_of, status_of
from agentik.web.types import ErrorBody
from agentik.wire import encode

if TYPE_CHECKING:
    from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

    from agentik.agent import LocalAgent
    from agentik.llm.base import LiteLlm
    from agentik.storage.hub import EventHub
    from agentik.tools.base import ToolRegistry

log = logging.getLogger("agentik.web")
access_log = logging.getLogger("agentik.web.access")

NOT_TRIO_MESSAGE = (
    "agentik needs hypercorn's trio worker: start it with `hypercorn -k trio agentik.web:app` "
    "(add `-k trio`), or use `agentik serve`"
)

JSON = "application/json"


def _flush_logs() -> None:
    for handler in [*logging.getLogger("agentik").handlers, *logging.getLogger().handlers]:
        handler.flush()
    sys.stderr.flush()


def _terminate(status: int) -> None:
    """End the process now with ``status`` (the runtime is already closed, or never opened).

    In a worker of hypercorn's supervisor (``hypercorn -k trio``), the worker's status is lost:
    hypercorn 0.18's ``run()`` exits 0 when its only worker fails (it calls ``_join_exited`` a
    second time on the already emptied process list, which returns 0). The supervisor holds
    nothing but the listening socket, and it treats SIGTERM/SIGINT as a clean shutdown, so it is
    killed (SIGKILL) to make the failure visible to whoever restarts the server."""
    _flush_logs()
    supervisor = _supervisor_pid()
    if supervisor is not None:
        os.kill(supervisor, signal.SIGKILL)
    os._exit(status)


def _exit_process(exc: BaseException) -> None:
    """Default ``on_fatal``: leave with a failure status (see the module docstring)."""
    log.critical("exiting with a failure status so that a supervisor can restart the server")
    _terminate(1)


def _supervisor_pid() -> int | None:
    """The pid of hypercorn's supervisor if this process is one of its spawned workers."""
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid == os.getppid():
        return parent.pid
    return None


async def _watch_sigterm(st: WebState) -> None:
    """Under ``hypercorn -k trio`` the app runs in a spawned worker whose SIGTERM is left at the
    default (die at once). A signal sent to the whole process group (systemd's default, timeout(1),
    a container runtime's process-group kill) would then kill the worker mid-turn with the
    database open. So when nobody else handles SIGTERM here, catch it: in a hypercorn worker, pass
    it on to the supervisor, whose shutdown event then stops this worker gracefully; in a lone
    worker, close the runtime and then exit (``exit_after_stop``)."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            supervisor = _supervisor_pid()
            if supervisor is None:
                st.exit_after_stop = True
                st.stop_requested.set()
                return
            log.info("SIGTERM: asking hypercorn (pid %d) for a graceful shutdown", supervisor)
            os.kill(supervisor, signal.SIGTERM)


def _should_watch_sigterm(st: WebState) -> bool:
    return (
        st.handle_sigterm
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )


@dataclass(eq=False)
class WebState:
    """Everything the routes need, on ``app.agentik``."""

    config: Config | None
    llm: LiteLlm | None
    tools: ToolRegistry | None
    #: seconds of silence before an SSE heartbeat comment / a WebSocket ping frame
    heartbeat: float
    on_fatal: Callable[[BaseException], None]
    #: catch SIGTERM in a hypercorn worker (see _watch_sigterm)
    handle_sigterm: bool = True
    agent: LocalAgent | None = None
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

    def require_agent(self) -> LocalAgent:
        """The running agent. Raises RuntimeClosedError (503) before start-up or after shutdown."""
        if self.agent is None:
            raise RuntimeClosedError("the runtime is not running")
        return self.agent

    @property
    def cfg(self) -> Config:
        if self.config is None:
            raise RuntimeClosedError("the runtime is not running")
        return self.config

    # The core keeps these behind private attributes; they are reached in this one place.
    @property
    def hub(self) -> EventHub:
        return self.require_agent().hub

    @property
    def runtime_tools(self) -> Any:
        return self.require_agent().tools

    @property
    def supports_images(self) -> bool:
        return self.require_agent().supports_image_input

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


class AgentikApp(QuartTrio):
    agentik: WebState

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if not trio.lowlevel.in_trio_run():
            await _refuse_without_trio(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


async def _refuse_without_trio(
    scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
) -> None:
    """Served by an asyncio worker by mistake: fail start-up at once, saying what to do."""
    print(f"ERROR: {NOT_TRIO_MESSAGE}", file=sys.stderr, flush=True)
    if _supervisor_pid() is not None:
        _terminate(1)  # a worker of hypercorn's supervisor: see _terminate
    if scope["type"] == "lifespan":
        await receive()
        await send({"type": "lifespan.startup.failed", "message": NOT_TRIO_MESSAGE})
    elif scope["type"] == "http":
        body = encode(error_body("not_trio", NOT_TRIO_MESSAGE))
        await send({
            "type": "http.response.start", "status": 500,
            "headers": [(b"content-type", JSON.encode())],
        })
        await send({"type": "http.response.body", "body": body, "more_body": False})
    else:
        await send({"type": "websocket.close", "code": 1011, "reason": "agentik needs -k trio"})


def state() -> WebState:
    return cast(AgentikApp, current_app).agentik


def json_response(
    obj: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(encode(obj), status=status, headers=headers, content_type=JSON)


def error_response(exc: AgentikError) -> Response:
    return json_response(ErrorBody(error=detail_of(exc)), status_of(exc), headers_of(exc))


def create_app(
    config: Config | None = None,
    llm: LiteLlm | None = None,
    tools: ToolRegistry | None = None,
    *,
    heartbeat: float = 15.0,
    on_fatal: Callable[[BaseException], None] | None = None,
    handle_sigterm: bool = True,
) -> AgentikApp:
    """Build the app. ``config=None`` reads the environment at start-up (not at import), so a bad
    variable stops start-up with a message naming it. ``llm``/``tools`` are passed to
    ``open_runtime``. ``on_fatal(exc)`` is called if the runtime dies while serving (default: exit
    the process with status 1)."""
    from agentik.web.http import bp as http_bp
    from agentik.web.sse import bp as sse_bp
    from agentik.web.ws import bp as ws_bp

    app = AgentikApp("agentik.web", static_folder=None)
    app.agentik = WebState(
        config=config, llm=llm, tools=tools, heartbeat=heartbeat,
        on_fatal=on_fatal or _exit_process, handle_sigterm=handle_sigterm,
    )
    # Unhandled errors become our JSON 500 (never re-raised into hypercorn), even in debug.
    app.config["PROPAGATE_EXCEPTIONS"] = False
    app.config["BACKGROUND_TASK_SHUTDOWN_TIMEOUT"] = 30
    if config is not None:
        app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.register_blueprint(http_bp)
    app.register_blueprint(sse_bp)
    app.register_blueprint(ws_bp)

    @app.before_serving
    async def _startup() -> None:
        await _start_runtime(app)

    @app.after_serving
    async def _shutdown() -> None:
        await _stop_runtime(app)

    @app.before_request
    async def _before() -> Response | None:
        g.agentik_started = time.perf_counter()
        if request.path == "/healthz":
            return None
        st = app.agentik
        if st.config is None:
            return None  # not started: the route answers 503
        try:
            auth.check(
                st.config.tokens, request.headers.get("Authorization"),
                request.args.get("access_token"),
                allow_query=request.endpoint in auth.QUERY_TOKEN_ENDPOINTS,
            )
        except AgentikError as exc:
            return error_response(exc)
        return None

    @app.after_request
    async def _after(response: Response) -> Response:
        if _unread_body():
            # Answered without reading the body (413, 401, 404, a GET with a body, ...): the rest
            # of it may still be on the connection, which then cannot carry another request.
            response.headers["Connection"] = "close"
        started = getattr(g, "agentik_started", None)
        log_request(
            request.method, request.path, request.query_string, response.status_code,
            request.headers.get("X-Client-Id"), started,
        )
        return response

    @app.errorhandler(AgentikError)
    async def _agentik_error(exc: AgentikError) -> Response:
        return error_response(exc)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        # Routing errors (unknown path 404, wrong method 405) and Quart's own (413, 408, 400).
        code = {
            400: "invalid_input", 404: "not_found", 405: "method_not_allowed", 408: "timeout",
            413: "too_large",
        }.get(exc.code or 500, "http_error")
        status = exc.code or 500
        headers = {}
        if status == 405 and getattr(exc, "valid_methods", None):
            headers["Allow"] = ", ".join(exc.valid_methods or [])  # type: ignore[attr-defined]
        return json_response(error_body(code, exc.description or exc.name), status, headers)

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.path, exc_info=exc)
        return json_response(error_body("internal", "internal server error"), 500)

    return app


def _unread_body() -> bool:
    has_body = bool(request.content_length) or "chunked" in request.headers.get(
        "Transfer-Encoding", ""
    ).lower()
    return has_body and not getattr(g, "agentik_body_read", False)


def log_request(
    method: str,
    path: str,
    query: bytes,
    status: int,
    client_id: str | None,
    started: float | None,
) -> None:
    """One access-log line per request. ``access_token`` values are masked; the Authorization
    header is never logged."""
    target = path
    if query:
        target += "?" + auth.mask_query(query.decode("latin-1"))
    elapsed = "" if started is None else f" {1000 * (time.perf_counter() - started):.1f}ms"
    client = (client_id or "-")[:64]
    access_log.info("%s %s %d client=%s%s", method, target, status, client, elapsed)


def _setup_logging() -> None:
    """Give agentik's loggers a stderr handler when nobody configured logging (plain
    ``hypercorn`` configures only its own loggers, so INFO lines would be lost)."""
    root = logging.getLogger()
    ours = logging.getLogger("agentik")
    if root.handlers or ours.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s"))
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)


def describe(exc: BaseException) -> str:
    """A one-line message for ``exc``; exception groups are flattened to their leaves."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = [describe(e) for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        return "; ".join(leaves) or "cancelled"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _start_runtime(app: AgentikApp) -> None:
    """before_serving. Raises RuntimeError with a one-line message if the runtime cannot start
    (hypercorn reports it and exits non-zero)."""
    _setup_logging()
    st = app.agentik
    try:
        if st.config is None:
            st.config = Config.from_env()
        app.config["MAX_CONTENT_LENGTH"] = st.config.max_body_bytes
        await app.nursery.start(_hold_runtime, app, st.config)
    except Exception as exc:
        message = f"agentik cannot start: {describe(exc)}"
        log.critical(message)
        if _supervisor_pid() is not None:
            _terminate(1)  # a worker of hypercorn's supervisor: see _terminate
        raise RuntimeError(message) from None
    log.info("agentik runtime started (database %s, epoch %s)", st.config.db_path, st.hub.epoch)


async def _hold_runtime(
    app: AgentikApp, config: Config, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Enter the runtime and hold it until ``after_serving`` sets ``stop_requested``. Raises only
    before ``started`` (start-up errors); a later death goes to ``on_fatal``.

    The runtime is never stopped by cancelling a scope around ``open_runtime``: that would cancel
    its storage actor together with the running turns, and the turns could not store their
    terminal records. Leaving the ``async with`` body lets open_runtime stop the actors first."""
    st = app.agentik
    try:
        async with open_runtime(config, llm=st.llm, tools=st.tools) as agent:
            st.agent = agent
            st.runtime_started = True
            task_status.started()
            async with trio.open_nursery() as nursery:
                if _should_watch_sigterm(st):
                    nursery.start_soon(_watch_sigterm, st)
                await st.stop_requested.wait()
                st.agent = None  # new requests get 503 while the runtime closes
                nursery.cancel_scope.cancel()
    except Exception as exc:
        st.agent = None
        if not st.runtime_started:
            raise
        if st.stopping:
            log.error("the runtime failed while shutting down: %s", describe(exc), exc_info=exc)
            return
        st.died = exc
        log.critical("the agentik runtime died: %s", describe(exc), exc_info=exc)
        st.on_fatal(exc)
        return
    finally:
        st.agent = None
        st.runtime_done.set()
    if st.exit_after_stop:
        # A lone worker that got SIGTERM: the runtime is closed cleanly; nobody can tell
        # hypercorn to stop, so leave the way SIGTERM would have, minus the damage.
        log.info("SIGTERM: runtime closed, exiting")
        _flush_logs()
        os._exit(0)
    if not st.stop_requested.is_set():
        # open_runtime returned without being asked to: as fatal as a crash.
        st.died = RuntimeError("the runtime stopped by itself")
        log.critical("the agentik runtime stopped unexpectedly")
        st.on_fatal(st.died)


async def _stop_runtime(app: AgentikApp) -> None:
    """after_serving: ask the runtime holder to leave, and wait until the runtime has closed."""
    st = app.agentik
    st.stopping = True
    st.stop_requested.set()
    if not st.runtime_started:
        return
    await st.runtime_done.wait()
    log.info("agentik runtime stopped")
