"""Errors the client adds to :mod:`agentik.errors`, and the mapping of HTTP answers onto the one
error tree (so code written against the in-process agent catches the same classes).

Status -> error::

    400 InvalidInputError     401 AuthError              404 NotFoundError
    409 ConversationFailedError                          410 OutboxGapError(oldest, current)
    413 InvalidInputError     429 MailboxFullError(retry_after)
    502 LlmError              503 RuntimeClosedError (code ``closed``) / StorageError (``storage``)
    anything else unexpected: ServerError(status)
    no answer at all (refused, reset, timeout, cut mid-stream): AgentikConnectionError
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentik.errors import (
    AgentikError,
    ConversationFailedError,
    InvalidInputError,
    LlmError,
    MailboxFullError,
    NotFoundError,
    OutboxGapError,
    RuntimeClosedError,
    StorageError,
)
from agentik.wire import Cursor


class AuthError(AgentikError):
    """The server refused our credentials (HTTP 401): no token, or a token it does not know.
    Retrying with the same token never helps."""

    code = "unauthorized"


class AgentikConnectionError(AgentikError, ConnectionError):
    """The server could not be reached, or the connection broke before the answer was complete
    (refused, reset, timed out, a stream cut in the middle). Also a builtin ``ConnectionError``.
    Transient: :class:`~agentik.client.ReconnectingOutbox` retries it."""

    code = "connection"


class ServerError(AgentikError):
    """An HTTP answer the protocol does not define (a 500, a proxy's 502 page, ...)."""

    code = "server"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _Detail(msgspec.Struct, kw_only=True):
    code: str = ""
    message: str = ""
    oldest: str | None = None
    current: str | None = None
    retry_after: float | None = None


class _Body(msgspec.Struct, kw_only=True):
    error: _Detail


def error_from_response(status: int, body: bytes, headers: Any = None) -> AgentikError:
    """The AgentikError for an HTTP error answer (``status`` >= 400)."""
    try:
        detail = msgspec.json.decode(body, type=_Body).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = body[:200].decode("utf-8", "replace").strip()
        detail = _Detail(code="", message=text or f"HTTP {status}")
    message = detail.message or f"HTTP {status}"
    if status == 400 or status == 413:
        return InvalidInputError(message)
    if status == 401:
        return AuthError(f"the server refused the credentials: {message}")
    if status == 404:
        return NotFoundError(message)
    if status == 409:
        return ConversationFailedError(message)
    if status == 410 and detail.oldest and detail.current:
        try:
            return OutboxGapError(
                message, oldest=Cursor.parse(detail.oldest), current=Cursor.parse(detail.current)
            )
        except InvalidInputError:
            pass
    if status == 429:
        retry_after = detail.retry_after
        if retry_after is None and headers is not None:
            try:
                retry_after = float(headers.get("Retry-After", "1"))
            except ValueError:
                retry_after = 1.0
        return MailboxFullError(message, retry_after=retry_after if retry_after is not None else 1.0)
    if status == 502 and detail.code.startswith("llm"):
        return LlmError(message)
    if status == 503:
        if detail.code == "storage":
            return StorageError(message)
        return RuntimeClosedError(message or "the server is starting or shutting down")
    return ServerError(f"HTTP {status}: {message}", status)


def gap_from_frame(data: str) -> OutboxGapError:
    """The OutboxGapError of an SSE ``event: gap`` frame (its data is the 410 body)."""
    err = error_from_response(410, data.encode())
    if isinstance(err, OutboxGapError):
        return err
    raise AgentikConnectionError(f"malformed gap frame: {data[:200]!r}")


#: errors worth retrying with the same request: the server may be back a moment later
TRANSIENT: tuple[type[AgentikError], ...] = (
    AgentikConnectionError,
    RuntimeClosedError,
    StorageError,
    ServerError,
)
