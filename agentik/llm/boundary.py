"""Where a backend calls its library:

- third-party errors converted once (like httpx's ``map_httpcore_exceptions``): each boundary
  names a table from exception class to conversion, and :func:`map_exceptions` applies it to
  whatever the block raises;
- :func:`retry_within`: a request retried within one deadline (AGENTIK_LLM_TIMEOUT bounds the
  whole wait, retries included), never starting a retry that cannot finish in time.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

import trio

from agentik.errors import LlmError

__all__ = ["ErrorTable", "map_exceptions", "retry_within"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: exception class -> the LlmError it becomes (the most specific class of an exception wins)
ErrorTable = Mapping[type[Exception], Callable[[Exception], LlmError]]


@contextmanager
def map_exceptions(table: ErrorTable) -> Iterator[None]:
    """Raise the table's LlmError for an exception of the block, ``from`` the original. The
    conversion of the first class in the exception's MRO that the table names is used, so a
    subclass entry overrides its base's. LlmError itself, classes the table does not name and
    BaseExceptions (Cancelled, GeneratorExit) pass through untouched."""
    try:
        yield
    except LlmError:
        raise
    except Exception as exc:
        for cls in type(exc).__mro__:
            convert = table.get(cls)
            if convert is not None:
                raise convert(exc) from exc
        raise


async def retry_within(
    attempt: Callable[[], Awaitable[T]],
    *,
    deadline: float,
    max_retries: int,
    retry_delay: Callable[[Exception, int], float | None],
    timed_out: Callable[[int], Exception],
    what: str = "request",
) -> T:
    """``await attempt()`` until it returns, before ``deadline`` (trio's clock) in all.

    A failed attempt is retried (at most ``max_retries`` times) when ``retry_delay(exc, retries)``
    gives the pause before the next one (None: not retryable, e.g. a 400 or a 401), and only
    when the next attempt can still finish in time: after the pause, at least as long as the
    failed attempt took must remain before the deadline. So a fast failure (a 500, a reset
    connection) is retried, and a late one fails with its own error instead of starting an
    attempt that the deadline would cut. The attempt running at the deadline is cancelled and
    ``timed_out(attempts)`` is raised (``attempts``: how many were started).

    Only the attempt is retried: a caller retries nothing once it has taken bytes from a
    response."""
    retries = 0
    with trio.move_on_at(deadline):
        while True:
            started = trio.current_time()
            try:
                return await attempt()
            except Exception as exc:
                delay = retry_delay(exc, retries)
                now = trio.current_time()
                if (
                    delay is None or retries >= max_retries
                    or now + delay + (now - started) > deadline
                ):
                    raise
                log.info("%s failed (%s), retrying in %.2f s (retry %d of %d)",
                         what, exc, delay, retries + 1, max_retries)
            retries += 1
            await trio.sleep(delay)
    raise timed_out(retries + 1)
