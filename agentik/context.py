"""Context-window budgeting (SPEC §5 "Context"; docs/CONTEXT.md): pure decisions, no I/O.

Before each model round the conversation asks :func:`decide` whether the working memory (which
already holds this turn's user message and any tool results) plus the round's output budget fits
the model's context window. The answer is one of:

- :class:`Fits` — send the round, generating at most ``max_output`` tokens (the output budget,
  shrunk when the prompt leaves less room, never below :attr:`Budget.min_output`);
- :class:`Compact` — first replace the oldest turns (everything between the system prompt and
  the kept recent turns) by a summary of at most :attr:`Budget.summary` tokens; the plan keeps
  room for that summary, so dropping without one (the fallback) always fits too;
- :class:`TooBig` — the current turn alone (system prompt + the user's message + this turn's
  tool results + the minimal output) cannot fit whatever is dropped: the turn fails with
  :func:`too_big_message`, and the conversation stays usable.

Token counts come from the backend (the engine's own tokenizer where it has one) or from
:func:`estimate_tokens`, a deliberately pessimistic estimate (see its docstring); an estimate
gets a larger safety margin (:func:`margin_for`).

Compaction aims below the limit (:data:`KEEP_SHARE`), so a conversation compacts every few turns
rather than on every turn; each compaction costs the embedded engine a full prefill of the
rebuilt history (its KV cache no longer matches).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import assert_never

from agentik.wire import (
    AssistantItem,
    Content,
    Image,
    SummaryItem,
    SystemItem,
    Text,
    ToolItem,
    UserItem,
    WorkingItem,
)

#: default output budget: this share of the window ...
OUTPUT_SHARE = 4
#: ... but at most this many tokens (a 1,024-token model gets 256; a 128k one 4,096)
OUTPUT_CAP = 4096
#: summary budget: this share of the window, at most SUMMARY_CAP tokens
SUMMARY_SHARE = 8
SUMMARY_CAP = 1024
#: after a compaction the kept old turns use at most this share of the room left for history,
#: so the next turns have space before the next compaction
KEEP_SHARE = 0.5
#: tokens a message costs beyond its text in an estimate (role markers, template tokens)
ESTIMATE_MESSAGE_OVERHEAD = 8
#: an image's cost when the backend cannot say (a typical vision encoder's tile)
ESTIMATE_IMAGE_TOKENS = 768


@dataclass(frozen=True)
class Budget:
    """The numbers one decision uses, all in tokens."""

    window: int
    #: the output budget of a round
    output: int
    #: kept free for counting errors
    margin: int
    #: the most tokens a summary may take
    summary: int

    @property
    def min_output(self) -> int:
        """A round is only worth sending with at least this much room to answer."""
        return min(self.output, max(16, self.window // 32))

    @property
    def prompt_room(self) -> int:
        """Tokens the prompt may use with the full output budget."""
        return self.window - self.margin - self.output


def output_budget(window: int | None, configured: int | None) -> int | None:
    """The output budget per round: ``configured`` (AGENTIK_MAX_OUTPUT_TOKENS /
    AGENTIK_LITERT_MAX_OUTPUT_TOKENS) if set, else a quarter of the window capped at OUTPUT_CAP;
    None when neither is known (the server's own default applies)."""
    if configured:
        return configured if not window else min(configured, window)
    if not window:
        return None
    return max(1, min(window // OUTPUT_SHARE, OUTPUT_CAP))


def summary_budget(window: int, configured: int | None = None) -> int:
    """The most tokens a compaction summary may take."""
    if configured:
        return min(configured, max(1, window // 2))
    return max(16, min(window // SUMMARY_SHARE, SUMMARY_CAP))


def margin_for(window: int, *, exact: bool) -> int:
    """Tokens kept free for counting errors: small with the engine's own tokenizer (template
    tokens it adds, e.g. BOS), larger for an estimate."""
    if exact:
        return max(8, window // 64)
    return max(32, window // 16)


def make_budget(
    window: int,
    *,
    exact: bool,
    output: int | None = None,
    summary: int | None = None,
) -> Budget:
    out = output_budget(window, output)
    assert out is not None
    return Budget(window=window, output=out, margin=margin_for(window, exact=exact),
                  summary=summary_budget(window, summary))


# --- the estimate --------------------------------------------------------------------------------

_PIECES = re.compile(
    r"[A-Za-z]+|\d|[ \t]+|\n+|[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]|[^\W\d_]+|.",
    re.S,
)


def _cjk(char: str) -> bool:
    return "\u3040" <= char <= "\ud7af" or "\uf900" <= char <= "\ufaff"


def estimate_tokens(text: str) -> int:
    """A pessimistic token count for a model whose tokenizer we do not have.

    Runs of ASCII letters cost one token per 4 letters (rounded up), every digit, punctuation
    mark, symbol, newline run, indentation run and CJK character one token, runs of other letters
    (Cyrillic, accented…) one per 3; a single space is free (tokenizers merge it into the next
    word). Against Gemma 3's tokenizer it over-counts English prose by ~1.3x, code ~1.25x, JSON
    ~1.15x, Russian and Chinese ~1.45x, and is exact for digits and plain short words: an
    estimate that errs towards compacting a little early, never towards overflowing.
    """
    n = 0
    for match in _PIECES.finditer(text):
        piece = match.group()
        char = piece[0]
        if char.isascii() and char.isalpha():
            n += -(-len(piece) // 4)
        elif char == " " and len(piece) == 1:
            pass
        elif char.isdigit() or char in " \t\n" or _cjk(char):
            n += 1
        elif char.isalpha():
            n += -(-len(piece) // 3)
        else:
            n += 1
    return n


def item_text(item: WorkingItem) -> str:
    """The text of a working-memory item as the model reads it (tool calls as name + JSON)."""
    match item:
        case SystemItem(text=text) | SummaryItem(text=text):
            return text
        case UserItem(content=content):
            return content_text(content)
        case AssistantItem(content=content, tool_calls=calls):
            return content_text(content) + "".join(
                f"{call.name}({call.arguments})" for call in calls
            )
        case ToolItem(name=name, content=content):
            return f"{name}: {content}"
        case _:
            assert_never(item)


def content_text(content: Sequence[Content]) -> str:
    return "".join(c.body for c in content if isinstance(c, Text))


def images_in(item: WorkingItem) -> int:
    if isinstance(item, UserItem | AssistantItem):
        return sum(1 for c in item.content if isinstance(c, Image))
    return 0


def estimate_item(item: WorkingItem, *, images: bool = True) -> int:
    """:func:`estimate_tokens` of an item plus the per-message overhead (and images, when the
    backend passes them to the model)."""
    n = estimate_tokens(item_text(item)) + ESTIMATE_MESSAGE_OVERHEAD
    if images:
        n += images_in(item) * ESTIMATE_IMAGE_TOKENS
    return n


# --- the decision --------------------------------------------------------------------------------


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
) -> Decision:
    """Whether the next round fits; see the module docstring.

    ``items`` is working memory as ``(order_idx, item)`` in order, ending with the current turn
    (its user message and what the turn added since); ``counts`` the tokens of each item.
    ``budget`` None means the window is unknown: everything fits. ``force`` (the backend
    reported an overflow although the counts said it fits) compacts whatever can be dropped.
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
    summary_room = min(budget.summary, room)
    keep_limit = int((room - summary_room) * KEEP_SHARE)
    # Keep the most recent whole turns (a turn starts at a UserItem) that fit keep_limit.
    keep_from = start
    kept = 0
    i = start
    # Forced (our count said it fits, the backend said no): drop every old turn.
    while i > first and not force:
        j = i - 1
        while j > first and not isinstance(items[j][1], UserItem):
            j -= 1
        turn_tokens = sum(counts[j:i])
        if kept + turn_tokens > keep_limit or not isinstance(items[j][1], UserItem):
            break
        kept += turn_tokens
        keep_from = j
        i = j
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


def summary_fits(plan: Compact, summary_tokens: int, budget: Budget) -> bool:
    """Whether the made summary fits next to what the plan keeps (else drop without it)."""
    return plan.kept_tokens + summary_tokens + budget.min_output <= budget.window - budget.margin


def transcript_room(budget: Budget, prompt_tokens: int, summary_room: int) -> int:
    """Tokens the summariser's transcript may take: the window minus its prompt, the summary's
    room and the margin."""
    return max(0, budget.window - budget.margin - prompt_tokens - summary_room)


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


# --- learning from the backend -------------------------------------------------------------------

_WINDOW_PATTERNS = (
    re.compile(r"maximum context length is (\d+)", re.I),  # OpenAI, vLLM
    re.compile(r"context (?:size|window|length)[^\d]{0,20}\((\d+) tokens\)", re.I),  # llama.cpp
    re.compile(r"context (?:size|window|length) (?:of |is )?(\d+)", re.I),
    re.compile(r"\d+\s*>=?\s*(\d+)"),  # LiteRT-LM: "... allowed: 1045 >= 1024"
)
_TOKENS_PATTERNS = (
    re.compile(r"resulted in (\d+) tokens", re.I),  # OpenAI
    re.compile(r"requested (\d+) tokens", re.I),  # vLLM
    re.compile(r"(\d+)\s*>=?\s*\d+"),  # LiteRT-LM
)
_OVERFLOW_WORDS = re.compile(
    r"context[_ ]length[_ ]exceeded|maximum context length|exceed(?:s|ed)? the (?:available )?"
    r"context|context (?:size|window) (?:exceeded|is full)|too many tokens|input token ids are "
    r"too long|prompt is too long|exceed_context_size",
    re.I,
)


def is_overflow_text(text: str) -> bool:
    """Whether a backend's error text says the context window overflowed."""
    return bool(_OVERFLOW_WORDS.search(text))


def window_from_text(text: str) -> int | None:
    """The window size a backend's overflow message names, if any."""
    for pattern in _WINDOW_PATTERNS:
        match = pattern.search(text)
        if match:
            return int(match.group(1))
    return None


def tokens_from_text(text: str) -> int | None:
    """The prompt size a backend's overflow message names, if any."""
    for pattern in _TOKENS_PATTERNS:
        match = pattern.search(text)
        if match:
            return int(match.group(1))
    return None


def learned_window(
    known: int | None, reported: int | None, sent_tokens: int
) -> int:
    """The window to use after an overflow: the one the server named; else (it did not say) an
    upper bound below what was just refused — ``sent_tokens`` is our count of that request —
    and never more than a window already known."""
    if reported:
        return reported
    guess = max(64, int(sent_tokens * 0.9))
    return min(known, guess) if known else guess
