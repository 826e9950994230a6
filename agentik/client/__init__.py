"""The agentik client library (docs/CLIENT.md): the in-process ``Agent`` interface over HTTP + SSE, on
anyio (trio or asyncio), plus reconnecting streams, local caches and the resync algorithm.

::

    async with AgentikAgent("my-app-<uuid>", "http://127.0.0.1:8080", token="s3cret") as agent:
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        await conv.send("Hello")
        async for ce in agent.outbox.conversation_events(cursor, conv.id): ...

See docs/CLIENT.md.
"""

from agentik.client.cache import (
    ConversationListCache,
    InMemoryJournalStore,
    JournalStore,
    SqliteJournalStore,
)
from agentik.client.errors import AgentikConnectionError, AuthError, ServerError
from agentik.client.http import (
    AgentikAgent,
    HttpConversation,
    HttpJournal,
    HttpOnlineOutbox,
    HttpOutbox,
)
from agentik.client.reconnect import (
    BackoffPolicy,
    Connected,
    Connecting,
    ConnectionStatus,
    Disconnected,
    EventStream,
    Failed,
    Gap,
    ReconnectingOutbox,
)
from agentik.client.sync import ConversationListSync, JournalSync, retrying
from agentik.errors import (
    AgentikError,
    ConversationFailedError,
    InvalidInputError,
    MailboxFullError,
    NotFoundError,
    OutboxGapError,
    RuntimeClosedError,
    StorageError,
)

__all__ = [
    "AgentikAgent",
    "AgentikConnectionError",
    "AgentikError",
    "AuthError",
    "BackoffPolicy",
    "Connected",
    "Connecting",
    "ConnectionStatus",
    "ConversationFailedError",
    "ConversationListCache",
    "ConversationListSync",
    "Disconnected",
    "EventStream",
    "Failed",
    "Gap",
    "HttpConversation",
    "HttpJournal",
    "HttpOnlineOutbox",
    "HttpOutbox",
    "InMemoryJournalStore",
    "InvalidInputError",
    "JournalStore",
    "JournalSync",
    "MailboxFullError",
    "NotFoundError",
    "OutboxGapError",
    "ReconnectingOutbox",
    "RuntimeClosedError",
    "ServerError",
    "SqliteJournalStore",
    "StorageError",
    "retrying",
]
