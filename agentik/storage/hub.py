"""EventHub: fan-out of durable events (after commit) by cursor, and of online events (live only).

Replay-then-live, with no gap and no duplicate, by construction:

1. Check the cursor against epoch, oldest and head (else OutboxGapError).
2. Register a live subscriber FIRST, then read the stored outbox after the cursor, page by page.
3. Then take from the live buffer, skipping offsets already replayed. Stored offsets are contiguous
   (every seq has exactly one outbox row; trimming removes only a prefix), so anything missed
   between the last replayed row and the first live one is impossible: the subscriber was
   registered before the read began.
4. The writer only ever ``send_nowait``s. A subscriber whose buffer is full is closed by the writer;
   its reader notices at the end of the buffer and goes back to step 2 from its last offset.
   A reader that waits somewhere else (an idle SSE stream waits for its client's disconnect, in
   one task: issue 13) passes ``wake``: then the live phase never waits, it yields an empty batch
   when nothing is queued, and the writer calls ``wake()`` after handing the subscriber events
   (or closing it), so the reader steps again.
5. If the outbox is trimmed past a reader's position while it replays, the next page shows
   ``last < oldest - 1`` and the reader raises OutboxGapError instead of skipping silently.

A conversation's durable stream (``conversation_id`` given) ends after that conversation's
``Deleted`` event: this is the one place of that rule; the in-process outbox, SSE, the WebSocket
and the client all end because the stream they read ends. No other durable stream ends by
itself. An online stream ends when its reader falls more than ``buffer`` events behind.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

import trio

from agentik.errors import OutboxGapError
from agentik.storage.engine import ReaderEngine
from agentik.storage.types import StoredEvent
from agentik.wire import CommonEvent, Cursor, Deleted, OnlineEvent, event_type

REPLAY_PAGE = 1000
_DELETED = event_type(Deleted(conversation_id=""))


@dataclass(eq=False)
class _Subscriber:
    conversation_id: str | None
    kind: str | None
    send: trio.MemorySendChannel[StoredEvent]
    #: called after events were handed over or the subscriber was closed (see stream's ``wake``)
    wake: Callable[[], None] | None = None

    def wants(self, ev: StoredEvent) -> bool:
        return (self.conversation_id is None or ev.conversation_id == self.conversation_id) and (
            self.kind is None or ev.kind == self.kind
        )


@dataclass(eq=False)
class _OnlineSubscriber:
    """A live subscriber read through a channel (:meth:`EventHub.online_events`)."""

    send: trio.MemorySendChannel[CommonEvent]


@dataclass(eq=False)
class OnlineSubscription:
    """One live subscriber read without waiting (:meth:`EventHub.subscribe_online`): the hub
    appends each event to ``events`` (oldest first) and then calls ``wake()``; the reader takes
    them from there (no channel: nothing raised when it is empty, issue 13). ``ended`` is set
    when the reader fell more than the hub's ``buffer`` behind: nothing more is queued (what
    was queued before stays, in order) and the hub has dropped it. ``close()`` unsubscribes
    (idempotent, synchronous: safe in any ``finally``)."""

    hub: EventHub
    conversation_id: str
    wake: Callable[[], None] | None
    events: deque[CommonEvent] = field(default_factory=deque)
    ended: bool = False

    def close(self) -> None:
        self.hub._unsubscribe_online(self.conversation_id, self)


@dataclass
class EventHub:
    epoch: str
    head: int
    oldest: int  # lowest retained offset; == head + 1 when the outbox is empty
    reader: ReaderEngine
    buffer: int = 4096
    _subs: set[_Subscriber] = field(default_factory=set)
    _online: dict[str, set[_OnlineSubscriber | OnlineSubscription]] = field(default_factory=dict)
    #: set (and replaced) whenever an online subscriber comes or goes
    _online_changed: trio.Event = field(default_factory=trio.Event)
    #: PostgreSQL cluster: also called with every online event published here
    online_tap: Callable[[str, OnlineEvent], None] | None = None

    # --- cursors ---------------------------------------------------------------------------------

    def current_cursor(self) -> Cursor:
        return Cursor(epoch=self.epoch, offset=self.head)

    def oldest_cursor(self) -> Cursor:
        """The oldest cursor that can still be resumed from."""
        return Cursor(epoch=self.epoch, offset=self.oldest - 1)

    def _gap(self, why: str) -> OutboxGapError:
        return OutboxGapError(why, oldest=self.oldest_cursor(), current=self.current_cursor())

    def check(self, after: Cursor) -> None:
        """Raise OutboxGapError unless ``after`` can be resumed from."""
        if after.epoch != self.epoch:
            raise self._gap(f"cursor {after} is from another database epoch")
        if after.offset > self.head:
            raise self._gap(f"cursor {after} is ahead of the head {self.head}")
        if after.offset < self.oldest - 1:
            raise self._gap(f"cursor {after} was evicted from the outbox")

    # --- durable ---------------------------------------------------------------------------------

    def publish(self, events: list[StoredEvent], oldest: int, head: int) -> None:
        """Called by the StorageActor after each commit, events in offset order. Never blocks."""
        self.oldest = oldest
        if not events:
            return
        self.head = max(self.head, head)
        dead: list[_Subscriber] = []
        for sub in self._subs:
            sent = False
            for ev in events:
                if not sub.wants(ev):
                    continue
                try:
                    sub.send.send_nowait(ev)
                    sent = True
                except (trio.WouldBlock, trio.BrokenResourceError):
                    dead.append(sub)
                    break
            if sent and sub.wake is not None:
                sub.wake()
        for sub in dead:
            self._subs.discard(sub)
            sub.send.close()
            if sub.wake is not None:
                sub.wake()

    def drop_live_subscribers(self) -> None:
        """Close every durable live subscriber: each goes back to replaying from the store (which
        raises OutboxGapError to a reader whose events were trimmed). Used by the PostgreSQL feed
        when the outbox was trimmed past its cursor."""
        subs, self._subs = self._subs, set()
        for sub in subs:
            sub.send.close()
            if sub.wake is not None:
                sub.wake()

    @property
    def subscriber_count(self) -> int:
        return len(self._subs)

    async def stream(
        self,
        after: Cursor | None,
        *,
        conversation_id: str | None = None,
        kind: str | None = None,
        wake: Callable[[], None] | None = None,
    ) -> AsyncGenerator[list[StoredEvent], None]:
        """Batches of stored events after ``after`` (None: from the current head), replayed then
        live, each exactly once in offset order. Raises OutboxGapError for a dead cursor or one
        overtaken by eviction. With ``conversation_id``, ends after that conversation's Deleted
        (its last batch ends with it); otherwise runs until the consumer stops iterating or is
        cancelled. The subscriber is registered in the first step of the iteration, before its
        first checkpoint. With ``wake``, the live phase does not wait: an empty batch means
        nothing is queued, and ``wake()`` is called (from the writer's task) when there may be.

        (Over 60 lines on purpose: register, replay page by page, then live with the skip of
        replayed offsets, in one loop, so the order that makes it gap- and duplicate-free reads
        top to bottom; see the module docstring.)"""
        if after is None:
            after = self.current_cursor()
        if after.epoch == self.epoch and after.offset > self.head:
            # A cursor from another node (PostgreSQL) may be ahead of this node's feed by a few
            # milliseconds: it is ahead of the head only if it is ahead of the stored head.
            _, head, _ = await self.reader.outbox_page(self.head, None, None, 0)
            self.head = max(self.head, head)
        self.check(after)
        last = after.offset
        while True:
            send, recv = trio.open_memory_channel[StoredEvent](self.buffer)
            sub = _Subscriber(conversation_id, kind, send, wake)
            self._subs.add(sub)
            try:
                # Replay what is stored after `last` (the subscriber already catches the rest).
                while True:
                    oldest, head, rows = await self.reader.outbox_page(
                        last, conversation_id, kind, REPLAY_PAGE
                    )
                    if last < oldest - 1:
                        raise OutboxGapError(
                            f"events after offset {last} were evicted while replaying",
                            oldest=Cursor(epoch=self.epoch, offset=oldest - 1),
                            current=self.current_cursor(),
                        )
                    if rows:
                        rows, ended = _up_to_deleted(rows, conversation_id)
                        last = rows[-1].offset
                        yield rows
                        if ended:
                            return
                    if len(rows) < REPLAY_PAGE:
                        # Everything stored up to `head` at that read was scanned; with a filter
                        # the non-matching offsets count as seen too.
                        last = max(last, head)
                        break
                # Live.
                while True:
                    try:
                        if wake is None:
                            first = await recv.receive()
                        else:
                            try:
                                first = recv.receive_nowait()
                            except trio.WouldBlock:
                                yield []  # nothing queued: stepped again after wake()
                                continue
                    except trio.EndOfChannel:
                        break  # overflowed: replay from the store, then live again
                    batch = [first]
                    while True:
                        try:
                            batch.append(recv.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    fresh = [ev for ev in batch if ev.offset > last]
                    if fresh:
                        fresh, ended = _up_to_deleted(fresh, conversation_id)
                        last = fresh[-1].offset
                        yield fresh
                        if ended:
                            return
            finally:
                self._subs.discard(sub)
                send.close()

    async def has_events_after(self, conversation_id: str, after: Cursor) -> bool:
        """Whether the stored outbox holds events of ``conversation_id`` after ``after`` (e.g. the
        Deleted of a conversation that is gone now)."""
        return await self.reader.has_conversation_events(conversation_id, after.offset)

    async def events(
        self, after: Cursor | None, *, conversation_id: str | None = None, kind: str | None = None
    ) -> AsyncGenerator[CommonEvent, None]:
        # aclosing: closing this generator closes the inner one (and its subscription) at once,
        # not whenever the garbage collector's finalizer task gets to it.
        async with aclosing(self.stream(after, conversation_id=conversation_id, kind=kind)) as stream:
            async for batch in stream:
                for ev in batch:
                    yield ev.event

    # --- online ----------------------------------------------------------------------------------

    def publish_online(self, conversation_id: str, event: OnlineEvent) -> None:
        if self.online_tap is not None:  # PostgreSQL: relayed to the other nodes too
            self.online_tap(conversation_id, event)
        self.deliver_online(conversation_id, event)

    def deliver_online(self, conversation_id: str, event: OnlineEvent) -> None:
        """Hand an online event to this node's live subscribers (a relayed one: not tapped)."""
        subs = self._online.get(conversation_id)
        if not subs:
            return
        common = CommonEvent(cursor=None, conversation_id=conversation_id, event=event)
        # Online events are live-only: a subscriber too slow to keep up is cut off (its stream
        # ends) rather than fed a stream with holes in the middle of a text.
        for sub in list(subs):
            if isinstance(sub, OnlineSubscription):
                if len(sub.events) < self.buffer:
                    sub.events.append(common)
                else:
                    subs.discard(sub)
                    sub.ended = True
                if sub.wake is not None:
                    sub.wake()
                continue
            try:
                sub.send.send_nowait(common)
            except (trio.WouldBlock, trio.BrokenResourceError):
                subs.discard(sub)
                sub.send.close()

    def subscribe_online(
        self, conversation_id: str, wake: Callable[[], None] | None = None
    ) -> OnlineSubscription:
        """Subscribe to the live online events of one conversation, from now on (registered when
        this returns), read from :attr:`OnlineSubscription.events`; it ends (``ended``) if the
        reader falls more than ``buffer`` events behind; :meth:`OnlineSubscription.close`
        unsubscribes. ``wake()`` (if given) is called after each event queued and when the
        subscription is ended."""
        subscription = OnlineSubscription(self, conversation_id, wake)
        self._subscribe(conversation_id, subscription)
        return subscription

    def _subscribe(self, conversation_id: str, sub: _OnlineSubscriber | OnlineSubscription) -> None:
        self._online.setdefault(conversation_id, set()).add(sub)
        self._online_change()

    def _unsubscribe_online(
        self, conversation_id: str, sub: _OnlineSubscriber | OnlineSubscription
    ) -> None:
        subs = self._online.get(conversation_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._online[conversation_id]
        if isinstance(sub, _OnlineSubscriber):
            sub.send.close()
        self._online_change()

    async def online_events(self, conversation_id: str) -> AsyncGenerator[CommonEvent, None]:
        """Live online events of one conversation, from now on (subscribed at the first
        iteration). Ends if the consumer falls more than ``buffer`` events behind."""
        send, recv = trio.open_memory_channel[CommonEvent](self.buffer)
        sub = _OnlineSubscriber(send)
        self._subscribe(conversation_id, sub)
        try:
            async for ev in recv:
                yield ev
        finally:
            self._unsubscribe_online(conversation_id, sub)
            recv.close()

    def online_subscribers(self, conversation_id: str) -> int:
        return len(self._online.get(conversation_id, ()))

    async def wait_online_subscribers(self, conversation_id: str, n: int = 1) -> None:
        """Wait until ``conversation_id`` has at least ``n`` online subscribers."""
        while self.online_subscribers(conversation_id) < n:
            await self._online_changed.wait()

    def _online_change(self) -> None:
        self._online_changed.set()
        self._online_changed = trio.Event()


def _up_to_deleted(
    batch: list[StoredEvent], conversation_id: str | None
) -> tuple[list[StoredEvent], bool]:
    """``batch`` up to and including the Deleted of ``conversation_id`` (a conversation's stream
    ends there), and whether it was found."""
    if conversation_id is None:
        return batch, False
    for i, ev in enumerate(batch):
        # The tag first: only a Deleted is decoded (a stored page is not decoded otherwise).
        if ev.type != _DELETED:
            continue
        if isinstance(ev.event.event, Deleted) and ev.event.event.conversation_id == conversation_id:
            return batch[: i + 1], True
    return batch, False

