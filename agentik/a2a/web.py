"""The A2A routes: the agent card and the JSON-RPC 2.0 endpoint (with SSE for the streaming
methods), as one Quart blueprint that any app mounts with :func:`mount` (agentik's own app, and
the TCK's system under test in ``tests/a2a_sut.py``).

- ``GET /.well-known/agent-card.json``: public; ``Cache-Control``, ``ETag`` (``If-None-Match``
  gives 304) and ``Last-Modified``. With ``agent_card_info`` (a server of several agents,
  docs/AGENTS.md), ``GET /a2a/{agent_id}/.well-known/agent-card.json`` is each agent's card, whose
  JSON-RPC URL is ``POST /a2a/{agent_id}``; the unprefixed ones are the default agent's.
- ``POST /a2a`` and ``POST /a2a/`` (the same handler, no redirect: a redirect loses the body):
  JSON-RPC. Checked in this order: Content-Type (-32005), JSON (-32700), envelope (-32600),
  ``A2A-Version`` (-32009; empty or missing means 0.3), method (-32601), params (-32602).
  Errors are JSON-RPC error objects with HTTP 200; A2A's own carry ErrorInfo.
- Streaming methods answer ``text/event-stream``: one ``data:`` line per event holding
  ``{jsonrpc, id, result: StreamResponse}``; the stream ends at the task's final word. An error
  found before the stream opens is a plain JSON-RPC answer.
"""

from __future__ import annotations

import email.utils
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
import trio
from quart import Blueprint, Quart, Response, current_app, g, request
from werkzeug.exceptions import HTTPException

from agentik.a2a import errors as e
from agentik.a2a.executor import CALLER, Caller
from agentik.a2a.forward import forward
from agentik.a2a.service import A2AService
from agentik.a2a.types import (
    MAX_ID_CHARS,
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    GetTaskParams,
    HTTPAuthSecurityScheme,
    ListPushConfigsParams,
    ListTasksParams,
    PushConfigParams,
    SecurityRequirement,
    SecurityScheme,
    SendMessageParams,
    StringList,
    TaskIdParams,
    TaskPushNotificationConfig,
    camel_keys,
    encode,
    valid_rpc_id,
)
from agentik.cluster import Peers
from agentik.errors import A2AError, AgentikError, NotFoundError, NotOwnerError
from agentik.llm.base import ToolSpec
from agentik.sse import SSE_TYPE, PumpBody, frame

log = logging.getLogger("agentik.a2a")

bp = Blueprint("agentik_a2a", __name__)

CARD_PATH = "/.well-known/agent-card.json"
RPC_PATH = "/a2a"
PROTOCOL_VERSION = "1.0"
CARD_MAX_AGE = 300
JSON = "application/json"

PUSH_METHODS = frozenset({
    "CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs", "DeleteTaskPushNotificationConfig",
})


@dataclass(frozen=True)
class CardInfo:
    """What the card says about the agent (the rest is fixed by the facade)."""

    name: str
    description: str
    version: str
    skills: list[AgentSkill]
    bearer_auth: bool = False
    provider: AgentProvider | None = None
    #: the push-notification config methods are served (docs/WEBHOOKS.md)
    push: bool = False


@dataclass(eq=False)
class A2AMount:
    """The facade's state in an app: the running service (None while not serving) and where
    the card's information comes from."""

    card_info: Callable[[], CardInfo]
    service: A2AService | None = None
    #: one agent's card (raises NotFoundError for an unknown id); None: one agent only
    agent_card_info: Callable[[str], CardInfo] | None = None
    heartbeat: float = 15.0
    started: str = field(default_factory=lambda: email.utils.formatdate(usegmt=True))
    #: open SSE streams (tests wait on it to see a disconnect released everything)
    open_streams: int = 0
    #: who the current request is (docs/USERS.md); the default reaches everything
    caller: Callable[[], Caller] = Caller
    #: a cluster node's clients of the others (a request for a conversation another node
    #: owns goes there: forward.py); None: one process, nothing is forwarded
    peers: Callable[[], Peers] | None = None

    def require(self) -> A2AService:
        if self.service is None:
            raise e.error(e.INTERNAL_ERROR, "the A2A service is not running")
        return self.service


def mount(
    app: Quart, card_info: Callable[[], CardInfo], *, heartbeat: float = 15.0,
    agent_card_info: Callable[[str], CardInfo] | None = None,
) -> A2AMount:
    """Register the A2A routes on ``app``; the caller sets ``.service`` while it serves."""
    state = A2AMount(card_info=card_info, heartbeat=heartbeat, agent_card_info=agent_card_info)
    cast(Any, app).agentik_a2a = state
    app.register_blueprint(bp)
    return state


def _state() -> A2AMount:
    return cast(A2AMount, cast(Any, current_app).agentik_a2a)


