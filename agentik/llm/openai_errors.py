"""The openai SDK's errors, for the OpenAI-compatible backend (:mod:`agentik.llm.openai`):

- :func:`retry_delay`: which failed requests are worth retrying (what the SDK itself would
  retry; the SDK's own retries are off, see :func:`agentik.llm.boundary.retry_within`);
- :func:`error_table`: how every SDK and transport error becomes an
  :class:`agentik.errors.LlmError` (applied once, by :func:`agentik.llm.boundary.map_exceptions`).
"""

from __future__ import annotations

import json
import random

import httpx2
import msgspec
import openai

from agentik.context import is_overflow_text, tokens_from_text, window_from_text
from agentik.errors import (
    LlmAuthError,
    LlmConnectionError,
    LlmContextOverflowError,
    LlmError,
    LlmResponseError,
    LlmTimeoutError,
)
from agentik.llm.boundary import ErrorTable

__all__ = ["error_table", "retry_delay"]


# --- retries -------------------------------------------------------------------------------------

#: the pause before the first retry, doubled for each next one up to the most (as the SDK does)
_RETRY_DELAY = 0.5
_MAX_RETRY_DELAY = 8.0
#: the longest Retry-After a server may ask for and still be retried
_MAX_RETRY_AFTER = 60.0


def retry_delay(exc: Exception, retries: int) -> float | None:
    """The pause before retrying a request that failed with ``exc`` after ``retries`` retries,
    None when it is not worth retrying. What the openai SDK retries: connection errors and
    timeouts; HTTP 408, 409, 429 and 5xx; whatever the server marks ``x-should-retry: true``
    (never what it marks ``false``). A ``Retry-After`` / ``retry-after-ms`` of at most a minute
    is honoured; else an exponential backoff with jitter."""
    if isinstance(exc, openai.APIStatusError):
        headers = exc.response.headers
        should = headers.get("x-should-retry")
        if should == "false":
            return None
        if should != "true" and exc.status_code not in (408, 409, 429) and exc.status_code < 500:
            return None
        asked = _retry_after(headers)
        if asked is not None:
            return asked
    elif not isinstance(exc, openai.APIConnectionError):
        return None
    backoff = min(_RETRY_DELAY * 2**retries, _MAX_RETRY_DELAY)
    return backoff * (1 - 0.25 * random.random())


def _retry_after(headers: httpx2.Headers) -> float | None:
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            value = float(headers.get(name, "")) * scale
        except ValueError:
            continue  # absent, or an HTTP date: the backoff then
        if 0 <= value <= _MAX_RETRY_AFTER:
            return value
    return None


# --- error conversion ----------------------------------------------------------------------------


def error_table(endpoint: str) -> ErrorTable:
    """How the SDK's and the transport's errors become LlmErrors, with messages naming
    ``endpoint`` (see :func:`agentik.llm.boundary.map_exceptions`)."""

    def timeout(exc: Exception) -> LlmError:
        return LlmTimeoutError(f"the LLM endpoint {endpoint} did not answer in time")

    def unreachable(exc: Exception) -> LlmError:
        cause = exc.__cause__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return LlmConnectionError(f"cannot reach the LLM endpoint {endpoint}{detail}")

    def status(exc: Exception) -> LlmError:
        assert isinstance(exc, openai.APIStatusError)
        text = f"the LLM endpoint {endpoint} answered HTTP {exc.status_code}: {_server_message(exc)}"
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            return LlmAuthError(text)
        message = _server_message(exc)
        if exc.status_code in (400, 413) and _is_overflow(exc, message):
            return LlmContextOverflowError(text, window=_window_of(exc, message),
                                           tokens=tokens_from_text(message))
        return LlmResponseError(text)

    def api_error(exc: Exception) -> LlmError:
        assert isinstance(exc, openai.APIError)
        return LlmResponseError(
            f"the LLM endpoint {endpoint} answered with an error: {_server_message(exc)}"
        )

    def failed(exc: Exception) -> LlmError:
        return LlmResponseError(f"the LLM request to {endpoint} failed: {exc}")

    def broken(exc: Exception) -> LlmError:
        return LlmConnectionError(f"the LLM endpoint {endpoint} broke the stream: {exc}")

    def malformed(exc: Exception) -> LlmError:
        return LlmResponseError(f"malformed answer from the LLM endpoint {endpoint}: {exc}")

    return {
        openai.APITimeoutError: timeout,  # a subclass of APIConnectionError
        openai.APIConnectionError: unreachable,
        openai.APIStatusError: status,
        openai.APIError: api_error,
        openai.OpenAIError: failed,
        # mid-stream the raw response's errors are not wrapped by the SDK
        httpx2.TimeoutException: timeout,
        httpx2.TransportError: broken,
        ValueError: malformed,
        TypeError: malformed,
        AttributeError: malformed,
        KeyError: malformed,
        msgspec.MsgspecError: malformed,
    }


def _is_overflow(exc: openai.APIError, message: str) -> bool:
    """An HTTP 400 saying the prompt does not fit: OpenAI's ``context_length_exceeded`` code,
    llama.cpp's ``exceed_context_size_error`` type, or the usual wordings."""
    body = exc.body if isinstance(exc.body, dict) else {}
    marks = (str(body.get("code") or ""), str(body.get("type") or ""), message)
    return any(is_overflow_text(mark) for mark in marks if mark)


def _window_of(exc: openai.APIError, message: str) -> int | None:
    body = exc.body if isinstance(exc.body, dict) else {}
    n_ctx = body.get("n_ctx")  # llama.cpp
    if isinstance(n_ctx, int) and n_ctx > 0:
        return n_ctx
    return window_from_text(message)


def _server_message(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
        return json.dumps(body)[:500]
    if isinstance(body, str) and body:
        return body[:500]
    return exc.message
