"""The Quart-Trio application: ``create_app()`` assembles it from its parts.

- :mod:`agentik.web._state`: the shared state (``WebState``, ``state()``) and response helpers;
- :mod:`agentik.web.http`, :mod:`~agentik.web.sse`, :mod:`~agentik.web.ws`: the routes;
- :mod:`agentik.web.lifespan`: the runtime held open while serving;
- :mod:`agentik.web.process`: the worker process (exit status, SIGTERM, the trio check).

Here: the app class, the request hooks (auth, access log) and the error handlers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import trio
from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from agentik import tracing
from agentik.a2a import serve as a2a_web
from agentik.config import Config
from agentik.errors import AgentikError, RuntimeClosedError
from agentik.openai_api import mount as openai_mount
from agentik.openai_api import web as openai_web
from agentik.sse import serve_body
from agentik.users import SHARED_ADMIN
from agentik.web import auth, cors, lifespan, logsafe, process
from agentik.web._state import (
    WebState,
    error_response,
    json_response,
    log,
    log_request,
    state,
)
from agentik.web.branches import bp as branches_bp
from agentik.web.errors import error_body
from agentik.web.http import bp as http_bp
from agentik.web.keepalive import shield_response_end
from agentik.web.pauses import bp as pauses_bp
from agentik.web.sse import HANDOFF, Handoff
from agentik.web.sse import bp as sse_bp
from agentik.web.ui import bp as ui_bp
from agentik.web.users import a2a_caller
from agentik.web.users import bp as usage_bp
from agentik.web.webhooks import bp as webhooks_bp
from agentik.web.ws import bp as ws_bp

if TYPE_CHECKING:
    from hypercorn.typing import (
        ASGIReceiveCallable,
        ASGISendCallable,
        HTTPScope,
        Scope,
        WebsocketScope,
    )

    from agentik.llm.base import LiteLlm
    from agentik.tools.base import ToolRegistry

__all__ = ["AgentikApp", "WebState", "create_app"]

#: the codes of the errors Quart and werkzeug raise themselves (routing, body limits, timeouts)
HTTP_ERROR_CODES = {
    400: "invalid_input", 404: "not_found", 405: "method_not_allowed", 408: "timeout",
    413: "too_large",
}


class AgentikApp(QuartTrio):
    agentik: WebState

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if not trio.lowlevel.in_trio_run():
            await process.refuse_without_trio(scope, receive, send)
            return
        if scope["type"] not in ("http", "websocket"):
            await super().__call__(scope, receive, send)
            return
        if tracing.enabled():
            with _server_span(cast("HTTPScope | WebsocketScope", scope)):
                await self._serve(scope, receive, send)
        else:
            await self._serve(scope, receive, send)

    async def _serve(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        shielded = shield_response_end(send)  # see agentik.web.keepalive
        # An SSE route hands its body off (agentik.web.sse): Quart answers, then the stream runs
        # here, in this task, with Quart's tasks and request objects gone.
        handoff = Handoff()
        cast("dict[str, object]", scope)[HANDOFF] = handoff
        await super().__call__(scope, handoff.wrap_receive(receive), handoff.wrap_send(shielded))
        if handoff.body is not None and not handoff.disconnected:
            # hypercorn's own send: serve_body shields the response's end itself (one wrapper
            # less per streamed chunk)
            await serve_body(handoff.body, receive, send)

    def log_exception(self, exception_info: Any) -> None:
        """Quart logs a failed ``before_serving`` with its traceback; a start-up failure of ours
        was already reported in one line (``lifespan.start_runtime``)."""
        if isinstance(exception_info[1], lifespan.StartupFailed):
            return
        super().log_exception(exception_info)


def _server_span(scope: HTTPScope | WebsocketScope) -> AbstractContextManager[tracing.Span]:
    """The request's server span (a WebSocket's for its whole connection), a child of the
    caller's ``traceparent``; named by method and route once routed (``_after_request``)."""
    headers = {name.decode("latin-1").lower(): value.decode("latin-1")
               for name, value in scope["headers"]}
    if scope["type"] == "http":
        name = method = scope["method"]
    else:  # a WebSocket's one route has no parameters: its path is its name
        method, name = "GET", f"GET {scope['path']}"
    return tracing.span(name, kind="server", parent=tracing.extract(headers), attributes={
        "http.request.method": method, "url.path": scope["path"],
        "url.scheme": scope["scheme"], "network.protocol.name": scope["type"]})


