"""Pure compaction logic (docs/CONTEXT.md): before a round that would not fit the
model's window, the old turns of working memory are replaced by a summary. Working memory only:
the journal keeps everything.

No I/O: the ConversationActor reads working memory, asks :func:`agentik.context.decide` whether
the round fits and what to drop, has the model summarise :func:`transcript` under
:data:`SUMMARY_PROMPT`, stores :func:`compact_op` and opens the new session with
:func:`session_history`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import assert_never

from agentik.context import Compact
from agentik.storage import ops
from agentik.wire import (
    AssistantItem,
    Content,
    SummaryItem,
    SystemItem,
    Text,
    ToolItem,
    UserItem,
    WorkingItem,
)


def turn_start(items: Sequence[tuple[int, WorkingItem]]) -> int | None:
    """order_idx of the current turn's user message (the last UserItem)."""
    for order_idx, item in reversed(items):
        if isinstance(item, UserItem):
            return order_idx
    return None


def session_history(
    items: Sequence[WorkingItem], *, first_round: bool
) -> tuple[list[WorkingItem], list[ToolItem]]:
    """What a new model session is opened with from working memory, and the tool results to
    hand it before the round: on a turn's first round everything but the current user message
    (the round sends it); later, everything but the trailing tool results (the round continues
    after them)."""
    history = list(items)
    results: list[ToolItem] = []
    if first_round:
        if history and isinstance(history[-1], UserItem):
            history.pop()
    else:
        while history and isinstance(history[-1], ToolItem):
            item = history.pop()
            assert isinstance(item, ToolItem)
            results.insert(0, item)
    return history, results


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


def compact_op(conversation_id: str, plan: Compact, summary: str | None) -> ops.Compact:
    """The op replacing the planned items; without a summary (the model could not make one) the
    old turns are dropped without one rather than overflowing the window."""
    return ops.Compact(conversation_id=conversation_id, before_order_idx=plan.before_order_idx,
                       summary=SummaryItem(text=summary) if summary else None,
                       dropped=len(plan.dropped))
