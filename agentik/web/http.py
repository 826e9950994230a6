"""REST routes of docs/PROTOCOL.md §3: each maps one request onto one call of the in-process Agent API.

Who raises what (all mapped to JSON errors in ``agentik.web.errors``): InvalidInputError (400: bad
JSON, a body or query parameter that fails validation), NotFoundError (404), PayloadTooLargeError
(413), MailboxFullError (429), ConversationFailedError (409), RuntimeClosedError/StorageError
(503).
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any, TypeVar

import msgspec
from quart import Blueprint, Response, g, request
from werkzeug.exceptions import RequestEntityTooLarge

import agentik
from agentik import metrics
from agentik.api import decode_client_json
from agentik.errors import (
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
    UnauthorizedError,
)
from agentik.web._state import json_response, principal, scope, state
from agentik.web.openapi import openapi_document
from agentik.web.types import (
    AgentInfo,
    Capabilities,
    CountResult,
    CreateConversationBody,
    CursorPair,
    Health,
    InterruptBody,
    InterruptResult,
    MessageAccepted,
    Readiness,
    RenameConversationBody,
    SendMessageBody,
    StorageReadiness,
    ToolServerProblem,
    ToolsStatus,
)
from agentik.wire import parse_offset

bp = Blueprint("agentik_http", __name__)

T = TypeVar("T")



# --- input helpers -------------------------------------------------------------------------------


def int_param(name: str, default: int) -> int:
    value = opt_int_param(name)
    return default if value is None else value


def opt_int_param(name: str) -> int | None:
    """A non-negative integer query parameter. Raises InvalidInputError."""
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    value = parse_offset(raw)  # the rule of cursor offsets (agentik.wire)
    if value is None:
        shown = raw if len(raw) <= 80 else raw[:80] + "..."
        raise InvalidInputError(
            f"query parameter `{name}` must be a non-negative integer of at most 19 ASCII "
            f"digits, got {shown!r}"
        )
    return value


def idempotency_key() -> str | None:
    """The request's ``Idempotency-Key`` header (docs/PROTOCOL.md §2), None without one."""
    return request.headers.get("Idempotency-Key")