def build_card(info: CardInfo, rpc_url: str) -> AgentCard:
    schemes = None
    requirements: list[SecurityRequirement] = []
    if info.bearer_auth:
        schemes = {"bearer": SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="Bearer", description="a token of AGENTIK_TOKENS"))}
        requirements = [SecurityRequirement(schemes={"bearer": StringList()})]
    return AgentCard(
        name=info.name, description=info.description, version=info.version,
        provider=info.provider,
        supported_interfaces=[AgentInterface(url=rpc_url, protocol_binding="JSONRPC",
                                             protocol_version=PROTOCOL_VERSION)],
        capabilities=AgentCapabilities(streaming=True, push_notifications=info.push,
                                       extended_agent_card=False),
        security_schemes=schemes, security_requirements=requirements,
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        skills=info.skills,
    )


@bp.get(CARD_PATH)
async def agent_card() -> Response:
    return _card(_state().card_info(), RPC_PATH)


@bp.get(RPC_PATH + "/<agent_id>" + CARD_PATH)
async def one_agent_card(agent_id: str) -> Response:
    return _card(_agent_card_info(agent_id), f"{RPC_PATH}/{agent_id}")


def _agent_card_info(agent_id: str) -> CardInfo:
    """Raises NotFoundError (404) for an agent this server does not have."""
    st = _state()
    if st.agent_card_info is None:
        raise NotFoundError(f"agent {agent_id!r} not found")
    return st.agent_card_info(agent_id)


def _card(info: CardInfo, rpc_path: str) -> Response:
    st = _state()
    body = encode(build_card(info, request.host_url.rstrip("/") + rpc_path))
    tag = hashlib.sha256(body).hexdigest()[:32]
    headers = {
        "Cache-Control": f"public, max-age={CARD_MAX_AGE}",
        "ETag": f'"{tag}"',
        "Last-Modified": st.started,
    }
    if request.if_none_match.contains(tag):
        return Response(b"", status=304, headers=headers)
    return Response(body, status=200, headers=headers, content_type=JSON)


# --- JSON-RPC ------------------------------------------------------------------------------------


def _result(request_id: Any, result: Any) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + encode(request_id) + b',"result":' + encode(result) + b"}"


