"""HTTP answers -> the one error tree, through the one map :data:`agentik.errors.HTTP_ERRORS`
(the server reads the same map the other way), so code written against the in-process agent
catches the same classes.

The classes only the client raises are in :mod:`agentik.errors` too: AgentikConnectionError (no
answer at all: refused, reset, timeout, cut mid-stream) and ServerError (an answer the protocol
does not define). ``AuthError`` is :class:`~agentik.errors.UnauthorizedError` (401), under the
name the client has always used.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentik.errors import (
    AgentikConnectionError,
    AgentikError,
    ConfigError,
    InvalidInputError,
    MailboxFullError,
    OutboxGapError,
    RateLimitedError,
    RuntimeClosedError,
    ServerError,
    StorageError,
    UnauthorizedError,
    error_class,
)
from agentik.wire import Cursor

#: the 401 error, by the client's name for it (one class: see agentik.errors)
AuthError = UnauthorizedError

__all__ = [
    "TRANSIENT",
    "AgentikConnectionError",
    "AuthError",
    "ServerError",
    "error_from_response",
    "gap_from_frame",
]


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
    cls = error_class(status, detail.code)
    if cls is OutboxGapError:
        if detail.oldest and detail.current:
            try:
                return OutboxGapError(
                    message, oldest=Cursor.parse(detail.oldest),
                    current=Cursor.parse(detail.current),
                )
            except InvalidInputError:
                pass
        cls = None
    if cls is MailboxFullError:
        retry_after = detail.retry_after
        if retry_after is None and headers is not None:
            try:
                retry_after = float(headers.get("Retry-After", "1"))
            except ValueError:
                retry_after = 1.0
        return MailboxFullError(message, retry_after=retry_after if retry_after is not None else 1.0)
    if cls is RateLimitedError:
        return RateLimitedError(message, retry_after=detail.retry_after or 1.0)
    if cls is UnauthorizedError:
        return UnauthorizedError(f"the server refused the credentials: {message}")
    if cls is RuntimeClosedError and not detail.message:
        return RuntimeClosedError("the server is starting or shutting down")
    if cls is None or issubclass(cls, ConfigError | ServerError):
        return ServerError(f"HTTP {status}: {message}", status)
    return cls(message)


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