def create_app(
    config: Config | None = None,
    llm: LiteLlm | None = None,
    tools: ToolRegistry | None = None,
    *,
    heartbeat: float = 15.0,
    on_fatal: Callable[[BaseException], None] | None = None,
    report_startup: bool = True,
    handle_sigterm: bool = True,
    tune_gc: bool = False,
) -> AgentikApp:
    """Build the app. ``config=None`` reads the environment at start-up (not at import), so a bad
    variable stops start-up with a message naming it. ``llm``/``tools`` are passed to
    ``open_runtime``. ``on_fatal(exc)`` is called if the runtime dies while serving (default: exit
    the process with status 1). ``tune_gc``: the process is the server's own (``agentik serve``,
    ``agentik.web:app``), so its garbage collector is tuned once the runtime started
    (``Config.gc_threshold``); an embedding program's is left alone."""
    app = AgentikApp("agentik.web", static_folder=None)
    st = app.agentik = WebState(
        config=config, llm=llm, tools=tools, heartbeat=heartbeat,
        on_fatal=on_fatal or process.exit_process, handle_sigterm=handle_sigterm,
        report_startup=report_startup, tune_gc=tune_gc,
    )
    # Unhandled errors become our JSON 500 (never re-raised into hypercorn), even in debug.
    app.config["PROPAGATE_EXCEPTIONS"] = False
    app.config["BACKGROUND_TASK_SHUTDOWN_TIMEOUT"] = 30
    if config is not None:
        app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.register_blueprint(http_bp)
    app.register_blueprint(pauses_bp)
    app.register_blueprint(branches_bp)
    app.register_blueprint(sse_bp)
    app.register_blueprint(ws_bp)
    app.register_blueprint(usage_bp)
    app.register_blueprint(webhooks_bp)
    # A2A requests are their principal's (docs/USERS.md)
    a2a_web.mount_agentik(app, st, heartbeat=heartbeat).caller = partial(a2a_caller, st)
    openai_mount.mount_agentik(app, st, heartbeat=heartbeat)
    app.register_blueprint(ui_bp)

    @app.before_serving
    async def _startup() -> None:
        await lifespan.start_runtime(app, st)

    @app.after_serving
    async def _shutdown() -> None:
        await lifespan.stop_runtime(st)

    app.before_request(_before_request)
    app.after_request(_after_request)
    app.register_error_handler(AgentikError, _agentik_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
    return app


async def _before_request() -> Response | None:
    """The request's principal (``g.agentik_principal``) for every route but ``/healthz`` and
    ``auth.PUBLIC_ENDPOINTS``; admins only on ``auth.ADMIN_ENDPOINTS``."""
    g.agentik_started = time.perf_counter()
    st = state()
    agent = st.agent
    if agent is not None and agent.wants_node_address:  # a cluster node without AGENTIK_NODE_URL
        agent.learn_node_address(base_url(request.scope))
    preflight = _cors_preflight()
    if preflight is not None:
        return preflight
    if request.path == "/healthz" or request.endpoint in auth.PUBLIC_ENDPOINTS:
        return None
    if st.authenticator is None:  # not started (or failed to)
        if st.config is None or st.config.auth_enabled:  # no route but the public ones
            return error_response(RuntimeClosedError("the runtime is not running"))
        g.agentik_principal = SHARED_ADMIN  # auth off: as the started app would say
        return None
    try:
        who = await st.authenticator.caller(
            request.headers.get("Authorization"), request.args.get("access_token"),
            allow_query=request.endpoint in auth.QUERY_TOKEN_ENDPOINTS,
        )
        if request.endpoint in auth.ADMIN_ENDPOINTS:
            auth.require_admin(who, request.path)
    except AgentikError as exc:
        return error_response(exc)
    g.agentik_principal = who
    return None


def base_url(scope: Mapping[str, Any]) -> str | None:
    """The base URL a request reached this server at: its scheme and the local address of its
    connection (ASGI ``server``), never the Host header (behind a load balancer that names the
    balancer, not this node). None when the connection has no such address (a UNIX socket)."""
    server = scope.get("server")
    if not server or server[1] is None:
        return None
    host, port = str(server[0]), int(server[1])
    if ":" in host:  # IPv6
        host = f"[{host}]"
    scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
    return f"{scheme}://{host}:{port}"


def _cors_origins() -> tuple[str, ...]:
    config = state().config
    return () if config is None else config.cors_origins


def _cors_preflight() -> Response | None:
    """A CORS preflight is answered here, before auth (agentik.web.cors)."""
    origins = _cors_origins()
    origin = request.headers.get("Origin")
    if not origins or not cors.is_preflight(
        request.method, origin, request.headers.get("Access-Control-Request-Method")
    ):
        return None
    return Response(b"", status=204, headers=cors.preflight_headers(origins, origin) or {})


async def _after_request(response: Response) -> Response:
    origins = _cors_origins()
    if origins and request.method != "OPTIONS":
        for name, value in (cors.response_headers(origins, request.headers.get("Origin"))
                            or {}).items():
            if name == "Vary":
                response.vary.add(value)  # added to a Vary the route set, never replacing it
            else:
                response.headers[name] = value
    if _unread_body():
        # Answered without reading the body (413, 401, 404, a GET with a body, ...): the rest
        # of it may still be on the connection, which then cannot carry another request.
        response.headers["Connection"] = "close"
    if request.path.startswith("/v1/"):
        response = await openai_web.openai_shaped(response)
    if tracing.enabled():
        span = tracing.current()
        rule = request.url_rule.rule if request.url_rule is not None else None
        span.rename(f"{request.method} {rule}" if rule else request.method)
        span.set("http.route", rule)
        span.set("http.response.status_code", response.status_code)
        if response.status_code >= 500:
            span.fail(str(response.status_code))
    started = getattr(g, "agentik_started", None)
    log_request(
        request.method, request.path, request.query_string, response.status_code,
        request.headers.get("X-Client-Id"), started, state().secrets,
    )
    return response


async def _agentik_error(exc: AgentikError) -> Response:
    return error_response(exc)


async def _http_error(exc: HTTPException) -> Response:
    """Routing errors (unknown path 404, wrong method 405) and Quart's own (413, 408, 400)."""
    status = exc.code or 500
    code = HTTP_ERROR_CODES.get(status, "http_error")
    headers = {}
    if status == 405 and getattr(exc, "valid_methods", None):
        headers["Allow"] = ", ".join(exc.valid_methods or [])  # type: ignore[attr-defined]
    return json_response(error_body(code, exc.description or exc.name), status, headers)


async def _unexpected(exc: Exception) -> Response:
    log.exception(
        "unexpected error on %s %s", request.method,
        logsafe.safe_text(request.path, state().secrets), exc_info=exc,
    )
    return json_response(error_body("internal", "internal server error"), 500)


def _unread_body() -> bool:
    has_body = bool(request.content_length) or "chunked" in request.headers.get(
        "Transfer-Encoding", ""
    ).lower()
    return has_body and not getattr(g, "agentik_body_read", False)

