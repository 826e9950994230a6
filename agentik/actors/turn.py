"""Pure turn logic: model deltas in, online events and records out. No I/O, no trio; the
ConversationActor is the shell that moves data between the LLM, the tools, storage and the hub.

A turn is one or more *rounds* (one model stream each). A round that ends with tool calls is
followed by the tools' results and another round, up to ``max_tool_rounds``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, assert_never

import msgspec

from agentik.llm.base import (
    FinishDelta,
    LlmDelta,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UsageDelta,
)
from agentik.wire import (
    AppendReasoning,
    AppendText,
    AssistantItem,
    AssistantMessage,
    Content,
    OnlineEvent,
    StartReasoning,
    StartResponse,
    SummaryItem,
    SystemItem,
    Text,
    ToolCallSpec,
    ToolItem,
    TurnTokens,
    UserItem,
    WorkingItem,
)


@dataclass
class _CallAcc:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class TurnState:
    """Everything a turn has produced so far."""

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
    calls: dict[int, _CallAcc] = field(default_factory=dict)
    finish_reason: str | None = None
    started_response: bool = False
    started_reasoning: bool = False
    #: prompt tokens of the latest round: how full the context is
    last_prompt_tokens: int = 0
    #: a terminal record (answer, error or interruption) was written: never write another
    finished: bool = False
    #: this round's text is already in working memory (with its tool calls)
    round_recorded: bool = False
    #: tool calls of this round stored without a result yet
    pending_calls: list[ToolCallSpec] = field(default_factory=list)


def new_round(state: TurnState) -> None:
    if state.round_text:
        state.texts.append("".join(state.round_text))
    state.round_text = []
    state.calls = {}
    state.finish_reason = None
    state.started_response = False
    state.started_reasoning = False
    state.round_recorded = False
    state.pending_calls = []
    state.rounds += 1


def apply_delta(state: TurnState, delta: LlmDelta) -> list[OnlineEvent]:
    """Fold one delta into the state; return the online events to publish for it."""
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
            acc = state.calls.setdefault(delta.index, _CallAcc())
            # Some servers repeat id and name in every fragment: assign, never append.
            if delta.id:
                acc.id = delta.id
            if delta.name:
                acc.name = delta.name
            if delta.arguments:
                acc.arguments.append(delta.arguments)
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
    """The round's tool calls in index order; a call without an id gets one, one without a name
    keeps an empty name (it fails as an unknown tool, which the model is told)."""
    out = []
    for index in sorted(state.calls):
        acc = state.calls[index]
        out.append(
            ToolCallSpec(
                call_id=acc.id or f"call_{uuid.uuid4().hex[:12]}",
                name=acc.name,
                arguments="".join(acc.arguments) or "{}",
            )
        )
    return out


def round_item(state: TurnState, calls: list[ToolCallSpec]) -> AssistantItem:
    """The working-memory item for a round that ended in tool calls."""
    text = "".join(state.round_text)
    return AssistantItem(content=[Text(body=text)] if text else [], tool_calls=calls)


def seen_text(state: TurnState) -> str:
    return "".join([*state.texts, "".join(state.round_text)])


def final_message(state: TurnState, *, interrupted: bool = False) -> AssistantMessage | None:
    """The journal's AssistantMessage: all text the user saw across rounds. None when an
    interrupted or failed turn produced no text (nothing to keep)."""
    text = seen_text(state)
    if interrupted and not text:
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
    )


def final_item(state: TurnState) -> AssistantItem:
    """The working-memory item closing the turn: the last round's text (earlier rounds' text is
    already in working memory with their tool calls)."""
    text = "" if state.round_recorded else "".join(state.round_text)
    return AssistantItem(content=[Text(body=text)] if text else [])


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


# --- compaction ----------------------------------------------------------------------------------

#: compaction starts when a round's prompt used this share of the context window
COMPACT_AT = 0.8
#: the most recent user turns kept verbatim
KEEP_TURNS = 2


@dataclass(frozen=True)
class CompactionPlan:
    before_order_idx: int  # items with system < order_idx < this are replaced
    dropped: list[WorkingItem]


def plan_compaction(
    items: list[tuple[int, WorkingItem]], prompt_tokens: int, context_window: int | None
) -> CompactionPlan | None:
    """Decide whether working memory must be compacted: when the last prompt used more than
    COMPACT_AT of the window, everything between the system prompt and the last KEEP_TURNS user
    turns is summarised. None when there is nothing to do (no window known, below the mark, or
    too few turns to drop any)."""
    if not context_window or prompt_tokens < COMPACT_AT * context_window:
        return None
    user_positions = [i for i, (_, item) in enumerate(items) if isinstance(item, UserItem)]
    if len(user_positions) <= KEEP_TURNS:
        return None
    keep_from = user_positions[-KEEP_TURNS]
    first = 1 if items and isinstance(items[0][1], SystemItem) else 0
    dropped = [item for _, item in items[first:keep_from]]
    if not dropped:
        return None
    return CompactionPlan(before_order_idx=items[keep_from][0], dropped=dropped)


def transcript(items: list[WorkingItem]) -> str:
    """Plain-text rendering of working-memory items for the summariser."""
    lines = []
    for item in items:
        match item:
            case UserItem(content=content):
                lines.append("User: " + _text_of(content))
            case AssistantItem(content=content, tool_calls=calls):
                text = _text_of(content)
                if text:
                    lines.append("Assistant: " + text)
                for call in calls:
                    lines.append(f"Assistant called {call.name}({call.arguments})")
            case ToolItem(name=name, content=content):
                lines.append(f"Tool {name} returned: {content}")
            case SummaryItem(text=text):
                lines.append("Earlier summary: " + text)
            case SystemItem(text=text):
                lines.append("System: " + text)
            case _:
                assert_never(item)
    return "\n".join(lines)


def _text_of(content: list[Content]) -> str:
    return " ".join(c.body if isinstance(c, Text) else f"[image {c.mime}]" for c in content)


SUMMARY_PROMPT = (
    "You compress conversations. Summarise the conversation below in a few sentences, keeping "
    "names, facts, decisions and open questions the assistant will need later. Answer with the "
    "summary only."
)
