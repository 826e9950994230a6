"""The PostgreSQL writer: one connection (autocommit), used from one worker thread at a time.

A batch is planned in Python (``pg.plan``) from one read of the rows it touches (``_load``), then
committed by ONE statement (``pg.statement``) that bumps the single counter row and stores every
row at ``base + rel``, with the lease checks of a cluster node inside it (``pg.fence``). One
statement is one round trip, and the counter's row lock is held only while the server runs it,
so offsets are dense and in commit order across nodes (SCALEOUT.md). The batch's events, stamped
with their offsets, go back with the result: the feed publishes them straight away when nothing
of another node's came before them (``pg.feed.Feed.own``), else it reads them from the outbox.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from agentik.errors import AgentikError, StorageError, StorageOutcomeUnknownError
from agentik.storage import ops
from agentik.storage.pg.arrays import Int8s
from agentik.storage.pg.connect import DEFAULT_TIMEOUT, connect, set_limits
from agentik.storage.pg.fence import LIVE_OTHER_OWNER, node_of, ownership, refusals
from agentik.storage.pg.flight import Flight, resolve, seed_after
from agentik.storage.pg.plan import Conv, Plan
from agentik.storage.pg.plan_ops import plan_all, read_found, read_turn_calls
from agentik.storage.pg.schema import channel, migrate
from agentik.storage.pg.send import Sender
from agentik.storage.pg.statement import commit_statement
from agentik.storage.types import BatchResult

log = logging.getLogger(__name__)

#: how many conversation rows a writer remembers (``PgWriter._known``)
KNOWN = 10_000

_LOAD_CONVERSATIONS = """
SELECT c.id, c.title, c.is_temporal, c.created_at, c.updated_at, c.seq, c.agent, c.instructions,
       (SELECT COALESCE(MAX(order_idx), 0) FROM working_memory w WHERE w.conversation_id = c.id)
