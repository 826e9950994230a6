"""Whether the next round fits, and what to compact if not (:func:`decide`; the module docstring
of :mod:`agentik.context` tells the whole story), and the checks after the summary is made."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agentik.context.budget import KEEP_SHARE, Budget
from agentik.wire import SystemItem, UserItem, WorkingItem


@dataclass(frozen=True)
class Fits:
    #: tokens the round may generate (None: no limit known, the server's default applies)
    max_output: int | None


@dataclass(frozen=True)
class Compact:
    #: working-memory items with system < order_idx < this are replaced (ops.Compact)
    before_order_idx: int
    dropped: list[WorkingItem]
    #: tokens the summary may take in this plan (0: no room, drop without a summary)
    summary_room: int
    #: tokens in context after the compaction, without the summary
    kept_tokens: int


@dataclass(frozen=True)
class TooBig:
    #: tokens of the current turn (its user message, tool results) and the system prompt
    tokens: int
    #: tokens of the user's message alone
    message_tokens: int
    window: int
    #: whether the turn has tool results (the message alone may fit)
    with_tools: bool


Decision = Fits | Compact | TooBig


def _turn_start(items: Sequence[tuple[int, WorkingItem]]) -> int:
    """Index of the current turn's user message (the last UserItem); len(items) if none."""
    for i in range(len(items) - 1, -1, -1):
        if isinstance(items[i][1], UserItem):
            return i
    return len(items)


