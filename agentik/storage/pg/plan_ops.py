"""The PostgreSQL engine's side of the ops (``storage/apply.py``): :class:`PgTarget`, each
primitive planned into a batch's :class:`~agentik.storage.pg.plan.Plan` (rows at batch-relative
offsets, committed by one statement). No savepoint can roll an op back, so every op checks first
(``apply`` is written so: a refusal, AgentikError, takes nothing and leaves no hole). A journal
record is its batch-relative offset (``Rec`` int) and a result what makes it from the batch's
base offset (``pg.plan.Result``; a list of records is a list of such offsets).
:func:`read_found` is the one read a batch's rechecks need.
"""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg

from agentik.errors import AgentikError
from agentik.storage import apply, ops
from agentik.storage.pg.plan import Conv, Found, Plan, Result, const
from agentik.storage.target import RecordEvent, Target
from agentik.wire import (
    AgentEvent,
    ConversationRecord,
    DurableEvent,
    Message,
    MessageRecord,
    WorkingItem,
    decode_message,
    decode_working_item,
)

#: the highest order_idx a working-memory range may name (the statement's int column)
_TOP = 2**31 - 1


class PgTarget:
    """``Target`` (``storage/target.py``) on one batch's plan."""

    __slots__ = ("_recovered", "now", "p")

    def __init__(self, p: Plan) -> None:
        self.p, self.now = p, p.now
        #: RecoverTurns: (conversation filter, its orphans) until ``drop_turns``
        self._recovered: dict[str | None, list[tuple[str, str]]] = {}

    # --- checks and reads -----------------------------------------------------------------------

    def require(self, conversation_id: str) -> None:
        self.p.require(conversation_id)

    def exists(self, conversation_id: str) -> bool:
        return self.p.conv.get(conversation_id) is not None

    def idempotency(self, key: str) -> tuple[str, str] | None:
        return self.p.idem.get(key)

    def task_seq(self, task_id: str) -> int | str | None:
        stored = self.p.tasks.get(task_id)
        return "changed in this batch" if isinstance(stored, tuple) else stored

    def open_turns(self, conversation_id: str | None) -> list[tuple[str, str]]:
        live, orphans = self.p.open_turns.pop(conversation_id, ([], []))
        turns = [(cid, turn_id) for cid, turn_id in live if self.p.conv.get(cid) is not None]
        self._recovered[conversation_id] = turns + orphans
        return turns

    def turn_calls(self, conversation_id: str, turn_id: str) -> list[Message]:
        return self.p.turn_calls.get((conversation_id, turn_id), [])

    def temporary(self) -> list[str]:
        ids, self.p.temporary = self.p.temporary or [], []
        return ids

    def stored_records(self, ids: tuple[str, ...]) -> list[MessageRecord]:
        records = _found(self.p).records
        return [records[i] for i in ids if i in records]

    def turn_open(self, conversation_id: str, turn_id: str) -> bool:
        return (conversation_id, turn_id) in _found(self.p).turns or turn_id in self.p.turns

    def started(self, conversation_id: str, turn_id: str) -> bool:
        return (conversation_id, turn_id) in _found(self.p).started

    def compacted(self, op: ops.Compact) -> bool:
        return (op.conversation_id, op.before_order_idx) in _found(self.p).compacted

    # --- writes ---------------------------------------------------------------------------------

    def alloc(self) -> int:
        p = self.p
        p.n += 1
        return p.n

    def emit(self, seq: int, conversation_id: str | None,
             event: DurableEvent | AgentEvent) -> None:
        self.p.emit(seq, conversation_id, event)

    def journal(self, conversation_id: str, message_id: str, message: Message,
                event: type[RecordEvent]) -> int:
        p = self.p
        return p.journal(p.require(conversation_id), message_id, message, event)

    def new_conversation(self, op: ops.CreateConversation, seq: int) -> ConversationRecord:
        p = self.p
        conv = Conv(op.conversation_id, op.title, op.is_temporal, p.now, p.now, None, seq,
                    in_db=False, max_order=0, agent=op.agent, instructions=op.instructions)
        p.conv[conv.id] = conv
        p.created.append(conv.id)
        return conv.record(-seq)  # seq 0: stamped on read (``pg.queries.stamp``)

    def rename(self, conversation_id: str, title: str | None, seq: int) -> None:
        p = self.p
        p.bump(p.require(conversation_id), seq, touch=True, rename=(title,))

    def bump(self, conversation_id: str, seq: int, *, touch: bool = False) -> None:
        p = self.p
        p.bump(p.require(conversation_id), seq, touch=touch)

    def remember(self, conversation_id: str, item: WorkingItem, source: str | None) -> None:
        self.p.remember(conversation_id, item, source)

    def forget(self, conversation_id: str, from_idx: int) -> None:
        """The stored items from ``from_idx`` on go (the statement's working-memory cut) and so
        do those this batch planned; the next item's index is taken after what is left (as
        SQLite's ``MAX(order_idx) + 1``: a remembered row the statement finds otherwise is read
        again)."""
        p = self.p
        p.memory_cut.append((conversation_id, from_idx, _TOP))
        p.memory = [m for m in p.memory if m[0] != conversation_id or m[1] < from_idx]
        conv = p.require(conversation_id)
        if conv.max_order >= from_idx:
            p.conv[conversation_id] = Conv(conv.id, conv.title, conv.is_temporal, conv.created_at,
                                           conv.updated_at, conv.seq, conv.rel, conv.in_db,
                                           from_idx - 1, conv.agent, conv.instructions)

    def compact(self, conversation_id: str, before_idx: int, summary: WorkingItem | None) -> None:
        p = self.p
        first = p.compact_first.get(conversation_id)
        p.memory_cut.append((conversation_id, first if first is not None else before_idx,
                             before_idx))
        if summary is not None and first is not None:
            p.remember(conversation_id, summary, None, order_idx=first)

    def open_turn(self, conversation_id: str, turn_id: str, running: bool, user: int) -> None:
        self.p.turns[turn_id] = (conversation_id, "running" if running else "queued", user)

    def run_turn(self, conversation_id: str, turn_id: str, *, waiting: bool = False) -> None:
        p = self.p
        state = "waiting" if waiting else "running"
        queued = p.turns.get(turn_id)
        if queued is not None:
            p.turns[turn_id] = (queued[0], state, queued[2])
        else:
            p.turns_running.append((conversation_id, turn_id, state))

    def close_turn(self, conversation_id: str, turn_id: str) -> None:
        p = self.p
        if p.turns.pop(turn_id, None) is None:
            p.turns_deleted.append((conversation_id, turn_id))

    def drop_turns(self, conversation_id: str | None) -> None:
        self.p.turns_deleted.extend(self._recovered.pop(conversation_id, []))

    def drop_conversation(self, conversation_id: str) -> str:
        agent = self.p.require(conversation_id).agent
        self.p.drop(conversation_id)
        return agent

    def put_task(self, op: ops.PutA2ATask, seq: int) -> None:
        p = self.p
        p.tasks[op.task_id] = ("rel", seq)
        p.task_rows.append((op.task_id, op.context_id, op.conversation_id, op.state, seq, op.task))

    def webhook_exists(self, webhook_id: str) -> bool:
        return self.p.hooks.get(webhook_id, False)

    def put_webhook(self, op: ops.PutWebhook, new: bool) -> None:
        p = self.p
        p.hooks[op.spec.id] = True
        progress = None
        if op.spec.id in p.hooks_deleted:  # deleted, then made again by this batch: one change
            p.hooks_deleted.remove(op.spec.id)
            op = msgspec.structs.replace(op, replace=True)
            progress = ops.WebhookProgress(webhook_id=op.spec.id, after=op.after)
        p.hook_rows[op.spec.id] = (op, progress)

    def drop_webhook(self, webhook_id: str) -> None:
        p = self.p
        p.hooks[webhook_id] = False
        # what this batch planned for it goes too (the statement cannot see its own inserts)
        p.hook_rows.pop(webhook_id, None)
        p.hook_progress = [g for g in p.hook_progress if g.webhook_id != webhook_id]
        p.hook_log = [g for g in p.hook_log if g[0] != webhook_id]
        p.hooks_deleted.append(webhook_id)

    def webhook_progress(self, op: ops.WebhookProgress) -> None:
        p = self.p
        planned = p.hook_rows.get(op.webhook_id)
        if planned is not None:  # its row is written by this statement: with this progress
            p.hook_rows[op.webhook_id] = (planned[0], op)
        else:
            p.hook_progress.append(op)
        p.hook_log.extend((op.webhook_id, line) for line in op.log)

    def keep_key(self, idem: ops.Idempotency, result_id: str) -> None:
        p = self.p
        p.idem[idem.key] = (idem.fingerprint, result_id)
        p.idem_rows.append((idem.key, idem.fingerprint, result_id, p.now + idem.ttl))

    def own(self, conversation_id: str, user: str) -> None:
        self.p.users.append((conversation_id, user))

    def count_tokens(self, conversation_id: str, tokens: int) -> None:
        self.p.usage.append((conversation_id, tokens))

    # --- results --------------------------------------------------------------------------------

    def value(self, value: object) -> Result:
        return const(value)

    def conversation(self, conversation_id: str) -> Result:
        conv = self.p.require(conversation_id)
        return lambda base: conv.record(base)

    def offset(self, seq: int) -> Result:
        return lambda base: base + seq


