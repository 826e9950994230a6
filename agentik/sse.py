"""Server-Sent Events for the front doors, written once: the frame, and the streaming response
bodies of :mod:`agentik.web.sse` (agentik's own streams) and :mod:`agentik.a2a.web` (A2A's).

- :func:`frame` is the one place an SSE frame is spelled: ``id:`` / ``event:`` / ``data:`` lines
  and the blank line. ``data`` is written as given (stored payload bytes are not re-encoded); it
  must be one line, as JSON without raw newlines is.
- :class:`ChannelBody` writes what a receive channel holds: every item already queued goes out
  in ONE write, each item its own frame(s), in order, and none is waited for; silence for
  ``heartbeat`` seconds writes a comment, so proxies keep the connection open. When the channel
  ends by itself, :attr:`ChannelBody.last` (if any) is the last write.
- :class:`PumpBody` feeds such a body from a *pump* task in a nursery owned by the body: Quart
  enters the body with ``async with`` and iterates it in the same task, so the nursery is opened
  and closed by that task, and a client disconnect (which cancels that task) closes the nursery,
  which ends the pump and whatever subscription it holds. No generator ever yields inside a
  nursery.
- :class:`WakeBody` waits in ONE place, woken by its source: its :meth:`WakeBody.step` takes
  what is queued without waiting, and its source calls :meth:`WakeBody.wake` when there may be
  more. :func:`serve_body` streams one in the ASGI app's own task, where the idle wait is the
  wait for the client's ``http.disconnect``: an idle agentik SSE stream is one task (hypercorn's)
  and no Quart request machinery (issue 13: memory per idle connection; see
  :mod:`agentik.web.sse`).
- *Parking*: a body that has just written events (one with :attr:`WakeBody.parks`: the live
  stream, whose events are a model's tokens 20-100 ms apart) waits for the next ones parked,
  for PARK to 1.5 PARK seconds, before that idle wait: its task is off the run queue with no
  cancel scope, no deadline and no wait on the client, and :meth:`WakeBody.wake` reschedules
  it. The idle wait's cancel scope and the ``Cancelled`` that ends it cost about as much as the
  token's write (issue 13: 759k -> 638k instructions per streamed token under ``agentik
  serve``, callgrind). A client gone meanwhile is noticed when the park runs out, or within
  :data:`BUSY_CHECK` while the stream writes. The durable streams do not park: their events
  are sparse, and their disconnects are noticed at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import trio
from quart.wrappers.response import ResponseBody

from agentik.parking import PARK_MAX, Parking, current_parking

if TYPE_CHECKING:
    from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable

SSE_TYPE = "text/event-stream; charset=utf-8"
HEARTBEAT = b": heartbeat\n\n"
OPENED = b": connected\n\n"
#: chunks a pump may queue ahead of the socket; beyond it the pump waits
PUMP_BUFFER = 16

Pump = Callable[..., Awaitable[None]]


def frame(data: bytes, event: bytes | None = None, id: bytes | None = None) -> bytes:
    """One SSE frame: ``id: ID`` (if given), ``event: EVENT`` (if given), ``data: DATA``."""
    if id is None:
        if event is None:
            return b"data: " + data + b"\n\n"
        return b"event: " + event + b"\ndata: " + data + b"\n\n"
    if event is None:
        return b"id: " + id + b"\ndata: " + data + b"\n\n"
    return b"id: " + id + b"\nevent: " + event + b"\ndata: " + data + b"\n\n"


def _as_is(chunk: bytes) -> bytes:
    return chunk


class ChannelBody(ResponseBody):
    """A streaming body that writes what ``self._recv`` holds (set it in ``__aenter__``).

    ``render`` turns one item into its bytes (default: the item is bytes already). The first
    write is ``opened`` (``b""``: none). Iteration ends once the channel has ended and everything
    in it, then :attr:`last`, was written.
    """

    #: the last write when the channel ends by itself (``b""``: none)
    last = b""

    def __init__(
        self,
        heartbeat: float,
        render: Callable[[Any], bytes] = _as_is,
        *,
        opened: bytes = OPENED,
    ) -> None:
        self._heartbeat = heartbeat
        self._render = render
        self._first = opened
        self._recv: trio.MemoryReceiveChannel[Any] | None = None
        self._ended = False

    def __aiter__(self) -> ChannelBody:
        return self

    async def __anext__(self) -> bytes:
        recv = self._recv
        assert recv is not None
        if self._first:
            # The first chunk tells the client the subscription is in place, and pushes the
            # headers through buffering proxies.
            first_chunk, self._first = self._first, b""
            return first_chunk
        if self._ended:
            raise StopAsyncIteration
        render = self._render
        parts: list[bytes] = []
        try:
            try:
                item = recv.receive_nowait()
            except trio.WouldBlock:
                with trio.move_on_after(self._heartbeat) as scope:
                    item = await recv.receive()
                if scope.cancelled_caught:
                    return HEARTBEAT
            parts.append(render(item))
            while True:
                parts.append(render(recv.receive_nowait()))
        except trio.WouldBlock:
            pass
        except trio.EndOfChannel:
            self._ended = True
            if self.last:
                parts.append(self.last)
            elif not parts:
                raise StopAsyncIteration from None
        return b"".join(parts)


class PumpBody(ChannelBody):
    """A :class:`ChannelBody` fed by ``pump(send, task_status=...)`` in a nursery of its own
    (module docstring). The pump must call ``task_status.started()`` once it is subscribed (the
    response starts after that) and must not raise (it logs and ends instead); it closes
    ``send`` when done. :meth:`opened` / :meth:`closed` are called once the body is open and
    when it closes (for accounting)."""

    def __init__(self, pump: Pump, heartbeat: float, *, opened: bytes = OPENED) -> None:
        super().__init__(heartbeat, opened=opened)
        self._pump = pump
        self._manager: Any = None
        self._nursery: trio.Nursery | None = None

    def opened(self) -> None:
        pass

    def closed(self) -> None:
        pass

    async def __aenter__(self) -> PumpBody:
        manager = trio.open_nursery()
        nursery = await manager.__aenter__()
        send, recv = trio.open_memory_channel[bytes](PUMP_BUFFER)
        try:
            await nursery.start(self._pump, send)
        except BaseException as exc:
            # Quart does not call __aexit__ when __aenter__ fails: close the nursery here.
            nursery.cancel_scope.cancel()
            await manager.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._manager, self._nursery, self._recv = manager, nursery, recv
        self.opened()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        try:
            await self._manager.__aexit__(exc_type, exc, tb)
        finally:
            self.closed()


class WakeBody(ResponseBody):
    """A streaming body whose source wakes it instead of being waited on: subclasses implement
    ``__aenter__`` / ``__aexit__`` (subscribe with :meth:`wake` as the source's callback, then
    unsubscribe) and :meth:`step`.

    The writes: ``opened``, then whatever :meth:`step` returns, one write each; silence for
    ``heartbeat`` seconds writes :data:`HEARTBEAT`. Iterated as a Quart body it waits for a wake
    or the heartbeat; :func:`serve_body` also ends it when the client disconnects.
    """

    #: whether a write of events is followed by a park (module docstring: parking), for a
    #: stream whose events come close together (a model's tokens); its client's disconnect is
    #: then noticed up to PARK_MAX seconds late
    parks = False

    def __init__(self, heartbeat: float, *, opened: bytes = OPENED) -> None:
        self._heartbeat = heartbeat
        self._first = opened
        self._deadline = 0.0
        #: the idle wait in progress (cancelled by wake())
        self._idle: trio.CancelScope | None = None
        #: the task parked in :meth:`_park` (rescheduled by wake() or when the park runs out)
        self._parked: trio.lowlevel.Task | None = None
        #: the last write carried events: the next wait may be a park
        self._may_park = False
        self._parking: Parking | None = None

    def wake(self) -> None:
        """There may be something for :meth:`step` now. Synchronous; called from the source's
        task (the hub's writer)."""
        if self._parked is not None:
            assert self._parking is not None
            del self._parking.parked[self]
            self.unpark()
        elif self._idle is not None:
            self._idle.cancel()

    def unpark(self) -> None:
        task, self._parked = self._parked, None
        assert task is not None
        trio.lowlevel.reschedule(task)

    async def _park(self, now: float) -> None:
        """Wait for a wake without the idle wait (module docstring: parking); returns when
        woken or once the park ran out (PARK to PARK_MAX seconds)."""
        parking = self._parking = current_parking()
        self._parked = trio.lowlevel.current_task()
        parking.park(self, now)

        def abort(_: object) -> trio.lowlevel.Abort:
            self._parked = None
            parking.parked.pop(self, None)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def step(self) -> bytes:
        """Everything already queued, as one write (``b""``: nothing; wait for :meth:`wake`).
        Must not wait for the source. Raises StopAsyncIteration once ended."""
        raise NotImplementedError

    async def next_chunk(self, idle: Callable[[], Awaitable[object]]) -> bytes:
        """The next write. While there is none, ``await idle()`` in a scope cancelled by a wake
        or the heartbeat deadline (anything ``idle`` raises goes through)."""
        if self._first:
            # The first chunk tells the client the subscription is in place, and pushes the
            # headers through buffering proxies.
            chunk, self._first = self._first, b""
            self._deadline = trio.current_time() + self._heartbeat
            return chunk
        while True:
            chunk = await self.step()
            now = trio.current_time()
            if chunk or now >= self._deadline:
                self._deadline = now + self._heartbeat
                self._may_park = self.parks and bool(chunk)
                return chunk or HEARTBEAT
            # No checkpoint since step() saw nothing queued: no wake can be missed.
            if self._may_park:
                # Events were just written: the next ones are likely close (a model's tokens).
                # Park once, if the heartbeat is not due before the park may end.
                self._may_park = False
                if self._deadline - now > PARK_MAX:
                    await self._park(now)
                    continue
            self._idle = trio.CancelScope(deadline=self._deadline)
            try:
                with self._idle:
                    await idle()
            finally:
                self._idle = None

    async def catch_up(self, write: Callable[[bytes], Awaitable[bool]]) -> bool:
        """Called by :func:`serve_body` after the first write: write what the body has to catch
        up on its own way before the step loop (default: nothing). ``write`` returns False
        once the client is gone; so must this then."""
        return True

    def __aiter__(self) -> WakeBody:
        return self

    async def __anext__(self) -> bytes:
        return await self.next_chunk(trio.sleep_forever)


async def drain(recv: trio.MemoryReceiveChannel[bytes], write: Callable[[bytes], Awaitable[bool]]) -> bool:
    """Write what ``recv`` brings until it ends, every chunk already queued in ONE write;
    False as soon as ``write`` says the client is gone."""
    async for chunk in recv:
        parts = [chunk]
        while True:
            try:
                parts.append(recv.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        if not await write(b"".join(parts)):
            return False
    return True


class _ClientGone(Exception):
    pass


#: seconds a stream may write without an idle wait before it checks for its client's disconnect
#: (no task waits for it while the stream writes: a client gone in the middle of a long replay
#: is noticed within this, not after the replay)
BUSY_CHECK = 1.0


async def serve_body(body: WakeBody, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    """Stream ``body`` (its response start already sent) in the calling task, the ASGI app's
    own: the idle wait is ``receive()``, so the client's ``http.disconnect`` ends the stream
    with no task of its own. Entered and exited here; the final body message is sent (shielded)
    when the body ends by itself, none after a disconnect (as when Quart's stream is
    cancelled)."""

    async def until_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        raise _ClientGone

    check_at = trio.current_time() + BUSY_CHECK

    async def write(chunk: bytes) -> bool:
        nonlocal check_at
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        now = trio.current_time()
        if now >= check_at:
            check_at = now + BUSY_CHECK
            try:
                with trio.move_on_after(0.001):  # a disconnect already queued, or nothing
                    await until_disconnect()
            except _ClientGone:
                return False
        return True

    async with body:
        try:
            if not await write(await body.next_chunk(until_disconnect)):
                return
            if not await body.catch_up(write):
                return
            while True:
                try:
                    chunk = await body.next_chunk(until_disconnect)
                except StopAsyncIteration:
                    break
                if not await write(chunk):
                    return
        except _ClientGone:
            return
    # Shielded: hypercorn finishes the connection's bookkeeping inside this send (see
    # agentik.web.keepalive).
    with trio.CancelScope(shield=True):
        await send({"type": "http.response.body", "body": b"", "more_body": False})
