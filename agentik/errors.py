"""The one error tree of agentik.

Every error agentik raises on purpose is an :class:`AgentikError`. Third-party errors (sqlite3,
openai, mcp, msgspec) are converted at the boundary of the module that owns the library, so code
above that boundary only ever sees this tree::

    AgentikError
     ├── ConfigError            a bad configuration value; names the variable
     ├── InvalidInputError      input that fails validation (HTTP 400); message from msgspec
     ├── NotFoundError          unknown conversation id (HTTP 404)
     ├── MailboxFullError       a conversation's mailbox is full (HTTP 429, Retry-After)
     ├── OutboxGapError         a dead cursor: evicted, another epoch, ahead of head (HTTP 410)
     ├── StorageError           a write or read on SQLite failed; a failed write was not stored
     ├── ConflictError          a write based on a stale read (an A2A task changed meanwhile)
     ├── ConversationFailedError  the conversation crashed too often and stopped taking turns
     ├── RuntimeClosedError     the runtime is shutting down or closed
     ├── LlmError               a backend failed a turn
     │    ├── LlmConnectionError   the endpoint could not be reached
     │    ├── LlmTimeoutError      no answer in time
     │    ├── LlmAuthError         the endpoint refused our credentials
     │    └── LlmResponseError     the endpoint answered with an error or a malformed answer
     └── ToolError              a tool call failed (error result, exception, timeout, unknown tool)

The HTTP facade maps each class to its status code in one place (``agentik.web``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentik.wire import Cursor


class AgentikError(Exception):
    """Base of every error agentik raises on purpose."""

    code = "internal"


class ConfigError(AgentikError):
    """A configuration value is missing or malformed; ``variable`` names it."""

    code = "config"

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


class InvalidInputError(AgentikError):
    """Input failed validation; the message says what and where."""

    code = "invalid_input"


class NotFoundError(AgentikError):
    """An unknown id (conversation, message)."""

    code = "not_found"


class MailboxFullError(AgentikError):
    """The conversation already holds as many queued turns as its mailbox allows."""

    code = "mailbox_full"

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class OutboxGapError(AgentikError):
    """The cursor is dead: the client must resync from a snapshot and never retry it."""

    code = "gap"

    def __init__(self, message: str, oldest: Cursor, current: Cursor) -> None:
        super().__init__(message)
        self.oldest = oldest
        self.current = current


class StorageError(AgentikError):
    """SQLite failed. For a write, nothing of that write was stored or acknowledged."""

    code = "storage"


class ConflictError(AgentikError):
    """A conditional write found the row changed since it was read (``expect_seq`` mismatch):
    nothing was stored; re-read and decide again."""

    code = "conflict"


class ConversationFailedError(AgentikError):
    """The conversation's actor crashed more often than its restart limit allows."""

    code = "conversation_failed"


class RuntimeClosedError(AgentikError):
    """The runtime is closing or closed and takes no more work."""

    code = "closed"


class LlmError(AgentikError):
    """A backend could not complete a turn."""

    code = "llm"


class LlmConnectionError(LlmError):
    code = "llm_connection"


class LlmTimeoutError(LlmError):
    code = "llm_timeout"


class LlmAuthError(LlmError):
    code = "llm_auth"


class LlmResponseError(LlmError):
    code = "llm_response"


class ToolError(AgentikError):
    """A tool call failed; the turn goes on with a ``ToolFailed`` event."""

    code = "tool"