def plan_op(p: Plan, op: ops.AnyOp) -> Result:
    """``op`` planned into ``p`` (``apply.APPLY``): its result. Raises AgentikError, having
    planned nothing, when it is refused."""
    return plan_all(p, [op], {})[0]  # type: ignore[return-value]


def plan_all(p: Plan, batch: list[ops.AnyOp], refused: dict[int, AgentikError]
             ) -> list[Result | AgentikError]:
    """Every op of ``batch`` planned into ``p`` (one target for the batch): its result, or the
    error refusing it (those of ``refused`` as given)."""
    target: Target[int] = PgTarget(p)  # (mypy: it is one)
    table = apply.APPLY
    results: list[Result | AgentikError] = []
    for i, op in enumerate(batch):
        if i in refused:
            results.append(refused[i])
            continue
        try:
            results.append(table[type(op)](target, op))
        except AgentikError as exc:
            results.append(exc)
    return results


def _found(p: Plan) -> Found:
    assert p.found is not None  # read with a batch holding a recheck (PgWriter._plan)
    return p.found


def read_found(conn: psycopg.Connection[Any], batch: list[ops.AnyOp]) -> Found | None:
    """The one read the rechecked ops of ``batch`` (``ops.rechecked``) need (``PgWriter._load``):
    their records already stored, which of their FinishTurns' turns are still open, which of
    their StartTurns' items and Compacts are stored; None (nothing read) when it has none. A
    retry after an unknown outcome is planned only once that outcome's session has ended
    (``PgWriter._settle``), so this sees whatever it left."""
    rechecks: list[ops.Recheckable] = [
        op for op in batch if type(op) in ops.RECHECKABLE and op.recheck]  # type: ignore[misc,union-attr]
    if not rechecks:
        return None
    found = Found()
    ids = [i for op in rechecks for i in ops.journal_ids(op)]
    if ids:
        for r in conn.execute("SELECT id, seq, conversation_id, created_at, payload FROM message "
                              "WHERE id = ANY(%s::text[])", (ids,)):
            found.records[r[0]] = MessageRecord(id=r[0], seq=int(r[1]), conversation_id=r[2],
                                                created_at=r[3], message=decode_message(r[4]))
    found.turns = _pairs(conn, "turn", "id", [(op.conversation_id, op.turn_id) for op in rechecks
                                              if type(op) is ops.FinishTurn and op.turn_id])
    found.started = _pairs(conn, "working_memory", "source_message_id", [
        (op.conversation_id, op.turn_id) for op in rechecks if type(op) is ops.StartTurn])
    found.compacted = {(op.conversation_id, op.before_order_idx) for op in rechecks
                       if type(op) is ops.Compact and ops.compacted(op, _kept(conn, op))}
    return found


