"""The resync algorithm (docs/PROTOCOL.md §6), done once, correctly.

:class:`JournalSync` keeps a :class:`~agentik.client.cache.JournalStore` equal to the current
branch of one conversation (its messages and snapshot; a ``BranchChanged`` reads it again);
:class:`ConversationListSync` keeps a :class:`~agentik.client.cache.ConversationListCache` equal
to the conversation list. Both::

    async with anyio.create_task_group() as tg:
        sync = JournalSync(agent, conversation_id, store)
        await tg.start(sync.run)          # returns once the cache holds a consistent state
        await sync.wait_for(offset)       # e.g. until an event you saw elsewhere is applied
        ...                               # read from the cache; cancel tg to stop

The algorithm:

1. Resume: if the store has a cursor for this key, stream events after it.
2. Otherwise (first run, or the cursor is dead: OutboxGapError / ``Gap``) resync:
   a. C0 = the current cursor; subscribe to events after C0 FIRST (the stream buffers);
   b. read the snapshot; its cursor C >= C0 says which changes it holds;
   c. replace the cached state with the snapshot, atomically with C (clear + apply);
   d. drain the stream in offset order, skipping offsets <= C (already in the snapshot),
      applying the rest (upsert/delete by id, idempotent), storing each event's cursor;
   e. keep applying live events.
3. Dropped connections are retried by :class:`~agentik.client.ReconnectingOutbox` from the last
   applied cursor; a Gap at any time goes back to 2. A conversation that is deleted (its
   ``Deleted`` event, or a 404 snapshot) empties the store and ``run`` returns.

``run`` raises the cause of a ``Failed`` status (e.g. AuthError, or AgentikConnectionError after
the policy's attempts) and NotFoundError never (a missing conversation is treated as deleted).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.abc

from agentik.client.cache import ConversationListCache, JournalStore
from agentik.client.errors import TRANSIENT
from agentik.client.reconnect import BackoffPolicy, EventStream, Failed, Gap, ReconnectingOutbox
from agentik.errors import NotFoundError
from agentik.wire import (
    ApprovalGiven,
    ApprovalRequested,
    AssistantMessageEvent,
    BranchChanged,
    ChatSnapshot,
    CommonEvent,
    ConversationRecord,
    Cursor,
    Deleted,
    ErrorEvent,
    InputGiven,
    InputRequested,
    Renamed,
    ToolCallEvent,
    ToolFailed,
    ToolResultEvent,
    Touched,
    UserMessageEvent,
)

T = TypeVar("T")

_RECORD_EVENTS = (
    UserMessageEvent, AssistantMessageEvent, ToolCallEvent, ToolResultEvent, ToolFailed, ErrorEvent,
    ApprovalRequested, ApprovalGiven, InputRequested, InputGiven,
)


async def retrying(call: Callable[[], Awaitable[T]], policy: BackoffPolicy, rng: random.Random) -> T:
    """``await call()``, retrying transient errors (connection, 503) per ``policy``; anything
    else, and the last transient error, is raised."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call()
        except TRANSIENT:
            if policy.max_attempts is not None and attempt >= policy.max_attempts:
                raise
            await anyio.sleep(policy.delay(attempt, rng))


def _covered(cursor: Cursor | None, applied: Cursor) -> bool:
    """Is the event at ``cursor`` already in a state valid at ``applied``?"""
    return cursor is not None and cursor.epoch == applied.epoch and cursor.offset <= applied.offset


class _Sync:
    """The shared loop; subclasses say what a snapshot is and how an event applies."""

    key: str

    def __init__(self, agent: Any, policy: BackoffPolicy | None, rng: random.Random | None) -> None:
        self.agent = agent
        self.policy = policy or BackoffPolicy()
        self.rng = rng or random.Random()
        #: the cursor the cache is valid at (None before the first snapshot)
        self.cursor: Cursor | None = None
        #: full resyncs done (the first snapshot counts)
        self.resyncs = 0
        #: Gap statuses seen (dead cursors)
        self.gaps = 0
        #: set when the conversation was deleted (JournalSync only)
        self.gone = False
        self._changed = anyio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, offset: int) -> None:
        """Wait until the cache holds every change up to ``offset`` (or the sync has ended
        because its conversation was deleted)."""
        while not self.gone and (self.cursor is None or self.cursor.offset < offset):
            await self._changed.wait()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        self.cursor = await self._load_cursor()
        while True:
            async with ReconnectingOutbox(self.agent.outbox, self.policy, rng=self.rng) as recon:
                if self.cursor is None:
                    c0 = await retrying(self.agent.outbox.current_cursor, self.policy, self.rng)
                    stream = self._open(recon, c0)  # subscribe FIRST: it buffers meanwhile
                    try:
                        cursor = await self._resync()
                    except NotFoundError:
                        await self._gone()
                        cursor = None
                    if cursor is None:
                        await stream.aclose()
                        if not started:
                            task_status.started()
                        return
                    self.cursor = cursor
                    self.resyncs += 1
                    self._notify()
                else:
                    stream = self._open(recon, self.cursor)
                if not started:
                    started = True
                    task_status.started()
                async with stream:
                    async for ce in stream:
                        if _covered(ce.cursor, self.cursor):
                            continue  # in the snapshot already
                        assert ce.cursor is not None
                        if await self._apply(ce):
                            return
                        self.cursor = ce.cursor
                        self._notify()
                status = recon.status
            if isinstance(status, Gap):
                self.gaps += 1
                self.cursor = None  # dead cursor: start over from a snapshot
                continue
            if isinstance(status, Failed):
                if isinstance(status.cause, NotFoundError):
                    # Resuming the stream of a conversation deleted meanwhile: the server
                    # answers 404 (its Deleted event may be all that is left of it).
                    await self._gone()
                    return
                raise status.cause
            # The stream ended without a terminal status: the conversation was deleted.
            await self._gone()
            return

    async def _gone(self) -> None:
        self.gone = True
        self._notify()

    # --- what subclasses fill in -----------------------------------------------------------------

    async def _load_cursor(self) -> Cursor | None:
        raise NotImplementedError

    def _open(self, recon: ReconnectingOutbox, after: Cursor) -> EventStream:
        raise NotImplementedError

    async def _resync(self) -> Cursor | None:
        """Read the snapshot and replace the cache with it; returns its cursor."""
        raise NotImplementedError

    async def _apply(self, ce: CommonEvent) -> bool:
        """Apply one event past the cache's cursor; True ends the sync (deleted)."""
        raise NotImplementedError


