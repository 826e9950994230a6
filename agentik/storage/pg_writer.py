"""The PostgreSQL writer: one connection (autocommit), used from one worker thread at a time.

A batch is planned in Python (``pg_plan``) from one read of the rows it touches (``_load``), then
committed by ONE statement (``pg_statement``) that bumps the single counter row and stores every
row at ``base + rel``, with the lease checks of a cluster node inside it (``pg_fence``). One
statement is one round trip, and the counter's row lock is held only while the server runs it,
so offsets are dense and in commit order across nodes (SCALEOUT.md). The batch's events, stamped
with their offsets, go back with the result: the feed publishes them straight away when nothing
of another node's came before them (``pg_feed.Feed.own``), else it reads them from the outbox.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from agentik.errors import AgentikError, StorageError
from agentik.storage import ops
from agentik.storage.pg_fence import LIVE_OTHER_OWNER, node_of, ownership, refusals
from agentik.storage.pg_plan import Conv, Plan, plan_op
from agentik.storage.pg_schema import channel, migrate
from agentik.storage.pg_statement import commit_statement
from agentik.storage.writer import BatchResult

log = logging.getLogger(__name__)

_LOAD_CONVERSATIONS = """
SELECT c.id, c.title, c.is_temporal, c.created_at, c.updated_at, c.seq,
       (SELECT COALESCE(MAX(order_idx), 0) FROM working_memory w WHERE w.conversation_id = c.id)
