"""The handles of :class:`~agentik.agent.LocalAgent` over storage: ``agent.journal``,
``agent.outbox``, ``agent.online_outbox`` and ``agent.task_records`` (the in-process
counterparts of :mod:`agentik.client.handles`), and the limits every read checks.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING

from agentik.errors import InvalidInputError
from agentik.storage import ops
from agentik.storage.hub import OnlineSubscription
from agentik.storage.types import A2ATaskRow, StoredEvent
from agentik.wire import CommonEvent, Cursor, MessageRecord, TaskUpdated

if TYPE_CHECKING:
    from agentik.actors.deps import Deps
    from agentik.agent_users import UserScope
    from agentik.storage.actor import Storage

MAX_PAGE = 1000


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidInputError(f"limit must be 1..{MAX_PAGE}, got {limit}")
    return limit


def check_non_negative(name: str, value: int) -> int:
    if value < 0:
        raise InvalidInputError(f"{name} must be >= 0, got {value}")
    return value


class Journal:
    """Append-only journal reads by seq. ``user``: only that user's conversations (another's
    conversation id reads as an unknown one: nothing)."""

    def __init__(self, deps: Deps, users: UserScope) -> None:
        self._deps = deps
        self._users = users

    async def list(
        self,
        conversation_id: str | None = None,
        after_seq: int = 0,
        up_to_seq: int | None = None,
        limit: int = 100,
        *,
        user: str | None = None,
    ) -> list[MessageRecord]:
        after_seq, limit = check_non_negative("after_seq", after_seq), check_limit(limit)
        reader = self._deps.storage.reader
        if user is not None and conversation_id is None:
            return await reader.journal_of(user, after_seq, up_to_seq, limit)
        if conversation_id is not None and not await self._users.owns(conversation_id, user):
            return []
        return await reader.journal(conversation_id, after_seq, up_to_seq, limit)

    async def waiting(self, conversation_id: str, *, user: str | None = None
                      ) -> tuple[str, int] | None:
        """The conversation's turn that waits for a person (docs/PROTOCOL.md, "A person in the
        loop"), if any: (its id, its user message's seq); None also for another user's."""
        if not await self._users.owns(conversation_id, user):
            return None
        return await self._deps.storage.reader.waiting_turn(conversation_id)

    async def count(
        self, conversation_id: str | None = None, after_seq: int = 0, *, user: str | None = None
    ) -> int:
        after_seq = check_non_negative("after_seq", after_seq)
        reader = self._deps.storage.reader
        if user is not None and conversation_id is None:
            return await reader.journal_count_of(user, after_seq)
        if conversation_id is not None and not await self._users.owns(conversation_id, user):
            return 0
        return await reader.journal_count(conversation_id, after_seq)


class Outbox:
    """Durable events by cursor: replay from the stored outbox, then live."""

    def __init__(self, deps: Deps, users: UserScope) -> None:
        self._hub = deps.storage.hub
        self._users = users

    async def current_cursor(self) -> Cursor:
        return self._hub.current_cursor()

    async def oldest_cursor(self) -> Cursor:
        return self._hub.oldest_cursor()

    def events(self, after: Cursor | None = None) -> AsyncGenerator[CommonEvent, None]:
        """Every durable event (agent and conversation) after ``after`` (None: from now)."""
        return self._hub.events(after)

    def agent_events(self, after: Cursor | None = None) -> AsyncGenerator[CommonEvent, None]:
        """Conversation-list events only: Created, Deleted, Renamed, Touched."""
        return self._hub.events(after, kind="agent")

    def conversation_events(
        self, after: Cursor | None, conversation_id: str
    ) -> AsyncGenerator[CommonEvent, None]:
        """One conversation's durable events, including its own Renamed/Touched; it ends after
        the conversation's Deleted."""
        return self._hub.events(after, conversation_id=conversation_id)

    # For transports (agentik.web): the same streams as stored, so they need not re-encode.

    def resumable(self, after: Cursor | None) -> Cursor:
        """``after`` (None: the current head) if a stream can start there. Raises OutboxGapError
        at once, so a transport can answer before its stream starts."""
        cursor = self._hub.current_cursor() if after is None else after
        self._hub.check(cursor)
        return cursor

    def stored_batches(
        self,
        after: Cursor,
        *,
        conversation_id: str | None = None,
        kind: str | None = None,
        wake: Callable[[], None] | None = None,
        user: str | None = None,
    ) -> AsyncGenerator[list[StoredEvent], None]:
        """The durable events of ``events`` / ``agent_events`` (``kind="agent"``) /
        ``conversation_events`` (``conversation_id``) in the batches they are committed in, each
        event with its stored CommonEvent JSON (``raw``). Same order, errors and end; the
        subscription is in place at the first step of the iteration (before it waits). With
        ``wake``, it never waits for live events: see :meth:`EventHub.stream`. ``user``: only
        the events of that user's conversations (the cursors stay the whole stream's)."""
        stream = self._hub.stream(after, conversation_id=conversation_id, kind=kind, wake=wake)
        return stream if user is None else self._users.filtered(stream, user)

    async def has_events_after(self, conversation_id: str, after: Cursor) -> bool:
        """Whether events of ``conversation_id`` after ``after`` are stored (e.g. the Deleted of
        a conversation that is gone now, still to be streamed to a client resuming there)."""
        return await self._hub.has_events_after(conversation_id, after)