async def read_body(limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes: by Content-Length before reading,
    and while reading (chunked bodies have no length). Raises PayloadTooLargeError."""
    length = request.content_length
    if length is not None and length > limit:
        raise PayloadTooLargeError(f"request body of {length} bytes is over the limit of {limit}")
    chunks: list[bytes] = []
    total = 0
    try:
        async for chunk in request.body:
            total += len(chunk)
            if total > limit:
                raise PayloadTooLargeError(f"request body is over the limit of {limit} bytes")
            chunks.append(chunk)
    except RequestEntityTooLarge:
        # Quart's own cap (MAX_CONTENT_LENGTH, set to the same limit) noticed first.
        raise PayloadTooLargeError(f"request body is over the limit of {limit} bytes") from None
    g.agentik_body_read = True
    return b"".join(chunks)


async def json_body(into: type[T], *, empty: T | None = None) -> T:
    """Decode and validate the JSON body. ``empty``: what an empty body means (None: an error).
    Raises InvalidInputError (msgspec's message names the offending path) or
    PayloadTooLargeError."""
    raw = await read_body(state().cfg.max_body_bytes)
    if not raw.strip():
        if empty is not None:
            return empty
        raise InvalidInputError("a JSON body is required")
    # api.decode_input's decode without its frame (one a send fewer: docs/ARCHITECTURE.md)
    return decode_client_json(partial(msgspec.json.decode, type=into), raw)


# --- agent ---------------------------------------------------------------------------------------


@bp.get("/healthz")
async def healthz() -> Response:
    st = state()
    if st.agent is None:
        return json_response(Health(status="starting" if st.died is None else "dead"), 503)
    return json_response(Health(status="ok"))


@bp.get("/agentik")
async def info() -> Response:
    agent = state().require_agent()
    default = agent.get_agent()  # the capabilities of a conversation created without an agent
    return json_response(
        AgentInfo(
            id=agent.id,
            name="agentik",
            version=agentik.__version__,
            capabilities=Capabilities(image_input=default.image_input, tools=default.tools),
            current=str(await agent.outbox.current_cursor()),
            oldest=str(await agent.outbox.oldest_cursor()),
        )
    )


@bp.get("/agentik/cursor")
async def cursor() -> Response:
    outbox = state().require_agent().outbox
    return json_response(
        CursorPair(
            current=str(await outbox.current_cursor()), oldest=str(await outbox.oldest_cursor())
        )
    )


@bp.get("/readyz")
async def readyz() -> Response:
    """Readiness: 503 ``not_ready`` while the runtime is not running, storage refuses writes
    (the writer's last commit or probe failed) or, in a PostgreSQL cluster, the node cannot
    heartbeat its leases (so it cannot run conversations); else 200, ``degraded`` when MCP
    servers failed, the model's server does not answer, or a cluster node has no address for
    forwarded commands (the reason names AGENTIK_NODE_URL). None makes the node unready, on
    purpose: every node has the same servers and the same model, conversations still run (without
    those tools) or fail their turns with an error, and taking every node out of a load balancer
    would not bring the server back; ``tools``, ``model_reachable`` and ``reasons`` say which
    and why.
    Public like /healthz; with auth on, the error texts (paths, hosts, a server's stderr) are
    given only to a request with an admin's token."""
    st = state()
    agent = st.agent
    if agent is None or st.stopping:
        if st.died is not None:
            runtime, why = "dead", f"the runtime died: {type(st.died).__name__}: {st.died}"
        elif st.stopping:
            runtime, why = "stopping", "the runtime is shutting down"
        else:
            runtime, why = "starting", "the runtime is starting"
        return json_response(Readiness(status="not_ready", runtime=runtime, reasons=[why]), 503)
    detail = await _may_see_details()
    health = agent.storage_health
    error = health.error if detail else None
    reasons: list[str] = []
    if not health.writable:
        reasons.append("storage refuses writes" + (f": {error}" if error else ""))
    lease_error = agent.lease_error
    if lease_error is not None:
        reasons.append("leases: cannot heartbeat" + (f": {lease_error}" if detail else ""))
    ready = health.writable and lease_error is None
    problems = [
        ToolServerProblem(name=str(s.get("name")), state=str(s.get("state")),
                          error=s.get("error") if detail else None)
        for s in await _tool_servers(agent.tools)
        if isinstance(s, dict) and s.get("state") in ("failed", "retrying") and s.get("error")
    ]
    reasons += [f"MCP server {p.name!r} failed" + (f": {p.error}" if p.error else "")
                for p in problems]
    model_error = agent.model_error
    if model_error is not None:
        reasons.append("the model does not answer" + (f": {model_error}" if detail else ""))
    address = agent.node_address_problem  # other nodes' sends to its conversations get 503
    if address is not None:
        reasons.append(address)
    degraded = bool(problems) or model_error is not None or address is not None
    status = "not_ready" if not ready else "degraded" if degraded else "ready"
    body = Readiness(
        status=status, runtime="running", reasons=reasons, tools=problems,
        model_reachable=model_error is None,
        storage=StorageReadiness(writable=health.writable, error=error, since=health.since),
    )
    return json_response(body, 200 if ready else 503)


async def _may_see_details() -> bool:
    """Auth off, or the request carries an admin's bearer token."""
    authenticator = state().authenticator
    if authenticator is None:
        return False
    try:
        who = await authenticator.principal(
            request.headers.get("Authorization"), None, allow_query=False)
    except UnauthorizedError:
        return False
    return who.is_admin


async def _tool_servers(registry: Any) -> list[Any]:
    """The registry's ``status()`` (JSON-ready server states; sync or async; a list or
    ``{"servers": [...]}``), or no servers for a registry without one."""
    status_fn = getattr(registry, "status", None)
    if status_fn is None:
        return []
    result: Any = status_fn()
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, dict):
        return list(result.get("servers") or [])
    return list(result)


@bp.get("/agentik/tools")
async def tools() -> Response:
    """``{"servers": [...]}``: the registry's server states (see ``_tool_servers``)."""
    servers = await _tool_servers(state().require_agent().tools)
    return json_response(ToolsStatus(servers=servers))


@bp.get("/metrics")
async def prometheus_metrics() -> Response:
    """Prometheus text exposition (agentik.metrics); same auth as the API."""
    body, content_type = metrics.exposition()
    return Response(body, content_type=content_type)


@bp.get("/agentik/openapi.json")
async def openapi() -> Response:
    return Response(openapi_document(), content_type="application/json")


# --- conversations -------------------------------------------------------------------------------


@bp.get("/agentik/conversations")
async def list_conversations() -> Response:
    agent = state().require_agent()
    snapshot = await agent.conversations_snapshot(
        offset=int_param("offset", 0), limit=int_param("limit", 100), user=scope()
    )
    return json_response(snapshot)


@bp.post("/agentik/conversations")
async def create_conversation() -> Response:
    agent = state().require_agent()
    body = await json_body(CreateConversationBody, empty=CreateConversationBody())
    who = principal()
    await agent.users.before_create(who.user, who.limits)
    conv = await agent.create_conversation(
        temp=body.temp, title=body.title, idempotency_key=idempotency_key(),
        agent=body.agent, instructions=body.instructions, owner=who.user)
    return json_response(conv.record, 201)


@bp.get("/agentik/agents")
async def list_agents() -> Response:
    return json_response(state().require_agent().agents())


@bp.get("/agentik/agents/<agent_id>")
async def get_agent(agent_id: str) -> Response:
    return json_response(state().require_agent().get_agent(agent_id))


async def _conversation(conversation_id: str) -> Any:
    conv = await state().require_agent().get_conversation(conversation_id, user=scope())
    if conv is None:
        raise NotFoundError(f"conversation {conversation_id!r} not found")
    return conv


@bp.get("/agentik/conversations/<conversation_id>")
async def get_conversation(conversation_id: str) -> Response:
    conv = await _conversation(conversation_id)
    return json_response(conv.record)


@bp.patch("/agentik/conversations/<conversation_id>")
async def rename_conversation(conversation_id: str) -> Response:
    agent = state().require_agent()
    body = await json_body(RenameConversationBody)
    record = await agent.rename_conversation(conversation_id, body.title, user=scope())
    return json_response(record)


@bp.delete("/agentik/conversations/<conversation_id>")
async def delete_conversation(conversation_id: str) -> Response:
    agent = state().require_agent()
    if not await agent.delete_conversation(conversation_id, user=scope()):
        raise NotFoundError(f"conversation {conversation_id!r} not found")
    return Response(b"", status=204)


@bp.post("/agentik/conversations/<conversation_id>/messages")
async def send_message(conversation_id: str) -> Response:
    agent = state().require_agent()
    body = await json_body(SendMessageBody)
    who = principal()
    await agent.users.before_send(who.user, who.limits)
    message_id = await agent.send(conversation_id, body.content, body.context,
                                  on_busy=body.on_busy, idempotency_key=idempotency_key(),
                                  user=scope())
    return json_response(MessageAccepted(message_id=message_id), 202)


@bp.post("/agentik/conversations/<conversation_id>/interrupt")
async def interrupt(conversation_id: str) -> Response:
    agent = state().require_agent()
    body = await json_body(InterruptBody, empty=InterruptBody())
    if body.turn_id is None:
        interrupted = await agent.interrupt(conversation_id, user=scope())
    else:
        interrupted = await agent.cancel_turn(conversation_id, body.turn_id, user=scope())
    return json_response(InterruptResult(interrupted=interrupted), 202)


@bp.get("/agentik/conversations/<conversation_id>/messages")
async def get_messages(conversation_id: str) -> Response:
    after_seq = int_param("after_seq", 0)
    offset = int_param("offset", 0)
    limit = int_param("limit", 100)
    conv = await _conversation(conversation_id)
    messages = await conv.get_messages(after_seq=after_seq, offset=offset, limit=limit)
    return json_response(messages)


@bp.get("/agentik/conversations/<conversation_id>/snapshot")
async def chat_snapshot(conversation_id: str) -> Response:
    agent = state().require_agent()
    return json_response(await agent.chat_snapshot(conversation_id, user=scope()))


# --- journal -------------------------------------------------------------------------------------


@bp.get("/agentik/journal")
async def journal() -> Response:
    agent = state().require_agent()
    records = await agent.journal.list(
        conversation_id=request.args.get("conversation_id") or None,
        after_seq=int_param("after_seq", 0),
        up_to_seq=opt_int_param("up_to_seq"),
        limit=int_param("limit", 100),
        user=scope(),
    )
    return json_response(records)


@bp.get("/agentik/journal/count")
async def journal_count() -> Response:
    agent = state().require_agent()
    count = await agent.journal.count(
        conversation_id=request.args.get("conversation_id") or None,
        after_seq=int_param("after_seq", 0),
        user=scope(),
    )
    return json_response(CountResult(count=count))
