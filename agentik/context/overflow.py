"""Learning from the backend: whether its error text says the context overflowed, and the
window and prompt sizes it names (OpenAI, vLLM, llama.cpp, LiteRT-LM)."""

from __future__ import annotations

import re

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


def _first_number(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for pattern in patterns:
        match = pattern.search(text)
        if match:
            return int(match.group(1))
    return None


def window_from_text(text: str) -> int | None:
    """The window size a backend's overflow message names, if any."""
    return _first_number(_WINDOW_PATTERNS, text)


def tokens_from_text(text: str) -> int | None:
    """The prompt size a backend's overflow message names, if any."""
    return _first_number(_TOKENS_PATTERNS, text)


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
