"""The read side's calls, typed and written once for both engines: each runs its engine's own
SQL (``sqlite/queries.py``, ``pg/queries.py``: the functions :class:`Queries` names) in a worker
thread with a pooled connection (the engine's :meth:`Reads._read`), so what it returns is one
consistent snapshot of the database."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Concatenate, Generic, ParamSpec, Protocol, TypeVar

from agentik.storage.ops import check_looked_up
from agentik.storage.types import A2ATaskRow, DeliveryRow, StoredEvent, WebhookRow
from agentik.wire import ConversationRecord, Message, MessageRecord, WorkingItem

C = TypeVar("C")
C_contra = TypeVar("C_contra", contravariant=True)
P = ParamSpec("P")
R = TypeVar("R")

#: one outbox read: (oldest retained offset, head, the events after the cursor)
Page = tuple[int, int, list[StoredEvent]]


class Queries(Protocol[C_contra]):
    """An engine's read functions (a module), each given a connection of its own kind."""

    def get_conversation(self, conn: C_contra, conversation_id: str, /
                         ) -> ConversationRecord | None: ...

    def list_conversations(self, conn: C_contra, offset: int, limit: int, /
                           ) -> list[ConversationRecord]: ...

    def get_messages(self, conn: C_contra, conversation_id: str, after_seq: int, offset: int,
                     limit: int, /) -> list[MessageRecord]: ...

    def branched(self, conn: C_contra, conversation_id: str, /) -> bool: ...

    def journal(self, conn: C_contra, conversation_id: str | None, after_seq: int,
                up_to_seq: int | None, limit: int, /) -> list[MessageRecord]: ...

    def journal_count(self, conn: C_contra, conversation_id: str | None, after_seq: int, /
                      ) -> int: ...

    def working_memory(self, conn: C_contra, conversation_id: str, /
                       ) -> list[tuple[int, WorkingItem]]: ...

    def queued_turns(self, conn: C_contra, conversation_id: str, /
                     ) -> list[tuple[str, Message]]: ...

    def waiting_turn(self, conn: C_contra, conversation_id: str, /) -> tuple[str, int] | None: ...

    def conversations_with_queued_turns(self, conn: C_contra, /) -> list[str]: ...

    def outbox_page(self, conn: C_contra, after: int, conversation_id: str | None,
                    kind: str | None, limit: int, /) -> Page: ...

    def has_conversation_events(self, conn: C_contra, conversation_id: str, after: int, /
                                ) -> bool: ...

    def idempotency_key(self, conn: C_contra, key: str, now: float, /
                        ) -> tuple[str, str] | None: ...

    def get_a2a_task(self, conn: C_contra, task_id: str, /) -> A2ATaskRow | None: ...

    def latest_a2a_task_of_context(self, conn: C_contra, context_id: str, /
                                   ) -> A2ATaskRow | None: ...

    def list_a2a_tasks(self, conn: C_contra, context_id: str | None, state: str | None,
                       before_first_seq: int | None, limit: int, user: str | None = None, /
                       ) -> tuple[list[A2ATaskRow], int]: ...

    def a2a_tasks_in_states(self, conn: C_contra, states: tuple[str, ...], /
                            ) -> list[A2ATaskRow]: ...

    def users_of(self, conn: C_contra, conversation_ids: list[str], /) -> dict[str, str]: ...

    def list_conversations_of(self, conn: C_contra, user: str, offset: int, limit: int, /
                              ) -> list[ConversationRecord]: ...

    def journal_of(self, conn: C_contra, user: str, after_seq: int, up_to_seq: int | None,
                   limit: int, /) -> list[MessageRecord]: ...

    def journal_count_of(self, conn: C_contra, user: str, after_seq: int, /) -> int: ...

    def user_standing(self, conn: C_contra, user: str, day: str, /) -> tuple[int, int, int]: ...

    def webhooks(self, conn: C_contra, task_id: str | None, /) -> list[WebhookRow]: ...

    def get_webhook(self, conn: C_contra, webhook_id: str, /) -> WebhookRow | None: ...

    def webhook_deliveries(self, conn: C_contra, webhook_id: str, limit: int, /
                           ) -> list[DeliveryRow]: ...


