"""StorageActor: the node's only writer (SQLite or PostgreSQL, behind ``engine.WriterEngine``).

Callers ``await storage.write(op)``; the request goes on a bounded channel with a one-shot reply.
The actor takes one request, then every request already queued (up to ``max_batch``), and commits
them all in ONE transaction in a worker thread: group commit, one fsync per batch, so batches grow
by themselves under load. Only after the commit does it publish the batch's events to the hub (in
offset order) and then answer each caller, so:

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
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from agentik import metrics
from agentik.errors import (
    AgentikError,
    LeaseLostError,
    RuntimeClosedError,
    StorageError,
    StorageUnavailableError,
)
from agentik.storage import ops
from agentik.storage.engine import ReaderEngine, WriterEngine, is_transient, probe_write
from agentik.storage.hub import EventHub
from agentik.storage.queries import Reader
from agentik.storage.writer import Writer

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Request:
    op: ops.AnyOp
    done: trio.Event = field(default_factory=trio.Event)
    result: Any = None
    error: BaseException | None = None


@dataclass
class StorageStats:
    batches: int = 0
    ops: int = 0
    largest_batch: int = 0


@dataclass(frozen=True)
class Backoff:
    """Waits that double from ``initial`` up to ``maximum`` seconds: between the writer's probes
    of a store that refuses writes, and between the attempts of ``write_until_stored``. The cap
    bounds how long after space returns a retried write is stored (a probe that succeeds wakes
    every waiting writer at once)."""

    initial: float = 0.05
    maximum: float = 1.0

    def delays(self) -> Iterator[float]:
        delay = self.initial
        while True:
            yield delay
            delay = min(delay * 2, self.maximum)


#: the backoff of the StorageActor's probes and of ``write_until_stored``
RETRY = Backoff()


class StorageHealth:
    """Whether the store accepts writes, as the writer last found it: every commit and every
    probe reports here (in the actor, before callers are answered). ``/readyz`` reads it through
    the Agent; ``wait_writable`` wakes writers retrying a refused write once one succeeds."""

    def __init__(self) -> None:
        self.writable = True
        #: why writes are refused (the database's message); None while writable
        self.error: str | None = None
        #: wall-clock time of the first refused write of this outage; None while writable
        self.since: float | None = None
        #: refused commits and probes in this outage
        self.refusals = 0
        self._changed = trio.Event()

    def refused(self, error: str) -> None:
        if self.writable:
            self.writable = False
            self.since = time.time()
            log.error("storage refuses writes: %s", error)
        self.error = error
        self.refusals += 1
        self._change()

    def accepted(self) -> None:
        if self.writable:
            return
        log.warning("storage accepts writes again (refused for %.1f s, %d attempts)",
                    time.time() - (self.since or time.time()), self.refusals)
        self.writable, self.error, self.since, self.refusals = True, None, None, 0
        self._change()

    def _change(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def changed(self) -> None:
        """Return at the next refused write or probe, or when writes are accepted again."""
        await self._changed.wait()

    async def wait_writable(self, writable: bool = True) -> None:
        """Return once the store accepts writes (``writable`` False: once it refuses them); at
        once when it does now."""
        while self.writable != writable:
            await self._changed.wait()


async def retry_until_stored(
    write: Callable[[ops.AnyOp], Awaitable[Any]],
    health: StorageHealth,
    op: ops.AnyOp,
    backoff: Backoff = RETRY,
) -> Any:
    """``await write(op)``, again after each StorageUnavailableError once ``health`` says writes
    are accepted again or the next backoff delay has passed. Each attempt is shielded (its
    answer is always known); the waits between attempts are not, so a cancel ends the retries
    with Cancelled, and then ``op`` was not stored. Other errors propagate at once."""
    delays = backoff.delays()
    attempts = 0
    while True:
        attempts += 1
        with trio.CancelScope(shield=True):
            try:
                return await write(op)
            except StorageUnavailableError as exc:
                error = exc
        if attempts == 1:
            log.warning("%s not stored (%s): retrying until the store accepts writes",
                        type(op).__name__, error)
        with trio.move_on_after(next(delays)):
            await health.wait_writable()


class Storage:
    """Handle to the running StorageActor: ``write`` for the writer, ``reader`` and ``hub`` for
    reads. Made by :func:`run_storage`: ``storage = await nursery.start(run_storage, path)``."""

    def __init__(
        self, send: trio.MemorySendChannel[_Request], reader: ReaderEngine, hub: EventHub
    ) -> None:
        self._send = send
        self.reader = reader
        self.hub = hub
        self.stats = StorageStats()
        self.health = StorageHealth()
        #: PostgreSQL: the node's feed (``pg_feed.Feed``) and leases (``pg_lease.Leases``); None
        #: on SQLite
        self.feed: Any = None
        self.leases: Any = None
        #: PostgreSQL: the online-event relay to the other nodes (``pg_online.OnlineRelay``)
        self.online: Any = None

    @property
    def epoch(self) -> str:
        return self.hub.epoch

    async def write(self, op: ops.AnyOp) -> Any:
        """Commit ``op`` and return its result once it is durable.

        Raises the op's own AgentikError (e.g. NotFoundError) if it was refused, StorageError if
        the transaction failed (nothing stored), RuntimeClosedError if storage is shut down. If the
        caller is cancelled after the request was queued, the write still happens.
        """
        req = _Request(op)
        try:
            await self._send.send(req)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise RuntimeClosedError("storage is closed") from None
        await req.done.wait()
        if req.error is not None:
            raise req.error
        return req.result

    async def write_until_stored(self, op: ops.AnyOp, *, backoff: Backoff = RETRY) -> Any:
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
    ``node_url`` for commands forwarded to it.
    ``clock`` is the writer's clock: every stored time comes from it, once per batch."""
    writer: WriterEngine
    reader: ReaderEngine
    feed: Any = None
    if database_url is not None:
        from agentik.storage.pg_feed import Feed
        from agentik.storage.pg_reader import PgReader
        from agentik.storage.pg_writer import PgWriter

        url = database_url
        pg_writer = await trio.to_thread.run_sync(
            lambda: PgWriter(url, outbox_cap=outbox_cap, outbox_ttl=outbox_ttl, clock=clock)
        )
        pg_reader = PgReader(url)
        try:
            await trio.to_thread.run_sync(pg_reader.open)
        except BaseException:
            pg_reader.close()
            await trio.to_thread.run_sync(pg_writer.close)
            raise
        writer, reader = pg_writer, pg_reader
        from agentik.storage.pg_lease import Leases

        leases = pg_writer.leases = Leases(url, node_id=node_id, ttl=lease_ttl, addr=node_url)
    else:
        writer = await trio.to_thread.run_sync(
            lambda: Writer(path, synchronous=synchronous, outbox_cap=outbox_cap,
                           outbox_ttl=outbox_ttl, clock=clock)
        )
        reader = Reader(path)
    hub = EventHub(
        epoch=writer.epoch, head=writer.next_seq - 1, oldest=writer.oldest, reader=reader,
        buffer=subscriber_buffer,
    )
    send, recv = trio.open_memory_channel[_Request](queue_size)
    storage = Storage(send, reader, hub)
    try:
        async with trio.open_nursery() as nursery:
            if not writer.publishes_commits:
                feed = storage.feed = Feed(url, pg_writer.channel, pg_reader, hub, pg_writer)
                await nursery.start(feed.run)
                storage.leases = leases
                leases.write = storage.write
                await nursery.start(leases.run)
                from agentik.storage.pg_online import OnlineRelay
                from agentik.storage.pg_schema import channel

                relay = storage.online = OnlineRelay(
                    url, channel("o_" + pg_writer.schema), leases.node_id, hub)
                hub.online_tap = relay.tap
                await nursery.start(relay.run)
            task_status.started(storage)
            probe = partial(_probe, writer, storage.health)
            async with recv:
                while True:
                    batch = await _next_batch(recv, max_batch, storage.health, probe)
                    await _commit(writer, hub, storage, batch, feed)
    finally:
        send.close()
        if feed is not None:
            feed.flush_pending()  # committed: answer them even though this node stops
        # Answer anyone still waiting so no caller hangs on a closed actor.
        while True:
            try:
                req = recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            req.error = RuntimeClosedError("storage is closed")
            req.done.set()
        with trio.CancelScope(shield=True):
            # Readers first: the writer's close is then the last connection's, which checkpoints
            # the WAL into the database file and removes it.
            reader.close()
            await trio.to_thread.run_sync(writer.close)


