"""The /v1/responses routes (docs/OPENAI.md): create, retrieve (and resume its stream), cancel,
delete, input items. A response is one conversation turn (:mod:`agentik.openai_api.responses`);
its stream is written from a :class:`~agentik.openai_api.service.LiveResponse`: the one this
node fills while it follows the turn, or one filled from storage once the turn's record is
stored (another node, a restart).
"""

from __future__ import annotations

import time

import msgspec
import trio
from quart import Blueprint, Response, request

from agentik.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    UnsupportedParameterError,
)
from agentik.openai_api import chat
from agentik.openai_api import responses as r
from agentik.openai_api.chat import Entry
from agentik.openai_api.responses_types import (
    Deleted,
    InputItem,
    ItemList,
    ResponsesRequest,
    StreamEvent,
    decode_responses_request,
    encode,
)
from agentik.openai_api.service import LiveResponse, OpenAiMount
from agentik.openai_api.types import ContentPart, ImageUrl
from agentik.openai_api.web import JSON, check_model, mount_state, openai_errors
from agentik.sse import SSE_TYPE, PumpBody, frame
from agentik.web._state import principal, scope, state
from agentik.web.http import read_body
from agentik.wire import Content, MessageContext

bp = Blueprint("agentik_openai_responses", __name__)
openai_errors(bp)


def _json(obj: object, status: int = 200) -> Response:
    return Response(encode(obj), status=status, content_type=JSON)


async def _request() -> ResponsesRequest:
    raw = await read_body(state().cfg.max_body_bytes)
    try:
        return decode_responses_request(raw)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(f"invalid request: {exc}") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidInputError(f"the body is not valid JSON: {exc}") from None


def check_request(req: ResponsesRequest) -> None:
    if req.tools:
        raise UnsupportedParameterError("tools", "client-side tools are not supported in "
                                                 "responses yet (they are in chat.completions): "
                                                 "the agent runs its own tools server-side")
    if req.n is not None and req.n != 1:
        raise UnsupportedParameterError("n", "n must be 1")
    fmt = (req.text or {}).get("format") or {}
    if isinstance(fmt, dict) and fmt.get("type", "text") != "text":
        raise UnsupportedParameterError("text", "only the text format is supported")
    if req.background and not req.store:
        raise InvalidInputError("background responses must be stored (store: true)")
    if req.conversation is not None and req.previous_response_id is not None:
        raise InvalidInputError("give conversation or previous_response_id, not both")


def _as_chat_message(i: int, item: InputItem) -> chat.ChatMessage:
    if item.type != "message":
        raise UnsupportedParameterError(
            "input", f"input[{i}]: items of type {item.type!r} are not supported (client-side "
                     "tools are not supported yet; only messages)")
    content: str | list[ContentPart] | None
    if isinstance(item.content, list):
        content = []
        for part in item.content:
            if part.type in ("input_text", "output_text", "text"):
                content.append(ContentPart(type="text", text=part.text or ""))
            elif part.type == "input_image" and part.image_url is not None:
                url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
                content.append(ContentPart(type="image_url", image_url=ImageUrl(url=url)))
            else:
                content.append(ContentPart(type=part.type))
    else:
        content = item.content
    return chat.ChatMessage(role=item.role, content=content)


def input_of(req: ResponsesRequest) -> tuple[list[Entry], list[Content]]:
    """The earlier input items (and the instructions, first) and the new message."""
    items = [InputItem(content=req.input)] if isinstance(req.input, str) else req.input
    messages = [_as_chat_message(i, item) for i, item in enumerate(items)]
    history, new, results = chat.split_messages(chat.ChatRequest(model=req.model,
                                                                  messages=messages))
    if results:
        raise UnsupportedParameterError("input", "tool results are not supported here yet "
                                                 "(client-side tools: /v1/chat/completions)")
    if req.instructions:
        history = [Entry(role="system", text=req.instructions), *history]
    return history, new


async def _conversation_of(req: ResponsesRequest) -> tuple[str, bool]:
    """The conversation the response goes to (the caller's: another user's is unknown), and
    whether it is a new one. A response is a send of the caller (docs/USERS.md)."""
    agent, who, user = state().require_agent(), principal(), scope()
    await agent.users.before_send(who.user, who.limits)
    cid = None
    if req.conversation is not None:
        cid = req.conversation if isinstance(req.conversation, str) else req.conversation.id
    elif req.previous_response_id is not None:
        cid, _ = r.parse_response_id(req.previous_response_id)
        r.find(req.previous_response_id, (await agent.chat_snapshot(cid, user=user)).messages)
    if cid is not None:
        conv = await agent.get_conversation(cid, user=user)
        if conv is None:
            raise NotFoundError(f"conversation {cid!r} not found")
        owner = agent.agent_of(conv.record.agent)
        if owner != req.model:
            raise ConflictError(f"conversation {cid!r} belongs to the model (agent) {owner!r}, "
                                f"not {req.model!r}")
        return cid, False
    await agent.users.before_create(who.user, who.limits)
    conv = await agent.create_conversation(temp=not req.store, title="OpenAI response",
                                           agent=req.model, owner=who.user)
    return conv.id, True


