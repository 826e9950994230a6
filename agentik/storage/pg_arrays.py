"""Row arrays of the commit statement, dumped in PostgreSQL's binary array format in one pass.

A commit statement carries ~20 arrays of up to a few hundred elements (``pg_statement``).
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
from typing import Any

from psycopg import adapters, pq
from psycopg.adapt import Dumper

_HEAD = struct.Struct("!iiIii").pack
_EMPTY = struct.Struct("!iiI").pack
_LEN = struct.Struct("!i").pack
_NULL = _LEN(-1)
_INT8 = struct.Struct("!iq").pack
_FLOAT8 = struct.Struct("!id").pack
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


def _varlen(items: list[Any], encode: Callable[[Any], bytes] | None) -> tuple[list[bytes], int]:
    parts: list[bytes] = []
    hasnull = 0
    for item in items:
        if item is None:
            parts.append(_NULL)
            hasnull = 1
            continue
        data = encode(item) if encode is not None else item
        parts.append(_LEN(len(data)))
        parts.append(data)
    return parts, hasnull


def _dump(oid: int, items: list[Any]) -> bytes:
    if not items:
        return _EMPTY(0, 0, oid)
    if oid == _INT8_OID:
        return _HEAD(1, 0, oid, len(items), 1) + b"".join([_INT8(8, v) for v in items])
    if oid == _FLOAT8_OID:
        return _HEAD(1, 0, oid, len(items), 1) + b"".join([_FLOAT8(8, v) for v in items])
    if oid == _BOOL:
        return _HEAD(1, 0, oid, len(items), 1) + b"".join(
            [_TRUE if v else _FALSE for v in items])
    parts, hasnull = _varlen(items, str.encode if oid == _TEXT else None)
    return _HEAD(1, hasnull, oid, len(items), 1) + b"".join(parts)


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