async def _next_batch(
    recv: trio.MemoryReceiveChannel[_Request],
    max_batch: int,
    health: StorageHealth,
    probe: Callable[[], Awaitable[None]],
    backoff: Backoff = RETRY,
) -> list[_Request]:
    """One request, then every request already queued (up to ``max_batch``). While the store
    refuses writes and no request comes, ``probe`` it after each backoff delay."""
    delays: Iterator[float] | None = None
    while True:
        if health.writable:
            delays = None
            first = await recv.receive()
            break
        if delays is None:
            delays = backoff.delays()
        with trio.move_on_after(next(delays)):
            first = await recv.receive()
            break
        await probe()
    batch = [first]
    while len(batch) < max_batch:
        try:
            batch.append(recv.receive_nowait())
        except trio.WouldBlock:
            break
    return batch


async def _probe(writer: WriterEngine, health: StorageHealth) -> None:
    """One probe write (in the writer's thread slot: the actor runs nothing else meanwhile)."""
    try:
        await trio.to_thread.run_sync(probe_write, writer)
    except StorageError as exc:
        health.refused(str(exc))
        return
    except Exception as exc:  # a probe must never take storage down
        log.exception("the storage probe failed")
        health.refused(f"probe failed: {type(exc).__name__}: {exc}")
        return
    health.accepted()