FROM conversation c WHERE c.id = ANY(%s::text[])
"""



class PgWriter:
    """The PostgreSQL :class:`~agentik.storage.engine.WriterEngine`. Constructed in a worker
    thread; raises StorageError.

    With ``leases`` set (a cluster node), every batch is checked inside its statement: a
    conversation this node holds must still carry this node's fence (else LeaseLostError), and a
    conversation it does not hold must not be owned by another live node (else NotOwnerError);
    a batch failing a check stores nothing, and is planned again without the refused ops."""

    publishes_commits = False

    def __init__(
        self, url: str, *, outbox_cap: int, outbox_ttl: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.clock = clock
        self.outbox_cap = outbox_cap
        self.outbox_ttl = outbox_ttl
        #: the node's leases (``pg_lease.Leases``); None: no ownership checks (one node)
        self.leases: Any = None
        try:
            self.conn = self._connect()
            self.schema = migrate(self.conn)
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
            assert row is not None
            self.epoch = str(row[0])
            head, lo = self.conn.execute(
                'SELECT (SELECT v FROM counter WHERE id = 1), (SELECT min("offset") FROM outbox)'
            ).fetchone() or (0, None)
        except psycopg.Error as exc:
            raise StorageError(f"cannot open database {_safe(url)}: {exc}") from exc
        self.channel = channel(self.schema)
        self.next_seq = int(head) + 1
        self.oldest = int(lo) if lo is not None else self.next_seq

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.url, autocommit=True)
        #: the server process of this connection: the sender of this node's NOTIFYs
        self.backend_pid = conn.info.backend_pid
        return conn

    def close(self) -> None:
        try:
            self.conn.close()
        except psycopg.Error:  # pragma: no cover - closing never matters more than the cause
            log.exception("closing the writer connection failed")

    def commit_batch(self, batch: list[ops.AnyOp]) -> BatchResult:
        """Plan ``batch`` and commit it in one statement. Raises StorageError if nothing was
        committed (the connection is then re-opened for the next batch)."""
        refused: dict[int, AgentikError] = {}
        try:
            if self.conn.closed or self.conn.broken:
                self.conn = self._connect()
            for _ in range(3):
                plan = Plan(epoch=self.epoch, now=self.clock())
                live = [op for i, op in enumerate(batch) if i not in refused]
                self._load(plan, live)
                results: list[Any] = []
                for i, op in enumerate(batch):
                    if i in refused:
                        results.append(refused[i])
                        continue
                    try:
                        results.append(plan_op(plan, op))
                    except AgentikError as exc:
                        results.append(exc)
                base = self._execute(plan)
                if base is not None:
                    break
                refused.update(refusals(self.conn, self.leases, batch, refused))
            else:
                raise StorageError("write failed, nothing stored: conversation ownership kept "
                                   "changing under the batch")
        except psycopg.Error as exc:
            raise StorageError(f"write failed, nothing stored: {exc}") from exc
        self.next_seq = base + plan.n + 1
        return BatchResult(
            [r if isinstance(r, AgentikError) else r(base) for r in results], plan.events(base),
            self.oldest, self.next_seq - 1,
        )

    def _load(self, p: Plan, batch: list[ops.AnyOp]) -> None:
        """The one read a batch's plan starts from (more only for start-up and A2A ops)."""
        conn = self.conn
        me, ttl = node_of(self.leases)
        cids: set[str] = set()
        tasks: list[str] = []
        compacts: list[str] = []
        for op in batch:
            if isinstance(op, ops.RecoverTurns) and op.conversation_id not in p.open_turns:
                sql = ("SELECT t.id, t.conversation_id, c.id IS NOT NULL FROM turn t "
                       "LEFT JOIN conversation c ON c.id = t.conversation_id ")
                if op.conversation_id is not None:
                    sql += "WHERE t.conversation_id = %(cid)s "
                else:  # a cluster's start-up leaves the turns of live nodes alone
                    sql += f"WHERE NOT (c.id IS NOT NULL AND {LIVE_OTHER_OWNER}) "
                rows = conn.execute(
                    sql + "ORDER BY t.seq",
                    {"cid": op.conversation_id, "me": me, "ttl": ttl},
                ).fetchall()
                p.open_turns[op.conversation_id] = (
                    [(r[0], r[1]) for r in rows if r[2]], [r[0] for r in rows if not r[2]])
                cids.update(r[1] for r in rows if r[2])
            elif isinstance(op, ops.PurgeTemporary) and p.temporary is None:
                p.temporary = [r[0] for r in conn.execute(
                    "SELECT id FROM conversation c WHERE is_temporal "
                    f"AND NOT {LIVE_OTHER_OWNER} ORDER BY seq", {"me": me, "ttl": ttl})]
                cids.update(p.temporary)
            elif isinstance(op, ops.PutA2ATask):
                tasks.append(op.task_id)
            elif isinstance(op, ops.Compact):
                compacts.append(op.conversation_id)
            cid = getattr(op, "conversation_id", None)
            if isinstance(cid, str):
                cids.add(cid)
        if cids:
            for r in conn.execute(_LOAD_CONVERSATIONS, (list(cids),)):
                p.conv[r[0]] = Conv(r[0], r[1], bool(r[2]), r[3], r[4], r[5], None, True, r[6])
        keys = [idem.key for op in batch
                if isinstance(op, ops.CreateConversation | ops.AppendUserMessage)
                and (idem := op.idempotency) is not None]
        if keys:
            stored = {r[0]: (r[1], r[2]) for r in conn.execute(
                "SELECT key, fingerprint, result_id FROM idempotency_key "
                "WHERE key = ANY(%s::text[]) AND expires_at > %s", (keys, p.now))}
            p.idem.update({k: stored.get(k) for k in keys})
        if tasks:
            found = dict(conn.execute(
                "SELECT id, seq FROM a2a_task WHERE id = ANY(%s::text[])", (tasks,)).fetchall())
            p.tasks.update({t: found.get(t) for t in tasks})
        for cid in compacts:
            row = conn.execute(
                "SELECT MIN(order_idx) FROM working_memory WHERE conversation_id = %s AND "
                "order_idx > (SELECT MIN(order_idx) FROM working_memory WHERE conversation_id = %s)",
                (cid, cid),
            ).fetchone()
            p.compact_first[cid] = row[0] if row else None

    def _execute(self, p: Plan) -> int | None:
        """Run the one statement; the head before this batch, or None when a lease check
        failed (then nothing was stored). Keeps ``oldest`` up to date."""
        sql, args = commit_statement(p, ownership(p, self.leases), channel=self.channel,
                                     outbox_cap=self.outbox_cap, outbox_ttl=self.outbox_ttl)
        row = self.conn.execute(sql, args).fetchone()
        if row is None:
            return None
        base, lo, ttl_bound = int(row[0]), row[2], row[3]
        head = base + p.n
        # what this statement trimmed (its snapshot does not show its own deletes)
        oldest = max(int(lo) if lo is not None else base + 1, head - self.outbox_cap + 1,
                     int(ttl_bound) + 1 if ttl_bound is not None else 0)
        self.oldest = min(oldest, head + 1)
        return base


def _safe(url: str) -> str:
    """The URL without its password, for error messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "(unparsable URL)"
    info.pop("password", None)
    return repr(psycopg.conninfo.make_conninfo(**info))  # type: ignore[arg-type]