FROM conversation c WHERE c.id = ANY(%s::text[])
"""


#: ops whose plan reads nothing but the row of the conversation they name (``_load``; by exact
#: type: an ``isinstance`` goes through msgspec's metaclass)
_PLAIN = frozenset({ops.AppendUserMessage, ops.StartTurn, ops.AppendToolCalls,
                    ops.AppendToolResult, ops.AnswerPause, ops.FinishTurn, ops.RenameConversation,
                    ops.DeleteConversation, ops.CreateConversation, ops.Regenerate,
                    ops.SwitchBranch, ops.ResetMemory, ops.ForkConversation})
#: ops that may carry an Idempotency-Key
_KEYED = frozenset({ops.CreateConversation, ops.AppendUserMessage, ops.Regenerate,
                    ops.SwitchBranch, ops.ForkConversation})


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
        clock: Callable[[], float] = time.time, timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.url = url
        #: AGENTIK_DB_TIMEOUT (``pg.connect``)
        self.timeout = timeout
        self.clock = clock
        self.outbox_cap = outbox_cap
        self.outbox_ttl = outbox_ttl
        #: the node's leases (``pg.lease.Leases``); None: no ownership checks (one node)
        self.leases: Any = None
        #: conversation rows as this writer's last commits left them: a batch touching only
        #: these needs no read before its statement (each is checked inside the statement, so
        #: one changed meanwhile by anybody makes the batch be planned again from a read)
        self._known: dict[str, Conv] = {}
        #: the server session of a connection lost with a commit out (``_failed``)
        self._unsettled: tuple[int, Any] | None = None
        try:
            self.conn = self._connect(limits=False)
            self.schema = migrate(self.conn)
            set_limits(self.conn, timeout)
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

    def _connect(self, limits: bool = True) -> psycopg.Connection[Any]:
        conn = connect(self.url, timeout=self.timeout, limits=limits)
        #: the server process of this connection: the sender of this node's NOTIFYs
        self.backend_pid = conn.info.backend_pid
        row = conn.execute("SELECT backend_start FROM pg_stat_activity WHERE pid = %s",
                           (self.backend_pid,)).fetchone()
        #: this connection's server session (pid, start), ended by :meth:`_settle` if it is
        #: lost with a commit of unknown outcome
        self._session: tuple[int, Any] = (self.backend_pid, row[0] if row else None)
        self._sender = Sender(conn)  # bounded by conn.answer_within (pg_connect)
        return conn

    def answer_remaining(self) -> float | None:
        """Seconds the statement in flight has left to answer before it is given up."""
        return self._sender.remaining()

    def socket(self) -> int:
        """The connection's socket: readable once the statement in flight has its answer."""
        return self.conn.pgconn.socket

    def close(self) -> None:
        try:
            self.conn.close()
        except psycopg.Error:  # pragma: no cover - closing never matters more than the cause
            log.exception("closing the writer connection failed")

    def commit_batch(self, batch: list[ops.AnyOp]) -> BatchResult:
        """Plan ``batch`` and commit it in one statement. Raises StorageError if nothing was
        committed (the connection is then re-opened for the next batch)."""
        flight = self.begin(batch)
        self.land(flight)
        return self.result(flight)

    # --- the same in steps, for the writer thread to plan batch k+1 while k runs (pg_flight) ---

    def begin(self, batch: list[ops.AnyOp]) -> Flight:
        """Plan ``batch`` (reading what it needs) and send its statement. Raises StorageError."""
        try:
            if self.conn.closed or self.conn.broken:
                self.conn = self._connect()
            if self._unsettled is not None:
                self._settle(self._unsettled)
            flight = self._plan(batch, {})
            self._send(flight)
        except psycopg.Error as exc:
            raise self._failed(exc) from exc
        return flight

    def follow(self, batch: list[ops.AnyOp], after: Flight) -> Flight | None:
        """Plan ``batch`` as if ``after`` (in flight) committed, reading nothing; None when it
        needs a read. Sent by :meth:`launch` once ``after`` has landed."""
        plan = Plan(epoch=self.epoch, now=self.clock())
        known = seed_after(plan, batch, after, self._known)
        if known is None:
            return None
        flight = Flight(batch, plan, plan_all(plan, batch, {}), known, after)
        # dumped now, while ``after`` runs; only the checked seqs wait for its base (launch)
        sql, args = self._statement(flight, [(cid, 0, mx) for cid, _, mx in known])
        flight.dumped = self._sender.dump(sql, args, late=("k_seq",))
        return flight

    def launch(self, flight: Flight) -> bool:
        """Send a followed flight once the flight it followed has landed; False (nothing sent)
        when that one did not commit as planned. Raises StorageError."""
        after = flight.after
        if after is None or not after.exact:
            return False
        flight.known = known = resolve(flight.known, after)  # type: ignore[assignment]
        flight.after = None
        try:
            self._sender.send_dumped(flight.dumped, {"k_seq": Int8s(k[1] for k in known)})
        except psycopg.Error as exc:
            raise self._failed(exc) from exc
        return True

    def land(self, flight: Flight) -> None:
        """Wait for the flight's statement. When a check failed (nothing stored), plan the
        batch again (from a read, refusing the ops whose lease is gone) until it is stored.
        Raises StorageError if nothing was committed."""
        refused: dict[int, AgentikError] = {}
        try:
            base = self._base(flight.plan, self._sender.wait())
            exact = base is not None
            attempts = 0
            while base is None:
                if flight.known:  # a remembered row may be what changed: read them all again
                    self._known.clear()
                else:
                    attempts += 1
                    if attempts == 3:
                        raise StorageError("write failed, nothing stored: conversation "
                                           "ownership kept changing under the batch")
                    refused.update(refusals(self.conn, self.leases, flight.ops, refused))
                again = self._plan(flight.ops, refused)
                flight.plan, flight.results, flight.known = again.plan, again.results, again.known
                self._send(flight)
                base = self._base(flight.plan, self._sender.wait())
        except psycopg.Error as exc:
            raise self._failed(exc) from exc
        flight.base, flight.exact = base, exact
        self._remember(flight.plan, base)
        self.next_seq = base + flight.plan.n + 1

    def _failed(self, exc: psycopg.Error) -> StorageError:
        """The StorageError of a failed step. The server's own error (it has a SQLSTATE) rolled
        the statement back; a connection that failed while a commit statement was out leaves
        that statement's outcome unknown: its server session may still run and commit it. The
        next connection first ends that session (:meth:`_settle`), so nothing planned later
        races it: a retry then reads what it left (an Idempotency-Key, ``ops.rechecked``)."""
        self._known.clear()
        if exc.sqlstate or not self._sender.unanswered:
            return StorageError(f"write failed, nothing stored: {exc}")
        self._unsettled = self._session
        self.conn.close()  # whatever state it is in: the next batch reconnects, then settles
        return StorageOutcomeUnknownError(f"write failed, whether it was stored is unknown: {exc}")

    def _settle(self, session: tuple[int, Any]) -> None:
        """End the server session left with a statement of unknown outcome (its pid and start
        time: a pid can be reused) and wait until it is gone; until then, refuse writes (the
        actor probes again): a batch planned now could race that statement. Raises
        psycopg.Error, or StorageError while the session lives (a stopped server process)."""
        pid, started = session
        wait_ms = max(1, round(self.timeout * 500))  # within this connection's statement_timeout
        self.conn.execute(
            "SELECT pg_terminate_backend(pid, %s) FROM pg_stat_activity "
            "WHERE pid = %s AND backend_start = %s", (wait_ms, pid, started))
        if self.conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s AND backend_start = %s",
                             (pid, started)).fetchone():
            raise StorageError(
                f"write refused: the database session {pid}, which had a commit of unknown "
                "outcome in flight, has not ended yet")
        log.warning("ended database session %d, whose commit's outcome was unknown", pid)
        self._unsettled = None

    def result(self, flight: Flight) -> BatchResult:
        """A landed flight's results and events, stamped with its offsets."""
        base = flight.base
        assert base is not None
        events = flight.plan.events(base)
        # every offset 1..n has its one event, in order: a journal record's is events[rel - 1]
        assert len(events) == flight.plan.n
        results: list[Any] = []
        for r in flight.results:
            kind = type(r)
            if kind is int:
                results.append(events[r - 1]._event.event.record)
            elif kind is list:
                results.append([events[i - 1]._event.event.record for i in r])
            elif isinstance(r, AgentikError):
                results.append(r)
            else:
                results.append(r(base))
        return BatchResult(results, events, self.oldest, base + flight.plan.n)

    def _plan(self, batch: list[ops.AnyOp], refused: dict[int, AgentikError]) -> Flight:
        plan = Plan(epoch=self.epoch, now=self.clock())
        taken = [op for i, op in enumerate(batch) if i not in refused]
        known = self._load(plan, taken)
        plan.found = read_found(self.conn, taken)  # None (no read) unless it holds a recheck
        return Flight(batch, plan, plan_all(plan, batch, refused), known)  # type: ignore[arg-type]

    def _remember(self, p: Plan, base: int) -> None:
        """Keep the conversation rows as batch ``p``, committed at ``base``, left them."""
        known = self._known
        for cid, conv in p.conv.items():
            if conv is None:
                known.pop(cid, None)
            else:
                known.pop(cid, None)  # re-inserted last: the oldest are dropped first
                known[cid] = Conv(cid, conv.title, conv.is_temporal, conv.created_at,
                                  conv.updated_at, conv.seq if conv.rel is None else base + conv.rel,
                                  None, True, conv.max_order, conv.agent, conv.instructions)
        if len(known) > KNOWN:
            for cid in list(itertools.islice(known, len(known) - KNOWN)):
                del known[cid]

    def _load_conversations(self, p: Plan, cids: set[str]) -> list[tuple[str, int, int]]:
        """The rows of ``cids`` into ``p``: remembered ones as they are (returned, to be checked
        by the statement), the others read."""
        used: list[tuple[str, int, int]] = []
        missing = []
        for cid in cids:
            conv = self._known.get(cid)
            if conv is None or conv.seq is None:
                missing.append(cid)
            else:
                p.conv[cid] = conv
                used.append((cid, conv.seq, conv.max_order))
        if missing:
            for r in self.conn.execute(_LOAD_CONVERSATIONS, (missing,)):
                p.conv[r[0]] = Conv(r[0], r[1], bool(r[2]), r[3], r[4], r[5], None, True, r[8], r[6], r[7])
        return used

    def _load(self, p: Plan, batch: list[ops.AnyOp]) -> list[tuple[str, int, int]]:
        """The one read a batch's plan starts from (more for start-up, A2A, webhook ops); none when
        every row it needs is remembered (``_known``). Returns those used: (id, seq, memory end)."""
        conn = self.conn
        me, ttl = node_of(self.leases)
        cids: set[str] = set()
        tasks: list[str] = []
        compacts: list[str] = []
        hooks: list[str] = []
        for op in batch:
            kind = type(op)
            if kind in _PLAIN:  # the common case: an op on the one conversation it names
                cids.add(op.conversation_id)  # type: ignore[union-attr,arg-type]
                continue
            if isinstance(op, ops.RecoverTurns) and op.conversation_id not in p.open_turns:
                sql = ("SELECT t.id, t.conversation_id, c.id IS NOT NULL FROM turn t LEFT JOIN conversation "
                       "c ON c.id = t.conversation_id WHERE (t.state = 'running' OR c.id IS NULL) ")
                if op.conversation_id is not None:
                    sql += "AND t.conversation_id = %(cid)s "
                else:  # a cluster's start-up leaves the turns of live nodes alone
                    sql += f"AND NOT (c.id IS NOT NULL AND {LIVE_OTHER_OWNER}) "
                rows = conn.execute(
                    sql + "ORDER BY t.seq",
                    {"cid": op.conversation_id, "me": me, "ttl": ttl},
                ).fetchall()
                live = [(r[1], r[0]) for r in rows if r[2]]
                p.open_turns[op.conversation_id] = (live, [(r[1], r[0]) for r in rows if not r[2]])
                p.turn_calls.update(read_turn_calls(conn, live))
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
            elif isinstance(op, ops.PutWebhook | ops.DeleteWebhook | ops.WebhookProgress):
                hooks.append(op.spec.id if isinstance(op, ops.PutWebhook) else op.webhook_id)
            cid = getattr(op, "conversation_id", None)
            if isinstance(cid, str):
                cids.add(cid)
        used = self._load_conversations(p, cids)
        keys = [idem.key for op in batch
                if type(op) in _KEYED and (idem := op.idempotency) is not None]  # type: ignore[union-attr]
        if keys:
            stored = {r[0]: (r[1], r[2]) for r in conn.execute(
                "SELECT key, fingerprint, result_id FROM idempotency_key "
                "WHERE key = ANY(%s::text[]) AND expires_at > %s", (keys, p.now))}
            p.idem.update({k: stored.get(k) for k in keys})
        self._load_records(p, tasks, hooks)
        for cid in compacts:
            row = conn.execute(
                "SELECT MIN(order_idx) FROM working_memory WHERE conversation_id = %s AND "
                "order_idx > (SELECT MIN(order_idx) FROM working_memory WHERE conversation_id = %s)",
                (cid, cid),
            ).fetchone()
            p.compact_first[cid] = row[0] if row else None
        return used

    def _load_records(self, p: Plan, tasks: list[str], hooks: list[str]) -> None:
        """The A2A tasks' seqs and whether the webhook subscriptions exist, as stored."""
        if tasks:
            found = dict(self.conn.execute(
                "SELECT id, seq FROM a2a_task WHERE id = ANY(%s::text[])", (tasks,)).fetchall())
            p.tasks.update({t: found.get(t) for t in tasks})
        if hooks:
            stored = {r[0] for r in self.conn.execute(
                "SELECT id FROM webhook WHERE id = ANY(%s::text[])", (hooks,))}
            p.hooks.update({h: h in stored for h in hooks})

    def _send(self, flight: Flight) -> None:
        self._sender.send(*self._statement(flight, flight.known))  # type: ignore[arg-type]

    def _statement(self, flight: Flight, known: list[tuple[str, int, int]]
                   ) -> tuple[str, dict[str, Any]]:
        p = flight.plan
        return commit_statement(p, ownership(p, self.leases), channel=self.channel,
                                outbox_cap=self.outbox_cap, outbox_ttl=self.outbox_ttl,
                                known=known)

    def _base(self, p: Plan, row: tuple[bytes | None, ...] | None) -> int | None:
        """The head before batch ``p`` from its statement's answer, or None when a check failed
        (a lease, or a remembered row: then nothing was stored). Keeps ``oldest`` up to date."""
        if row is None:
            return None
        base, lo, ttl_bound = int(row[0] or b"0"), row[2], row[3]
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