def _kept(conn: psycopg.Connection[Any], op: ops.Compact) -> list[WorkingItem]:
    """The first two working-memory items between the system prompt and ``op``'s cut."""
    return [decode_working_item(r[0]) for r in conn.execute(
        "SELECT payload FROM working_memory WHERE conversation_id = %(c)s AND order_idx < %(b)s "
        "AND order_idx > (SELECT MIN(order_idx) FROM working_memory WHERE conversation_id = %(c)s) "
        "ORDER BY order_idx LIMIT 2", {"c": op.conversation_id, "b": op.before_order_idx})]


def _pairs(conn: psycopg.Connection[Any], table: str, column: str,
           pairs: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Those of ``pairs`` (conversation id, ``column``) that rows of ``table`` have; no read
    when there are none."""
    if not pairs:
        return set()
    return {(r[0], r[1]) for r in conn.execute(
        f"SELECT conversation_id, {column} FROM {table} WHERE (conversation_id, {column}) IN "
        "(SELECT * FROM unnest(%s::text[], %s::text[]))",
        ([t[0] for t in pairs], [t[1] for t in pairs]))}


def read_turn_calls(conn: psycopg.Connection[Any], turns: list[tuple[str, str]]
                    ) -> dict[tuple[str, str], list[Message]]:
    """For RecoverTurns (``PgWriter._load``): each turn's tool calls and results stored after
    its user message, in order (``Target.turn_calls``); no read when there are none."""
    out: dict[tuple[str, str], list[Message]] = {turn: [] for turn in turns}
    if turns:
        for r in conn.execute(
                "SELECT t.conversation_id, t.id, m.payload FROM turn t JOIN message m "
                "ON m.conversation_id = t.conversation_id AND m.seq > t.seq "
                "WHERE (t.conversation_id, t.id) IN (SELECT * FROM unnest(%s::text[], %s::text[])) "
                "AND m.type IN ('tool_call', 'tool_result') ORDER BY m.seq",
                ([c for c, _ in turns], [i for _, i in turns])):
            out[(r[0], r[1])].append(decode_message(r[2]))
    return out
