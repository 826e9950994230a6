"""Pure turn logic: model deltas in; online events and the storage ops to store out.

No I/O and no trio: the ConversationActor is the shell that moves data between the LLM, the
tools, storage and the hub, and asks this module what to do and what to store at each step.
``TurnState`` is the turn's whole state; every function here that returns an op also moves the
state on (a stored round is marked recorded, a closed call leaves ``pending_calls``, an ending
marks the turn ``finished``), so the shell never writes turn state itself.

A turn is one or more *rounds* (one model stream each). A round that ends with tool calls is
followed by the tools' results and another round, up to ``max_tool_rounds``. A turn ends in one
of two ways: with its answer (``after_round`` returns ``Answer``), or through :func:`end` with an
``Ending`` (failed, interrupted, cancelled, crashed) that keeps what the user already saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, assert_never

import msgspec

from agentik.actors import asking
from agentik.ids import new_id
from agentik.llm.base import (
    FinishDelta,
    LlmDelta,
    ReasoningDelta,
    TextDelta,
    ToolCallAssembler,
    ToolCallDelta,
    UsageDelta,
)
from agentik.storage import ops
from agentik.tools.base import ToolOutcome
from agentik.wire import (
    AppendReasoning,
    AppendText,
    AssistantItem,
    AssistantMessage,
    Content,
    Error,
    OnlineEvent,
    StartReasoning,
    StartResponse,
    Text,
    ToolCall,
    ToolCallSpec,
    ToolItem,
    ToolResult,
    TurnTokens,
    UserItem,
    encode,
)


@dataclass
class TurnState:
    """Everything a turn has produced so far."""

    conversation_id: str
    turn_id: str
    rounds: int = 0
    #: text of every round, in order (what the user saw)
    texts: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    saw_usage: bool = False
    # per round
    round_text: list[str] = field(default_factory=list)
    calls: ToolCallAssembler = field(default_factory=ToolCallAssembler)
    finish_reason: str | None = None
    started_response: bool = False
    started_reasoning: bool = False
    #: prompt tokens of the latest round: how full the context is
    last_prompt_tokens: int = 0
    #: a terminal record (answer, error or interruption) was made: never make another
    finished: bool = False
    #: this round's text is already in working memory (with its tool calls)
    round_recorded: bool = False
    #: tool calls of this round stored without a result yet
    pending_calls: list[ToolCallSpec] = field(default_factory=list)


def start(state: TurnState, content: list[Content], *, item: bool = True) -> ops.StartTurn:
    """The op that opens the turn: its user message enters working memory now (not when it was
    queued), so it can never land between another turn's question and answer. (A message sent
    to an idle conversation is stored with this item already: ``ops.AppendUserMessage.start``.)
    Without ``item`` (a regenerate: its user message is in working memory already) it only
    marks the turn running."""
    return ops.StartTurn(conversation_id=state.conversation_id, turn_id=state.turn_id,
                         item=user_item(content) if item else None)


def user_item(content: list[Content]) -> UserItem:
    """The working-memory item of a user message (its list: content keeps one shape)."""
    return UserItem(content=content)


def new_round(state: TurnState) -> None:
    if state.round_text:
        state.texts.append("".join(state.round_text))
    state.round_text = []
    state.calls = ToolCallAssembler()
    state.finish_reason = None
    state.started_response = False
    state.started_reasoning = False
    state.round_recorded = False
    state.pending_calls = []
    state.rounds += 1


def apply_delta(state: TurnState, delta: LlmDelta) -> list[OnlineEvent]:
    """Fold one delta into the state; return the online events to publish for it."""
    if type(delta) is TextDelta and state.started_response:  # most deltas: a token of text
        if not delta.text:
            return []
        state.round_text.append(delta.text)
        return [AppendText(text=delta.text)]
    match delta:
        case TextDelta(text=text):
            if not text:
                return []
            state.round_text.append(text)
            events: list[OnlineEvent] = []
            if not state.started_response:
                state.started_response = True
                events.append(StartResponse())
            events.append(AppendText(text=text))
            return events
        case ReasoningDelta(text=text):
            if not text:
                return []
            state.reasoning.append(text)
            events = []
            if not state.started_reasoning:
                state.started_reasoning = True
                events.append(StartReasoning())
            events.append(AppendReasoning(text=text))
            return events
        case ToolCallDelta():
            state.calls.add(delta)
            return []
        case UsageDelta():
            state.saw_usage = True
            state.prompt_tokens += delta.prompt_tokens
            state.completion_tokens += delta.completion_tokens
            state.last_prompt_tokens = delta.prompt_tokens
            return []
        case FinishDelta(reason=reason):
            state.finish_reason = reason
            return []
        case _:
            assert_never(delta)


def round_tool_calls(state: TurnState) -> list[ToolCallSpec]:
    """The round's tool calls in index order (see ToolCallAssembler.calls)."""
    return state.calls.calls()