def _raw_result(request_id: Any, raw: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + encode(request_id) + b',"result":' + raw + b"}"


def _error(request_id: Any, exc: A2AError) -> Response:
    return Response(encode(e.error_response(request_id, exc)), status=200, content_type=JSON)


def _params(raw: Any, into: type[Any]) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise e.invalid_params("params must be an object")
    try:
        return msgspec.convert(camel_keys(raw), into)
    except msgspec.ValidationError as exc:
        raise e.invalid_params(f"invalid params: {exc}") from None


def _check_version() -> None:
    version = (request.headers.get("A2A-Version") or "").strip() or "0.3"
    major = version.partition(".")[0]
    if major != "1":
        raise e.error(e.VERSION_NOT_SUPPORTED,
                      f"A2A version {version!r} is not supported (this agent speaks 1.0)")


async def rpc(agent_id: str | None = None) -> Response:
    """One JSON-RPC request, to the default agent or to ``agent_id``'s endpoint (an unknown one
    is a 404, before the body is read)."""
    if agent_id is not None:
        _agent_card_info(agent_id)
    g.agentik_body_read = True
    request_id: Any = None
    try:
        if request.mimetype != JSON:
            raise e.error(e.CONTENT_TYPE_NOT_SUPPORTED,
                          f"Content-Type must be {JSON}, got {request.mimetype or 'none'!r}")
        body = cast(bytes, await request.get_data(as_text=False))
        try:
            envelope = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
            raise e.error(e.PARSE_ERROR, f"invalid JSON: {exc}") from None
        if not isinstance(envelope, dict):
            raise e.error(e.INVALID_REQUEST, "the request must be one JSON-RPC object "
                                             "(batches are not supported)")
        request_id = envelope.get("id")
        if not valid_rpc_id(request_id):
            request_id = None  # never echoed: it may be a bool, a float, 1 MB or 400 digits
            raise e.error(e.INVALID_REQUEST, f"id must be null, a string of at most {MAX_ID_CHARS} "
                                             "characters or an integer of at most 64 bits")
        if envelope.get("jsonrpc") != "2.0":
            raise e.error(e.INVALID_REQUEST, 'jsonrpc must be "2.0"')
        method = envelope.get("method")
        if not isinstance(method, str) or not method:
            raise e.error(e.INVALID_REQUEST, "method must be a non-empty string")
        _check_version()
        token = CALLER.set(_state().caller())
        try:
            return await _dispatch(request_id, method, envelope.get("params"), agent_id)
        except NotOwnerError as exc:  # raised before anything was counted or stored here
            st = _state()
            return await forward(st.peers, exc, request_id, body, st.heartbeat)
        finally:
            CALLER.reset(token)
    except A2AError as exc:
        return _error(request_id, exc)
    except AgentikError as exc:
        return _error(request_id, e.error(e.INTERNAL_ERROR, str(exc)))
    except HTTPException:
        raise  # the app answers these (413 body too large, ...)
    except Exception:
        log.exception("A2A request failed")
        return _error(request_id, e.error(e.INTERNAL_ERROR, "internal error"))


bp.add_url_rule(RPC_PATH, "rpc", rpc, methods=["POST"])
bp.add_url_rule(RPC_PATH + "/", "rpc_slash", rpc, methods=["POST"])
bp.add_url_rule(RPC_PATH + "/<agent_id>", "rpc_agent", rpc, methods=["POST"])
bp.add_url_rule(RPC_PATH + "/<agent_id>/", "rpc_agent_slash", rpc, methods=["POST"])


async def _dispatch(request_id: Any, method: str, raw: Any, agent: str | None) -> Response:
    st = _state()
    if method == "SendMessage":
        result: Any = await st.require().send(_params(raw, SendMessageParams), agent=agent)
    elif method == "SendStreamingMessage":
        params = _params(raw, SendMessageParams)
        return _sse(st, request_id, await st.require().open_stream(params, agent=agent))
    elif method == "SubscribeToTask":
        params = _params(raw, TaskIdParams)
        return _sse(st, request_id, await st.require().subscribe(params.id))
    elif method == "GetTask":
        get = _params(raw, GetTaskParams)
        result = await st.require().get_task(get.id, get.history_length)
    elif method == "ListTasks":
        result = await st.require().list_tasks(_params(raw, ListTasksParams))
    elif method == "CancelTask":
        result = await st.require().cancel(_params(raw, TaskIdParams).id)
    elif method in PUSH_METHODS:
        result = await _push(st.require(), method, raw)
    elif method == "GetExtendedAgentCard":
        raise e.error(e.EXTENDED_CARD_NOT_CONFIGURED, "this agent has no extended agent card")
    else:
        raise e.error(e.METHOD_NOT_FOUND, f"method {method!r} not found")
    return Response(_result(request_id, result), status=200, content_type=JSON)


async def _push(service: A2AService, method: str, raw: Any) -> Any:
    pushes = service.pushes
    if pushes is None:
        raise e.error(e.PUSH_NOT_SUPPORTED, "push notifications are not supported")
    if method == "CreateTaskPushNotificationConfig":
        return await pushes.create(_params(raw, TaskPushNotificationConfig))
    if method == "ListTaskPushNotificationConfigs":
        return await pushes.list(_params(raw, ListPushConfigsParams))
    if method == "GetTaskPushNotificationConfig":
        return await pushes.get(_params(raw, PushConfigParams))
    return await pushes.delete(_params(raw, PushConfigParams))


# --- SSE -----------------------------------------------------------------------------------------


def _sse(st: A2AMount, request_id: Any, events: AsyncIterator[bytes]) -> Response:
    response = Response(_SseBody(st, request_id, events), status=200, content_type=SSE_TYPE,
                        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut the stream
    return response


class _SseBody(PumpBody):
    """A streaming body fed by a pump task in a nursery of its own (:class:`agentik.sse.PumpBody`):
    the pump reads the task's events (so a heartbeat never interrupts a read), the body writes
    what is queued. A client disconnect cancels the body's task, which closes the nursery and
    with it the pump and its storage subscription."""

    def __init__(self, st: A2AMount, request_id: Any, events: AsyncIterator[bytes]) -> None:
        super().__init__(self._pump_events, st.heartbeat, opened=b"")
        self._st = st
        self._id = request_id
        self._events = events

    async def _pump_events(
        self, send: trio.MemorySendChannel[bytes],
        *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        task_status.started()
        async with send:
            try:
                async for raw in self._events:
                    await send.send(frame(_raw_result(self._id, raw)))
            except AgentikError as exc:
                err = exc if isinstance(exc, A2AError) else e.error(e.INTERNAL_ERROR, str(exc))
                await send.send(frame(encode(e.error_response(self._id, err))))
            finally:
                aclose = getattr(self._events, "aclose", None)
                if aclose is not None:
                    with trio.CancelScope(shield=True):
                        await aclose()

    def opened(self) -> None:
        self._st.open_streams += 1

    def closed(self) -> None:
        self._st.open_streams -= 1


def skills_of(specs: Sequence[ToolSpec]) -> list[AgentSkill]:
    """One skill for the agent itself, plus one per tool the model can call."""
    skills = [AgentSkill(id="chat", name="Conversation",
                         description="Answers messages in a conversation (one per contextId)",
                         tags=["chat"])]
    for spec in specs:
        skills.append(AgentSkill(id=f"tool:{spec.name}", name=spec.name,
                                 description=spec.description or spec.name, tags=["tool"]))
    return skills
