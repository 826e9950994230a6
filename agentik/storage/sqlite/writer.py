"""The synchronous half of the StorageActor: one sqlite3 connection, used from one worker thread at a
time (the actor awaits each batch before it starts the next).

``commit_batch`` applies a batch of ops in ONE transaction. An op that fails on purpose
(NotFoundError, ...) is rolled back alone and its seqs are handed back, so the counter stays
gap-free: the batch first runs with no SAVEPOINT (the common case: nothing refused); if an op is
refused, the transaction is rolled back and the batch runs again with each op in its own SAVEPOINT.
Any sqlite3 error fails the whole batch, which is rolled back and acknowledged to nobody. The ops
themselves are in ``sqlite.ops``.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from agentik.errors import AgentikError, StorageError
from agentik.storage import ops
from agentik.storage.sqlite.dblock import lock_database
from agentik.storage.sqlite.ops import SqliteTarget, Tx, apply_all, apply_op
from agentik.storage.sqlite.rows import write_outbox, write_rows, write_seqs
from agentik.storage.sqlite.schema import migrate
from agentik.storage.types import BatchResult

log = logging.getLogger(__name__)


def open_connection(path: str, *, synchronous: str = "FULL", readonly: bool = False,
                    busy_timeout: float = 10.0) -> sqlite3.Connection:
    """Open a connection with agentik's pragmas. Raises sqlite3.Error."""
    if readonly:
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
    else:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    # AGENTIK_DB_TIMEOUT: how long a statement waits for another process's lock on the file
    conn.execute(f"PRAGMA busy_timeout = {max(1, round(busy_timeout * 1000))}")
    if not readonly:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