def decide(
    items: Sequence[tuple[int, WorkingItem]],
    counts: Sequence[int],
    budget: Budget | None,
    *,
    force: bool = False,
    summarise: bool = True,
) -> Decision:
    """Whether the next round fits; see the module docstring.

    ``items`` is working memory as ``(order_idx, item)`` in order, ending with the current turn
    (its user message and what the turn added since); ``counts`` the tokens of each item.
    ``budget`` None means the window is unknown: everything fits. ``force`` (the backend
    reported an overflow although the counts said it fits) compacts whatever can be dropped.
    ``summarise`` False plans no summary (the last resort: ``force=True, summarise=False``
    drops every old item, so what is left is the current turn, which either fits or is TooBig).
    """
    if len(items) != len(counts):
        raise ValueError("one count per item")
    if budget is None:
        return Fits(max_output=None)
    total = sum(counts)
    free = budget.window - budget.margin - total
    if not force and free >= budget.output:
        return Fits(max_output=budget.output)

    first = 1 if items and isinstance(items[0][1], SystemItem) else 0
    start = _turn_start(items)
    protected = sum(counts[:first]) + sum(counts[start:])
    droppable = list(range(first, start))
    if not droppable:
        if not force and free >= budget.min_output:
            return Fits(max_output=free)
        return _too_big(items, counts, budget, first, start, protected)

    # Room for old turns kept verbatim and a summary, with at least min_output to answer.
    room = budget.window - budget.margin - protected - budget.output
    if room < 0:
        room = budget.window - budget.margin - protected - budget.min_output
        if room < 0:
            return _too_big(items, counts, budget, first, start, protected)
    summary_room = min(budget.summary, room) if summarise else 0
    keep_limit = int((room - summary_room) * KEEP_SHARE)
    # Forced (our count said it fits, the backend said no): drop every old turn.
    keep_from, kept = (start, 0) if force else _kept_turns(items, counts, first, start, keep_limit)
    dropped_tokens = sum(counts[first:keep_from])
    # A summary is shorter than what it replaces.
    summary_room = min(summary_room, dropped_tokens // 2)
    if not force and free >= budget.min_output and (
        keep_from == first or dropped_tokens - summary_room < budget.min_output
    ):
        # The prompt is big but the old turns small: compacting would gain next to nothing, so
        # answer in the room there is.
        return Fits(max_output=free)
    return Compact(
        before_order_idx=items[keep_from][0] if keep_from < len(items) else items[-1][0] + 1,
        dropped=[item for _, item in items[first:keep_from]],
        summary_room=summary_room,
        kept_tokens=protected + kept,
    )


def _kept_turns(
    items: Sequence[tuple[int, WorkingItem]],
    counts: Sequence[int],
    first: int,
    start: int,
    keep_limit: int,
) -> tuple[int, int]:
    """The most recent whole old turns (a turn starts at a UserItem) that fit ``keep_limit``
    tokens: the index the kept ones start at (``start``: none kept) and their tokens."""
    keep_from = start
    kept = 0
    i = start
    while i > first:
        j = i - 1
        while j > first and not isinstance(items[j][1], UserItem):
            j -= 1
        turn_tokens = sum(counts[j:i])
        if kept + turn_tokens > keep_limit or not isinstance(items[j][1], UserItem):
            break
        kept += turn_tokens
        keep_from = j
        i = j
    return keep_from, kept


def _too_big(
    items: Sequence[tuple[int, WorkingItem]],
    counts: Sequence[int],
    budget: Budget,
    first: int,
    start: int,
    protected: int,
) -> TooBig:
    message = counts[start] if start < len(counts) else 0
    return TooBig(tokens=protected, message_tokens=message, window=budget.window,
                  with_tools=len(items) - start > 1)


def too_big_message(decision: TooBig, *, exact: bool) -> str:
    """The turn's error text (never the engine's own): what is too big, against which window."""
    about = "" if exact else "about "
    if decision.with_tools:
        return (f"this turn (the message and its tool results) is {about}{decision.tokens} "
                f"tokens; the model's window is {decision.window}: send a shorter message or "
                "ask for less tool output")
    return (f"the message is {about}{decision.message_tokens} tokens; the model's window is "
            f"{decision.window} (with the system prompt and room for the answer it cannot fit): "
            "send a shorter message")


# --- after the summary ---------------------------------------------------------------------------


def last_resort(decision: Decision, attempt: int) -> bool:
    """Whether a round's ``attempt``-th decision must be replaced by the last resort (every old
    item dropped, no summary): a compaction already ran for this round and the round still does
    not fit (a summary longer than asked, counts that moved). Dropping is deterministic, so the
    attempt after it ends in Fits or TooBig: compaction always makes room when the current turn
    alone fits."""
    return attempt > 0 and isinstance(decision, Compact)


def summary_fits(plan: Compact, summary_tokens: int, budget: Budget) -> bool:
    """Whether the made summary fits next to what the plan keeps (else drop without it)."""
    return plan.kept_tokens + summary_tokens + budget.min_output <= budget.window - budget.margin


def transcript_room(budget: Budget, prompt_tokens: int, summary_room: int) -> int:
    """Tokens the summariser's transcript may take: the window minus its prompt, the summary's
    room and the margin."""
    return max(0, budget.window - budget.margin - prompt_tokens - summary_room)


def cut_summary(text: str, tokens: int, room: int) -> str:
    """A summary of ``tokens`` tokens cut to ``room`` (a server may ignore the summary's output
    budget, as ``litert-lm serve`` does): its beginning kept, by character share with a tenth to
    spare, at a word boundary; "" when there is no room."""
    if tokens <= room or not text:
        return text
    if room <= 0:
        return ""
    keep_chars = math.floor(len(text) * room / tokens * 0.9)
    head = text[:keep_chars]
    cut = head.rfind(" ")
    return (head[:cut] if cut > keep_chars // 2 else head).rstrip() + " [...]" if head else ""


def cut_transcript(text: str, tokens: int, room: int) -> str:
    """Fit a transcript of ``tokens`` tokens into ``room``: keep its first line (an earlier
    summary, if any, comes first) and as much of its end as fits, by character share."""
    if tokens <= room or not text:
        return text
    if room <= 0:
        return ""
    keep_chars = max(0, math.floor(len(text) * room / tokens * 0.9))
    head, sep, rest = text.partition("\n")
    if head.startswith("Earlier summary:") and len(head) < keep_chars // 2:
        tail_chars = keep_chars - len(head) - 1
        return head + sep + "[...]\n" + rest[-tail_chars:] if tail_chars > 0 else head
    return "[...]\n" + text[-keep_chars:] if keep_chars else ""
