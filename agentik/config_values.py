"""The rule for each kind of setting value, once for every setting (:mod:`agentik.config` names
which kind each variable is; docs/CONFIG.md says the rules to users). Each parser takes the raw
text and returns the value or raises ValueError saying what is wrong, which ``Config.from_env``
turns into one ConfigError line naming the variable.

- integers: ASCII digits only (no sign, no ``_``, no full-width digits, no exponent), within
  their type's range: a C int (:data:`INT_MAX`) unless narrower (a port 0..65535, a listen
  backlog 1..65535), so no value can overflow where it is used;
- seconds: an ASCII decimal number (``2.5``, ``1e3``), finite, at least a millisecond and at
  most a year (a database timeout at most 24 days: PostgreSQL takes milliseconds in a C int);
- tokens (bearer tokens, an API key): printable ASCII without spaces, never echoed back;
- URLs: ``http://`` or ``https://`` with a host (and a valid port), printable ASCII;
- CORS origins: ``scheme://host[:port]`` with no path, query or user, or ``*`` alone;
- lines (names, ids, the model): non-empty, printable, no control characters.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Callable

#: the largest integer setting: a C int, what every consumer takes (the garbage collector's
#: threshold, socket and thread counts, SQLite's limits)
INT_MAX = 2**31 - 1
#: seconds settings: at least a millisecond, at most a year
SECONDS_MIN, SECONDS_MAX = 0.001, 365 * 24 * 3600.0
#: a database timeout: PostgreSQL's statement and lock timeouts are milliseconds in a C int
DB_SECONDS_MAX = 24 * 24 * 3600.0

_DIGITS = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_TOKEN = re.compile(r"[!-~]+")  # printable ASCII, no space


def integer(low: int, high: int = INT_MAX) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        text = raw.strip()
        if not _DIGITS.fullmatch(text):
            raise ValueError(f"must be an integer in ASCII digits, {low}..{high}")
        # Compared as text first: int() of thousands of digits is slow, and refused anyway.
        if len(text.lstrip("0")) > len(str(high)) or not low <= int(text) <= high:
            raise ValueError(f"must be {low}..{high}")
        return int(text)

    return parse


port = integer(0, 65535)
backlog = integer(1, 65535)
positive_int = integer(1)
non_negative_int = integer(0)


def number(low: float, high: float, unit: str = "") -> Callable[[str], float]:
    """An ASCII decimal number (``2.5``, ``.5``, ``1e3``), finite, within ``low..high``."""

    def parse(raw: str) -> float:
        text = raw.strip()
        if not _DECIMAL.fullmatch(text):
            raise ValueError(f"must be a number{unit and ' of ' + unit} in ASCII digits "
                             "(e.g. 2.5)")
        value = float(text)
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError(f"must be {low:g}..{high:.15g}{unit and ' ' + unit}")
        return value

    return parse


def seconds_up_to(high: float) -> Callable[[str], float]:
    return number(SECONDS_MIN, high, "seconds")


seconds = seconds_up_to(SECONDS_MAX)


def seconds_or_zero(raw: str) -> float:
    """:data:`seconds`, or 0 (a wait without a limit)."""
    text = raw.strip()
    if _DECIMAL.fullmatch(text) and float(text) == 0:
        return 0.0
    try:
        return seconds(raw)
    except ValueError as exc:
        raise ValueError(f"{exc}, or 0 (no limit)") from None
db_seconds = seconds_up_to(DB_SECONDS_MAX)


def line(raw: str) -> str:
    """Non-empty printable text on one line (a name, an id, a model)."""
    text = raw.strip()
    if not text:
        raise ValueError("must not be blank")
    if not text.isprintable():
        raise ValueError("must be printable text (no control characters)")
    return text


def token(raw: str) -> str:
    text = raw.strip()
    if not _TOKEN.fullmatch(text):
        raise ValueError("must be printable ASCII without spaces")
    return text


def tokens(raw: str) -> tuple[str, ...]:
    items = tuple(t.strip() for t in raw.split(",") if t.strip())
    if not items:
        raise ValueError("no token in the list")
    for i, item in enumerate(items, 1):
        if not _TOKEN.fullmatch(item):
            raise ValueError(f"token {i} of the list must be printable ASCII without spaces")
    return items


def _split(raw: str) -> urllib.parse.SplitResult:
    text = raw.strip()
    if not _TOKEN.fullmatch(text):
        raise ValueError("must be printable ASCII without spaces")
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError("must start with http:// or https://")
    if not parts.hostname:
        raise ValueError("must name a host (http://host[:port]...)")
    try:
        parts.port  # noqa: B018 - read for its check: a port out of range or not a number
    except ValueError as exc:
        raise ValueError(f"has a bad port ({exc})") from None
    return parts


def url(raw: str) -> str:
    _split(raw)
    return raw.strip()


def origins(raw: str) -> tuple[str, ...]:
    items = tuple(o.strip().removesuffix("/") for o in raw.split(",") if o.strip())
    if not items:
        raise ValueError("no origin in the list")
    if "*" in items and len(items) > 1:
        raise ValueError("* allows every origin: it must be alone")
    for item in items:
        if item == "*":
            continue
        try:
            parts = _split(item)
        except ValueError as exc:
            raise ValueError(f"origin {item[:200]!r} {exc}") from None
        if parts.path or "?" in item or "#" in item or "@" in parts.netloc:
            raise ValueError(f"origin {item[:200]!r} must be scheme://host[:port] "
                             "(no path, query, fragment or user)")
    return items


def postgres_url(raw: str) -> str:
    text = raw.strip()
    if not text.startswith(("postgresql://", "postgres://")):
        raise ValueError("must start with postgresql:// (PostgreSQL is the only database URL)")
    if not text.isprintable():
        raise ValueError("must be printable text (no control characters)")
    return text


def choice(*choices: str, upper: bool = False) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().upper() if upper else raw.strip().lower()
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse
