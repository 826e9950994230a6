"""What the StorageActor does with each outcome the writer thread posts (``actor``): health and
stats, then publish the batch's events and answer its callers, in that order (nothing is
acknowledged before its events are in the hub), or answer every caller with the error of a batch
that stored nothing (transient: the store refuses writes for now, ``engine.is_transient``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from trio.lowlevel import reschedule

from agentik import metrics, tracing
from agentik.errors import (
    AgentikError,
    LeaseLostError,
    StorageError,
    StorageOutcomeUnknownError,
    StorageUnavailableError,
)
from agentik.storage.committer import PROBE, Outcome, Request
from agentik.storage.engine import is_transient
from agentik.storage.types import StoredEvent

if TYPE_CHECKING:
    from agentik.storage.actor import Storage
    from agentik.storage.hub import EventHub

log = logging.getLogger("agentik.storage.actor")  # the actor's own lines, as before


class Publisher(Protocol):
    """What publishes a committed batch when the hub is not fed directly (PostgreSQL's feed,
    ``pg.feed.Feed``: every node's events in global order)."""

    def own(self, events: list[StoredEvent], oldest: int, head: int,
            fn: Callable[[], None]) -> None: ...


def deliver(hub: EventHub, storage: Storage, outcome: Outcome, feed: Publisher | None) -> None:
    """Report one outcome of the writer thread: health, stats, publish, answer its callers."""
    batch, result = outcome.batch, outcome.result
    if batch and tracing.enabled():
        _trace(outcome)
    if isinstance(result, BaseException):
        _failed(storage, batch + outcome.probes, result)
        return
    storage.health.accepted()
    for req in outcome.probes:
        req.answer()
    if not batch:
        return
    assert result is not None  # a batch's outcome: its BatchResult
    storage.stats.batches += 1
    storage.stats.ops += len(batch)
    storage.stats.largest_batch = max(storage.stats.largest_batch, len(batch))
    storage.stats.followed += outcome.followed
    metrics.STORAGE_COMMIT.observe(outcome.elapsed)
    metrics.STORAGE_BATCH.observe(len(batch))
    metrics.EVENTS_COMMITTED.inc(len(result.events))

    def answer() -> None:
        # Request.answer inline: this runs for every write
        for req, value in zip(batch, result.results, strict=True):
            if isinstance(value, AgentikError):
                if isinstance(value, LeaseLostError) and storage.leases is not None:
                    cid = getattr(req.op, "conversation_id", None)
                    if isinstance(cid, str):
                        storage.leases.fenced_out(cid)
                req.error = value
            else:
                req.result = value
            req.answered = True
            task = req.task
            if task is not None:
                req.task = None
                reschedule(task)
        storage._answered(len(batch))

    if feed is None:
        hub.publish(result.events, result.oldest, result.head)
        answer()
    else:
        # Every node's events (this one's too) reach the hub through the feed, in global order;
        # callers are answered once their batch is published there.
        feed.own(result.events, result.oldest, result.head, answer)


def _trace(outcome: Outcome) -> None:
    """The batch's span (``storage commit``, timed by the thread), linked to the spans of the
    writes in it: a batch serves many turns, so it is no one's child."""
    failed = outcome.result if isinstance(outcome.result, BaseException) else None
    tracing.record("storage commit", outcome.elapsed, links=[r.trace for r in outcome.batch],
                   failed=f"{type(failed).__name__}: {failed}" if failed else None,
                   attributes={"agentik.storage.batch_size": len(outcome.batch),
                               "agentik.storage.followed": outcome.followed})


def _failed(storage: Storage, reqs: list[Request], exc: BaseException) -> None:
    """A batch (or probe) that stored nothing: every caller gets the error."""
    error: type[StorageError] = StorageError
    writes = sum(1 for r in reqs if r.op is not PROBE)
    if writes == 0:  # a probe: whatever went wrong, the store still refuses writes
        if not isinstance(exc, StorageError):  # a probe must never take storage down
            log.error("the storage probe failed", exc_info=exc)
        storage.health.refused(str(exc) if isinstance(exc, StorageError)
                               else f"probe failed: {type(exc).__name__}: {exc}")
        for req in reqs:
            req.answer()
        return
    if isinstance(exc, StorageError):
        unknown = isinstance(exc, StorageOutcomeUnknownError)
        if unknown or is_transient(exc):
            # StorageHealth logs the outage once when it starts and once when it ends; retries
            # during it are not news (one line per attempt would flood the log for its length).
            log.debug("storage batch of %d refused: %s", writes, exc)
            # an unknown outcome stays one: its retry must check (ops.rechecked)
            error = StorageOutcomeUnknownError if unknown else StorageUnavailableError
            storage.health.refused(str(exc))
        else:
            log.error("storage batch of %d failed: %s", writes, exc)
        message = str(exc)
    else:  # a defect in the engine: the batch is lost, the writer goes on
        log.error("storage batch of %d failed", writes, exc_info=exc)
        message = f"write failed, nothing stored: {type(exc).__name__}: {exc}"
    for req in reqs:
        req.error = error(message)
        req.answer()
    storage._answered(writes)