class JournalSync(_Sync):
    """Keeps ``store`` equal to the journal of ``conversation_id`` (module docstring). The
    cursor is kept in the store under the conversation id, so a restarted client resumes.
    ``conversation`` is the conversation record, kept up to date by Renamed/Touched."""

    def __init__(
        self,
        agent: Any,
        conversation_id: str,
        store: JournalStore,
        *,
        policy: BackoffPolicy | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(agent, policy, rng)
        self.conversation_id = conversation_id
        self.key = conversation_id
        self.store = store
        self.conversation: ConversationRecord | None = None
        #: a branch turn is under way: its answer reads the branch again (``_read_branch``)
        self._branch_turn = False

    async def _load_cursor(self) -> Cursor | None:
        return await self.store.load_cursor(self.key)

    def _open(self, recon: ReconnectingOutbox, after: Cursor) -> EventStream:
        return recon.conversation_events(after, self.conversation_id)

    async def _resync(self) -> Cursor | None:
        snap: ChatSnapshot = await retrying(
            lambda: self.agent.chat_snapshot(self.conversation_id), self.policy, self.rng
        )
        await self.store.replace(self.conversation_id, snap.messages, snap.cursor)
        self.conversation = snap.conversation
        return snap.cursor

    async def _read_branch(self, ce: CommonEvent) -> None:
        """The current branch moved (a BranchChanged): read it again, and once more when the
        turn that moved it has its answer (the records its events carry are not numbered)."""
        self._branch_turn = isinstance(ce.event, BranchChanged)
        snap: ChatSnapshot = await retrying(
            lambda: self.agent.chat_snapshot(self.conversation_id), self.policy, self.rng)
        await self.store.replace(self.conversation_id, snap.messages, ce.cursor)

    async def _gone(self) -> None:
        await self.store.clear(self.conversation_id)
        self.conversation = None
        await super()._gone()

    async def _apply(self, ce: CommonEvent) -> bool:
        event = ce.event
        if isinstance(event, _RECORD_EVENTS):
            await self.store.upsert([event.record], key=self.key, cursor=ce.cursor)
            if self._branch_turn and isinstance(event, AssistantMessageEvent | ErrorEvent):
                await self._read_branch(ce)  # its answer: the versions' counts are final
            return False
        if isinstance(event, BranchChanged):
            await self._read_branch(ce)
            return False
        if isinstance(event, Deleted) and event.conversation_id == self.conversation_id:
            await self._gone()
            return True
        if isinstance(event, Renamed | Touched) and self.conversation is not None:
            title = event.title if isinstance(event, Renamed) else self.conversation.title
            self.conversation = ConversationRecord(
                id=self.conversation.id, title=title, is_temporal=self.conversation.is_temporal,
                created_at=self.conversation.created_at, updated_at=event.updated_at,
                seq=ce.cursor.offset if ce.cursor else self.conversation.seq,
            )
        await self.store.save_cursor(self.key, ce.cursor)
        return False


class ConversationListSync(_Sync):
    """Keeps ``cache`` equal to the server's conversation list (module docstring). The snapshot
    is read in pages of ``page`` and is valid at the first page's cursor; events after it are
    replayed over all pages, and a Renamed/Touched for a conversation no page held (it moved
    between pages while they were read) is fetched by id."""

    key = ""

    def __init__(
        self,
        agent: Any,
        cache: ConversationListCache,
        *,
        policy: BackoffPolicy | None = None,
        rng: random.Random | None = None,
        page: int = 1000,
    ) -> None:
        super().__init__(agent, policy, rng)
        self.cache = cache
        self.page = page

    async def _load_cursor(self) -> Cursor | None:
        await anyio.lowlevel.checkpoint()
        return self.cache.cursor

    def _open(self, recon: ReconnectingOutbox, after: Cursor) -> EventStream:
        return recon.agent_events(after)

    async def _resync(self) -> Cursor | None:
        records: list[ConversationRecord] = []
        first: Cursor | None = None
        offset = 0
        while True:
            snap = await retrying(
                lambda o=offset: self.agent.conversations_snapshot(offset=o, limit=self.page),  # type: ignore[misc]
                self.policy, self.rng,
            )
            first = first or snap.cursor
            records.extend(snap.conversations)
            if len(snap.conversations) < self.page:
                break
            offset += self.page
        self.cache.replace(records, first)
        return first

    async def _apply(self, ce: CommonEvent) -> bool:
        assert ce.cursor is not None
        missing = self.cache.apply(ce.event, ce.cursor.offset)
        if missing is not None:
            conv = await retrying(
                lambda: self.agent.get_conversation(missing), self.policy, self.rng
            )
            if conv is not None:
                self.cache.upsert(conv.record)
        self.cache.cursor = ce.cursor
        return False
