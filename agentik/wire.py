"""Wire types (docs/PROTOCOL.md §2): one definition of each, shared by the runtime, storage payloads, the HTTP
facade and the client library.

All types are frozen msgspec Structs. Members of a union carry a snake_case ``type`` tag. New fields
are only ever added with defaults, so old stored payloads and old clients keep decoding.

Encoders and decoders are built once at import (``encode``, ``decode_*``); a decode error is a
``msgspec.ValidationError`` whose message names the offending path, e.g.
``Expected `str`, got `int` - at `$.content[0].body```. For a client's JSON,
:mod:`agentik.api` (``decode_input``, ``convert_input``) turns it into
:class:`agentik.errors.InvalidInputError`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agentik.errors import InvalidInputError

# (``X as X``: re-exported, defined there)
from agentik.wire_base import MAX_OFFSET as MAX_OFFSET
from agentik.wire_base import Tagged, Wire, parse_offset
from agentik.wire_branch import BranchPoint
from agentik.wire_pause import ApprovalAnswer, ApprovalRequest, ClientTool, InputAnswer, InputRequest
from agentik.wire_pause import Pause as Pause
from agentik.wire_pause import PauseAnswer as PauseAnswer

# --- content -------------------------------------------------------------------------------------


# Content takes its fields positionally too (``Text("hello")``, ``Image(data, "image/jpeg")``),
# as Python code naturally writes it; the JSON is the same either way.


class Text(Tagged, frozen=True, kw_only=False):
    body: str


class Image(Tagged, frozen=True, kw_only=False):
    data: str  # base64, no data: prefix
    mime: str = "image/png"


Content = Text | Image


class MessageOrigin(Wire, frozen=True, kw_only=True):
    kind: Literal["user", "agent", "system"] = "user"
    id: str | None = None


class MessageContext(Wire, frozen=True, kw_only=True):
    origin: MessageOrigin | None = None
    metadata: dict[str, str] = {}
    #: the sender's own tools for this turn (docs/PROTOCOL.md, "A person in the loop")
    tools: list[ClientTool] | None = None


class TurnTokens(Wire, frozen=True, kw_only=True):
    prompt: int = 0
    completion: int = 0


# --- messages (the journal) ----------------------------------------------------------------------


class UserMessage(Tagged, frozen=True, kw_only=True):
    content: list[Content]
    context: MessageContext | None = None


class AssistantMessage(Tagged, frozen=True, kw_only=True):
    content: list[Content]
    reasoning: str | None = None
    tokens: TurnTokens | None = None
    interrupted: bool = False
    turn_id: str | None = None  # id of the UserMessage that started the turn
    #: why the last round stopped: "stop", "length" (cut at the output budget or the context
    #: window), "tool_calls", … as the backend said; None if it did not say
    finish_reason: str | None = None


class ToolCall(Tagged, frozen=True, kw_only=True):
    call_id: str
    name: str
    arguments: str  # JSON text exactly as the model produced it
    turn_id: str | None = None


class ToolResult(Tagged, frozen=True, kw_only=True):
    call_id: str
    name: str
    content: str
    is_error: bool = False
    structured: Any = None
    turn_id: str | None = None


class Error(Tagged, frozen=True, kw_only=True):
    message: str
    code: str = "internal"
    turn_id: str | None = None


Message = (UserMessage | AssistantMessage | ToolCall | ToolResult | Error | ApprovalRequest
           | ApprovalAnswer | InputRequest | InputAnswer | BranchPoint)


class MessageRecord(Wire, frozen=True, kw_only=True, omit_defaults=True):
    id: str
    seq: int
    conversation_id: str
    created_at: float
    #: a current branch's listing: versions at this place, this one's (omitted: 1, 0; docs/PROTOCOL.md)
    siblings: int = 1
    sibling_index: int = 0
    message: Message


class ConversationRecord(Wire, frozen=True, kw_only=True):
    id: str
    title: str | None = None
    is_temporal: bool = False
    created_at: float
    updated_at: float
    seq: int
    agent: str = "default"  # its agent (docs/AGENTS.md); one stored before agents: default
    instructions: str | None = None  # given at creation in place of its agent's


# --- working memory (what the model sees; stored as payloads) ------------------------------------


class ToolCallSpec(Wire, frozen=True, kw_only=True):
    call_id: str
    name: str
    arguments: str


# Working-memory items are not tracked by the cycle collector (``gc=False``): a live actor keeps its
# whole working memory (actors/memory.py), and a cold-loaded 10,000-item conversation tracked 35k
# objects, a heap growth that made CPython run a full collection (~65 ms in agentik's process) on
# nearly every cold load (issue 13). They cannot be part of a cycle: frozen, and their fields are
# strings and lists of frozen string-only structs.


class SystemItem(Tagged, frozen=True, kw_only=True, tag="system", gc=False):
    text: str


class UserItem(Tagged, frozen=True, kw_only=True, tag="user", gc=False):
    content: list[Content]


class AssistantItem(Tagged, frozen=True, kw_only=True, tag="assistant", gc=False):
    content: list[Content]
    tool_calls: list[ToolCallSpec] = []


class ToolItem(Tagged, frozen=True, kw_only=True, tag="tool", gc=False):
    call_id: str
    name: str
    content: str


class SummaryItem(Tagged, frozen=True, kw_only=True, tag="summary", gc=False):
    """Replaces compacted turns: the model's own summary of them."""

    text: str


