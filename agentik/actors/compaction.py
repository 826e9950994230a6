"""Pure compaction logic (SPEC §5): when the context nears the model's window, the old turns of
working memory are replaced by a summary. Working memory only: the journal keeps everything.

No I/O: the ConversationActor reads working memory, asks :func:`plan_compaction` whether and
what to drop, has the model summarise :func:`transcript` under :data:`SUMMARY_PROMPT`, and
stores :func:`compact_op`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

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


def compact_op(conversation_id: str, plan: CompactionPlan, summary: str | None) -> ops.Compact:
    """The op replacing the planned items; without a summary (the model could not make one) the
    old turns are dropped without one (the seeds' v1 behaviour) rather than overflowing the
    window."""
    return ops.Compact(conversation_id=conversation_id, before_order_idx=plan.before_order_idx,
                       summary=SummaryItem(text=summary) if summary else None,
                       dropped=len(plan.dropped))
