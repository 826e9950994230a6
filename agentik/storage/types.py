"""What both engines hand the shared core, engine-neutral: a committed event
(:class:`StoredEvent`), a batch's outcome (:class:`BatchResult`), and the stored rows as the
read side returns them (:class:`A2ATaskRow`, :func:`conversation_of`, :func:`message_of`)."""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from agentik.errors import AgentikError
from agentik.storage import ops
from agentik.wire import (
    AgentEvent,
    CommonEvent,
    ConversationRecord,
    DurableEvent,
    Message,
    MessageRecord,
    TaskUpdated,
    ToolCall,
    ToolResult,
    decode_common_event,
    decode_message,
    event_type,
)


class _TypeOnly(msgspec.Struct, gc=False):
    type: str


class _EventTypeOnly(msgspec.Struct, gc=False):
    event: _TypeOnly


#: encoded CommonEvent JSON -> just its ``.event.type``: the rest is skipped, not built (~0.4 us,
#: no objects for the garbage collector)
decode_type_only = msgspec.json.Decoder(_EventTypeOnly).decode


#: an outbox row's kind, by its event's class: the conversation list's events are ``agent``, an
#: A2A task's change ``a2a``, every other durable event ``conversation`` (a stream filters by it)
KINDS: dict[type, str] = {
    **{cls: "conversation" for cls in typing.get_args(DurableEvent)},
    **{cls: "agent" for cls in typing.get_args(AgentEvent)},
    TaskUpdated: "a2a",
}


def kind_of(event: DurableEvent | AgentEvent) -> str:
    return KINDS[type(event)]


class StoredEvent(msgspec.Struct, gc=False):
    """A committed durable event with its encoded CommonEvent JSON (what SSE sends as data).

    ``event`` may be given as None when only ``raw`` is at hand (a page read from the outbox):
    it is then decoded from ``raw`` on first use, so a transport that sends the stored bytes
    (SSE, WebSocket) never decodes them; ``type`` (the event's tag, the SSE ``event:`` name) reads
    just the tag. A replay of 100k events spent most of its time decoding events nobody looked
    at, and collecting the garbage the decoded objects made (issue 13). A msgspec Struct (built
    in C, ~0.1 us) and not tracked by the garbage collector (``gc=False``: it refers to its
    event and bytes only, never to itself), since a replay makes one per event.
    """

    offset: int
    conversation_id: str | None
    kind: str  # "agent", "conversation" or "a2a"
    _event: CommonEvent | None
    raw: bytes

    @property
    def event(self) -> CommonEvent:
        event = self._event
        if event is None:
            # Two threads may both decode: they get equal values, either one is kept.
            event = self._event = decode_common_event(self.raw)
        return event

    @property
    def type(self) -> str:
        """The event's ``type`` tag, without decoding the event if it is not decoded yet."""
        event = self._event
        if event is None:
            return decode_type_only(self.raw).event.type
        return event_type(event.event)

    @staticmethod
    def types_of(batch: list[StoredEvent]) -> list[str]:
        """``[ev.type for ev in batch]`` in one loop with no call per event but the tag's decode
        (a replay names every frame from it: ~0.3 us per event less than the property)."""
        read = decode_type_only
        return [
            read(ev.raw).event.type if ev._event is None else event_type(ev._event.event)
            for ev in batch
        ]


@dataclass
class BatchResult:
    #: per op: its result, or the AgentikError that refused it
    results: list[object | AgentikError]
    events: list[StoredEvent]
    oldest: int  # lowest retained offset (head + 1 when the outbox is empty)
    head: int


#: a conversation row's columns, in the order :func:`conversation_of` reads them
CONVERSATION_COLUMNS = (
    "id, title, is_temporal, created_at, updated_at, seq, agent, instructions")
