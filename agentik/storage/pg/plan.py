"""Planning a PostgreSQL batch: each op is turned into rows with batch-relative offsets.

Planned from one read of the rows the batch touches (``PgWriter._load``). Each op is checked
first and refused (AgentikError) before it takes anything, so a refusal never leaves a hole; then
it adds rows at batch-relative offsets ``rel`` (1..n), stored at ``base + rel`` by the commit
statement (``pg.statement``); each op is planned by ``pg.plan_ops.PgTarget``. The offset is known only
inside the statement, so outbox payloads carry offset 0 (readers stamp it, ``pg.queries.stamp``);
results (:data:`Result`) and this node's events (:meth:`Plan.events`) are built from ``base``
after commit.

The rows are kept as columns (one typed list a column, ``pg.arrays``: what the statement sends,
with no per-row tuple to make and take apart), and a journal record's event (``Plan.journal``)
as what it is made of: after commit it is made once, stamped, and is also the op's result; its
published bytes are its stored payload with the offsets written in (:func:`_splice`), and its
payload embeds the journal row's encoded message (``msgspec.Raw``): one encode of the message
a record instead of three.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from agentik.errors import (
    NotFoundError,
)
from agentik.storage.pg.arrays import Byteas, Int8s, Texts
from agentik.storage.pg.queries import stamp
from agentik.storage.types import KINDS, StoredEvent
from agentik.wire import (
    AgentEvent,
    CommonEvent,
    ConversationRecord,
    Cursor,
    Deleted,
    DurableEvent,
    Message,
    MessageRecord,
    WorkingItem,
    encode,
)


class Conv(msgspec.Struct, frozen=True, gc=False):
    """A conversation row as a batch plans it (only scalars: not tracked by the collector, and
    made in C: ``bump`` makes one a journal record)."""

    id: str
    title: str | None
    is_temporal: bool
    created_at: float
    updated_at: float
    #: absolute seq as read, or None once the batch changed it (then ``rel`` is its offset)
    seq: int | None
    rel: int | None
    in_db: bool
    max_order: int
    #: the agent it belongs to and its own instructions (set at creation, never changed; no
    #: default: every copy must carry them on)
    agent: str
    instructions: str | None

    def record(self, base: int) -> ConversationRecord:
        seq = self.seq if self.rel is None else base + self.rel
        return ConversationRecord(id=self.id, title=self.title, is_temporal=self.is_temporal,
                                  created_at=self.created_at, updated_at=self.updated_at,
                                  seq=seq if seq is not None else 0, agent=self.agent,
                                  instructions=self.instructions)


#: an op's result as planned: ``fn(base)`` (known once the batch's base offset is), or the
#: batch-relative offset of a journal record (int: the record, stamped; a list of them: a list
#: of records), made with the batch's events (``PgWriter.result``)
Result = Callable[[int], Any] | int | list[int]

#: where a CommonEvent's bytes carry its cursor's offset: right after this (the cursor is its
#: first field, the epoch a string: its escaped text never holds this sequence)
_OFFSET = b'"offset":0'
#: where a journal record's bytes carry its seq (the record's second field, after its id: the
#: first such key in the event's bytes; an escaped string never holds this sequence)
_SEQ = b'"seq":0'


def _splice(payload: bytes, at_offset: int, at_seq: int, offset: int) -> bytes:
    """``payload`` (a journal event encoded with offset 0 in its cursor and seq 0 in its record,
    those zeros at ``at_offset`` and ``at_seq``) as encoded with ``offset`` in both: what
    ``encode(stamp(event, offset))`` gives, without encoding it again."""
    digits = b"%d" % offset
    return b"".join((payload[:at_offset], digits, payload[at_offset + 1:at_seq], digits,
                     payload[at_seq + 1:]))


def const(value: Any) -> Result:
    return lambda base: value


@dataclass
class Found:
    """What the rechecked ops of a batch (``ops.rechecked``) need, read before it is planned
    (``PgWriter._load``): their journal records already stored, by message id, which of
    their FinishTurns' turn rows are still open and which of their StartTurns' user items are in
    working memory, as (conversation id, turn id), and which of their Compacts are stored, as
    (conversation id, before_order_idx)."""

    records: dict[str, MessageRecord] = field(default_factory=dict)
    turns: set[tuple[str, str]] = field(default_factory=set)
    started: set[tuple[str, str]] = field(default_factory=set)
    compacted: set[tuple[str, int]] = field(default_factory=set)


@dataclass
class Plan:
    epoch: str
    now: float
    n: int = 0
    conv: dict[str, Conv | None] = field(default_factory=dict)
    #: the outbox rows, a column each: rel, conversation_id, kind, payload (the CommonEvent
    #: encoded with offset 0), and how its event is made after commit: the CommonEvent (stamped
    #: by ``pg.queries.stamp``), or for a journal record (its event class, message id, message,
    #: where the payload carries its seq)
    o_rel: Int8s = field(default_factory=Int8s)
    o_cid: Texts = field(default_factory=Texts)
    o_kind: Texts = field(default_factory=Texts)
    o_payload: Byteas = field(default_factory=Byteas)
    o_event: list[Any] = field(default_factory=list)
    #: the journal rows, a column each: rel, id, conversation_id, type, payload
    m_rel: Int8s = field(default_factory=Int8s)
    m_id: Texts = field(default_factory=Texts)
    m_cid: Texts = field(default_factory=Texts)
    m_type: Texts = field(default_factory=Texts)
    m_payload: Byteas = field(default_factory=Byteas)
    memory: list[tuple[str, int, str | None, bytes]] = field(default_factory=list)
    memory_cut: list[tuple[str, int, int]] = field(default_factory=list)
    #: turns inserted by this batch: id -> (conversation_id, state, rel)
    turns: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    #: turns of earlier batches set running or waiting: (conversation id, turn id, state)
    turns_running: list[tuple[str, str, str]] = field(default_factory=list)
    #: (conversation id, turn id) of turns the batch ends
    turns_deleted: list[tuple[str, str]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    #: A2A task seqs as read (absolute) or written by this batch ("rel", r)
    tasks: dict[str, int | tuple[str, int] | None] = field(default_factory=dict)
    task_rows: list[tuple[str, str, str | None, str, int, bytes]] = field(default_factory=list)
    #: pre-read for ops that need more than the conversation rows
    compact_first: dict[str, int | None] = field(default_factory=dict)
    #: RecoverTurns' open turns by its conversation filter, as (conversation id, turn id): those
    #: of live conversations, and the orphans whose conversation is gone
    open_turns: dict[str | None, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = field(
        default_factory=dict)
    #: RecoverTurns: each open turn's calls and results (``Target.turn_calls``)
    turn_calls: dict[tuple[str, str], list[Message]] = field(default_factory=dict)
    temporary: list[str] | None = None
    #: conversations created by this batch (their owner row is this node's, fence 1)
    created: list[str] = field(default_factory=list)
    #: Idempotency-Keys of the batch's ops: key -> (fingerprint, result id) stored and not
    #: expired, or planned by an earlier op of this batch; None when free
    idem: dict[str, tuple[str, str] | None] = field(default_factory=dict)
    #: (key, fingerprint, result id, expires_at) to insert with the batch
    idem_rows: list[tuple[str, str, str, float]] = field(default_factory=list)
    #: read for the batch's rechecked ops; None when it has none
    found: Found | None = None
    #: (conversation id, user) of conversations created for a user (docs/USERS.md)
    users: list[tuple[str, str]] = field(default_factory=list)
    #: (conversation id, model tokens) of the batch's answers, added to their users' day
    usage: list[tuple[str, int]] = field(default_factory=list)
    #: webhook subscriptions the batch's ops name: stored (as read, then as planned) or not
    hooks: dict[str, bool] = field(default_factory=dict)
    #: their rows to upsert (``ops.PutWebhook``, with the progress a later op of the batch
    #: stored for it: one statement cannot change a row twice), delete, and progress to store
    hook_rows: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    hooks_deleted: list[str] = field(default_factory=list)
    hook_progress: list[Any] = field(default_factory=list)
    #: (webhook id, ``ops.WebhookAttempt``): delivery log lines to add
    hook_log: list[tuple[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._cursor0 = Cursor(epoch=self.epoch, offset=0)
        #: where an event's payload carries its cursor's offset (the same for every event)
        self._at_offset = encode(CommonEvent(cursor=self._cursor0, conversation_id=None,
                                             event=Deleted(conversation_id=""))).index(_OFFSET) + 9

    def alloc(self) -> int:
        """The next batch-relative offset, 1..n (the stored offset is base + rel)."""
        self.n += 1
        return self.n

    def require(self, conversation_id: str) -> Conv:
        conv = self.conv.get(conversation_id)
        if conv is None:
            raise NotFoundError(f"conversation {conversation_id!r} not found")
        return conv

    def bump(self, conv: Conv, rel: int, *, touch: bool = False,
             rename: tuple[str | None] | None = None) -> Conv:
        """The conversation as changed at ``rel`` (a new value: earlier results keep theirs);
        made directly, not by ``dataclasses.replace``: it runs for every journal row."""
        title = conv.title if rename is None else rename[0]
        new = Conv(conv.id, title, conv.is_temporal, conv.created_at,
                   self.now if touch else conv.updated_at, None, rel, conv.in_db, conv.max_order,
                   conv.agent, conv.instructions)
        self.conv[conv.id] = new
        return new

    def emit(self, rel: int, conversation_id: str | None,
             event: DurableEvent | AgentEvent) -> None:
        common = CommonEvent(cursor=self._cursor0, conversation_id=conversation_id, event=event)
        self.o_rel.append(rel)
        self.o_cid.append(conversation_id)
        self.o_kind.append(KINDS[type(event)])
        self.o_payload.append(encode(common))
        self.o_event.append(common)

    def events(self, base: int) -> list[StoredEvent]:
        """The batch's events as committed at ``base``, stamped as a reader would stamp them, in
        offset order (rel 1..n: every offset has its one event)."""
        out = []
        epoch, now = self.epoch, self.now
        rows: Iterator[tuple[Any, ...]] = zip(self.o_rel, self.o_cid, self.o_kind,
                                              self.o_payload, self.o_event, strict=True)
        if self.o_rel != sorted(self.o_rel):
            rows = iter(sorted(rows, key=lambda o: o[0]))
        for rel, cid, kind, payload, made in rows:
            offset = base + rel
            if type(made) is tuple:
                cls, message_id, message, at_seq = made
                record = MessageRecord(id=message_id, seq=offset, conversation_id=cid,
                                       created_at=now, message=message)
                stamped = CommonEvent(cursor=Cursor(epoch=epoch, offset=offset),
                                      conversation_id=cid, event=cls(record=record))
                raw = _splice(payload, self._at_offset, at_seq, offset)
            else:
                stamped = stamp(made, offset)
                raw = encode(stamped)
            out.append(StoredEvent(offset, cid, kind, stamped, raw))
        return out

    def journal(self, conv: Conv, message_id: str, message: Message,
                cls: type[Any]) -> int:
        """A journal record of ``message`` at the next offset, with its event (``cls``, one of
        the events carrying a record): its row, its outbox row; returns its rel (the record
        itself is made after commit, ``events``)."""
        rel = self.n = self.n + 1
        cid = conv.id
        self.conv[cid] = Conv(cid, conv.title, conv.is_temporal, conv.created_at,
                              conv.updated_at, None, rel, conv.in_db, conv.max_order,
                              conv.agent, conv.instructions)
        body = encode(message)
        self.m_rel.append(rel)
        self.m_id.append(message_id)
        self.m_cid.append(cid)
        self.m_type.append(message.__struct_config__.tag)  # type: ignore[arg-type]
        self.m_payload.append(body)
        # the stored event embeds the row's bytes: the message is encoded once
        payload = encode(CommonEvent(
            cursor=self._cursor0, conversation_id=cid, event=cls(record=MessageRecord(
                id=message_id, seq=0, conversation_id=cid, created_at=self.now,
                message=msgspec.Raw(body)))))  # type: ignore[arg-type]
        self.o_rel.append(rel)
        self.o_cid.append(cid)
        self.o_kind.append(KINDS[cls])
        self.o_payload.append(payload)
        self.o_event.append((cls, message_id, message,
                             payload.index(_SEQ, self._at_offset) + 6))
        return rel

    def remember(self, conversation_id: str, item: WorkingItem, source: str | None,
                 order_idx: int | None = None) -> None:
        conv = self.require(conversation_id)
        if order_idx is None:
            order_idx = conv.max_order + 1
            self.conv[conversation_id] = msgspec.structs.replace(conv, max_order=order_idx)
        self.memory.append((conversation_id, order_idx, source, encode(item)))

    def drop(self, conversation_id: str) -> None:
        """The conversation's rows go (``apply.delete`` emits its events around this)."""
        conv = self.require(conversation_id)
        # rows this batch planned for it go too (the statement cannot see its own inserts)
        keep = [i for i, cid in enumerate(self.m_cid) if cid != conversation_id]
        for name in ("m_rel", "m_id", "m_cid", "m_type", "m_payload"):
            column = getattr(self, name)
            setattr(self, name, type(column)(column[i] for i in keep))
        self.memory = [m for m in self.memory if m[0] != conversation_id]
        self.turns = {k: v for k, v in self.turns.items() if v[0] != conversation_id}
        self.task_rows = [t for t in self.task_rows if t[2] != conversation_id]
        if conv.in_db:
            self.deleted.append(conversation_id)
        self.conv[conversation_id] = None