# --- after a round: run tools, answer, or fail -----------------------------------------------------


@dataclass(frozen=True)
class RunTools:
    """Store ``op`` (the round's calls and its working-memory item, the calls that wait for a
    person), then run ``calls`` in order; each result goes to the model and through
    :func:`tool_done` to storage. ``renamed``: a call id the model reused was replaced by
    agentik's own (the model session knows the old one: open a new one from working memory)."""

    op: ops.AppendToolCalls
    calls: list[ToolCallSpec]
    renamed: bool = False


@dataclass(frozen=True)
class Answer:
    """Store ``op`` (the answer: the turn's terminal record), shielded; the turn is finished."""

    op: ops.FinishTurn


@dataclass(frozen=True)
class Failed:
    """The turn fails: end it through :func:`end` (also used for LLM errors and crashes)."""

    code: str
    message: str
    #: working-memory items from this order_idx on are removed (a turn too big for the context
    #: window must not stay in what the model sees; the journal keeps it)
    forget_from: int | None = None


@dataclass(frozen=True)
class Interrupted:
    """The user interrupted the turn: keep what was seen, no Error."""


@dataclass(frozen=True)
class Cancelled:
    """The runtime is shutting down or the conversation is being deleted."""


#: how a turn ends without its answer
Ending = Failed | Interrupted | Cancelled


def after_round(state: TurnState, max_tool_rounds: int, policy: asking.PausePolicy | None = None,
                seen: set[str] | None = None) -> RunTools | Answer | Failed:
    """What follows a finished model stream; ``policy``: which calls wait for a person;
    ``seen``: the conversation's call ids so far (``asking.unique_calls``)."""
    calls, renamed = asking.unique_calls(round_tool_calls(state),
                                         set() if seen is None else seen)
    if not calls:
        state.finished = True
        answer = final_message(state)
        assert answer is not None  # only a turn ended without its answer may have no message
        return Answer(ops.FinishTurn(
            conversation_id=state.conversation_id, turn_id=state.turn_id,
            assistant=(new_id(), answer), item=_final_item(state),
        ))
    if state.rounds > max_tool_rounds:
        return Failed("tool_rounds",
                      f"the model asked for tools more than {max_tool_rounds} times in one turn")
    op = ops.AppendToolCalls(
        conversation_id=state.conversation_id,
        calls=tuple(
            (new_id(), ToolCall(call_id=c.call_id, name=c.name, arguments=c.arguments,
                                        turn_id=state.turn_id))
            for c in calls
        ),
        item=_round_item(state, calls),
        pauses=asking.pauses_for(state.turn_id, calls, policy) if policy is not None else (),
        turn_id=state.turn_id,
    )
    state.round_recorded = True
    state.pending_calls = list(calls)
    return RunTools(op, calls, renamed)


def resumed(state: TurnState, rounds: int, pending: list[ToolCallSpec], texts: list[str]) -> None:
    """A turn that waited for a person goes on in a new actor (a restart, another node): its
    ``rounds`` and their ``texts`` so far, its last round's calls without a result (run now)."""
    state.rounds, state.texts = rounds, list(texts)
    state.round_recorded = True
    state.pending_calls = list(pending)


def calls_not_stored(state: TurnState) -> None:
    """The round's ``RunTools`` op was not stored (the turn was cut while the store refused
    it): its calls are neither recorded nor pending, so the turn's ending keeps the round's
    text and stores no result for a call the journal does not have."""
    state.round_recorded = False
    state.pending_calls = []


def result_not_stored(state: TurnState, call: ToolCallSpec) -> None:
    """The ``tool_done`` op of ``call`` was not stored: the call is pending again (the ending
    gives it a ToolFailed), first, as the calls run in order."""
    if all(c.call_id != call.call_id for c in state.pending_calls):
        state.pending_calls.insert(0, call)


def tool_result(state: TurnState, call: ToolCallSpec, outcome: ToolOutcome, cap: int) -> ToolResult:
    """A tool's outcome as the journal's ToolResult. Untrusted and possibly huge: the text (which
    the model sees) is cut to ``cap`` characters; structured content is kept only when it fits."""
    structured = outcome.structured
    if structured is not None and len(encode(structured)) > cap:
        structured = None
    return ToolResult(call_id=call.call_id, name=call.name, content=cap_text(outcome.content, cap),
                      is_error=outcome.is_error, structured=structured, turn_id=state.turn_id)


