"""Row arrays of the commit statement, dumped in PostgreSQL's binary array format in one pass.

A commit statement carries ~20 arrays of up to a few hundred elements (``pg.statement``).
psycopg's generic list dumper scans each list for its element type and dumps each element
through a per-element dumper call; the statement knows its element types, so each array is a
typed list (:class:`Int8s`, :class:`Texts`, ...) whose dumper writes the whole array at once:
about a third of the client's CPU per batch was this dumping.

The format (PostgreSQL's ``array_send``): ndim, has-null flag, element oid, then per dimension
its length and lower bound (1), then each element as its length (-1: NULL) and its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from psycopg import adapters, pq
from psycopg.adapt import Dumper

_HEAD = struct.Struct("!iiIii").pack
_EMPTY = struct.Struct("!iiI").pack
_LEN = struct.Struct("!i").pack
_NULL = _LEN(-1)
_TRUE, _FALSE = b"\x00\x00\x00\x01\x01", b"\x00\x00\x00\x01\x00"

# element oids and their array oids (pg_type)
_BOOL, _BYTEA, _INT8_OID, _TEXT, _FLOAT8_OID = 16, 17, 20, 25, 701
_ARRAY_OID = {_BOOL: 1000, _BYTEA: 1001, _INT8_OID: 1016, _TEXT: 1009, _FLOAT8_OID: 1022}


class Int8s(list[int]):
    """A bigint[] parameter."""


class Float8s(list[float]):
    """A double precision[] parameter."""


class Bools(list[bool]):
    """A boolean[] parameter."""


class Texts(list[str | None]):
    """A text[] parameter (NULLs allowed)."""


class Byteas(list[bytes]):
    """A bytea[] parameter."""


class _Prefixes(dict[int, bytes]):
    """Length -> its 4-byte prefix, made once (a ``struct`` pack is the dearest part of an
    element); lengths past the first few thousand seen are packed each time."""

    def __missing__(self, n: int) -> bytes:
        prefix = _LEN(n)
        if len(self) < 4096:
            self[n] = prefix
        return prefix


_prefix = _Prefixes().__getitem__


@lru_cache(maxsize=64)
def _fixed(code: str, n: int) -> Callable[..., bytes]:
    """The packer of ``n`` fixed-size elements (``code``: their length and value)."""
    return struct.Struct("!" + code * n).pack


def _fixed_body(code: str, items: list[Any]) -> bytes:
    fields: list[Any] = [8] * (2 * len(items))
    fields[1::2] = items
    return _fixed(code, len(items))(*fields)


def _varlen_body(items: list[Any], text: bool) -> bytes:
    """The elements of a text or bytea array in C-level passes: a column of one repeated value
    (a batch's conversation, kind, type, state) is one element repeated; values of one length
    (ids) are joined around their one prefix. Raises TypeError at a NULL (None has neither an
    ``encode`` nor a length; AttributeError for a column of NULLs): the caller then takes the
    slow path, with no scan for one first."""
    n = len(items)
    first = items[0]
    if items.count(first) == n:
        data = first.encode() if text else first
        return (_prefix(len(data)) + data) * n
    values: list[bytes] = list(map(str.encode, items)) if text else items
    lengths = list(map(len, values))
    if lengths.count(lengths[0]) == n:
        prefix = _prefix(lengths[0])
        return prefix + prefix.join(values)
    parts: list[bytes] = [b""] * (2 * n)
    parts[::2] = map(_prefix, lengths)
    parts[1::2] = values
    return b"".join(parts)


def _with_nulls(items: list[Any], text: bool) -> bytes:
    parts: list[bytes] = []
    for item in items:
        if item is None:
            parts.append(_NULL)
            continue
        data = item.encode() if text else item
        parts.append(_LEN(len(data)))
        parts.append(data)
    return b"".join(parts)


def _dump(oid: int, items: list[Any]) -> bytes:
    n = len(items)
    if not n:
        return _EMPTY(0, 0, oid)
    if oid == _INT8_OID:
        return _HEAD(1, 0, oid, n, 1) + _fixed_body("iq", items)
    if oid == _FLOAT8_OID:
        return _HEAD(1, 0, oid, n, 1) + _fixed_body("id", items)
    if oid == _BOOL:
        return _HEAD(1, 0, oid, n, 1) + b"".join([_TRUE if v else _FALSE for v in items])
    text = oid == _TEXT
    try:
        return _HEAD(1, 0, oid, n, 1) + _varlen_body(items, text)
    except (TypeError, AttributeError):  # a NULL (None.encode, len(None))
        return _HEAD(1, 1, oid, n, 1) + _with_nulls(items, text)


def _dumper(element_oid: int) -> type[Dumper]:
    class ArrayDumper(Dumper):
        format = pq.Format.BINARY
        oid = _ARRAY_OID[element_oid]

        def dump(self, obj: Any) -> bytes:
            return _dump(element_oid, obj)

    return ArrayDumper


for _cls, _oid in ((Int8s, _INT8_OID), (Float8s, _FLOAT8_OID), (Bools, _BOOL), (Texts, _TEXT),
                   (Byteas, _BYTEA)):
    adapters.register_dumper(_cls, _dumper(_oid))
