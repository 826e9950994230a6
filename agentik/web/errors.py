"""Errors as HTTP answers and JSON error bodies (docs/PROTOCOL.md §2); the status of each class is in the one
map, :data:`agentik.errors.HTTP_ERRORS`.

Every error answer is ``{"error": {"code", "message"}}``; a gap adds ``oldest`` and ``current``,
a full mailbox and a user over a limit add ``retry_after`` (and the ``Retry-After`` header), a
503 says ``Retry-After: 1``, a 401 says ``WWW-Authenticate``. WebSocket error frames carry the same
:class:`~agentik.web.types.ErrorDetail`.
"""

from __future__ import annotations

import math

from agentik.errors import (
    AgentikError,
    MailboxFullError,
    OutboxGapError,
    RuntimeClosedError,
    StorageError,
    UnauthorizedError,
)
from agentik.web.types import ErrorBody, ErrorDetail


def detail_of(exc: AgentikError) -> ErrorDetail:
    if isinstance(exc, OutboxGapError):
        return ErrorDetail(
            code=exc.code, message=str(exc), oldest=str(exc.oldest), current=str(exc.current)
        )
    if isinstance(exc, MailboxFullError):  # and RateLimitedError
        return ErrorDetail(code=exc.code, message=str(exc), retry_after=exc.retry_after)
    return ErrorDetail(code=exc.code, message=str(exc))


def headers_of(exc: AgentikError) -> dict[str, str]:
    if isinstance(exc, MailboxFullError):  # and RateLimitedError
        # Retry-After takes whole seconds; never 0, which would invite a hot retry loop.
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    if isinstance(exc, UnauthorizedError):
        return {"WWW-Authenticate": 'Bearer realm="agentik"'}
    if isinstance(exc, StorageError | RuntimeClosedError):
        return {"Retry-After": "1"}
    return {}


def error_body(code: str, message: str) -> ErrorBody:
    return ErrorBody(error=ErrorDetail(code=code, message=message))
