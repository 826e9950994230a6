"""A PostgreSQL batch in flight, and planning the next one while it runs.

The writer thread (``committer``) keeps the server busy: while batch k's statement runs on the
server (sent by ``pg.send.Sender``), the thread takes batch k+1 and plans it in Python
(``PgWriter.follow``) as if k had committed: its conversation rows are k's plan's rows as k
leaves them. No read is made for it, so only a batch whose plan needs nothing but those rows (or
rows the writer remembers, ``PgWriter._known``) can follow: ops on existing conversations with
no Idempotency-Key (a key, an A2A task, a start-up op, a compaction, a new conversation, a
rechecked retry, ``ops.rechecked``, each need a read first).

Why it is safe: k+1 is sent only after k's answer came back and only when k committed exactly as
planned (``Flight.exact``); else k+1 is planned again from a read. And the statement of k+1
checks every row it took from k or from memory (``pg.statement``'s ``k`` part: the row's seq and
its last working-memory index), so a row changed by anybody else in between makes k+1 store
nothing and be planned again from a read (``PgWriter.land``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentik.storage import ops
from agentik.storage.pg.plan import Conv, Plan

#: ops whose plan needs only the rows of the conversation they name (by exact type: an
#: ``isinstance`` goes through msgspec's metaclass)
_FOLLOWABLE = frozenset({ops.AppendUserMessage, ops.StartTurn, ops.AppendToolCalls,
                         ops.AppendToolResult, ops.FinishTurn, ops.RenameConversation,
                         ops.DeleteConversation})

#: a remembered row to check in the statement: (conversation id, its seq, its last
#: working-memory index); the seq of a row taken from the flight before is that flight's row,
#: known once it has landed
Known = tuple[str, int | Conv, int]


@dataclass(eq=False)
class Flight:
    ops: list[ops.AnyOp]
    plan: Plan
    #: per op: ``pg.plan.Result`` (a function of the base offset), or the AgentikError refusing it
    results: list[Any]
    known: list[Known] = field(default_factory=list)
    #: the flight this one was planned after (``PgWriter.follow``), until it is sent
    after: Flight | None = None
    #: the batch's base offset, once landed
    base: int | None = None
    #: landed as planned (not planned again after a failed check): a flight may follow it
    exact: bool = False
    #: a followed flight's statement, dumped while the flight before ran (``pg.send.Dumped``)
    dumped: Any = None


def seed_after(p: Plan, batch: list[ops.AnyOp], after: Flight,
               remembered: dict[str, Conv]) -> list[Known] | None:
    """Put into ``p`` the rows ``batch`` needs as ``after`` leaves them (else as remembered);
    the rows to check, or None when ``batch`` needs a read (it cannot follow)."""
    known: list[Known] = []
    seen: set[str] = set()
    for op in batch:
        if (type(op) not in _FOLLOWABLE or getattr(op, "idempotency", None) is not None
                or getattr(op, "recheck", False)):  # a key, a recheck: a read first
            return None
        cid: str = op.conversation_id  # type: ignore[union-attr,assignment]
        if cid in seen:
            continue
        seen.add(cid)
        if cid in after.plan.conv:
            conv = after.plan.conv[cid]
            if conv is None:  # deleted by ``after``: gone, if it commits
                p.conv[cid] = None
                continue
            p.conv[cid] = Conv(cid, conv.title, conv.is_temporal, conv.created_at,
                               conv.updated_at, None, None, True, conv.max_order, conv.agent,
                               conv.instructions)
            known.append((cid, conv, conv.max_order))
            continue
        mem = remembered.get(cid)
        if mem is None or mem.seq is None:
            return None
        p.conv[cid] = mem
        known.append((cid, mem.seq, mem.max_order))
    return known


def resolve(known: list[Known], after: Flight | None) -> list[tuple[str, int, int]]:
    """``known`` with the seqs of rows taken from ``after`` (landed) filled in."""
    out: list[tuple[str, int, int]] = []
    for cid, row, max_order in known:
        if isinstance(row, Conv):
            assert after is not None and after.base is not None
            seq = row.seq if row.rel is None else after.base + row.rel
            assert seq is not None
        else:
            seq = row
        out.append((cid, seq, max_order))
    return out
