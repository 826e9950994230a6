"""The writer thread: the node's one writer engine, driven by one OS thread for the actor's life.

The StorageActor used to hand each batch to ``trio.to_thread`` and wait for it on the trio
thread, so between two commits the writer sat idle through two thread hand-offs, the answers to
the last batch's callers and the gathering of the next batch. Here the thread gathers its next
batch itself the moment a commit ends (every request already queued, up to ``max_batch``) and
posts the outcome to trio without waiting for it: the trio side publishes and answers batch k
while batch k+1 is in the database.

What keeps the actor's guarantees (``actor``'s docstring) with two threads:

- requests are taken in the order they were queued (one FIFO, one consumer), and outcomes are
  posted in commit order into one channel the actor reads in order, so events reach the hub in
  offset order;
- the engine is touched by this thread only (its probes included), one call at a time;
- the outcome channel cannot be full: the actor admits at most ``capacity`` requests at a time
  (``Storage.write`` waits for room) and each outcome answers at least one of them or is the one
  probe in flight, so the channel is sized ``capacity + 1``;
- stopping: the thread finishes the batch it is committing (a commit that started is always
  answered), takes no other, and posts ``DONE`` last; what is still queued then is answered
  "storage is closed" by the actor.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import threading
import time
from dataclasses import dataclass
from typing import Any, Final, cast

import msgspec
import trio

from agentik.storage import ops
from agentik.storage.engine import StepWriter, WriterEngine, probe_write
from agentik.storage.types import BatchResult

log = logging.getLogger(__name__)


class _Probe:
    """The op of a probe request: not a write, ``engine.probe_write`` run alone."""

    __slots__ = ()


#: the op of a probe request
PROBE: Final = _Probe()


class Request(msgspec.Struct, eq=False):
    """A write (or probe) and its answer. Its caller parks (:meth:`wait`, or ``Storage.write``
    inline) until the actor calls :meth:`answer` (on the trio thread): the task itself is
    rescheduled, with no Event and parking lot per write. A caller cancelled while waiting
    leaves; the write still happens, and its answer goes to nobody. (A Struct: made in C, one
    per write.)"""

    op: ops.AnyOp | _Probe
    #: the op's result (its ``ops.Op[R]``'s R), set with ``answered``
    result: object = None
    error: BaseException | None = None
    answered: bool = False
    #: the caller's task while it waits
    task: trio.lowlevel.Task | None = None
    #: the Storage that queued it, if its caller may withdraw it (``Storage.write``)
    home: Any = None
    #: the writer's trace context (traces on only): its batch's span links to it
    trace: Any = None

    def answer(self) -> None:
        self.answered = True
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def abort(self, _: Any) -> trio.lowlevel.Abort:
        """The caller was cancelled while it waited: its answer goes to nobody. Cancelled
        already as it parked (it is the task running: nothing ran since it queued the
        request), it takes the request back, which was then never handed over."""
        task, self.task = self.task, None
        if self.home is not None and task is not None:
            try:
                parking = trio.lowlevel.current_task() is task
            except RuntimeError:  # a deadline expired: the run loop itself cancels
                parking = False
            if parking:
                self.home._withdraw(self)
        return trio.lowlevel.Abort.SUCCEEDED

    async def wait(self) -> None:
        if self.answered:
            await trio.lowlevel.checkpoint()
            return
        self.task = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self.abort)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One commit (or probe) as the thread ended it: ``result`` is the engine's BatchResult, or
    the exception it raised (StorageError for a database failure; anything else is a defect)."""

    batch: list[Request]
    result: BatchResult | BaseException | None
    #: seconds the commit took in the thread
    elapsed: float
    #: probe requests taken with this batch: answered by its outcome, no probe of their own
    probes: list[Request]
    #: planned while the batch before it ran (``_run_pipelined``)
    followed: bool = False


class Done:
    __slots__ = ()


#: posted last, once the thread has stopped
DONE: Final = Done()
_STOP: Final = object()


