"""The in-process ``Agent`` API: what ``open_runtime`` yields. The HTTP client library
(``agentik.client``) offers the same names over the wire, and the web facade maps its routes onto
exactly these calls.

Who raises what: NotFoundError (unknown conversation), MailboxFullError (send to a full mailbox),
ConversationFailedError (a conversation past its crash limit), OutboxGapError (dead cursor, from
the ``events`` iterators at their first step), StorageError (SQLite failed; nothing stored),
RuntimeClosedError (the runtime is shutting down), InvalidInputError (bad arguments).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING

import msgspec

from agentik.actors.deps import Deps
from agentik.actors.registry import Registry
from agentik.cluster import forward
from agentik.config import BUSY_POLICIES
from agentik.errors import InvalidInputError, NotFoundError, NotOwnerError, RuntimeClosedError
from agentik.storage import ops
from agentik.storage import queries as q
from agentik.storage.hub import OnlineSubscription
from agentik.storage.writer import StoredEvent
from agentik.wire import (
    ChatSnapshot,
    CommonEvent,
    Content,
    ConversationRecord,
    ConversationsSnapshot,
    ConversationView,
    Cursor,
    Image,
    MessageContext,
    MessageRecord,
    TaskUpdated,
    Text,
)

if TYPE_CHECKING:
    from agentik.config import Config
    from agentik.storage.actor import Storage
    from agentik.storage.hub import EventHub

MAX_PAGE = 1000
#: longest accepted Idempotency-Key
MAX_IDEMPOTENCY_KEY = 255


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidInputError(f"limit must be 1..{MAX_PAGE}, got {limit}")
    return limit


def _non_negative(name: str, value: int) -> int:
    if value < 0:
        raise InvalidInputError(f"{name} must be >= 0, got {value}")
    return value


class Journal:
    """Append-only journal reads by seq."""

    def __init__(self, deps: Deps) -> None:
        self._deps = deps

    async def list(
        self,
        conversation_id: str | None = None,
        after_seq: int = 0,
        up_to_seq: int | None = None,
        limit: int = 100,
    ) -> list[MessageRecord]:
        return await self._deps.storage.reader.run(
            q.journal, conversation_id, _non_negative("after_seq", after_seq), up_to_seq,
            _limit(limit),
        )

    async def count(self, conversation_id: str | None = None, after_seq: int = 0) -> int:
        return await self._deps.storage.reader.run(
            q.journal_count, conversation_id, _non_negative("after_seq", after_seq)
        )


class Outbox:
    """Durable events by cursor: replay from the stored outbox, then live."""

    def __init__(self, deps: Deps) -> None:
        self._hub = deps.storage.hub

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
        self, after: Cursor, *, conversation_id: str | None = None, kind: str | None = None
    ) -> AsyncGenerator[list[StoredEvent], None]:
        """The durable events of ``events`` / ``agent_events`` (``kind="agent"``) /
        ``conversation_events`` (``conversation_id``) in the batches they are committed in, each
        event with its stored CommonEvent JSON (``raw``). Same order, errors and end; the
        subscription is in place at the first step of the iteration (before it waits)."""
        return self._hub.stream(after, conversation_id=conversation_id, kind=kind)

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

    def subscribe(self, conversation_id: str) -> OnlineSubscription:
        """The same events on a receive channel, subscribed when this returns (no generator and
        no task in between: the live SSE stream reads it directly); ``close()`` it when done."""
        return self._hub.subscribe_online(conversation_id)


class TaskRecords:
    """Task records kept under the shared counter (the A2A facade's tasks, SPEC §11): each
    change stores the whole record (an opaque JSON ``record``, its ``state``) with seq = N and a
    ``TaskUpdated`` event (``update``, outbox kind ``a2a``) at offset N, in one transaction.
    ``expect_seq`` makes a change conditional on the seq last read (None: the record must not
    exist); a stale one raises ConflictError and stores nothing."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def put(
        self, *, task_id: str, context_id: str, conversation_id: str | None, state: str,
        record: bytes, update: bytes, expect_seq: int | None,
    ) -> int:
        """Store one change; returns its seq. Raises ConflictError, StorageError."""
        seq: int = await self._storage.write(ops.PutA2ATask(
            task_id=task_id, context_id=context_id, conversation_id=conversation_id,
            state=state, task=record, update=update, expect_seq=expect_seq,
        ))
        return seq

    async def get(self, task_id: str) -> q.A2ATaskRow | None:
        return await self._storage.reader.run(q.get_a2a_task, task_id)

    async def latest_of_context(self, context_id: str) -> q.A2ATaskRow | None:
        """The context's most recently created record, None for an unused context."""
        return await self._storage.reader.run(q.latest_a2a_task_of_context, context_id)

    async def page(
        self, context_id: str | None, state: str | None, before_first_seq: int | None, limit: int
    ) -> tuple[list[q.A2ATaskRow], int]:
        """Newest first by creation (before ``before_first_seq`` if given), and the total."""
        return await self._storage.reader.run(
            q.list_a2a_tasks, context_id, state, before_first_seq, _limit(limit)
        )

    async def in_states(self, states: tuple[str, ...]) -> list[q.A2ATaskRow]:
        return await self._storage.reader.run(q.a2a_tasks_in_states, states)

    async def updates(self, after_seq: int) -> AsyncGenerator[tuple[int, TaskUpdated], None]:
        """Every record change after ``after_seq`` (replayed, then live), in order. A position
        already trimmed from the outbox starts at the oldest retained change: a record's last
        change is its newest, so nothing of a record read at ``after_seq`` is skipped."""
        hub = self._storage.hub
        after = max(after_seq, hub.oldest_cursor().offset)
        async for batch in hub.stream(Cursor(epoch=hub.epoch, offset=after), kind="a2a"):
            for ev in batch:
                if isinstance(ev.event.event, TaskUpdated):
                    yield ev.offset, ev.event.event


