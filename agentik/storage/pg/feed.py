"""The per-node feed (PostgreSQL): every node sees every event, once, in order.

One task per node reads ``outbox WHERE offset > cursor ORDER BY offset LIMIT 1000`` and hands the
rows to the local hub. It wakes on a NOTIFY of the schema's channel from another node (a hint
only: a notification sent while the listener is disconnected is lost), on this node's own
commits, on every listener (re)connect, and on a 1 s timer, so a lost hint costs at most a second.
A read that fails (the database out of reach) is tried again on the timer: the node outlives it.
Each page is checked for contiguity (``offset == cursor + 1``): the counter makes offsets dense
and in commit order, so a jump can only mean that the outbox was trimmed past this node's cursor;
then the hub's live subscribers are cut off and fall back to replay, which reports the gap (410)
to their readers instead of skipping silently.

This node's own batch is published as its writer returned it when every earlier offset already
is (``own``: nothing read back or decoded), else read in order with the others'. Writers are
answered only once the feed has published their batch, so a caller that was acknowledged finds
its events in the local hub, as with SQLite.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from agentik import metrics
from agentik.errors import StorageError
from agentik.storage.hub import EventHub
from agentik.storage.pg.connect import DEFAULT_TIMEOUT
from agentik.storage.pg.listen import listen
from agentik.storage.pg.reader import PgReader
from agentik.storage.types import StoredEvent

log = logging.getLogger(__name__)

PAGE = 1000
TIMER = 1.0


class Feed:
    def __init__(self, url: str, channel: str, reader: PgReader, hub: EventHub,
                 writer: Any = None) -> None:
        self.url = url
        #: this node's writer (``pg.writer.PgWriter``): its own commits reach the feed through
        #: :meth:`own`, so their NOTIFYs (sent by its ``backend_pid``) wake nothing
        self.writer = writer
        self.channel = channel
        self.reader = reader
        self.hub = hub
        #: the last offset handed to the hub
        self.cursor = hub.head
        self._wake = trio.Event()
        self._pending: list[tuple[int, Callable[[], None]]] = []
        self.stats = {"wakeups": 0, "read_failures": 0, "notifies": 0, "connects": 0,
                      "reconnects": 0, "pages": 0,
                      "gaps": 0, "own": 0}
        #: the listener connection's server process id (None while disconnected)
        self.listener_pid: int | None = None

    def wake(self) -> None:
        self._wake.set()

    def own(self, events: list[StoredEvent], oldest: int, head: int,
            fn: Callable[[], None]) -> None:
        """This node's committed batch (offsets up to ``head``); ``fn`` answers its writers.
        When every earlier offset is already published, its events are published right away
        (no read back, nothing decoded); else the feed reads them in order with the others'."""
        if events and events[0].offset == self.cursor + 1 and not self._pending:
            self.cursor = head
            self.stats["own"] += 1
            self.hub.publish(events, oldest, head)
            fn()
        else:
            self.after(head, fn)

    def after(self, head: int, fn: Callable[[], None]) -> None:
        """Call ``fn`` once every event up to ``head`` is published (now, if it already is)."""
        if head <= self.cursor:
            fn()
        else:
            self._pending.append((head, fn))
            self.wake()

    def flush_pending(self) -> None:
        """Shutdown: answer everyone still waiting (their batches are committed)."""
        pending, self._pending = self._pending, []
        for _, fn in pending:
            fn()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self._listen)
            task_status.started()
            while True:
                with trio.move_on_after(TIMER):
                    await self._wake.wait()
                self._wake = trio.Event()
                self.stats["wakeups"] += 1
                try:
                    await self._drain()
                except StorageError as exc:
                    # the database out of reach (the reader waited AGENTIK_DB_TIMEOUT): the
                    # node must outlive it; the timer tries again, the cursor has not moved
                    self.stats["read_failures"] += 1
                    log.warning("feed: reading the outbox failed: %s", exc)

    async def _drain(self) -> None:
        while True:
            after = self.cursor
            oldest, head, rows = await self.reader.outbox_page(after, None, None, PAGE)
            self.stats["pages"] += 1
            full = len(rows) == PAGE
            if self.cursor != after:  # this node's own batch was published meanwhile (``own``)
                rows = [r for r in rows if r.offset > self.cursor]
            if rows and rows[0].offset != self.cursor + 1:
                # Trimmed past our cursor before we read it: the live subscribers cannot be fed
                # what is gone; cut them off so their replay reports the gap.
                self.stats["gaps"] += 1
                metrics.CLUSTER_FEED_GAPS.inc()
                log.warning("feed: events %d..%d were trimmed before this node read them",
                            self.cursor + 1, rows[0].offset - 1)
                self.hub.drop_live_subscribers()
            good = rows
            for i in range(1, len(rows)):
                if rows[i].offset != rows[i - 1].offset + 1:  # pragma: no cover - counter rule
                    log.error("feed: hole after offset %d in one page", rows[i - 1].offset)
                    good = rows[:i]
                    break
            if good:
                self.cursor = good[-1].offset
            elif head > self.cursor and oldest > self.cursor + 1:
                self.stats["gaps"] += 1
                metrics.CLUSTER_FEED_GAPS.inc()
                self.hub.drop_live_subscribers()
                self.cursor = head
            self.hub.publish(good, oldest, self.cursor)
            self._answer()
            if not full:
                return

    def _answer(self) -> None:
        if not self._pending:
            return
        ready = [fn for h, fn in self._pending if h <= self.cursor]
        self._pending = [(h, fn) for h, fn in self._pending if h > self.cursor]
        for fn in ready:
            fn()

    async def _listen(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The feed's listener: every (re)connect wakes the feed (what was notified meanwhile is
        lost), every notification from another node's writer too."""
        await listen(self.url, self.channel, self._notified, name="feed listener",
                     on_connect=self._connected, on_disconnect=self._disconnected,
                     db_timeout=getattr(self.writer, "timeout", DEFAULT_TIMEOUT),
                     task_status=task_status)

    def _connected(self, pid: int) -> None:
        if self.stats["connects"]:
            self.stats["reconnects"] += 1
        self.stats["connects"] += 1
        self.listener_pid = pid
        self.wake()

    def _disconnected(self) -> None:
        self.listener_pid = None

    def _notified(self, notes: list[Any]) -> None:
        mine = getattr(self.writer, "backend_pid", None)
        if any(note.be_pid != mine for note in notes):
            self.stats["notifies"] += 1
            self.wake()