class Reads(ABC, Generic[C]):
    """The :class:`~agentik.storage.engine.ReaderEngine` calls over an engine's ``queries``."""

    queries: Queries[C]

    @abstractmethod
    async def _read(self, fn: Callable[Concatenate[C, P], R], *args: P.args,
                    **kwargs: P.kwargs) -> R:
        """``fn(conn, *args)`` in a worker thread with a pooled connection. Raises
        StorageError."""

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        check_looked_up(conversation_id)
        return await self._read(self.queries.get_conversation, conversation_id)

    async def list_conversations(self, offset: int, limit: int) -> list[ConversationRecord]:
        return await self._read(self.queries.list_conversations, offset, limit)

    async def get_messages(self, conversation_id: str, after_seq: int, offset: int, limit: int
                           ) -> list[MessageRecord]:
        check_looked_up(conversation_id)
        return await self._read(self.queries.get_messages, conversation_id, after_seq, offset,
                                limit)

    async def branched(self, conversation_id: str) -> bool:
        """Whether the conversation has branch points (else its journal is its one branch)."""
        check_looked_up(conversation_id)
        return await self._read(self.queries.branched, conversation_id)

    async def journal(self, conversation_id: str | None, after_seq: int, up_to_seq: int | None,
                      limit: int) -> list[MessageRecord]:
        check_looked_up(conversation_id)
        return await self._read(self.queries.journal, conversation_id, after_seq, up_to_seq,
                                limit)

    async def journal_count(self, conversation_id: str | None, after_seq: int) -> int:
        check_looked_up(conversation_id)
        return await self._read(self.queries.journal_count, conversation_id, after_seq)

    async def working_memory(self, conversation_id: str) -> list[tuple[int, WorkingItem]]:
        check_looked_up(conversation_id)
        return await self._read(self.queries.working_memory, conversation_id)

    async def queued_turns(self, conversation_id: str) -> list[tuple[str, Message]]:
        """The conversation's accepted turns that have not started (their message stored and
        queued when its last actor went), in the order they came: (turn id, its message)."""
        return await self._read(self.queries.queued_turns, conversation_id)

    async def waiting_turn(self, conversation_id: str) -> tuple[str, int] | None:
        """The conversation's turn that waits for a person (docs/PROTOCOL.md, "A person in the
        loop"), if any: (turn id, its user message's seq)."""
        check_looked_up(conversation_id)
        return await self._read(self.queries.waiting_turn, conversation_id)

    async def conversations_with_queued_turns(self) -> list[str]:
        """The conversations that have queued turns or a turn waiting for a person, oldest turn
        first (start-up loads them: the queued turns run, the waiting one waits again)."""
        return await self._read(self.queries.conversations_with_queued_turns)

    async def outbox_page(self, after: int, conversation_id: str | None, kind: str | None,
                          limit: int) -> Page:
        """One consistent read: (oldest retained offset, head, events after ``after`` matching
        the filter, at most ``limit``)."""
        check_looked_up(conversation_id, kind)
        return await self._read(self.queries.outbox_page, after, conversation_id, kind, limit)

    async def has_conversation_events(self, conversation_id: str, after: int) -> bool:
        check_looked_up(conversation_id)
        return await self._read(self.queries.has_conversation_events, conversation_id, after)

    async def idempotency_key(self, key: str, now: float) -> tuple[str, str] | None:
        """(fingerprint, result_id) stored under an Idempotency-Key that has not expired."""
        check_looked_up(key)
        return await self._read(self.queries.idempotency_key, key, now)

    async def get_a2a_task(self, task_id: str) -> A2ATaskRow | None:
        check_looked_up(task_id)
        return await self._read(self.queries.get_a2a_task, task_id)

    async def latest_a2a_task_of_context(self, context_id: str) -> A2ATaskRow | None:
        check_looked_up(context_id)
        return await self._read(self.queries.latest_a2a_task_of_context, context_id)

    async def list_a2a_tasks(self, context_id: str | None, state: str | None,
                             before_first_seq: int | None, limit: int, user: str | None = None
                             ) -> tuple[list[A2ATaskRow], int]:
        """``user``: only the tasks of that user's conversations."""
        check_looked_up(context_id, state, user)
        return await self._read(self.queries.list_a2a_tasks, context_id, state,
                                before_first_seq, limit, user)

    async def a2a_tasks_in_states(self, states: tuple[str, ...]) -> list[A2ATaskRow]:
        check_looked_up(*states)
        return await self._read(self.queries.a2a_tasks_in_states, states)

    # users (docs/USERS.md): who each conversation is, what a user's reads see, their standing

    async def users_of(self, conversation_ids: list[str]) -> dict[str, str]:
        """conversation id -> its user (deleted conversations too), those that have one."""
        check_looked_up(*conversation_ids)
        return await self._read(self.queries.users_of, conversation_ids)

    async def list_conversations_of(self, user: str, offset: int, limit: int
                                    ) -> list[ConversationRecord]:
        check_looked_up(user)
        return await self._read(self.queries.list_conversations_of, user, offset, limit)

    async def journal_of(self, user: str, after_seq: int, up_to_seq: int | None, limit: int
                         ) -> list[MessageRecord]:
        check_looked_up(user)
        return await self._read(self.queries.journal_of, user, after_seq, up_to_seq, limit)

    async def journal_count_of(self, user: str, after_seq: int) -> int:
        check_looked_up(user)
        return await self._read(self.queries.journal_count_of, user, after_seq)

    async def user_standing(self, user: str, day: str) -> tuple[int, int, int]:
        """(conversations kept, turns accepted and not ended, model tokens on the UTC ``day``)."""
        check_looked_up(user)
        return await self._read(self.queries.user_standing, user, day)

    # webhooks (docs/WEBHOOKS.md): subscriptions with their progress, their delivery logs

    async def webhooks(self, task_id: str | None = None) -> list[WebhookRow]:
        """Every subscription, or (``task_id``) the A2A push configs of one task."""
        check_looked_up(task_id)
        return await self._read(self.queries.webhooks, task_id)

    async def get_webhook(self, webhook_id: str) -> WebhookRow | None:
        check_looked_up(webhook_id)
        return await self._read(self.queries.get_webhook, webhook_id)

    async def webhook_deliveries(self, webhook_id: str, limit: int) -> list[DeliveryRow]:
        check_looked_up(webhook_id)
        return await self._read(self.queries.webhook_deliveries, webhook_id, limit)

    @abstractmethod
    def close(self) -> None: ...
