"""StorageActor: the node's only writer (SQLite or PostgreSQL, behind ``engine.WriterEngine``).

Callers ``await storage.write(op)``; the request is queued (at most ``queue_size + max_batch``
admitted at a time: a write past that waits for room) with a one-shot reply. The writer thread
(``committer``) takes one request, then every request already queued (up to ``max_batch``), and
commits them all in ONE transaction: group commit, one fsync per batch, so batches grow by
themselves under load. Only after the commit does the actor publish the batch's events to the
hub (in offset order) and then answer each caller, so:

- nothing is acknowledged that is not committed (a failed commit answers every caller of the batch
  with StorageError);
- a reader that takes ``hub.current_cursor()`` and then reads state sees every row <= that cursor.

When the store refuses writes (disk or database full, read-only, I/O error, lost connection: a
*transient* failure, ``engine.is_transient``), the callers get StorageUnavailableError and
``Storage.health`` says so until a commit succeeds again; while nothing else is written, the
actor probes the engine (``engine.probe_write``) with bounded backoff, so readiness (``/readyz``)
comes back without traffic. A turn's writes go through ``write_until_stored``, which retries them
until they are stored: no accepted turn is left without its terminal record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

import trio
from trio.lowlevel import current_task, wait_task_rescheduled

from agentik import tracing
from agentik.config import DEFAULT_DB_TIMEOUT
from agentik.errors import RuntimeClosedError, missing_extra
from agentik.storage import ops
from agentik.storage.committer import PROBE, Committer, Done, Outcome, Request
from agentik.storage.engine import ReaderEngine, WriterEngine
from agentik.storage.health import RETRY, Backoff, StorageHealth, retry_until_stored
from agentik.storage.hub import EventHub
from agentik.storage.outcomes import deliver
from agentik.storage.sqlite.reader import Reader
from agentik.storage.sqlite.writer import Writer
from agentik.wire import End

#: the top-level modules the ``postgres`` extra installs
POSTGRES_EXTRA = ("psycopg", "psycopg_pool")

if TYPE_CHECKING:
    from agentik.storage.pg.feed import Feed
    from agentik.storage.pg.lease import Leases
    from agentik.storage.pg.online import OnlineRelay

log = logging.getLogger(__name__)
R = TypeVar("R")


@dataclass
class StorageStats:
    batches: int = 0
    ops: int = 0
    largest_batch: int = 0
    #: batches planned while the one before ran (PostgreSQL: ``committer._run_pipelined``)
    followed: int = 0


class Storage:
    """Handle to the running StorageActor: ``write`` for the writer, ``reader`` and ``hub`` for
    reads. Made by :func:`run_storage`: ``storage = await nursery.start(run_storage, path)``."""

    def __init__(self, reader: ReaderEngine, hub: EventHub, capacity: int) -> None:
        self.reader = reader
        self.hub = hub
        self.stats = StorageStats()
        self.health = StorageHealth()
        #: PostgreSQL: the node's feed and leases; None on SQLite
        self.feed: Feed | None = None
        self.leases: Leases | None = None
        #: PostgreSQL: the online-event relay to the other nodes
        self.online: OnlineRelay | None = None
        #: PostgreSQL: the database URL and timeout (``lead``)
        self.url: str | None = None
        self.db_timeout = DEFAULT_DB_TIMEOUT
        self._committer: Committer | None = None
        self._closed = False
        #: requests admitted and not yet answered may not exceed ``capacity`` (the bounded
        #: mailbox: a write past it waits for room)
        self._room = capacity
        self._roomy = trio.lowlevel.ParkingLot()
        #: requests not yet handed to the writer thread, and set when the first is added
        self._pending: list[Request] = []
        self._queued = trio.Event()
        #: set by a write while the store refuses writes: the prober's backoff starts over
        self._activity = trio.Event()

    @property
    def epoch(self) -> str:
        return self.hub.epoch

    async def write(self, op: ops.Op[R]) -> R:
        """Commit ``op`` and return its result once it is durable.

        Raises the op's own AgentikError (e.g. NotFoundError) if it was refused, StorageError if
        the transaction failed (nothing stored), RuntimeClosedError if storage is shut down. If the
        caller is cancelled after the request was queued, the write still happens; a caller
        cancelled already when it calls ``write`` queues nothing.
        """
        # No schedule point while there is room: one more task switch per write for nothing
        # (the wait below parks the task anyway).
        while self._room <= 0 and not self._closed:
            await self._roomy.park()
        if self._closed or self._committer is None:
            await trio.lowlevel.checkpoint_if_cancelled()
            raise RuntimeClosedError("storage is closed")
        ops.check_text(op)  # type: ignore[arg-type]  # an Op is an AnyOp (a closed union)
        self._room -= 1
        # Request.wait inline (one coroutine a write fewer): nothing can answer the request
        # before this task parks, as no schedule point comes between. A caller cancelled
        # already is told so as it parks, before any other task runs: Request.abort then takes
        # its request back (``_withdraw``), so it was never handed over (this is what
        # ``checkpoint_if_cancelled`` first did, on every write).
        req = Request(cast("ops.AnyOp", op), task=current_task(), home=self)  # (a closed union)
        if tracing.enabled():
            req.trace = tracing.carry()
        pending = self._pending
        pending.append(req)
        if len(pending) == 1:
            self._queued.set()
        if not self.health.writable:
            self._activity.set()
        await wait_task_rescheduled(req.abort)
        if req.error is not None:
            raise req.error
        return cast(R, req.result)  # the engine's answer to an Op[R]

    async def lead(self, name: str, job: Callable[[], Awaitable[None]]) -> None:
        """Run ``job`` while this node is the one doing ``name`` (PostgreSQL: the node holding
        its lock, ``pg/leader.py``; SQLite: one process, at once)."""
        if self.url is None:
            await job()
            return
        from agentik.storage.pg.leader import lead

        await lead(self.url, name, job, db_timeout=self.db_timeout,
                   every=max(0.5, (self.leases.ttl if self.leases else 10.0) / 2))

    async def recover_turns(self, op: ops.RecoverTurns) -> list[tuple[str, str]]:
        """Store ``op`` (the running turns a dead process or node left get their Error), then
        end their live streams as a turn's own ending does (``actors/ending.py``): an ``End``
        online event each, after the Error is in the hub, so a ``/live`` subscriber waiting for
        the turn's end (on this node, or relayed to the others) gets it. Returns the closed
        turns as (conversation id, turn id)."""
        closed: list[tuple[str, str]] = await self.write(op)
        for conversation_id, turn_id in closed:
            self.hub.publish_online(conversation_id, End(turn_id=turn_id))
        return closed

    def _withdraw(self, req: Request) -> None:
        """Take back the request of a caller that was cancelled before it parked (it is the last
        one queued: no other task ran since)."""
        pending = self._pending
        for i in range(len(pending) - 1, -1, -1):
            if pending[i] is req:
                del pending[i]
                self._answered(1)
                return

    def _answered(self, n: int) -> None:
        self._room += n
        self._roomy.unpark(count=n)

    def _close(self) -> None:
        self._closed = True
        self._roomy.unpark_all()

    async def _hand_over(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                         ) -> None:
        """Hand the queued requests to the writer thread, all together, once per scheduling
        round: woken by the first write of a round, this task runs in the next one, after every
        writer made runnable with it (say, the callers of the last batch, answered together)
        has queued its request. So a batch is as large as the load, as when the actor gathered
        it, and the thread's queue sees one put per round instead of one per write."""
        assert self._committer is not None
        task_status.started()
        while True:
            await self._queued.wait()
            self._queued = trio.Event()
            reqs, self._pending = self._pending, []
            if reqs:  # empty when the one write of the round was withdrawn
                self._committer.submit(reqs)

    async def _activity_wait(self) -> None:
        self._activity = trio.Event()
        await self._activity.wait()

    async def write_until_stored(self, op: ops.Op[R], *, backoff: Backoff = RETRY) -> R:
        """:meth:`write`, retried while the store refuses writes (StorageUnavailableError: disk
        full, read-only, ...) until ``op`` is stored: for the writes of a turn, above all its
        ending, which must not be lost to a full disk. Raises what :meth:`write` raises but
        StorageUnavailableError; Cancelled when cancelled between attempts (``op`` then not
        stored; see :func:`retry_until_stored`)."""
        return await retry_until_stored(self.write, self.health, op, backoff)


