"""The model's summary of old turns, for compaction (docs/CONTEXT.md): the I/O half of
``compaction.py``, in a model session of its own that never touches the conversation's."""

from __future__ import annotations

import logging
from contextlib import aclosing

from agentik import context as ctx
from agentik.actors import compaction
from agentik.errors import LlmError
from agentik.llm.base import LiteLlm, TextDelta
from agentik.wire import SummaryItem, SystemItem, Text, UserItem, WorkingItem

log = logging.getLogger(__name__)


async def make_summary(
    llm: LiteLlm, conversation_id: str, plan: ctx.Compact, budget: ctx.Budget
) -> str | None:
    """A summary of the plan's old turns of at most ``plan.summary_room`` tokens (a longer one
    is cut to it), or None when there is no room for one, the model fails to make it, or it does
    not fit (the old turns are then dropped without one)."""
    if plan.summary_room <= 0:
        return None
    try:
        text = await summarise(llm, plan, budget)
    except LlmError as exc:
        log.warning("summarising %s for compaction failed (%s); dropping old turns",
                    conversation_id, exc)
        return None
    if not text:
        return None
    tokens = (await llm.count_tokens([SummaryItem(text=text)]))[0]
    for _ in range(3):
        if tokens <= plan.summary_room or not text:
            break
        # The server ignored the summary's output budget (litert-lm serve does): a summary over
        # its room would take the kept turns' room and the next round would not fit either.
        log.info("the summary of %s is %d tokens, over its %d: cut", conversation_id, tokens,
                 plan.summary_room)
        text = ctx.cut_summary(text, tokens, plan.summary_room)
        tokens = (await llm.count_tokens([SummaryItem(text=text)]))[0] if text else 0
    if not text or tokens > plan.summary_room or not ctx.summary_fits(plan, tokens, budget):
        log.warning("the summary of %s (%d tokens) does not fit; dropping old turns",
                    conversation_id, tokens)
        return None
    return text


async def summarise(llm: LiteLlm, plan: ctx.Compact, budget: ctx.Budget) -> str | None:
    """The model's summary of the plan's old turns in a session of its own, within the summary
    budget, its transcript cut to fit the window. Raises LlmError."""
    prompt: list[WorkingItem] = [SystemItem(text=compaction.SUMMARY_PROMPT)]
    text = compaction.transcript(plan.dropped)
    prompt_tokens, text_tokens = await llm.count_tokens(
        [*prompt, UserItem(content=[Text(body=text)])])
    room = ctx.transcript_room(budget, prompt_tokens, plan.summary_room)
    text = ctx.cut_transcript(text, text_tokens, room)
    if not text:
        return None
    conv = await llm.open(prompt, [])
    try:
        parts: list[str] = []
        stream = conv.send_stream([Text(body=text)], max_output_tokens=plan.summary_room)
        async with aclosing(stream):
            async for delta in stream:
                if isinstance(delta, TextDelta):
                    parts.append(delta.text)
        return "".join(parts).strip() or None
    finally:
        await conv.close()
