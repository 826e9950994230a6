"""The one place that maps errors onto HTTP statuses and JSON error bodies (SPEC §6).

Every error answer is ``{"error": {"code", "message"}}``; a gap adds ``oldest`` and ``current``,
a full mailbox adds ``retry_after`` (and the ``Retry-After`` header). WebSocket error frames carry
the same :class:`~agentik.web.types.ErrorDetail`.

Status by class (the first matching base in the MRO wins)::

    InvalidInputError 400   UnauthorizedError 401   NotFoundError 404
    ConversationFailedError / ConflictError 409   OutboxGapError 410   PayloadTooLargeError 413
    MailboxFullError 429   LlmError / ToolError 502   StorageError / RuntimeClosedError 503
    any other AgentikError 500
"""

from __future__ import annotations

import math

from agentik.errors import (
    AgentikError,
    ConfigError,
    ConflictError,
    ConversationFailedError,
    InvalidInputError,
    LlmError,
    MailboxFullError,
    NotFoundError,
    OutboxGapError,
    RuntimeClosedError,
    StorageError,
    ToolError,
)
from agentik.web.types import ErrorBody, ErrorDetail


class UnauthorizedError(AgentikError):
    """A missing or unknown bearer token (web layer only)."""

    code = "unauthorized"


class PayloadTooLargeError(AgentikError):
    """A request body (or WebSocket message) over ``config.max_body_bytes``."""

    code = "too_large"


STATUS: dict[type[AgentikError], int] = {
    InvalidInputError: 400,
    UnauthorizedError: 401,
    NotFoundError: 404,
    ConversationFailedError: 409,
    ConflictError: 409,
    OutboxGapError: 410,
    PayloadTooLargeError: 413,
    MailboxFullError: 429,
    LlmError: 502,
    ToolError: 502,
    StorageError: 503,
    RuntimeClosedError: 503,
    ConfigError: 500,
}


def status_of(exc: AgentikError) -> int:
    for cls in type(exc).__mro__:
        status = STATUS.get(cls)
        if status is not None:
            return status
    return 500


def detail_of(exc: AgentikError) -> ErrorDetail:
    if isinstance(exc, OutboxGapError):
        return ErrorDetail(
            code=exc.code, message=str(exc), oldest=str(exc.oldest), current=str(exc.current)
        )
    if isinstance(exc, MailboxFullError):
        return ErrorDetail(code=exc.code, message=str(exc), retry_after=exc.retry_after)
    return ErrorDetail(code=exc.code, message=str(exc))


def headers_of(exc: AgentikError) -> dict[str, str]:
    if isinstance(exc, MailboxFullError):
        # Retry-After takes whole seconds; never 0, which would invite a hot retry loop.
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    if isinstance(exc, UnauthorizedError):
        return {"WWW-Authenticate": 'Bearer realm="agentik"'}
    if isinstance(exc, StorageError | RuntimeClosedError):
        return {"Retry-After": "1"}
    return {}


def error_body(code: str, message: str) -> ErrorBody:
    return ErrorBody(error=ErrorDetail(code=code, message=message))
