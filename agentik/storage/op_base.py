"""What every op is made of (:class:`Op`, its result type) and the idempotency rule
(:class:`Idempotency`, :func:`replay`): apart from ``storage/ops.py``, which re-exports them, so
ops defined in modules of their own (``ops_branch.py``) can use them too."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

from agentik.errors import IdempotencyKeyReusedError

R_co = TypeVar("R_co", covariant=True)
#: any op (``rechecked`` keeps its type)
OpT = TypeVar("OpT", bound="Op[Any]")


class Op(msgspec.Struct, Generic[R_co], frozen=True, kw_only=True):
    """An op whose result (what ``Storage.write`` returns once it is stored) is an ``R_co``."""


class Idempotency(msgspec.Struct, frozen=True, kw_only=True):
    """An ``Idempotency-Key`` stored with the write it came with, in the same transaction
    (table ``idempotency_key``). A key already stored and not expired makes the write a replay:
    nothing is written and the op's result is :class:`Replayed` (same ``fingerprint``) or
    IdempotencyKeyReusedError (another one). ``fingerprint`` covers the route, the
    conversation and the body. The PostgreSQL engine must keep the same contract."""

    key: str
    fingerprint: str
    #: seconds the key is remembered (AGENTIK_IDEMPOTENCY_TTL)
    ttl: float


class Replayed(msgspec.Struct, frozen=True, kw_only=True):
    """The result of an idempotent op whose key was already stored: the id its first write
    returned (a message id, a conversation id)."""

    result_id: str


def replay(stored: tuple[str, str] | None, idem: Idempotency) -> Replayed | None:
    """The one idempotency rule (both engines' writes and the registry's read before one):
    ``stored`` is (fingerprint, result id) kept under ``idem.key`` and not expired. None: the
    key is free (the write goes ahead and keeps it); the same fingerprint: the write is a replay
    of the one that stored it; another: IdempotencyKeyReusedError."""
    if stored is None:
        return None
    fingerprint, result_id = stored
    if fingerprint != idem.fingerprint:
        raise IdempotencyKeyReusedError(
            "this Idempotency-Key was already used with another request")
    return Replayed(result_id=result_id)