class Committer:
    """Owns ``writer`` from :meth:`start` until the thread posts :data:`DONE`."""

    def __init__(
        self, writer: WriterEngine, max_batch: int, post: trio.MemorySendChannel[Outcome | Done]
    ) -> None:
        self._writer = writer
        self._max_batch = max_batch
        self._post_channel = post
        #: lists of requests (or of _STOP), each as the trio side handed it over
        self._queue: queue.SimpleQueue[list[Request | object]] = queue.SimpleQueue()
        #: requests taken from the queue past ``max_batch``: the next batch starts with them
        self._carry: list[Request | object] = []
        self._stopping = False
        self._token: trio.lowlevel.TrioToken | None = None
        #: an engine that commits in steps (``_run_pipelined``), and the pipe that wakes its
        #: thread while it waits for an answer
        self._pipelined = hasattr(writer, "follow")
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def start(self) -> None:
        """Start the thread (from the trio thread)."""
        self._token = trio.lowlevel.current_trio_token()
        threading.Thread(target=self._run, name="agentik-storage-writer", daemon=True).start()

    def submit(self, reqs: list[Request]) -> None:
        """Queue ``reqs`` (taken in this order, after everything queued before)."""
        self._queue.put(cast("list[Request | object]", reqs))  # (read back as such: _take)
        if self._pipelined:
            try:  # wakes a thread waiting for either more requests or its statement's answer
                os.write(self._wake_w, b"\0")
            except BlockingIOError:  # full: the thread has a wake-up to read already
                pass

    def stop(self) -> None:
        """Ask the thread to stop after the batch it is committing; it then posts DONE."""
        self._stopping = True
        self._queue.put([_STOP])

    def close(self) -> None:
        """Release the wake-up pipe (after DONE: nothing submits or waits any more)."""
        os.close(self._wake_r)
        os.close(self._wake_w)

    def leftovers(self) -> list[Request]:
        """What was queued and never taken (call after DONE)."""
        out = [r for r in self._carry if isinstance(r, Request)]
        self._carry = []
        while True:
            try:
                items = self._queue.get_nowait()
            except queue.Empty:
                return out
            out.extend(r for r in items if isinstance(r, Request))

    def _post(self, item: Outcome | Done) -> None:
        assert self._token is not None
        self._token.run_sync_soon(_send_nowait, self._post_channel, item)

    def _run(self) -> None:
        try:
            if self._pipelined:
                self._run_pipelined()
            else:
                self._run_serial()
        finally:
            self._post(DONE)

    def _run_serial(self) -> None:
        stop = False
        while not (stop or self._stopping):
            batch, probes, stop = self._take()
            if not batch:
                if probes:
                    self._probe(probes)
                continue
            started = time.perf_counter()
            result: BatchResult | BaseException
            try:
                result = self._writer.commit_batch([r.op for r in batch])  # type: ignore[misc]
            except BaseException as exc:  # posted: the actor answers with it
                result = exc
            self._post(Outcome(batch, result, time.perf_counter() - started, probes))

    def _run_pipelined(self) -> None:
        """An engine that commits in steps (``PgWriter``: begin, follow, launch, land, result):
        while batch k's statement runs on the server, batch k+1 is taken and planned; k+1's
        statement goes out as soon as k's answer is in, before k is stamped and posted, so the
        server is idle only for the time it takes to send."""
        w = cast("StepWriter[object]", self._writer)  # (``_pipelined``: it has the steps)
        flight: tuple[list[Request], list[Request], object, float, bool] | None = None
        stop = False
        while True:
            if flight is None:
                if stop or self._stopping:
                    return
                batch, probes, stop = self._take()
                if not batch:
                    if probes:
                        self._probe(probes)
                    continue
                flight = self._begin(w, batch, probes)
                if flight is None:
                    continue
            batch, probes, current, started, followed = flight
            flight = None
            nxt: tuple[list[Request], list[Request]] | None = None
            ahead = None
            if not (stop or self._stopping):
                more, more_probes, stop = self._take(block=False)
                if not more and not stop and self._wait_for_more(w):
                    more, more_probes2, stop = self._take(block=False)
                    more_probes += more_probes2
                if more:
                    nxt = (more, more_probes)
                    try:
                        ahead = w.follow([r.op for r in more], current)  # type: ignore[misc]
                    except Exception:  # planning ahead is an optimisation: never a failure
                        log.exception("planning the next batch ahead failed")
                else:
                    probes = probes + more_probes  # answered by this batch's outcome
            result: BatchResult | BaseException | None = None
            try:
                w.land(current)
            except BaseException as exc:
                result = exc
            if nxt is not None:
                more, more_probes = nxt
                launched = False
                if result is None and ahead is not None:
                    try:
                        launched = w.launch(ahead)
                    except BaseException as exc:
                        self._post(Outcome(more, exc, 0.0, more_probes))
                        more = []
                if more:
                    flight = ((more, more_probes, ahead, time.perf_counter(), True) if launched
                              else self._begin(w, more, more_probes))
            if result is None:
                try:
                    result = w.result(current)
                except BaseException as exc:
                    result = exc
            self._post(Outcome(batch, result, time.perf_counter() - started, probes, followed))

    def _wait_for_more(self, w: StepWriter[object]) -> bool:
        """While the statement runs: True once more requests are queued, False once its answer
        is there (whichever comes first)."""
        self._drain_wakeups()
        if self._carry or not self._queue.empty():
            return True
        try:  # bounded like the answer itself (``pg.connect``): landing then says it is late
            ready, _, _ = select.select([w.socket(), self._wake_r], [], [], w.answer_remaining())
        except Exception:  # a broken connection: landing the statement says so
            return False
        return self._wake_r in ready

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _begin(self, w: StepWriter[object], batch: list[Request], probes: list[Request]
               ) -> tuple[list[Request], list[Request], object, float, bool] | None:
        started = time.perf_counter()
        try:
            return batch, probes, w.begin([r.op for r in batch]), started, False  # type: ignore[misc]
        except BaseException as exc:
            self._post(Outcome(batch, exc, time.perf_counter() - started, probes))
            return None

    def _probe(self, probes: list[Request]) -> None:
        started = time.perf_counter()
        result: BaseException | None = None
        try:
            probe_write(self._writer)
        except BaseException as exc:
            result = exc
        self._post(Outcome([], result, time.perf_counter() - started, probes))

    def _take(self, block: bool = True) -> tuple[list[Request], list[Request], bool]:
        """The requests queued first (waiting for one unless not ``block``), then every one
        already queued, up to ``max_batch`` writes; what is past that is kept for the next
        batch. Returns (writes, probes, whether a stop was met)."""
        batch: list[Request] = []
        probes: list[Request] = []
        items, self._carry = self._carry, []
        if not items:
            if block:
                items = self._queue.get()
            else:
                try:
                    items = self._queue.get_nowait()
                except queue.Empty:
                    return batch, probes, False
        while True:
            for i, req in enumerate(items):
                if not isinstance(req, Request):  # _STOP
                    self._carry = items[i + 1:]
                    return batch, probes, True
                if req.op is PROBE:
                    probes.append(req)
                    continue
                batch.append(req)
                if len(batch) >= self._max_batch:
                    self._carry = items[i + 1:]
                    return batch, probes, False
            try:
                items = self._queue.get_nowait()
            except queue.Empty:
                return batch, probes, False


def _send_nowait(channel: trio.MemorySendChannel[Outcome | Done], item: Outcome | Done) -> None:
    # Runs as a trio callback: raising here would crash the run. The channel cannot be full
    # (module docstring) and is closed only after DONE was received.
    try:
        channel.send_nowait(item)
    except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
        log.critical("storage outcome lost (%s): its callers are not answered", type(item).__name__)
