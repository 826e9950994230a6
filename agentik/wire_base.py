"""The base of agentik's wire types and the one rule for offsets (re-exported by
:mod:`agentik.wire`, where every type is defined; here so that :mod:`agentik.wire_pause` can
build on them without a cycle)."""

from __future__ import annotations

import re

import msgspec

#: the largest cursor offset (and seq, count or offset in a query): what SQLite's INTEGER holds
MAX_OFFSET = 2**63 - 1
_OFFSET = re.compile(r"[0-9]{1,19}")


def parse_offset(text: str) -> int | None:
    """The one rule for a cursor offset and every integer in a request (``after=``,
    ``Last-Event-ID``, the WebSocket's ``after``, ``limit``/``offset``/``after_seq`` query
    parameters, the client reading a server's cursor): 1 to 19 ASCII digits, at most
    :data:`MAX_OFFSET`; None for anything else. Not ``int()`` / ``str.isdigit()``: they take
    "²", Arabic-Indic and full-width digits, signs, spaces and ``_``, and a 5,000-digit string
    hits Python's int-string limit (a 500)."""
    if _OFFSET.fullmatch(text) is None:
        return None
    value = int(text)
    return value if value <= MAX_OFFSET else None


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """Base of plain (untagged) wire structs."""


class Tagged(Wire, frozen=True, kw_only=True, tag_field="type", tag=_snake):
    """Base of union members: encoded with a ``type`` tag."""