#: a journal row's columns, in the order :func:`message_of` reads them
MESSAGE_COLUMNS = "id, seq, conversation_id, created_at, payload"
#: an A2A task row's columns, in the order :func:`a2a_task_of` reads them
A2A_TASK_COLUMNS = (
    "id, context_id, conversation_id, state, created_at, updated_at, first_seq, seq, payload"
)


def conversation_of(row: Sequence[Any]) -> ConversationRecord:
    return ConversationRecord(
        id=row[0], title=row[1], is_temporal=bool(row[2]), created_at=row[3], updated_at=row[4],
        seq=row[5], agent=row[6], instructions=row[7],
    )


def message_of(row: Sequence[Any]) -> MessageRecord:
    return MessageRecord(id=row[0], seq=int(row[1]), conversation_id=row[2], created_at=row[3],
                         message=decode_message(row[4]))


@dataclass(frozen=True, slots=True)
class A2ATaskRow:
    """One stored A2A task: ``payload`` is its A2A Task JSON; ``first_seq`` the offset of its
    first event, ``seq`` of its last change."""

    id: str
    context_id: str
    conversation_id: str | None
    state: str
    created_at: float
    updated_at: float
    first_seq: int
    seq: int
    payload: bytes


def a2a_task_of(row: Sequence[Any]) -> A2ATaskRow:
    return A2ATaskRow(row[0], row[1], row[2], row[3], row[4], row[5], int(row[6]), int(row[7]),
                      bytes(row[8]))


class WebhookRow(msgspec.Struct, frozen=True, kw_only=True):
    """A stored subscription (``ops.WebhookSpec``) with its progress (``ops.WebhookProgress``):
    every event up to ``after`` is done; the next failed ``attempts`` times, the first of them at
    ``failing_since``, and is tried again at ``next_at`` (the writer's clock)."""

    spec: ops.WebhookSpec
    created_at: float
    after: int
    attempts: int
    next_at: float
    failing_since: float | None


class DeliveryRow(msgspec.Struct, frozen=True, kw_only=True):
    """A line of a subscription's delivery log (``ops.WebhookAttempt``) with its time."""

    attempt: ops.WebhookAttempt
    at: float


#: a webhook row's columns, in the order :func:`webhook_of` reads them
WEBHOOK_COLUMNS = ('id, url, events, agent, conversation_id, task_id, secret, source, config, '
                   'created_at, "after", attempts, next_at, failing_since')
#: a delivery log line's columns, in the order :func:`delivery_of` reads them
DELIVERY_COLUMNS = '"offset", type, attempt, outcome, status, error, at'


def webhook_of(row: Sequence[Any]) -> WebhookRow:
    spec = ops.WebhookSpec(
        id=row[0], url=row[1], events=tuple(row[2].split(",")) if row[2] else (), agent=row[3],
        conversation_id=row[4], task_id=row[5], secret=row[6], source=row[7],
        config=None if row[8] is None else bytes(row[8]))
    return WebhookRow(spec=spec, created_at=row[9], after=int(row[10]), attempts=int(row[11]),
                      next_at=row[12], failing_since=row[13])


def delivery_of(row: Sequence[Any]) -> DeliveryRow:
    return DeliveryRow(attempt=ops.WebhookAttempt(
        offset=int(row[0]), type=row[1], attempt=int(row[2]), outcome=row[3], status=row[4],
        error=row[5]), at=row[6])


#: the result of a call that was running when the server (or its node) stopped: it is never run
#: again, and nobody can say whether it had its effect (docs/TOOLS.md)
OUTCOME_UNKNOWN = "outcome unknown: the server stopped while it ran"


def unanswered(turn_id: str, messages: list[Message]) -> list[ToolCall]:
    """The turn's calls without a result, in order, from its calls and results (pure)."""
    calls = {m.call_id: m for m in messages if type(m) is ToolCall and m.turn_id == turn_id}
    for m in messages:
        if type(m) is ToolResult and m.turn_id == turn_id:
            calls.pop(m.call_id, None)
    return list(calls.values())
