"""Context-window budgeting (docs/CONTEXT.md): pure decisions, no I/O.

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

from agentik.context.budget import (
    KEEP_SHARE,
    OUTPUT_CAP,
    OUTPUT_SHARE,
    SUMMARY_CAP,
    SUMMARY_SHARE,
    Budget,
    make_budget,
    margin_for,
    output_budget,
    summary_budget,
)
from agentik.context.decision import (
    Compact,
    Decision,
    Fits,
    TooBig,
    cut_summary,
    cut_transcript,
    decide,
    last_resort,
    summary_fits,
    too_big_message,
    transcript_room,
)
from agentik.context.estimate import (
    ESTIMATE_IMAGE_TOKENS,
    ESTIMATE_MESSAGE_OVERHEAD,
    content_text,
    estimate_item,
    estimate_tokens,
    images_in,
    item_text,
)
from agentik.context.overflow import (
    is_overflow_text,
    learned_window,
    tokens_from_text,
    window_from_text,
)

__all__ = [
    "ESTIMATE_IMAGE_TOKENS",
    "ESTIMATE_MESSAGE_OVERHEAD",
    "KEEP_SHARE",
    "OUTPUT_CAP",
    "OUTPUT_SHARE",
    "SUMMARY_CAP",
    "SUMMARY_SHARE",
    "Budget",
    "Compact",
    "Decision",
    "Fits",
    "TooBig",
    "content_text",
    "cut_summary",
    "cut_transcript",
    "decide",
    "estimate_item",
    "estimate_tokens",
    "images_in",
    "is_overflow_text",
    "item_text",
    "last_resort",
    "learned_window",
    "make_budget",
    "margin_for",
    "output_budget",
    "summary_budget",
    "summary_fits",
    "tokens_from_text",
    "too_big_message",
    "transcript_room",
    "window_from_text",
]
