"""One conversation turn as the front doors that project turns read it (the A2A executor, whose
task is a turn, and the OpenAI-compatible routes, whose completion or response is one): each
durable event of the conversation is one step of a given turn, or nothing to it. Pure; written
once so both projections end a turn alike (pure, but for :func:`turn_records`, a journal read
through the Agent API).

- :class:`ToolStep`: the agent called a tool (its ToolCall record);
- :class:`AnswerStep`: the turn's answer, all the text the model wrote across its rounds;
- :class:`PartialStep`: the text shown before the turn was cut (an interrupted answer); its
  ending (:class:`InterruptedStep` or :class:`ErrorStep`) follows in the same commit;
- :class:`InterruptedStep`, :class:`ErrorStep`: the turn ended without its answer;
- :class:`ClosedStep`: the conversation is closing (deleted): every turn of it is over;
- :class:`PauseStep`, :class:`AnsweredStep`: a call of the turn waits for a person (docs/PROTOCOL.md,
  "A person in the loop"), and the answer that ends that wait (whoever gave it).

:func:`open_pauses` and :func:`ending_in` read the journal the same way: which pauses of a turn
still wait, and how it ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentik.wire import (
    ApprovalAnswer,
    ApprovalGiven,
    ApprovalRequest,
    ApprovalRequested,
    AssistantMessage,
    AssistantMessageEvent,
    Content,
    ConversationClosing,
    Error,
    ErrorEvent,
    Event,
    InputAnswer,
    InputGiven,
    InputRequest,
    InputRequested,
    Interrupted,
    MessageRecord,
    Pause,
    PauseAnswer,
    Text,
    ToolCall,
    ToolCallEvent,
)

if TYPE_CHECKING:
    from agentik.agent import LocalAgent

#: journal records read at a time from a turn's first pause on
PAGE = 500


@dataclass(frozen=True)
class ToolStep:
    call: ToolCall


@dataclass(frozen=True)
class AnswerStep:
    answer: AssistantMessage
    text: str


@dataclass(frozen=True)
class PartialStep:
    text: str


@dataclass(frozen=True)
class InterruptedStep:
    pass


@dataclass(frozen=True)
class ErrorStep:
    error: Error


@dataclass(frozen=True)
class ClosedStep:
    reason: str


@dataclass(frozen=True)
class PauseStep:
    request: Pause
    #: the request's journal seq (the turn's open pauses are read from there on)
    seq: int


@dataclass(frozen=True)
class AnsweredStep:
    answer: PauseAnswer


TurnStep = (ToolStep | AnswerStep | PartialStep | InterruptedStep | ErrorStep | ClosedStep
            | PauseStep | AnsweredStep)


def text_of(content: Sequence[Content]) -> str:
    return "".join(c.body for c in content if isinstance(c, Text))


def turn_step(event: Event, turn_id: str | None) -> TurnStep | None:
    """What ``event`` (of the turn's conversation) is to the turn ``turn_id``."""
    match event:
        case ToolCallEvent(record=record):
            call = record.message
            if isinstance(call, ToolCall) and call.turn_id == turn_id:
                return ToolStep(call)
        case AssistantMessageEvent(record=record):
            answer = record.message
            if isinstance(answer, AssistantMessage) and answer.turn_id == turn_id:
                text = text_of(answer.content)
                return PartialStep(text) if answer.interrupted else AnswerStep(answer, text)
        case Interrupted(turn_id=interrupted) if interrupted == turn_id:
            return InterruptedStep()
        case ErrorEvent(record=record):
            error = record.message
            if isinstance(error, Error) and error.turn_id == turn_id:
                return ErrorStep(error)
        case ConversationClosing(reason=reason):
            return ClosedStep(reason)
        case ApprovalRequested(record=record) | InputRequested(record=record):
            request = record.message
            if isinstance(request, ApprovalRequest | InputRequest) and request.turn_id == turn_id:
                return PauseStep(request, record.seq)
        case ApprovalGiven(record=record) | InputGiven(record=record):
            given = record.message
            if isinstance(given, ApprovalAnswer | InputAnswer) and given.turn_id == turn_id:
                return AnsweredStep(given)
    return None


def open_pauses(records: Sequence[MessageRecord], turn_id: str | None) -> list[Pause]:
    """The pauses of the turn ``turn_id`` in ``records`` (journal records, in order) that no
    answer in them ended, in the order the turn waits on them."""
    waiting: dict[str, Pause] = {}
    for record in records:
        message = record.message
        if isinstance(message, ApprovalRequest | InputRequest) and message.turn_id == turn_id:
            waiting[message.call_id] = message
        elif isinstance(message, ApprovalAnswer | InputAnswer) and message.turn_id == turn_id:
            waiting.pop(message.call_id, None)
    return list(waiting.values())


def ending_in(records: Sequence[MessageRecord], turn_id: str | None
              ) -> AnswerStep | ErrorStep | PartialStep | None:
    """How the turn ``turn_id`` ended, from journal records: its answer, its Error (a failure),
    or its interrupted answer alone (an interrupt; the text may be empty); None: not ended."""
    partial: PartialStep | None = None
    for record in records:
        message = record.message
        if isinstance(message, Error) and message.turn_id == turn_id:
            return ErrorStep(message)
        if isinstance(message, AssistantMessage) and message.turn_id == turn_id:
            text = text_of(message.content)
            if not message.interrupted:
                return AnswerStep(message, text)
            partial = PartialStep(text)
    return partial


async def turn_records(agent: LocalAgent, cid: str, seq: int) -> list[MessageRecord]:
    """The conversation's journal from ``seq`` on (a turn's first pause: what follows is its)."""
    conversation = await agent.get_conversation(cid)
    if conversation is None:
        return []
    out: list[MessageRecord] = []
    after = seq - 1
    while True:
        page = await agent.journal.list(conversation.id, after_seq=after, limit=PAGE)
        out.extend(page)
        if len(page) < PAGE:
            return out
        after = page[-1].seq