@bp.post("/v1/responses")
async def create_response() -> Response:
    req = await _request()
    check_model(req.model)
    check_request(req)
    history, new = input_of(req)
    cid, is_new = await _conversation_of(req)
    params = r.Params(model=req.model, instructions=req.instructions, metadata=req.metadata,
                      background=req.background, store=req.store,
                      previous_response_id=req.previous_response_id)
    content, context = chat.seed_content(history, new, "responses")
    context = MessageContext(origin=context.origin,
                             metadata={**context.metadata, r.PARAMS_KEY: params.encode()})
    service = mount_state().require()
    run = await service.start_turn(cid, content, context, delete_after=is_new and not req.store)
    rid = r.response_id(cid, run.turn_id)
    live = service.track(rid, run)
    found = r.Found(rid=rid, conversation_id=cid, turn_id=run.turn_id, created_at=time.time(),
                    params=params, input=[*history, chat.entry_of("user", new)],
                    outcome=r.Outcome("in_progress"))
    if req.stream:
        return _stream(mount_state(), found, live, -1)
    if req.background:
        return _json(r.response_object(found, r.Outcome("in_progress")))
    return _json(r.response_object(found, await live.ended()))


async def _found(rid: str) -> r.Found:
    cid, _ = r.parse_response_id(rid)
    agent = state().require_agent()
    if await agent.get_conversation(cid, user=scope()) is None:  # another user's: unknown
        raise NotFoundError(f"response {rid[:200]!r} not found")
    return r.find(rid, (await agent.chat_snapshot(cid)).messages)


def _source(found: r.Found) -> LiveResponse:
    service = mount_state().require()
    live = service.live.get(found.rid)
    return live if live is not None else service.watch(found.conversation_id, found.turn_id)


@bp.get("/v1/responses/<rid>")
async def get_response(rid: str) -> Response:
    found = await _found(rid)
    if request.args.get("stream", "").lower() == "true":
        after = r.check_starting_after(request.args.get("starting_after"))
        return _stream(mount_state(), found, _source(found), after)
    return _json(r.response_object(found))


@bp.post("/v1/responses/<rid>/cancel")
async def cancel_response(rid: str) -> Response:
    found = await _found(rid)
    if not found.params.background:
        raise InvalidInputError("only background responses can be cancelled")
    if found.outcome.status == "in_progress":
        await state().require_agent().cancel_turn(found.conversation_id, found.turn_id)
        with trio.fail_after(30):
            return _json(r.response_object(found, await _source(found).ended()))
    return _json(r.response_object(found))


@bp.delete("/v1/responses/<rid>")
async def delete_response(rid: str) -> Response:
    """A response is deleted with its conversation, when it is that conversation's only turn
    (the journal is append-only: a turn inside a longer conversation stays)."""
    found = await _found(rid)
    agent = state().require_agent()
    messages = (await agent.chat_snapshot(found.conversation_id)).messages
    turns = sum(isinstance(m.message, chat.UserMessage) for m in messages)
    if turns > 1:
        raise ConflictError(
            f"response {rid!r} is one turn of a conversation of {turns}: the journal keeps "
            "every turn; delete the conversation (DELETE /v1/conversations/{id}) instead")
    await agent.delete_conversation(found.conversation_id)
    return _json(Deleted(id=rid, object="response.deleted"))


@bp.get("/v1/responses/<rid>/input_items")
async def input_items(rid: str) -> Response:
    items = r.input_items(await _found(rid))
    if request.args.get("order", "desc") != "asc":
        items.reverse()
    return _json(ItemList(data=items, first_id=items[0].id if items else None,
                          last_id=items[-1].id if items else None, has_more=False))


# --- the stream ----------------------------------------------------------------------------------


def _stream(mount: OpenAiMount, found: r.Found, live: LiveResponse, after: int) -> Response:
    response = Response(_EventBody(mount, found, live, after), status=200, content_type=SSE_TYPE,
                        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    response.timeout = None
    return response


def _frame(event: StreamEvent) -> bytes:
    return frame(encode(event), event=event.type.encode())


class _EventBody(PumpBody):
    """A response's events after ``after``: the head, one delta for each change of its text
    (numbered by the text's length, so a resumed reader gets what it lacks as one delta), then
    the tail once it ended."""

    def __init__(self, mount: OpenAiMount, found: r.Found, live: LiveResponse, after: int) -> None:
        super().__init__(self._pump, mount.heartbeat, opened=b"")
        self._mount, self._found, self._live, self._after = mount, found, live, after

    async def _pump(self, send: trio.MemorySendChannel[bytes],
                    *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        found, live, after = self._found, self._live, self._after
        async with send:
            for event in r.head_events(found, after):
                await send.send(_frame(event))
            emitted = r.sent_chars(after)
            while True:
                text, outcome, changed = live.text, live.outcome, live.changed
                if outcome is not None:
                    text = outcome.text
                if len(text) > emitted:
                    await send.send(_frame(r.delta_event(found.turn_id, text, emitted,
                                                         len(text))))
                    emitted = len(text)
                if outcome is not None:
                    for event in r.tail_events(found, outcome, max(after, r.HEAD + emitted)):
                        await send.send(_frame(event))
                    return
                if live.gone:
                    return  # the server is stopping: the reader resumes it later
                await changed.wait()

    def opened(self) -> None:
        self._mount.stream_count(+1)

    def closed(self) -> None:
        self._mount.stream_count(-1)
