"""Responses as pure projections of the journal (no I/O): a response is one conversation turn.

- Its id names both: ``resp_<conversation id>_<turn id>`` (the turn id is its user message's
  id), so any node finds it in storage with nothing stored beside the journal. The request's
  own settings (model, instructions, metadata, background, store, previous response) ride in
  the user message's context metadata (``openai_response``).
- Its state (:class:`Outcome`) is read off the turn's records: the answer (``completed``), an
  Error (``failed``, the text shown so far kept), an interrupted answer without an Error
  (``cancelled``), else still ``in_progress``.
- Its stream is a function of its text, so every node and every later time numbers it alike:
  ``response.created`` 0, ``response.in_progress`` 1, ``response.output_item.added`` 2,
  ``response.content_part.added`` 3; a text delta ending at character offset ``k`` of the
  answer is number ``3 + k``; after an answer of ``n`` characters, ``output_text.done``,
  ``content_part.done``, ``output_item.done`` and the ending (``response.completed``,
  ``.failed`` or ``.cancelled``) are ``n + 4`` .. ``n + 7``. Numbers are strictly increasing
  and unique; a reader resuming ``starting_after`` a delta's number knows how much text it has,
  so whatever text was not streamed to it comes as one delta holding the rest.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from agentik.errors import InvalidInputError, NotFoundError
from agentik.openai_api.chat import Entry, entry_of, seeded_of
from agentik.openai_api.responses_types import (
    ContentOut,
    ConversationId,
    MessageItem,
    ResponseError,
    ResponseObject,
    ResponseUsage,
    StreamEvent,
)
from agentik.wire import AssistantMessage, Error, MessageRecord, Text, TurnTokens, UserMessage

PARAMS_KEY = "openai_response"
HEAD = 3  # the number of the last event before the first delta


def response_id(conversation_id: str, turn_id: str) -> str:
    return f"resp_{conversation_id}_{turn_id}"


def parse_response_id(rid: str) -> tuple[str, str]:
    """(conversation id, turn id). Raises NotFoundError for an id agentik did not make."""
    body = rid.removeprefix("resp_")
    cid, sep, turn = body.rpartition("_")
    if not rid.startswith("resp_") or not sep or not cid or not turn:
        raise NotFoundError(f"response {rid[:200]!r} not found")
    return cid, turn


@dataclass(frozen=True)
class Params:
    """What a response's request said, kept with its user message."""

    model: str
    instructions: str | None = None
    metadata: dict[str, str] | None = None
    background: bool = False
    store: bool = True
    previous_response_id: str | None = None

    def encode(self) -> str:
        return json.dumps(self.__dict__, ensure_ascii=False)

    @classmethod
    def decode(cls, raw: str | None) -> Params:
        try:
            return cls(**json.loads(raw)) if raw else cls(model="default")
        except (ValueError, TypeError):
            return cls(model="default")


@dataclass(frozen=True)
class Outcome:
    """A response's state as its turn's records say."""

    status: str  # in_progress | completed | failed | cancelled
    text: str = ""
    tokens: TurnTokens | None = None
    error: str | None = None
    error_code: str | None = None


@dataclass(frozen=True)
class Found:
    """A response read from its conversation's journal."""

    rid: str
    conversation_id: str
    turn_id: str
    created_at: float
    params: Params
    input: list[Entry]
    outcome: Outcome


def find(rid: str, records: Sequence[MessageRecord]) -> Found:
    """The response ``rid`` in its conversation's records. Raises NotFoundError."""
    cid, turn_id = parse_response_id(rid)
    user = next((r for r in records if r.id == turn_id), None)
    if user is None or not isinstance(user.message, UserMessage):
        raise NotFoundError(f"response {rid[:200]!r} not found")
    metadata = user.message.context.metadata if user.message.context else {}
    if PARAMS_KEY not in metadata:
        raise NotFoundError(f"response {rid[:200]!r} not found")
    return Found(rid=rid, conversation_id=cid, turn_id=turn_id, created_at=user.created_at,
                 params=Params.decode(metadata.get(PARAMS_KEY)),
                 input=input_entries(user.message), outcome=outcome_of(turn_id, records))


def input_entries(message: UserMessage) -> list[Entry]:
    """The input items of a response: seeded ones (earlier items, instructions) and the new."""
    seeded = seeded_of(message)
    if seeded is None:
        return [entry_of("user", message.content)]
    return [*seeded[0], entry_of("user", seeded[1])]


def outcome_of(turn_id: str, records: Sequence[MessageRecord]) -> Outcome:
    partial: AssistantMessage | None = None
    for record in records:
        message = record.message
        if isinstance(message, AssistantMessage) and message.turn_id == turn_id:
            text = "".join(c.body for c in message.content if isinstance(c, Text))
            if not message.interrupted:
                return Outcome("completed", text, message.tokens)
            partial = message
        elif isinstance(message, Error) and message.turn_id == turn_id:
            text = "" if partial is None else "".join(
                c.body for c in partial.content if isinstance(c, Text))
            return Outcome("failed", text, None, message.message, message.code)
    if partial is not None:
        text = "".join(c.body for c in partial.content if isinstance(c, Text))
        return Outcome("cancelled", text, partial.tokens)
    return Outcome("in_progress")


