"""Whether the store accepts writes, and writing until it does (issue 11: a full disk).

``StorageHealth`` is what the StorageActor last found: every commit and every probe reports to
it, before callers are answered; ``/readyz`` reads it through the Agent. ``retry_until_stored``
is how a turn's writes survive a store that refuses them (disk or database full, read-only, an
I/O error, a lost connection: StorageUnavailableError): retried with ``Backoff``, woken at once
when a write succeeds again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import trio

from agentik.errors import StorageOutcomeUnknownError, StorageUnavailableError
from agentik.metrics import STORAGE_ACCEPTING_WRITES
from agentik.storage import ops

log = logging.getLogger(__name__)
R = TypeVar("R")


@dataclass(frozen=True)
class Backoff:
    """Waits that double from ``initial`` up to ``maximum`` seconds: between the writer's probes
    of a store that refuses writes, and between the attempts of ``write_until_stored``. The cap
    bounds how long after space returns a retried write is stored (a probe that succeeds wakes
    every waiting writer at once)."""

    initial: float = 0.05
    maximum: float = 1.0

    def delays(self) -> Iterator[float]:
        delay = self.initial
        while True:
            yield delay
            delay = min(delay * 2, self.maximum)


#: the backoff of the StorageActor's probes and of ``write_until_stored``
RETRY = Backoff()


class StorageHealth:
    """Whether the store accepts writes, as the writer last found it: every commit and every
    probe reports here (in the actor, before callers are answered). ``/readyz`` reads it through
    the Agent; ``wait_writable`` wakes writers retrying a refused write once one succeeds.
    The gauge ``agentik_storage_accepting_writes`` follows ``writable`` (one store per
    process)."""

    def __init__(self) -> None:
        self.writable = True
        #: why writes are refused (the database's message); None while writable
        self.error: str | None = None
        #: wall-clock time of the first refused write of this outage; None while writable
        self.since: float | None = None
        #: refused commits and probes in this outage
        self.refusals = 0
        self._changed = trio.Event()
        STORAGE_ACCEPTING_WRITES.set(1)

    def refused(self, error: str) -> None:
        if self.writable:
            self.writable = False
            self.since = time.time()
            STORAGE_ACCEPTING_WRITES.set(0)
            log.error("storage refuses writes: %s", error)
        self.error = error
        self.refusals += 1
        self._change()

    def accepted(self) -> None:
        if self.writable:
            return
        log.warning("storage accepts writes again (refused for %.1f s, %d attempts)",
                    time.time() - (self.since or time.time()), self.refusals)
        self.writable, self.error, self.since, self.refusals = True, None, None, 0
        STORAGE_ACCEPTING_WRITES.set(1)
        self._change()

    def _change(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def changed(self) -> None:
        """Return at the next refused write or probe, or when writes are accepted again."""
        await self._changed.wait()

    async def wait_writable(self, writable: bool = True) -> None:
        """Return once the store accepts writes (``writable`` False: once it refuses them); at
        once when it does now."""
        while self.writable != writable:
            await self._changed.wait()


async def retry_until_stored(
    write: Callable[[ops.Op[R]], Awaitable[R]],
    health: StorageHealth,
    op: ops.Op[R],
    backoff: Backoff = RETRY,
) -> R:
    """``await write(op)``, again after each StorageUnavailableError once ``health`` says writes
    are accepted again or the next backoff delay has passed. Each attempt is shielded (its
    answer is always known); the waits between attempts are not, so a cancel ends the retries
    with Cancelled, and then ``op`` was not stored (but see below). Other errors propagate at
    once.

    After a StorageOutcomeUnknownError (PostgreSQL: the connection failed with the commit in
    flight, which may have stored it) the retries write ``ops.rechecked(op)``: a turn's write
    then stores nothing if its first attempt was stored, and returns what is stored. A
    cancel after such an outcome leaves it unknown whether ``op`` was stored: whoever goes on
    storing it must write ``ops.rechecked(op)`` (``actors/ending.py`` does)."""
    delays = backoff.delays()
    attempts = 0
    while True:
        attempts += 1
        with trio.CancelScope(shield=True):
            try:
                return await write(op)
            except StorageUnavailableError as exc:
                error = exc
                if isinstance(exc, StorageOutcomeUnknownError):
                    op = ops.rechecked(op)
        if attempts == 1:
            log.warning("%s not stored (%s): retrying until the store accepts writes",
                        type(op).__name__, error)
        with trio.move_on_after(next(delays)):
            await health.wait_writable()