WorkingItem = SystemItem | UserItem | AssistantItem | ToolItem | SummaryItem


# --- cursor --------------------------------------------------------------------------------------


class Cursor(Wire, frozen=True, kw_only=True):
    epoch: str
    offset: int

    def __str__(self) -> str:
        return f"{self.epoch}:{self.offset}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """Parse ``EPOCH:OFFSET``; raises InvalidInputError naming the problem."""
        epoch, sep, digits = text.rpartition(":")
        offset = parse_offset(digits)
        if not sep or not epoch or offset is None:
            shown = text if len(text) <= 80 else text[:80] + "..."
            raise InvalidInputError(
                "cursor must be EPOCH:OFFSET with a non-negative offset of at most 19 ASCII "
                f"digits, got {shown!r}"
            )
        return cls(epoch=epoch, offset=offset)


# --- events --------------------------------------------------------------------------------------
# Durable conversation events carry the whole record they announce (events are absolute).


class UserMessageEvent(Tagged, frozen=True, kw_only=True, tag="user_message"):
    record: MessageRecord


class AssistantMessageEvent(Tagged, frozen=True, kw_only=True, tag="assistant_message"):
    record: MessageRecord


class ToolCallEvent(Tagged, frozen=True, kw_only=True, tag="tool_call"):
    record: MessageRecord


class ToolResultEvent(Tagged, frozen=True, kw_only=True, tag="tool_result"):
    record: MessageRecord


class ToolFailed(Tagged, frozen=True, kw_only=True):
    record: MessageRecord  # a ToolResult with is_error=True


class ApprovalRequested(Tagged, frozen=True, kw_only=True):
    record: MessageRecord  # an ApprovalRequest: the turn waits (docs/PROTOCOL.md)


class ApprovalGiven(Tagged, frozen=True, kw_only=True):
    record: MessageRecord  # an ApprovalAnswer


class InputRequested(Tagged, frozen=True, kw_only=True):
    record: MessageRecord  # an InputRequest: the turn waits


class InputGiven(Tagged, frozen=True, kw_only=True):
    record: MessageRecord  # an InputAnswer


class Interrupted(Tagged, frozen=True, kw_only=True):
    turn_id: str | None = None


class ErrorEvent(Tagged, frozen=True, kw_only=True, tag="error"):
    record: MessageRecord


class BranchChanged(Tagged, frozen=True, kw_only=True):
    record: MessageRecord  # a BranchPoint


class ConversationClosing(Tagged, frozen=True, kw_only=True):
    reason: str = "deleted"


class CompactionTriggered(Tagged, frozen=True, kw_only=True):
    dropped_items: int
    summary: str | None = None


class TaskUpdated(Tagged, frozen=True, kw_only=True):
    """A2A (docs/A2A.md): one change of an A2A task, stored with outbox kind ``a2a``. ``state`` is the
    task's state after the change (``TASK_STATE_*``); ``update`` is the A2A ``StreamResponse`` JSON
    that the task's subscribers get for it (``{"task": ...}``, ``{"statusUpdate": ...}`` or
    ``{"artifactUpdate": ...}``), kept as raw JSON: agentik's wire does not model A2A types."""

    task_id: str
    context_id: str
    state: str
    update: msgspec.Raw