async def _commit(
    writer: WriterEngine, hub: EventHub, storage: Storage, batch: list[_Request], feed: Any
) -> None:
    # The thread call is not abandoned on cancel: a commit that started always finishes and is
    # answered, so a caller is never told "failed" about data that is in fact stored.
    started = time.perf_counter()
    try:
        result = await trio.to_thread.run_sync(writer.commit_batch, [r.op for r in batch])
    except StorageError as exc:
        log.error("storage batch of %d failed: %s", len(batch), exc)
        error: type[StorageError] = StorageError
        if is_transient(exc):
            error = StorageUnavailableError
            storage.health.refused(str(exc))
        for req in batch:
            req.error = error(str(exc))
            req.done.set()
        return
    storage.health.accepted()
    storage.stats.batches += 1
    storage.stats.ops += len(batch)
    storage.stats.largest_batch = max(storage.stats.largest_batch, len(batch))
    metrics.STORAGE_COMMIT.observe(time.perf_counter() - started)
    metrics.STORAGE_BATCH.observe(len(batch))
    metrics.EVENTS_COMMITTED.inc(len(result.events))

    def answer() -> None:
        for req, value in zip(batch, result.results, strict=True):
            if isinstance(value, LeaseLostError) and storage.leases is not None:
                cid = getattr(req.op, "conversation_id", None)
                if isinstance(cid, str):
                    storage.leases.fenced_out(cid)
            if isinstance(value, AgentikError):
                req.error = value
            else:
                req.result = value
            req.done.set()

    if feed is None:
        hub.publish(result.events, result.oldest, result.head)
        answer()
    else:
        # Every node's events (this one's too) reach the hub through the feed, in global order;
        # callers are answered once their batch is published there.
        feed.own(result.events, result.oldest, result.head, answer)