async def run_storage(
    path: str,
    *,
    database_url: str | None = None,
    node_id: str = "",
    lease_ttl: float = 10.0,
    node_url: str | None = None,
    db_timeout: float = DEFAULT_DB_TIMEOUT,
    synchronous: str = "FULL",
    outbox_cap: int = 100_000,
    outbox_ttl: float = 7 * 24 * 3600.0,
    max_batch: int = 512,
    subscriber_buffer: int = 4096,
    queue_size: int = 4096,
    clock: Callable[[], float] = time.time,
    task_status: trio.TaskStatus[Storage] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the StorageActor until cancelled. ``task_status.started`` gets the Storage handle once
    the database is open and migrated. Raises StorageError if the database cannot be opened.
    ``database_url`` (``postgresql://…``) selects PostgreSQL instead of the SQLite file ``path``;
    the node then holds conversation leases as ``node_id`` (TTL ``lease_ttl``), advertising
    ``node_url`` for commands forwarded to it. ``db_timeout``: AGENTIK_DB_TIMEOUT (``pg.connect``).
    ``clock`` is the writer's clock: every stored time comes from it, once per batch."""
    if database_url is not None:
        engines = await _open_postgres(database_url, node_id=node_id, lease_ttl=lease_ttl,
                                       node_url=node_url, outbox_cap=outbox_cap,
                                       outbox_ttl=outbox_ttl, clock=clock, db_timeout=db_timeout)
    else:
        sqlite = await trio.to_thread.run_sync(
            lambda: Writer(path, synchronous=synchronous, outbox_cap=outbox_cap,
                           outbox_ttl=outbox_ttl, clock=clock, busy_timeout=db_timeout)
        )
        engines = _Engines(sqlite, Reader(path, busy_timeout=db_timeout))
    writer, reader = engines.writer, engines.reader
    hub = EventHub(
        epoch=writer.epoch, head=writer.next_seq - 1, oldest=writer.oldest, reader=reader,
        buffer=subscriber_buffer,
    )
    capacity = queue_size + max_batch
    storage = Storage(reader, hub, capacity)
    # +1: the one probe in flight (committer's docstring: this channel is never full)
    post, outcomes = trio.open_memory_channel[Outcome | Done](capacity + 1)
    committer = Committer(writer, max_batch, post)
    feed: Feed | None = None
    try:
        async with trio.open_nursery() as nursery:
            committer.start()
            storage._committer = committer
            if engines.url is not None:
                feed = await _start_node(nursery, storage, engines)
            await nursery.start(storage._hand_over)
            await nursery.start(_probe_loop, storage, committer)
            task_status.started(storage)
            async for outcome in outcomes:
                assert isinstance(outcome, Outcome)  # DONE comes only after stop()
                deliver(hub, storage, outcome, feed)
    finally:
        with trio.CancelScope(shield=True):
            await _shut_down(storage, engines, outcomes, feed)


async def _shut_down(storage: Storage, engines: _Engines,
                     outcomes: trio.MemoryReceiveChannel[Outcome | Done], feed: Feed | None
                     ) -> None:
    """Stop the writer thread, answer everyone, close the engines (shielded by the caller)."""
    storage._close()
    committer = storage._committer
    if committer is not None:
        committer.stop()
        # a commit that started always finishes and is answered: a caller is never told
        # "failed" about data that is in fact stored
        async for outcome in outcomes:
            if not isinstance(outcome, Outcome):
                break
            deliver(storage.hub, storage, outcome, feed)
        committer.close()
    unsent, storage._pending = storage._pending, []
    for req in (committer.leftovers() if committer is not None else []) + unsent:
        req.error = RuntimeClosedError("storage is closed")
        req.answer()
    if feed is not None:
        feed.flush_pending()  # committed: answer them even though this node stops
    # Readers first: the writer's close is then the last connection's, which checkpoints the WAL
    # into the database file and removes it.
    engines.reader.close()
    await trio.to_thread.run_sync(engines.writer.close)


@dataclass
class _Engines:
    writer: WriterEngine
    reader: ReaderEngine
    #: PostgreSQL: the database URL and the node's leases
    url: str | None = None
    leases: Leases | None = None


async def _open_postgres(
    url: str, *, node_id: str, lease_ttl: float, node_url: str | None, outbox_cap: int,
    outbox_ttl: float, clock: Callable[[], float], db_timeout: float,
) -> _Engines:
    try:  # the PostgreSQL modules import psycopg: the bare install has none
        from agentik.storage.pg.lease import Leases
        from agentik.storage.pg.reader import PgReader
        from agentik.storage.pg.writer import PgWriter
    except ImportError as exc:
        if exc.name is not None and exc.name.partition(".")[0] not in POSTGRES_EXTRA:
            raise  # not the extra's: a bug of ours, not a missing install
        raise missing_extra("AGENTIK_DATABASE_URL", "PostgreSQL needs psycopg", "postgres",
                            exc) from None

    pg_writer = await trio.to_thread.run_sync(
        lambda: PgWriter(url, outbox_cap=outbox_cap, outbox_ttl=outbox_ttl, clock=clock,
                         timeout=db_timeout)
    )
    pg_reader = PgReader(url, timeout=db_timeout)
    try:
        await trio.to_thread.run_sync(pg_reader.open)
    except BaseException:
        pg_reader.close()
        await trio.to_thread.run_sync(pg_writer.close)
        raise
    leases = pg_writer.leases = Leases(url, node_id=node_id, ttl=lease_ttl, addr=node_url)
    return _Engines(pg_writer, pg_reader, url=url, leases=leases)


async def _start_node(nursery: trio.Nursery, storage: Storage, engines: _Engines) -> Feed:
    """PostgreSQL: start the node's feed (returned), leases and online relay in ``nursery``."""
    from agentik.storage.pg.feed import Feed
    from agentik.storage.pg.online import OnlineRelay
    from agentik.storage.pg.reader import PgReader
    from agentik.storage.pg.schema import channel
    from agentik.storage.pg.writer import PgWriter

    pg_writer = engines.writer
    url, leases, hub = engines.url, engines.leases, storage.hub
    assert url is not None and leases is not None and isinstance(pg_writer, PgWriter)
    assert isinstance(engines.reader, PgReader)
    feed = storage.feed = Feed(url, pg_writer.channel, engines.reader, hub, pg_writer)
    storage.url, storage.db_timeout = url, pg_writer.timeout
    await nursery.start(feed.run)
    storage.leases = leases
    leases.write, leases.recover = storage.write, storage.recover_turns
    await nursery.start(leases.run)
    relay = storage.online = OnlineRelay(
        url, channel("o_" + pg_writer.schema), leases.node_id, hub, timeout=pg_writer.timeout)
    hub.online_tap = relay.tap
    await nursery.start(relay.run)
    return feed


async def _probe_loop(
    storage: Storage, committer: Committer, backoff: Backoff = RETRY,
    *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """While the store refuses writes and no write comes, probe it after each backoff delay (in
    the writer thread, between batches), so readiness returns without traffic."""

    async def probe() -> None:
        req = Request(PROBE)
        committer.submit([req])
        await req.wait()

    task_status.started()
    await probe_while_refused(storage.health, storage._activity_wait, probe, backoff)


async def probe_while_refused(
    health: StorageHealth,
    activity: Callable[[], Awaitable[None]],
    probe: Callable[[], Awaitable[None]],
    backoff: Backoff = RETRY,
) -> None:
    """Forever: once ``health`` says writes are refused, ``probe()`` after each delay of
    ``backoff`` until it says they are accepted again. A write arriving meanwhile (``activity``
    returns) is itself a probe: the backoff starts over from it."""
    while True:
        await health.wait_writable(False)
        delays: Iterator[float] = backoff.delays()
        while not health.writable:
            with trio.move_on_after(next(delays)) as waited:
                await activity()
            if waited.cancelled_caught:
                await probe()
            else:
                delays = backoff.delays()
