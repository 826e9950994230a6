"""What a request may put into a log line (issue 11 #6 and #7), in one place.

- Secrets never reach a log: the value of every query parameter whose name, decoded (percent and
  ``+``, repeatedly, so ``access%5Ftoken`` and ``access%255Ftoken`` count), contains ``token`` or
  ``authorization`` is replaced by ``***``, for every occurrence, with ``&`` and ``;`` both taken as
  separators; and any configured token found anywhere in the line (path, query, client id, in
  clear or percent-encoded) is replaced too. The Authorization header is never logged.
- No forged lines: control characters (CR, LF, NUL, ESC, ...), other non-printable characters
  (U+2028, ...) and the backslash are written as escapes (``\\n``, ``\\x1b``, ``\\u2028``, ``\\\\``),
  so one request is one line that says exactly what came in.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import unquote_plus

_SEPARATORS = re.compile(r"([&;])")
_SECRET_NAMES = ("token", "authorization")
MASK = "***"


def escape(text: str) -> str:
    """``text`` with every non-printable character and the backslash escaped."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(
        ch if ch.isprintable() and ch != "\\" else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )


def _decoded(text: str) -> str:
    """``text`` percent- and plus-decoded until it no longer changes (at most 5 times)."""
    for _ in range(5):
        decoded = unquote_plus(text, encoding="latin-1")
        if decoded == text:
            break
        text = decoded
    return text


def _has_secret(text: str, secrets: Sequence[str]) -> bool:
    return any(secret and secret in text for secret in secrets)


def safe_query(query: str, secrets: Sequence[str] = ()) -> str:
    """The query string for a log line: secret values masked, the rest escaped."""
    out: list[str] = []
    for part in _SEPARATORS.split(query):
        if part in ("&", ";"):
            out.append(part)
            continue
        name, eq, _value = part.partition("=")
        plain_name = _decoded(name)
        if _has_secret(plain_name, secrets):
            out.append(MASK)
        elif any(word in plain_name.lower() for word in _SECRET_NAMES):
            out.append(escape(name) + "=" + MASK if eq else escape(name))
        elif _has_secret(_decoded(part), secrets):
            out.append(escape(name) + "=" + MASK)
        else:
            out.append(escape(part))
    return "".join(out)


def safe_text(text: str, secrets: Sequence[str] = ()) -> str:
    """A request value (path, client id, ...) for a log line: escaped, configured tokens masked."""
    if _has_secret(_decoded(text), secrets):
        for secret in secrets:
            if secret:
                text = text.replace(secret, MASK)
        if _has_secret(_decoded(text), secrets):  # hidden by an encoding: drop it all
            return MASK
    return escape(text)
