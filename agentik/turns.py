"""One conversation turn as the front doors that project turns read it (the A2A executor, whose
task is a turn, and the OpenAI-compatible routes, whose completion or response is one): each
durable event of the conversation is one step of a given turn, or nothing to it. Pure; written
once so both projections end a turn alike.

- :class:`ToolStep`: the agent called a tool (its ToolCall record);
- :class:`AnswerStep`: the turn's answer, all the text the model wrote across its rounds;
- :class:`PartialStep`: the text shown before the turn was cut (an interrupted answer); its
  ending (:class:`InterruptedStep` or :class:`ErrorStep`) follows in the same commit;
- :class:`InterruptedStep`, :class:`ErrorStep`: the turn ended without its answer;
- :class:`ClosedStep`: the conversation is closing (deleted): every turn of it is over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentik.wire import (
    AssistantMessage,
    AssistantMessageEvent,
    Content,
    ConversationClosing,
    Error,
    ErrorEvent,
    Event,
    Interrupted,
    Text,
    ToolCall,
    ToolCallEvent,
)


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


TurnStep = ToolStep | AnswerStep | PartialStep | InterruptedStep | ErrorStep | ClosedStep


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
    return None
