"""The /v1 routes (docs/OPENAI.md): Models and Chat Completions over agentik's conversations.

Every answer of these routes is OpenAI's shape, errors included: ``{"error": {"message",
"type", "param", "code"}}`` with the status of agentik's error map (400, 401, 404, 409, 413,
429, 502, 503), also for what the app answers before a route runs (a 401 from the auth hook, a
413 from the body limit) and for an unknown /v1 path.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec
from quart import Blueprint, Response, current_app, request
from werkzeug.exceptions import HTTPException

from agentik.a2a.pauses import yes_or_no
from agentik.errors import (
    AgentikError,
    ConflictError,
    InvalidInputError,
    ModelNotFoundError,
    NotFoundError,
    UnsupportedParameterError,
    http_status,
)
from agentik.openai_api import chat
from agentik.openai_api.follow import Cancelled, Failed
from agentik.openai_api.service import OpenAiMount, TurnRun
from agentik.openai_api.stream import call_id_in, chat_stream, completion, ending_error, ending_of
from agentik.openai_api.types import (
    ChatRequest,
    ErrorAnswer,
    ErrorObject,
    Model,
    ModelList,
    decode_chat_request,
    encode,
)
from agentik.profiles import ASK_USER
from agentik.turns import open_pauses, turn_records
from agentik.web._state import principal, scope, state
from agentik.web.errors import headers_of
from agentik.web.http import read_body
from agentik.wire import (
    ApprovalRequest,
    ClientTool,
    Content,
    ConversationRecord,
    InputRequest,
    MessageContext,
    MessageOrigin,
    Pause,
)

bp = Blueprint("agentik_openai", __name__)

JSON = "application/json"
#: the request header naming the conversation to continue, and the answer's header naming the
#: conversation a stored exchange went to
CONVERSATION_HEADER = "X-Agentik-Conversation-Id"
#: Open WebUI's chat id (sent when it forwards user info headers): a conversation of its own
OPEN_WEBUI_CHAT = "X-OpenWebUI-Chat-Id"
#: ``metadata`` member naming the conversation to continue (for clients that cannot set headers)
METADATA_KEY = "agentik_conversation_id"


def mount_state() -> OpenAiMount:
    return cast(OpenAiMount, cast(Any, current_app).agentik_openai)


# --- errors --------------------------------------------------------------------------------------


def error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def openai_error(status: int, message: str, code: str | None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> Response:
    body = ErrorAnswer(error=ErrorObject(message=message, type=error_type(status), param=param,
                                         code=code))
    return Response(encode(body), status=status, headers=headers, content_type=JSON)


async def agentik_error(exc: AgentikError) -> Response:
    param = exc.param if isinstance(exc, UnsupportedParameterError) else None
    return openai_error(http_status(exc), str(exc), exc.code, param, headers_of(exc))


async def http_error(exc: HTTPException) -> Response:
    status = exc.code or 500
    return openai_error(status, exc.description or exc.name, None)


def openai_errors(blueprint: Blueprint) -> None:
    """Every error of ``blueprint``'s routes answered in OpenAI's shape."""
    blueprint.register_error_handler(AgentikError, agentik_error)
    blueprint.register_error_handler(HTTPException, http_error)


openai_errors(bp)


async def openai_shaped(response: Response) -> Response:
    """An agentik-shaped error of a /v1 path answered outside these routes (the auth hook's 401,
    an unknown path's 404, Quart's 405 and 413) in OpenAI's shape: ``{"error": {"code",
    "message"}}`` -> ``{"error": {"message", "type", "param", "code"}}``. The app calls this
    for every answer under /v1/."""
    if response.status_code < 400 or response.mimetype != JSON:
        return response
    try:
        detail = msgspec.json.decode(await response.get_data())["error"]
        if "type" in detail:
            return response  # already OpenAI's
        message, code = str(detail["message"]), str(detail["code"])
    except (msgspec.DecodeError, KeyError, TypeError):
        return response
    response.set_data(encode(ErrorAnswer(error=ErrorObject(
        message=message, type=error_type(response.status_code), code=code))))
    return response


# --- models --------------------------------------------------------------------------------------


def model_ids() -> list[str]:
    """Each agent of the server is a model (its id the agent's id; docs/AGENTS.md)."""
    return [entry.id for entry in state().require_agent().agents().agents]


def check_model(name: str) -> str:
    known = model_ids()
    if name not in known:
        raise ModelNotFoundError(f"the model {name!r} does not exist: the models are this "
                                 f"server's agents ({', '.join(known)})")
    return name


@bp.get("/v1/models")
async def list_models() -> Response:
    created = mount_state().created
    body = ModelList(data=[Model(id=i, created=created) for i in model_ids()])
    return Response(encode(body), content_type=JSON)


@bp.get("/v1/models/<model_id>")
async def get_model(model_id: str) -> Response:
    check_model(model_id)
    return Response(encode(Model(id=model_id, created=mount_state().created)),
                    content_type=JSON)


# --- chat completions ----------------------------------------------------------------------------


async def _chat_request() -> ChatRequest:
    raw = await read_body(state().cfg.max_body_bytes)
    if not raw.strip():
        raise InvalidInputError("a JSON body is required")
    try:
        return decode_chat_request(raw)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(f"invalid request: {exc}") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidInputError(f"the body is not valid JSON: {exc}") from None


def _given_conversation(req: ChatRequest) -> str | None:
    header = request.headers.get(CONVERSATION_HEADER)
    if header:
        return header
    return (req.metadata or {}).get(METADATA_KEY) or None


def _tools_of(req: ChatRequest) -> list[ClientTool] | None:
    """The request's client-side tools (``tools``), checked before anything is stored."""
    own = {t.name for t in state().require_agent().agent_tools(req.model)} | {ASK_USER}
    return chat.client_tools(req, own)


def _with(context: MessageContext, tools: list[ClientTool] | None) -> MessageContext:
    return context if tools is None else msgspec.structs.replace(context, tools=tools)


async def _answer_calls(req: ChatRequest, answers: list[chat.ToolAnswer]
                        ) -> tuple[TurnRun, str | None]:
    """A request ending with ``tool`` results: they answer the client-side calls its turn waits
    on (all of them), and the turn is followed on from there; the conversation is the one the
    request names, or the one the calls' ids name (their ids as :func:`stream.call_id_out`
    gave them)."""
    agent = state().require_agent()
    given = _given_conversation(req)
    named = {call_id_in(a.tool_call_id)[1] for a in answers} - {None}
    cid = given or (named.pop() if len(named) == 1 else None)
    if cid is None:
        raise InvalidInputError("the tool results name no conversation: send the tool_call_id "
                                f"values as given, or the {CONVERSATION_HEADER} header")
    results = {call_id_in(a.tool_call_id)[0]: a.text for a in answers}
    snapshot = await agent.chat_snapshot(cid, user=scope())
    if agent.agent_of(snapshot.conversation.agent) != req.model:
        raise ConflictError(f"conversation {cid!r} belongs to another model (agent)")
    asked = {r.message.call_id: r.message for r in snapshot.messages
             if isinstance(r.message, InputRequest) and r.message.tool is not None}
    seqs = {r.id: r.seq for r in snapshot.messages}
    unknown = [c for c in results if c not in asked]
    if unknown:
        raise NotFoundError(f"no client-side tool call {unknown[0]!r} in conversation {cid!r}")
    turn_id = asked[next(iter(results))].turn_id
    waiting = {p.call_id for p in open_pauses(snapshot.messages, turn_id)
               if isinstance(p, InputRequest) and p.tool is not None}
    if not waiting & results.keys():
        raise ConflictError("these tool calls have their results already")
    if waiting - results.keys():
        raise InvalidInputError("the results of every call the turn waits on are needed: "
                                f"missing {sorted(waiting - results.keys())}")
    cursor = await agent.outbox.current_cursor()
    for call_id in sorted(waiting, key=list(results).index):
        await agent.answer(cid, call_id, results[call_id], user=scope())
    assert turn_id is not None
    temporal = snapshot.conversation.is_temporal
    run = await mount_state().require().follow(
        cid, turn_id, cursor, seqs.get(turn_id, 1), delete_after=temporal, ask=not temporal)
    run.ids_for = None if given else cid
    return run, None if snapshot.conversation.is_temporal else cid


async def _waiting(cid: str) -> tuple[str, int, Pause] | None:
    """The conversation's turn, when it waits for a person: (its id, its user message's seq,
    the first pause still open). Raises ConflictError when it waits for client-side results."""
    agent = state().require_agent()
    turn = await agent.journal.waiting(cid, user=scope())
    if turn is None:
        return None
    records = await turn_records(agent, cid, turn[1])
    waiting = open_pauses(records, turn[0])
    if any(isinstance(p, InputRequest) and p.tool is not None for p in waiting):
        raise ConflictError("the conversation's turn waits for the results of client-side "
                            "tool calls: send them as tool messages")
    return (*turn, waiting[0]) if waiting else None


async def _record(conversation_id: str, user: str | None) -> ConversationRecord:
    conv = await state().require_agent().get_conversation(conversation_id, user=user)
    if conv is None:
        raise NotFoundError(f"conversation {conversation_id!r} not found")
    return conv.record


async def _answer_person(cid: str, new: list[Content], turn_id: str, seq: int, pause: Pause
                         ) -> TurnRun:
    """A new message while the conversation's turn waits for a person is the answer: to a
    question, its text; to an approval, yes approves, no refuses (with the reason after it),
    any other text refuses with it as the reason. The turn is followed on from there."""
    agent = state().require_agent()
    text = chat.entry_of("user", new).text
    cursor = await agent.outbox.current_cursor()
    try:
        if isinstance(pause, ApprovalRequest):
            approve, reason = yes_or_no(text) or (False, text)
            await agent.approve(cid, pause.call_id, approve, reason, user=scope())
        else:
            await agent.answer(cid, pause.call_id, text, user=scope())
    except ConflictError:
        pass  # another client answered first: the turn goes on all the same
    return await mount_state().require().follow(cid, turn_id, cursor, seq, delete_after=False,
                                                ask=True)


async def _start(req: ChatRequest, history: list[chat.Entry], new: list[Content]
                 ) -> tuple[TurnRun, str | None]:
    """The request's turn started in the conversation it continues or seeds; and the id to
    answer in the conversation header (None for a temporary one)."""
    agent = state().require_agent()
    service = mount_state().require()
    tools = _tools_of(req)
    given = _given_conversation(req)
    chat_id = request.headers.get(OPEN_WEBUI_CHAT)
    origin = "chat.completions"
    whole = given is None and bool(chat_id)  # Open WebUI sends the whole exchange each time
    who = principal()  # a completion is a send; a conversation it makes is the caller's
    await agent.users.before_send(who.user, who.limits)
    if given is None:
        await agent.users.before_create(who.user, who.limits)
    if given is None and chat_id:
        conv = await agent.create_conversation(title=f"Open WebUI chat {chat_id[:100]}",
                                               idempotency_key=f"openwebui-chat:{chat_id[:200]}",
                                               agent=req.model, owner=who.user)
        given = conv.id
    if given is not None:
        # Only the new message: the conversation's record is enough (no history to check).
        user = scope()  # another user's conversation answers as an unknown one
        snapshot = None if not history and not whole else await agent.chat_snapshot(
            given, user=user)
        record = snapshot.conversation if snapshot is not None else await _record(given, user)
        owner = agent.agent_of(record.agent)
        if owner != req.model:
            raise ConflictError(f"conversation {given!r} belongs to the model (agent) {owner!r}, "
                                f"not {req.model!r}")
        if (waiting := await _waiting(given)) is not None:  # the message answers what it asks
            return await _answer_person(given, new, *waiting), given
        branch: tuple[str, str] | None = None
        if snapshot is None or not snapshot.messages:  # none, or a fresh one: seeded
            content, context = chat.seed_content(history, new, origin)
        else:
            if not chat.history_matches(history, chat.transcript(snapshot.messages),
                                        whole=whole):
                # an edited or regenerated exchange: a branch (docs/PROTOCOL.md "Branches")
                branch = chat.branch_of(history, new, snapshot.messages)
                if branch is None:
                    raise ConflictError(
                        f"the messages before the last one differ from conversation {given!r}'s "
                        "history, and not as an edit or a regenerate of one of its turns: send "
                        "only the new message, or the history as it is stored (up to a turn), "
                        "or no conversation id to start anew")
            content = new
            context = MessageContext(origin=MessageOrigin(kind="user"),
                                     metadata={"openai_api": origin})
        run = await service.start_turn(given, content, _with(context, tools),
                                       delete_after=False, branch=branch, ask=True)
        return run, given
    keep = bool(req.store)
    conv = await agent.create_conversation(temp=not keep, title="OpenAI chat completion",
                                           agent=req.model, owner=who.user)
    content, context = chat.seed_content(history, new, origin)
    run = await service.start_turn(conv.id, content, _with(context, tools),
                                   delete_after=not keep, ask=keep)
    run.ids_for = conv.id  # the caller named none: the calls' ids name it
    return run, conv.id if keep else None


@bp.post("/v1/chat/completions")
async def chat_completions() -> Response:
    req = await _chat_request()
    check_model(req.model)
    chat.check_supported(req)
    history, new, answers = chat.split_messages(req)
    if answers:
        run, conversation_id = await _answer_calls(req, answers)
    else:
        run, conversation_id = await _start(req, history, new)
    headers = {} if conversation_id is None else {CONVERSATION_HEADER: conversation_id}
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        return chat_stream(mount_state(), run, req.model, include_usage, headers)
    try:
        end = await ending_of(run)
    finally:
        run.scope.cancel()
    if isinstance(end, Failed | Cancelled):
        status, error = ending_error(end)
        return Response(encode(ErrorAnswer(error=error)), status=status, content_type=JSON,
                        headers=headers)
    return Response(encode(completion(run, req.model, end)), content_type=JSON, headers=headers)
