"""The /v1/conversations routes (docs/OPENAI.md) over agentik's conversations, with the same
ids: one conversation is the same object here, in /v1/responses (``conversation``) and in
/agentik. Its ``metadata`` holds one key, ``title`` (the conversation's title); its items are
its journal's user messages and answers."""

from __future__ import annotations

import msgspec
from quart import Blueprint, Response, request

from agentik.errors import InvalidInputError, NotFoundError, UnsupportedParameterError
from agentik.openai_api.responses_types import (
    ContentOut,
    ConversationObject,
    Deleted,
    ItemList,
    MessageItem,
    decode_conversation_create,
    decode_conversation_update,
    encode,
)
from agentik.openai_api.web import JSON, openai_errors
from agentik.web._state import principal, scope, state
from agentik.web.http import read_body
from agentik.wire import AssistantMessage, ConversationRecord, MessageRecord, Text, UserMessage

bp = Blueprint("agentik_openai_conversations", __name__)
openai_errors(bp)


def _json(obj: object) -> Response:
    return Response(encode(obj), content_type=JSON)


def _object(record: ConversationRecord) -> ConversationObject:
    return ConversationObject(id=record.id, created_at=int(record.created_at),
                              metadata={} if record.title is None else {"title": record.title})


def _title(metadata: dict[str, str] | None) -> str | None:
    metadata = metadata or {}
    others = sorted(set(metadata) - {"title"})
    if others:
        raise UnsupportedParameterError("metadata", f"a conversation's metadata holds only "
                                                    f"`title`, not {others}")
    return metadata.get("title")


async def _body() -> bytes:
    return await read_body(state().cfg.max_body_bytes)


async def _record(cid: str) -> ConversationRecord:
    conv = await state().require_agent().get_conversation(cid, user=scope())
    if conv is None:
        raise NotFoundError(f"conversation {cid!r} not found")
    return conv.record


@bp.post("/v1/conversations")
async def create() -> Response:
    raw = await _body()
    try:
        body = decode_conversation_create(raw) if raw.strip() else None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InvalidInputError(f"invalid request: {exc}") from None
    if body is not None and body.items:
        raise UnsupportedParameterError("items", "a conversation starts empty: send its first "
                                                 "message with POST /v1/responses")
    title = _title(None if body is None else body.metadata)
    agent, who = state().require_agent(), principal()
    await agent.users.before_create(who.user, who.limits)
    conv = await agent.create_conversation(title=title, owner=who.user)
    return _json(_object(conv.record))


@bp.get("/v1/conversations/<cid>")
async def retrieve(cid: str) -> Response:
    return _json(_object(await _record(cid)))


@bp.post("/v1/conversations/<cid>")
async def update(cid: str) -> Response:
    raw = await _body()
    try:
        body = decode_conversation_update(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InvalidInputError(f"invalid request: {exc}") from None
    record = await state().require_agent().rename_conversation(cid, _title(body.metadata),
                                                               user=scope())
    return _json(_object(record))


@bp.delete("/v1/conversations/<cid>")
async def delete(cid: str) -> Response:
    if not await state().require_agent().delete_conversation(cid, user=scope()):
        raise NotFoundError(f"conversation {cid!r} not found")
    return _json(Deleted(id=cid, object="conversation.deleted"))


def item_of(record: MessageRecord) -> MessageItem | None:
    message = record.message
    if isinstance(message, UserMessage):
        content = [ContentOut(type="input_text", text=c.body) if isinstance(c, Text)
                   else ContentOut(type="input_image") for c in message.content]
        return MessageItem(id=f"msg_{record.id}", role="user", status="completed",
                           content=content)
    if isinstance(message, AssistantMessage):
        text = "".join(c.body for c in message.content if isinstance(c, Text))
        return MessageItem(id=f"msg_{record.id}", role="assistant",
                           status="incomplete" if message.interrupted else "completed",
                           content=[ContentOut(type="output_text", text=text, annotations=[])])
    return None


@bp.get("/v1/conversations/<cid>/items")
async def items(cid: str) -> Response:
    """``limit`` (1..100, 20), ``order`` (``desc`` by default, or ``asc``), ``after`` (an item
    id: the items after it in that order)."""
    limit_raw = request.args.get("limit", "20")
    if not limit_raw.isascii() or not limit_raw.isdigit() or not 1 <= int(limit_raw) <= 100:
        raise InvalidInputError("limit must be 1..100")
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidInputError("order must be asc or desc")
    snapshot = await state().require_agent().chat_snapshot(cid, user=scope())
    all_items = [i for i in map(item_of, snapshot.messages) if i is not None]
    if order == "desc":
        all_items.reverse()
    after = request.args.get("after")
    if after:
        ids = [i.id for i in all_items]
        if after not in ids:
            raise InvalidInputError(f"after: no item {after[:100]!r} in this conversation")
        all_items = all_items[ids.index(after) + 1:]
    page = all_items[:int(limit_raw)]
    return _json(ItemList(data=page, first_id=page[0].id if page else None,
                          last_id=page[-1].id if page else None,
                          has_more=len(all_items) > len(page)))