DurableEvent = (
    UserMessageEvent
    | AssistantMessageEvent
    | ToolCallEvent
    | ToolResultEvent
    | ToolFailed
    | Interrupted
    | ErrorEvent
    | ApprovalRequested
    | ApprovalGiven
    | InputRequested
    | InputGiven
    | BranchChanged
    | ConversationClosing
    | CompactionTriggered
    | TaskUpdated
)


# Agent events: the conversation list.


class Created(Tagged, frozen=True, kw_only=True):
    conversation: ConversationRecord


class Deleted(Tagged, frozen=True, kw_only=True):
    conversation_id: str
    #: the agent it belonged to (a reader that knew nothing of it can still filter by agent)
    agent: str | None = None


class Renamed(Tagged, frozen=True, kw_only=True):
    conversation_id: str
    title: str | None
    updated_at: float


class Touched(Tagged, frozen=True, kw_only=True):
    conversation_id: str
    updated_at: float


AgentEvent = Created | Deleted | Renamed | Touched


# Online events: live only, never stored, no cursor.


class Working(Tagged, frozen=True, kw_only=True):
    turn_id: str | None = None


class End(Tagged, frozen=True, kw_only=True):
    turn_id: str | None = None


class StartReasoning(Tagged, frozen=True, kw_only=True):
    pass


class AppendReasoning(Tagged, frozen=True, kw_only=True):
    text: str


class StartResponse(Tagged, frozen=True, kw_only=True):
    pass


class AppendText(Tagged, frozen=True, kw_only=True):
    text: str


class AppendImage(Tagged, frozen=True, kw_only=True):
    data: str
    mime: str = "image/png"


OnlineEvent = Working | End | StartReasoning | AppendReasoning | StartResponse | AppendText | AppendImage

Event = DurableEvent | AgentEvent | OnlineEvent

AGENT_EVENT_TYPES: tuple[type, ...] = AgentEvent.__args__


class CommonEvent(Wire, frozen=True, kw_only=True):
    cursor: Cursor | None  # None for online events
    conversation_id: str | None
    event: Event

    @property
    def type(self) -> str:
        return event_type(self.event)


def event_type(event: Event) -> str:
    """The snake_case ``type`` tag of an event (also the SSE ``event:`` name)."""
    return type(event).__struct_config__.tag  # type: ignore[return-value]


# --- snapshots -----------------------------------------------------------------------------------


class ConversationsSnapshot(Wire, frozen=True, kw_only=True):
    cursor: Cursor
    conversations: list[ConversationRecord]


class ChatSnapshot(Wire, frozen=True, kw_only=True):
    cursor: Cursor
    conversation: ConversationRecord
    messages: list[MessageRecord]


# --- codecs, built once --------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()
encode = _encoder.encode

decode_common_event = msgspec.json.Decoder(CommonEvent).decode


decode_message = msgspec.json.Decoder(Message).decode
decode_working_item = msgspec.json.Decoder(WorkingItem).decode