class LocalConversation(ConversationView):
    def __init__(self, agent: LocalAgent, record: ConversationRecord) -> None:
        self._agent = agent
        self.record = record
        self._closed = False

    @property
    def supports_image_input(self) -> bool:
        return self._agent._deps.llm.supports_images

    async def send(
        self,
        content: Sequence[Content] | Content | str,
        context: MessageContext | None = None,
        *,
        on_busy: str | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Queue a user message; returns its id once it is stored. The answer arrives as events.
        ``on_busy``: queue | reject | interrupt (default AGENTIK_BUSY_POLICY); an
        ``idempotency_key`` already used for this send returns the first message's id.
        Raises MailboxFullError, BusyError, NotFoundError, ConversationFailedError,
        IdempotencyKeyReusedError, StorageError."""
        return await self._agent._send(self.id, _content(content), context,
                                       on_busy=on_busy, idempotency_key=idempotency_key)

    async def interrupt(self) -> bool:
        """Cancel the running turn (Interrupted event). Returns whether a turn was running."""
        return await self._agent.interrupt(self.id)

    async def get_messages(
        self, after_seq: int = 0, offset: int = 0, limit: int = 100
    ) -> list[MessageRecord]:
        page: list[MessageRecord] = await self._agent._deps.storage.reader.run(
            q.get_messages, self.id, _non_negative("after_seq", after_seq),
            _non_negative("offset", offset), _limit(limit),
        )
        if not page and await self._agent._deps.storage.reader.run(
            q.get_conversation, self.id
        ) is None:
            raise NotFoundError(f"conversation {self.id!r} not found")
        return page

    async def rename(self, title: str | None) -> ConversationRecord:
        self.record = await self._agent.rename_conversation(self.id, title)
        return self.record

    async def close(self) -> None:
        """Release this object (idempotent). The conversation itself stays; see delete."""
        self._closed = True


def _content(content: Sequence[Content] | Content | str) -> list[Content]:
    if isinstance(content, str):
        return [Text(body=content)]
    if isinstance(content, Text | Image):
        return [content]
    items = list(content)
    if not items:
        raise InvalidInputError("content must not be empty")
    return items


class LocalAgent:
    """The in-process Agent."""

    def __init__(self, deps: Deps, registry: Registry) -> None:
        self._deps = deps
        self._registry = registry
        self._closed = False
        self.journal = Journal(deps)
        self.outbox = Outbox(deps)
        self.online_outbox = OnlineOutbox(deps)
        #: the tool registry turns run through (NoTools, FunctionTools, the MCP registry)
        self.tools = deps.tools

    @property
    def id(self) -> str:
        return self._deps.storage.epoch

    @property
    def config(self) -> Config:
        return self._deps.config

    @property
    def hub(self) -> EventHub:
        """The event hub (durable fan-out by cursor, online fan-out)."""
        return self._deps.storage.hub

    @property
    def task_records(self) -> TaskRecords:
        """Durable task records under the shared counter (the A2A facade's tasks, SPEC §11)."""
        return TaskRecords(self._deps.storage)

    @property
    def supports_image_input(self) -> bool:
        return self._deps.llm.supports_images

    def mark_closed(self) -> None:
        """Refuse every later call (RuntimeClosedError); ``open_runtime`` calls this as it leaves."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeClosedError("the runtime is closed")

    async def create_conversation(
        self, temp: bool = False, title: str | None = None, *, idempotency_key: str | None = None
    ) -> LocalConversation:
        """An ``idempotency_key`` already used to create one returns that conversation."""
        self._check_open()
        idem = self._idempotency(idempotency_key, "create", [temp, title])
        record = await self._registry.create(temp=temp, title=title, idempotency=idem)
        return LocalConversation(self, record)

    def _idempotency(
        self, key: str | None, scope: str, body: object
    ) -> ops.Idempotency | None:
        """The stored form of an Idempotency-Key: the key and a fingerprint of the request
        (route, conversation, body), so the same key with another request is refused."""
        if key is None:
            return None
        if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY or not key.isprintable():
            raise InvalidInputError(
                f"an idempotency key must be 1..{MAX_IDEMPOTENCY_KEY} printable characters")
        digest = hashlib.sha256(scope.encode() + b"\0" + msgspec.json.encode(body)).hexdigest()
        return ops.Idempotency(key=key, fingerprint=digest, ttl=self.config.idempotency_ttl)

    async def get_conversation(self, conversation_id: str) -> LocalConversation | None:
        self._check_open()
        record = await self._deps.storage.reader.run(q.get_conversation, conversation_id)
        return None if record is None else LocalConversation(self, record)

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Stop its actor (a running turn gets its terminal record), then delete everything of it
        in one transaction (ConversationClosing, Deleted). Returns False if it did not exist."""
        self._check_open()
        await self._registry.stop(conversation_id)
        try:
            deleted: bool = await self._deps.storage.write(
                ops.DeleteConversation(conversation_id=conversation_id)
            )
        except NotOwnerError as exc:  # a cluster: the owner stops its actor and deletes
            return await forward(self.config, exc, lambda o: o.delete_conversation(conversation_id))
        return deleted

    async def rename_conversation(self, conversation_id: str, title: str | None) -> ConversationRecord:
        """Raises NotFoundError."""
        self._check_open()
        try:
            record: ConversationRecord = await self._deps.storage.write(
                ops.RenameConversation(conversation_id=conversation_id, title=title)
            )
        except NotOwnerError as exc:
            return await forward(
                self.config, exc, lambda o: o.rename_conversation(conversation_id, title))
        return record

    async def interrupt(self, conversation_id: str) -> bool:
        """Cancel the running turn (Interrupted event). Returns whether a turn was running.
        Raises NotFoundError."""
        self._check_open()
        try:
            return await self._registry.interrupt(conversation_id)
        except NotOwnerError as exc:
            return await forward(self.config, exc, lambda o: o.interrupt(conversation_id))

    async def _send(
        self,
        conversation_id: str,
        content: list[Content],
        context: MessageContext | None,
        *,
        on_busy: str | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Queue the message on the conversation's actor; returns the stored message's id. In a
        cluster, a conversation owned by another live node gets it through its owner."""
        self._check_open()
        if on_busy is not None and on_busy not in BUSY_POLICIES:
            raise InvalidInputError(f"on_busy must be one of {', '.join(BUSY_POLICIES)}, "
                                    f"got {on_busy!r}")
        idem = self._idempotency(idempotency_key, f"send:{conversation_id}", [content, context])
        try:
            return await self._registry.submit(
                conversation_id, content, context, on_busy=on_busy, idempotency=idem)
        except NotOwnerError as exc:
            return await forward(self.config, exc, lambda o: o.send(
                conversation_id, content, context, on_busy=on_busy,
                idempotency_key=idempotency_key))

    async def send(
        self,
        conversation_id: str,
        content: Sequence[Content] | Content | str,
        context: MessageContext | None = None,
        *,
        on_busy: str | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """See :meth:`LocalConversation.send`."""
        return await self._send(conversation_id, _content(content), context,
                                on_busy=on_busy, idempotency_key=idempotency_key)

    async def conversations_snapshot(self, offset: int = 0, limit: int = 100) -> ConversationsSnapshot:
        """The conversation list at a cursor: every change <= cursor is in it."""
        cursor = self._deps.storage.hub.current_cursor()  # cursor FIRST, then state
        conversations = await self._deps.storage.reader.run(
            q.list_conversations, _non_negative("offset", offset), _limit(limit)
        )
        return ConversationsSnapshot(cursor=cursor, conversations=conversations)

    async def chat_snapshot(self, conversation_id: str) -> ChatSnapshot:
        """One conversation and its messages at a cursor. Raises NotFoundError."""
        cursor = self._deps.storage.hub.current_cursor()  # cursor FIRST, then state
        record = await self._deps.storage.reader.run(q.get_conversation, conversation_id)
        if record is None:
            raise NotFoundError(f"conversation {conversation_id!r} not found")
        messages: list[MessageRecord] = []
        after = 0
        while True:
            page = await self._deps.storage.reader.run(
                q.get_messages, conversation_id, after, 0, MAX_PAGE
            )
            messages.extend(page)
            if len(page) < MAX_PAGE:
                break
            after = page[-1].seq
        return ChatSnapshot(cursor=cursor, conversation=record, messages=messages)
