"""Fencing: the lease checks every PostgreSQL commit carries (a cluster node, ``pg.lease``).

For the conversations of a batch, the commit statement (``pg.statement``) checks that this node's
fences are still current (a conversation it holds) and that no other live node owns one it holds
no lease for. A batch failing a check stores nothing; :func:`refusals` then reads the owners to
decide which ops to refuse and why (LeaseLostError: the local actor is stopped; NotOwnerError:
the command is forwarded to the owner), and the rest of the batch is planned again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from agentik.errors import AgentikError, LeaseLostError, NotOwnerError
from agentik.storage import ops
from agentik.storage.pg.plan import Plan

#: SQL condition: conversation ``c`` is owned by another live node (params ``me``, ``ttl``)
LIVE_OTHER_OWNER = (
    "EXISTS (SELECT 1 FROM conv_owner x JOIN nodes y ON y.node_id = x.node_id "
    "WHERE x.conversation_id = c.id AND x.node_id <> %(me)s "
    "AND y.heartbeat_at > now() - make_interval(secs => %(ttl)s))"
)


@dataclass
class Ownership:
    """What a batch's statement checks: this node's fences for the conversations it holds, and
    the conversations it holds none for. Empty for a single node (no leases)."""

    node_id: str = ""
    ttl: float = 0.0
    fenced: list[str] = field(default_factory=list)
    fences: list[int] = field(default_factory=list)
    unfenced: list[str] = field(default_factory=list)


def node_of(leases: Any) -> tuple[str, float]:
    """(node id, lease TTL) of ``leases``; ("", 0) without leases."""
    if leases is None:
        return "", 0.0
    return str(leases.node_id), float(leases.ttl)


def ownership(p: Plan, leases: Any) -> Ownership:
    """The checks for the conversations ``p`` touches (those it creates are its own, fence 1)."""
    node_id, ttl = node_of(leases)
    own = Ownership(node_id, ttl)
    if leases is None:
        return own
    created = set(p.created)
    for cid in p.conv:
        if cid in created:
            continue
        fence = leases.fences.get(cid)
        if fence is None:
            own.unfenced.append(cid)
        else:
            own.fenced.append(cid)
            own.fences.append(fence)
    return own


def refusals(
    conn: psycopg.Connection[Any], leases: Any, batch: list[ops.AnyOp],
    refused: dict[int, AgentikError],
) -> dict[int, AgentikError]:
    """After a batch failed its lease checks: which ops to refuse, and why."""
    me, ttl = node_of(leases)
    cids = sorted({cid for op in batch
                   if isinstance(cid := getattr(op, "conversation_id", None), str)})
    rows = conn.execute(
        "SELECT x.conversation_id, x.node_id, x.fence, y.addr, "
        "COALESCE(y.heartbeat_at > now() - make_interval(secs => %s), false) "
        "FROM conv_owner x LEFT JOIN nodes y ON y.node_id = x.node_id "
        "WHERE x.conversation_id = ANY(%s::text[])", (ttl, cids),
    ).fetchall()
    owners = {r[0]: r for r in rows}
    out: dict[int, AgentikError] = {}
    for i, op in enumerate(batch):
        cid = getattr(op, "conversation_id", None)
        if i in refused or not isinstance(cid, str) or isinstance(op, ops.CreateConversation):
            continue
        row = owners.get(cid)
        fence = leases.fences.get(cid) if leases is not None else None
        if fence is not None:
            if row is None or row[1] != me or row[2] != fence:
                out[i] = LeaseLostError(f"this node's lease on conversation {cid!r} was taken")
        elif row is not None and row[1] != me and row[4]:
            out[i] = NotOwnerError(f"conversation {cid!r} is owned by node {row[1]!r}",
                                   node_id=row[1], addr=row[3])
    if not out:  # e.g. a start-up op over many conversations met a fresh owner: retry whole
        out = {i: NotOwnerError("a conversation of this op is owned by another node",
                                node_id="", addr=None)
               for i, op in enumerate(batch)
               if i not in refused and isinstance(op, ops.RecoverTurns | ops.PurgeTemporary)}
    return out
