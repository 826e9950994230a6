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
from agentik.storage.health import RETRY, Backoff, StorageHealth, retry_until_stored
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
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            # Not ``send`` while there is room: its extra schedule point after queueing is one
            # more task switch per write for nothing (the wait below parks the task anyway).
            try:
                self._send.send_nowait(req)
            except trio.WouldBlock:
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
    if database_url is not None:
        engines = await _open_postgres(database_url, node_id=node_id, lease_ttl=lease_ttl,
                                       node_url=node_url, outbox_cap=outbox_cap,
                                       outbox_ttl=outbox_ttl, clock=clock)
    else:
        sqlite = await trio.to_thread.run_sync(
            lambda: Writer(path, synchronous=synchronous, outbox_cap=outbox_cap,
                           outbox_ttl=outbox_ttl, clock=clock)
        )
        engines = _Engines(sqlite, Reader(path))
    writer, reader = engines.writer, engines.reader
    hub = EventHub(
        epoch=writer.epoch, head=writer.next_seq - 1, oldest=writer.oldest, reader=reader,
        buffer=subscriber_buffer,
    )
    send, recv = trio.open_memory_channel[_Request](queue_size)
    storage = Storage(send, reader, hub)
    feed: Any = None
    try:
        async with trio.open_nursery() as nursery:
            if engines.url is not None:
                feed = await _start_node(nursery, storage, engines)
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
        _answer_closed(recv)
        with trio.CancelScope(shield=True):
            # Readers first: the writer's close is then the last connection's, which checkpoints
            # the WAL into the database file and removes it.
            reader.close()
            await trio.to_thread.run_sync(writer.close)


@dataclass
class _Engines:
    writer: WriterEngine
    reader: ReaderEngine
    #: PostgreSQL: the database URL and the node's leases (``pg_lease.Leases``)
    url: str | None = None
    leases: Any = None


async def _open_postgres(
    url: str, *, node_id: str, lease_ttl: float, node_url: str | None, outbox_cap: int,
    outbox_ttl: float, clock: Callable[[], float],
) -> _Engines:
    from agentik.storage.pg_lease import Leases
    from agentik.storage.pg_reader import PgReader
    from agentik.storage.pg_writer import PgWriter

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
    leases = pg_writer.leases = Leases(url, node_id=node_id, ttl=lease_ttl, addr=node_url)
    return _Engines(pg_writer, pg_reader, url=url, leases=leases)


async def _start_node(nursery: trio.Nursery, storage: Storage, engines: _Engines) -> Any:
    """PostgreSQL: start the node's feed (returned), leases and online relay in ``nursery``."""
    from agentik.storage.pg_feed import Feed
    from agentik.storage.pg_online import OnlineRelay
    from agentik.storage.pg_schema import channel

    pg_writer: Any = engines.writer
    url, leases, hub = engines.url, engines.leases, storage.hub
    assert url is not None
    feed = storage.feed = Feed(url, pg_writer.channel, engines.reader, hub, pg_writer)  # type: ignore[arg-type]
    await nursery.start(feed.run)
    storage.leases = leases
    leases.write = storage.write
    await nursery.start(leases.run)
    relay = storage.online = OnlineRelay(
        url, channel("o_" + pg_writer.schema), leases.node_id, hub)
    hub.online_tap = relay.tap
    await nursery.start(relay.run)
    return feed


def _answer_closed(recv: trio.MemoryReceiveChannel[_Request]) -> None:
    """Answer anyone still waiting so no caller hangs on a closed actor."""
    while True:
        try:
            req = recv.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return
        req.error = RuntimeClosedError("storage is closed")
        req.done.set()


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
        error: type[StorageError] = StorageError
        if is_transient(exc):
            # StorageHealth logs the outage once when it starts and once when it ends; retries
            # during it are not news (one line per attempt would flood the log for its length).
            log.debug("storage batch of %d refused: %s", len(batch), exc)
            error = StorageUnavailableError
            storage.health.refused(str(exc))
        else:
            log.error("storage batch of %d failed: %s", len(batch), exc)
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