def tool_failure(state: TurnState, call: ToolCallSpec, message: str) -> ToolResult:
    """An error result (ToolFailed): the turn goes on and the model hears what went wrong."""
    return ToolResult(call_id=call.call_id, name=call.name, content=message, is_error=True,
                      turn_id=state.turn_id)


def tool_done(state: TurnState, result: ToolResult) -> ops.AppendToolResult:
    """The op storing one call's result; the call is no longer pending."""
    state.pending_calls = [c for c in state.pending_calls if c.call_id != result.call_id]
    return ops.AppendToolResult(
        conversation_id=state.conversation_id, message_id=new_id(), result=result,
        item=ToolItem(call_id=result.call_id, name=result.name, content=result.content),
    )


#: the Error of a turn cancelled by a shutdown or a deletion
CANCELLED = "turn cancelled: the server is shutting down or the conversation was closed"
#: the ToolFailed of a call still running when its turn ended
CALL_CUT = "the turn ended before this tool call finished"


def end(state: TurnState, ending: Ending) -> list[ops.AppendToolResult | ops.FinishTurn]:
    """The ops that end a turn without its answer, in order: a ToolFailed for every stored call
    without a result (no client shows a call that never ends, and the model's history has an
    answer for each call), then the terminal record keeping what the user saw. Marks the turn
    finished."""
    out: list[ops.AppendToolResult | ops.FinishTurn] = [
        tool_done(state, tool_failure(state, call, CALL_CUT)) for call in list(state.pending_calls)
    ]
    # An interruption is always in the journal: with no text, as an empty interrupted answer
    # (a failed or cancelled turn's Error record is its end there).
    partial = final_message(state, interrupted=True,
                            keep_empty=isinstance(ending, Interrupted))
    item = _final_item(state) if partial is not None else None
    error: Error | None
    match ending:
        case Failed(code=code, message=message):
            error = Error(message=message, code=code, turn_id=state.turn_id)
        case Interrupted():
            error = None
        case Cancelled():
            error = Error(message=CANCELLED, code="cancelled", turn_id=state.turn_id)
        case _:
            assert_never(ending)
    state.finished = True
    out.append(ops.FinishTurn(
        conversation_id=state.conversation_id, turn_id=state.turn_id,
        assistant=(new_id(), partial) if partial is not None else None,
        item=item if item is not None and item.content else None,
        interrupted=isinstance(ending, Interrupted),
        error=(new_id(), error) if error is not None else None,
        forget_from=ending.forget_from if isinstance(ending, Failed) else None,
    ))
    return out


# --- what the journal and working memory get --------------------------------------------------------


def seen_text(state: TurnState) -> str:
    return "".join([*state.texts, "".join(state.round_text)])


def final_message(
    state: TurnState, *, interrupted: bool = False, keep_empty: bool = False
) -> AssistantMessage | None:
    """The journal's AssistantMessage: all text the user saw across rounds. None when an
    interrupted or failed turn produced no text, unless ``keep_empty`` (an interruption: the
    empty message is its record in the history)."""
    text = seen_text(state)
    if interrupted and not text and not keep_empty:
        return None
    content: list[Content] = [Text(body=text)] if text else []
    tokens = (
        TurnTokens(prompt=state.prompt_tokens, completion=state.completion_tokens)
        if state.saw_usage
        else None
    )
    return AssistantMessage(
        content=content,
        reasoning="".join(state.reasoning) or None,
        tokens=tokens,
        interrupted=interrupted,
        turn_id=state.turn_id,
        finish_reason=state.finish_reason,
    )


def _round_item(state: TurnState, calls: list[ToolCallSpec]) -> AssistantItem:
    """The working-memory item for a round that ended in tool calls."""
    text = "".join(state.round_text)
    return AssistantItem(content=[Text(body=text)] if text else [], tool_calls=calls)


def _final_item(state: TurnState) -> AssistantItem:
    """The working-memory item closing the turn: the last round's text (earlier rounds' text is
    already in working memory with their tool calls)."""
    text = "" if state.round_recorded else "".join(state.round_text)
    return AssistantItem(content=[Text(body=text)] if text else [])


# --- tool arguments and results ---------------------------------------------------------------------


class BadArguments(ValueError):
    pass


def parse_arguments(arguments: str) -> dict[str, Any]:
    """The model's arguments as a JSON object; raises BadArguments saying what is wrong."""
    try:
        value = msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError as exc:
        raise BadArguments(f"arguments are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadArguments(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def cap_text(text: str, limit: int) -> str:
    """Cap untrusted tool output at ``limit`` characters, saying so at the end."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... truncated {len(text) - limit} characters]"