class OnlineOutbox:
    def __init__(self, deps: Deps) -> None:
        self._hub = deps.storage.hub

    def online_events(self, conversation_id: str) -> AsyncGenerator[CommonEvent, None]:
        """Live-only events (Working, StartResponse, AppendText, End, ...); no cursor, no replay."""
        return self._hub.online_events(conversation_id)

    def subscribe(
        self, conversation_id: str, wake: Callable[[], None] | None = None
    ) -> OnlineSubscription:
        """The same events on a receive channel, subscribed when this returns (no generator and
        no task in between: the live SSE stream reads it directly); ``close()`` it when done.
        ``wake()`` is called after each event queued there and when it ends."""
        return self._hub.subscribe_online(conversation_id, wake)


#: outbox rows read at a time for a task's changes after its row
_CHANGES_PAGE = 500


class TaskRecords:
    """Task records kept under the shared counter (the A2A facade's tasks, docs/A2A.md): each
    change stores the whole record (an opaque JSON ``record``, its ``state``) with seq = N and a
    ``TaskUpdated`` event (``update``, outbox kind ``a2a``) at offset N, in one transaction; a
    chunk stores its event only (:meth:`changes_after` reads them back).
    ``expect_seq`` makes a change conditional on the seq last read (None: the record must not
    exist); a stale one raises ConflictError and stores nothing."""

    def __init__(self, storage: Storage, users: UserScope | None = None) -> None:
        self._storage = storage
        self._users = users

    async def put(
        self, *, task_id: str, context_id: str, conversation_id: str | None, state: str,
        record: bytes, update: bytes, expect_seq: int | None, chunk: bool = False,
    ) -> int:
        """Store one change (``chunk``: its event only, ``ops.PutA2ATask.chunk``); returns its
        seq. Raises ConflictError, StorageError."""
        seq: int = await self._storage.write(ops.PutA2ATask(
            task_id=task_id, context_id=context_id, conversation_id=conversation_id,
            state=state, task=record, update=update, expect_seq=expect_seq, chunk=chunk,
        ))
        return seq

    async def get(self, task_id: str, user: str | None = None) -> A2ATaskRow | None:
        """The record; None also when it is not ``user``'s (a record of one of their
        conversations), answered as for an unknown one."""
        row = await self._storage.reader.get_a2a_task(task_id)
        if row is None or user is None:
            return row
        cid = row.conversation_id
        owned = cid is not None and self._users is not None and await self._users.owns(cid, user)
        return row if owned else None

    async def changes_after(self, after_seq: int, conversation_id: str | None, task_id: str
                            ) -> list[tuple[int, TaskUpdated]]:
        """The task's changes stored after ``after_seq`` (its row's seq: the chunks since its
        last whole change), as the outbox still has them."""
        out: list[tuple[int, TaskUpdated]] = []
        while True:
            _, _, page = await self._storage.reader.outbox_page(
                after_seq, conversation_id, "a2a", _CHANGES_PAGE)
            for ev in page:
                event = ev.event.event
                if isinstance(event, TaskUpdated) and event.task_id == task_id:
                    out.append((ev.offset, event))
            if len(page) < _CHANGES_PAGE:
                return out
            after_seq = page[-1].offset

    async def latest_of_context(self, context_id: str) -> A2ATaskRow | None:
        """The context's most recently created record, None for an unused context."""
        return await self._storage.reader.latest_a2a_task_of_context(context_id)

    async def page(
        self, context_id: str | None, state: str | None, before_first_seq: int | None, limit: int,
        user: str | None = None,
    ) -> tuple[list[A2ATaskRow], int]:
        """Newest first by creation (before ``before_first_seq`` if given), and the total;
        ``user``: only the records of that user's conversations."""
        return await self._storage.reader.list_a2a_tasks(
            context_id, state, before_first_seq, check_limit(limit), user
        )

    async def in_states(self, states: tuple[str, ...]) -> list[A2ATaskRow]:
        return await self._storage.reader.a2a_tasks_in_states(states)

    async def updates(
        self, after_seq: int, conversation_id: str | None = None
    ) -> AsyncGenerator[tuple[int, TaskUpdated], None]:
        """Every record change after ``after_seq`` (replayed, then live), in order; with
        ``conversation_id`` only those of that conversation's records, ending after its
        ``Deleted`` (its records are deleted with it). A position already trimmed from the
        outbox starts at the oldest retained change: a record's last change is its newest, so
        nothing of a record read at ``after_seq`` is skipped."""
        hub = self._storage.hub
        after = Cursor(epoch=hub.epoch, offset=max(after_seq, hub.oldest_cursor().offset))
        stream = (hub.stream(after, kind="a2a") if conversation_id is None
                  else hub.stream(after, conversation_id=conversation_id))
        async for batch in stream:
            for ev in batch:
                if isinstance(ev.event.event, TaskUpdated):
                    yield ev.offset, ev.event.event