class Writer:
    """The SQLite :class:`~agentik.storage.engine.WriterEngine`: owns the single writer connection.
    Constructed in a worker thread; raises StorageError."""

    publishes_commits = True

    def __init__(
        self,
        path: str,
        *,
        synchronous: str,
        outbox_cap: int,
        outbox_ttl: float,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 10.0,
    ) -> None:
        #: the one clock of every stored time (created_at, updated_at, outbox TTL)
        self.clock = clock
        self.outbox_cap = outbox_cap
        self.outbox_ttl = outbox_ttl
        self._lock = lock_database(path)
        try:
            self.conn = open_connection(path, synchronous=synchronous, busy_timeout=busy_timeout)
            #: the ops' primitives on this connection (``sqlite.ops``), given each batch's Tx
            self._target = SqliteTarget(self.conn)
            migrate(self.conn)
            self.epoch = self._meta("epoch")
            self.next_seq = int(self._meta("next_seq"))
            self.oldest = self._oldest(self.next_seq)
            self._oldest_time = self._oldest_created()
        except sqlite3.Error as exc:
            self._lock.release()
            raise StorageError(f"cannot open database {path!r}: {exc}") from exc

    def _meta(self, key: str) -> str:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        if row is None:
            raise sqlite3.DatabaseError(f"meta.{key} is missing")
        return str(row[0])

    def _oldest(self, next_seq: int) -> int:
        row = self.conn.execute('SELECT MIN("offset") FROM outbox').fetchone()
        return int(row[0]) if row and row[0] is not None else next_seq

    def _oldest_created(self) -> float:
        """The oldest ``created_at`` in the outbox (one descent of ``outbox_mark_by_time``: the
        marks have the times of the outbox rows), +inf when it is empty."""
        row = self.conn.execute("SELECT MIN(created_at) FROM outbox_mark").fetchone()
        return float(row[0]) if row and row[0] is not None else math.inf

    def close(self) -> None:
        try:
            self.conn.close()
        except sqlite3.Error:  # pragma: no cover - closing never matters more than the cause
            log.exception("closing the writer connection failed")
        finally:
            self._lock.release()

    def commit_batch(self, batch: list[ops.AnyOp]) -> BatchResult:
        """Apply ``batch`` in one transaction. Raises StorageError if nothing was committed."""
        conn = self.conn
        now = self.clock()
        target = self._target  # the batch's state, the one target's from now on
        try:
            conn.execute("BEGIN IMMEDIATE")
            tx = target.tx = Tx(epoch=self.epoch, next_seq=self.next_seq, now=now)
            target.now = now
            try:
                # Every op with no SAVEPOINT: a SAVEPOINT per op is what made a batch slow (each
                # copies every page its op touches to the statement journal first).
                results = apply_all(target, batch)
            except AgentikError:
                # An op was refused after it may have written rows: start the batch over, each op
                # in its own SAVEPOINT this time (the ops are deterministic given the database and
                # ``now``, so the ops before the refused one do again what they did).
                conn.execute("ROLLBACK")
                conn.execute("BEGIN IMMEDIATE")
                tx, results = self._apply_each_in_savepoint(batch, now)
            write_rows(conn, tx)
            write_seqs(conn, tx)
            if tx.events:
                write_outbox(conn, tx)
            oldest, oldest_time = self.oldest, self._oldest_time
            if tx.next_seq != self.next_seq:
                conn.execute("UPDATE meta SET value=? WHERE key='next_seq'", (str(tx.next_seq),))
                oldest, oldest_time = self._trim(tx, min(oldest_time, now))
                if len(tx.events) != tx.next_seq - self.next_seq:  # never yet: a seq with no event
                    oldest = self._oldest(tx.next_seq)  # (then _trim's sums do not hold)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:
                log.exception("rollback after a failed batch failed")
            raise StorageError(f"write failed, nothing stored: {exc}") from exc
        self.next_seq = tx.next_seq
        self.oldest, self._oldest_time = oldest, oldest_time
        return BatchResult(results, tx.events, self.oldest, self.next_seq - 1)

    def _apply_each_in_savepoint(self, batch: list[ops.AnyOp], now: float) -> tuple[Tx, list[Any]]:
        """Apply ``batch`` with each op in its own SAVEPOINT: a refused op (AgentikError) is
        rolled back alone and its seqs are handed back, so the counter stays gap-free."""
        target = self._target
        tx = target.tx = Tx(epoch=self.epoch, next_seq=self.next_seq, now=now)
        target.now = now
        results: list[Any] = []
        conn = self.conn
        for op in batch:
            mark = (tx.next_seq, len(tx.events), len(tx.outbox), dict(tx.seqs))
            conn.execute("SAVEPOINT op")
            try:
                results.append(apply_op(target, op))
                write_rows(conn, tx)  # in its SAVEPOINT
                conn.execute("RELEASE op")
            except AgentikError as exc:
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
                tx.next_seq, n_events, n_outbox, tx.seqs = mark
                del tx.events[n_events:]
                del tx.outbox[n_outbox:]
                tx.messages.clear()  # the rows it left pending
                tx.turns.clear()
                results.append(exc)
        return tx, results

    def probe(self) -> None:
        """A small write that must reach the disk (see ``engine.probe_write``): a row of a few
        pages put in ``meta`` and committed (new pages, new WAL frames: what a full disk or
        database refuses), then removed. Raises StorageError; nothing else is touched."""
        conn = self.conn
        size = 4 * int(conn.execute("PRAGMA page_size").fetchone()[0])
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('probe', ?)",
                         ("0" * size,))
            conn.execute("COMMIT")
            conn.execute("DELETE FROM meta WHERE key = 'probe'")
        except sqlite3.Error as exc:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:
                log.exception("rollback after a failed probe failed")
            raise StorageError(f"probe write failed: {exc}") from exc

    def _trim(self, tx: Tx, oldest_time: float) -> tuple[int, float]:
        """Trim the outbox by cap and TTL; returns the new ``oldest`` and ``_oldest_time``.

        Trimming only ever removes a prefix of offsets, so what is retained stays contiguous:
        that is what lets a replaying reader detect eviction as a jump. Each trim runs only when
        it can remove something, known without a query: every seq has its outbox row (the
        caller reads ``oldest`` back if a batch ever broke that), so the outbox holds exactly
        ``oldest..head`` (the cap trim is due when ``oldest <= head - cap``
        and leaves ``head - cap + 1``), and ``oldest_time`` is at most the oldest ``created_at``
        retained (the TTL trim is due only when it is older than the cutoff; after one, it is
        read again)."""
        conn = self.conn
        head = tx.next_seq - 1
        oldest = self.oldest
        if oldest <= head - self.outbox_cap:
            self._drop_prefix(head - self.outbox_cap)
            oldest = head - self.outbox_cap + 1
        cutoff = tx.now - self.outbox_ttl
        if oldest_time < cutoff:
            # The newest row older than the cutoff and every offset before it (a prefix, even if
            # the clock went back): the newest mark older than it (``schema``: every row of a
            # batch has its batch's time, and its mark the batch's last offset), one descent of
            # outbox_mark_by_time.
            row = conn.execute(
                'SELECT MAX("offset") FROM outbox_mark INDEXED BY outbox_mark_by_time '
                "WHERE created_at < ?",
                (cutoff,),
            ).fetchone()
            if row[0] is not None:
                self._drop_prefix(row[0])
                oldest = row[0] + 1  # head + 1 (next_seq) when nothing is left
            oldest_time = self._oldest_created()
        return oldest, oldest_time

    def _drop_prefix(self, last: int) -> None:
        """Trim the outbox up to offset ``last`` and the marks with it: a mark kept is its
        batch's last offset, above ``last``, so it still dates that batch's rows that are kept."""
        self.conn.execute('DELETE FROM outbox WHERE "offset" <= ?', (last,))
        self.conn.execute('DELETE FROM outbox_mark WHERE "offset" <= ?', (last,))