# --- the objects ---------------------------------------------------------------------------------


def item_id(turn_id: str) -> str:
    return f"msg_{turn_id}"


def output_item(turn_id: str, text: str, status: str) -> MessageItem:
    item_status = {"in_progress": "in_progress", "completed": "completed"}.get(status,
                                                                               "incomplete")
    return MessageItem(id=item_id(turn_id), role="assistant", status=item_status,
                       content=[ContentOut(type="output_text", text=text, annotations=[])])


def response_object(found: Found, outcome: Outcome | None = None, *,
                    with_output: bool = True) -> ResponseObject:
    out = outcome or found.outcome
    params = found.params
    usage = None
    if out.tokens is not None:
        usage = ResponseUsage(input_tokens=out.tokens.prompt, output_tokens=out.tokens.completion,
                              total_tokens=out.tokens.prompt + out.tokens.completion)
    error = None
    if out.status == "failed":
        error = ResponseError(code="server_error", message=out.error or "the turn failed")
    return ResponseObject(
        id=found.rid, created_at=found.created_at, status=out.status,
        background=params.background, error=error, instructions=params.instructions,
        metadata=params.metadata or {}, model=params.model,
        output=[output_item(found.turn_id, out.text, out.status)] if with_output else [],
        previous_response_id=params.previous_response_id,
        conversation=ConversationId(id=found.conversation_id) if params.store else None,
        store=params.store, usage=usage,
    )


def input_items(found: Found) -> list[MessageItem]:
    items = []
    for i, entry in enumerate(found.input):
        content = [ContentOut(type="input_text", text=entry.text)] if entry.text else []
        content += [ContentOut(type="input_image")] * entry.images
        items.append(MessageItem(id=f"in_{found.turn_id}_{i}", role=entry.role,
                                 status="completed", content=content))
    return items


# --- the stream ----------------------------------------------------------------------------------


def head_events(found: Found, after: int) -> list[StreamEvent]:
    """Events 0..3 after ``after``."""
    running = Outcome("in_progress")
    start = response_object(found, running, with_output=False)
    iid = item_id(found.turn_id)
    events = [
        StreamEvent(type="response.created", sequence_number=0, response=start),
        StreamEvent(type="response.in_progress", sequence_number=1, response=start),
        StreamEvent(type="response.output_item.added", sequence_number=2, output_index=0,
                    item=MessageItem(id=iid, role="assistant", status="in_progress",
                                     content=[])),
        StreamEvent(type="response.content_part.added", sequence_number=3, item_id=iid,
                    output_index=0, content_index=0,
                    part=ContentOut(type="output_text", text="", annotations=[])),
    ]
    return [e for e in events if e.sequence_number > after]


def sent_chars(after: int) -> int:
    """How much text a reader resuming after event ``after`` has (if ``after`` is a delta)."""
    return max(0, after - HEAD)


def delta_event(turn_id: str, text: str, start: int, end: int) -> StreamEvent:
    """The delta carrying ``text[start:end]``."""
    return StreamEvent(type="response.output_text.delta", sequence_number=HEAD + end,
                       item_id=item_id(turn_id), output_index=0, content_index=0,
                       delta=text[start:end], logprobs=[])


def tail_events(found: Found, outcome: Outcome, after: int) -> list[StreamEvent]:
    """The events after the last delta, for an ended response, after ``after``."""
    n = HEAD + len(outcome.text)
    iid = item_id(found.turn_id)
    part = ContentOut(type="output_text", text=outcome.text, annotations=[])
    ending = {"completed": "response.completed", "failed": "response.failed",
              "cancelled": "response.cancelled"}[outcome.status]
    events = [
        StreamEvent(type="response.output_text.done", sequence_number=n + 1, item_id=iid,
                    output_index=0, content_index=0, text=outcome.text, logprobs=[]),
        StreamEvent(type="response.content_part.done", sequence_number=n + 2, item_id=iid,
                    output_index=0, content_index=0, part=part),
        StreamEvent(type="response.output_item.done", sequence_number=n + 3, output_index=0,
                    item=output_item(found.turn_id, outcome.text, outcome.status)),
        StreamEvent(type=ending, sequence_number=n + 4,
                    response=response_object(found, outcome)),
    ]
    return [e for e in events if e.sequence_number > after]


def check_starting_after(raw: str | None) -> int:
    """``starting_after`` (absent: -1, every event). Raises InvalidInputError."""
    if raw is None or raw == "":
        return -1
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise InvalidInputError(f"starting_after must be a non-negative integer, got "
                                f"{raw[:40]!r}")
    return int(raw)
