"""``ReconnectingOutbox``: durable event streams that survive dropped connections.

::

    async with ReconnectingOutbox(agent.outbox, policy=BackoffPolicy()) as recon:
        async with recon.events(after=last_seen) as events:      # or conversation_events(...)
            async for ce in events:        # each event exactly once, in order, across reconnects
                apply(ce)
        # the stream ended: recon.status says why (Gap -> resync; Failed -> give up)

    async for status in recon.connection_status():   # in another task: Connecting, Connected,
        ...                                           # Disconnected(will_retry_in), Failed, Gap

Two independent streams: ``events`` holds only CommonEvents, ``connection_status`` only
statuses. A dropped connection (AgentikConnectionError) or a server that is starting or stopping
(503) is retried after ``policy``'s delay, resuming after the last event delivered. A dead
cursor (OutboxGapError) is never retried: ``Gap(cause)`` and the stream ends; the caller
resyncs. Exhausted attempts (or an error a retry cannot fix: 401, 404, 400) give
``Failed(cause)`` and the stream ends. A stream that ends by itself (a conversation's, after its
``Deleted``) ends this one too. ``close()`` (or leaving the ``async with``) ends both streams.

Works with any outbox of the Agent interface (HTTP or in-process); with the HTTP one,
``Connected`` is reported when the server confirms the subscription, otherwise when the stream
is opened.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from agentik.client.errors import TRANSIENT
from agentik.client.handles import HttpOutbox
from agentik.errors import AgentikError, OutboxGapError
from agentik.wire import CommonEvent, Cursor

# --- policy --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BackoffPolicy:
    """Exponential backoff with jitter: attempt n waits ``initial * multiplier**(n-1)``, capped at
    ``max``, spread by ±``jitter`` (a fraction). ``max_attempts`` consecutive failures (None:
    unlimited) give ``Failed``. A connection that delivered events resets the count."""

    initial: float = 1.0
    max: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.2
    max_attempts: int | None = None

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        base = min(self.max, self.initial * self.multiplier ** max(0, attempt - 1))
        if self.jitter:
            base *= 1 + rng.uniform(-self.jitter, self.jitter)
        return max(0.0, base)

    @classmethod
    def fixed(cls, delay: float, attempts: int | None = None) -> BackoffPolicy:
        """The same delay every time, no jitter (for tests)."""
        return cls(initial=delay, max=delay, multiplier=1.0, jitter=0.0, max_attempts=attempts)


# --- statuses ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Connecting:
    attempt: int = 1


@dataclass(frozen=True)
class Connected:
    after: Cursor | None = None


@dataclass(frozen=True)
class Disconnected:
    will_retry_in: float
    cause: BaseException | None = None


@dataclass(frozen=True)
class Failed:
    cause: BaseException


@dataclass(frozen=True)
class Gap:
    cause: OutboxGapError


ConnectionStatus = Connecting | Connected | Disconnected | Failed | Gap


# --- the wrapper ---------------------------------------------------------------------------------


class _Outbox(Protocol):
    async def current_cursor(self) -> Cursor: ...
    def events(self, after: Cursor | None = None) -> Any: ...
    def agent_events(self, after: Cursor | None = None) -> Any: ...
    def conversation_events(self, after: Cursor | None, conversation_id: str) -> Any: ...


class EventStream:
    """The consumer's end of one reconnecting stream: ``async for ce in stream``. Use it as an
    async context manager (or call ``aclose``) to stop early."""

    def __init__(self, receive: MemoryObjectReceiveStream[CommonEvent], scope: anyio.CancelScope) -> None:
        self._receive = receive
        self._scope = scope

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> CommonEvent:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._scope.cancel()
        self._receive.close()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@dataclass
class _Watchers:
    sends: list[MemoryObjectSendStream[ConnectionStatus]] = field(default_factory=list)


class ReconnectingOutbox:
    """See the module docstring. ``rng`` makes the jitter reproducible; ``buffer`` is how many
    events may wait for a slow consumer before reading from the server pauses (the server then
    catches up from its stored outbox, so nothing is lost)."""

    def __init__(
        self,
        outbox: _Outbox,
        policy: BackoffPolicy | None = None,
        *,
        rng: random.Random | None = None,
        buffer: int = 256,
    ) -> None:
        self._outbox = outbox
        self.policy = policy or BackoffPolicy()
        self._rng = rng or random.Random()
        self._buffer = buffer
        self._tg: TaskGroup | None = None
        self._closed = False
        self._watchers = _Watchers()
        #: the latest status (None before the first connection attempt)
        self.status: ConnectionStatus | None = None
        #: cursor of the last event handed to the consumer
        self.last_cursor: Cursor | None = None

    async def __aenter__(self) -> ReconnectingOutbox:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._close_streams()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(exc_type, exc, tb)

    async def close(self) -> None:
        """End every stream of this wrapper (events and statuses). Idempotent."""
        self._close_streams()
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
        await anyio.lowlevel.checkpoint()

    def _close_streams(self) -> None:
        self._closed = True
        for send in self._watchers.sends:
            send.close()
        self._watchers.sends.clear()

    # --- statuses --------------------------------------------------------------------------------

    def connection_status(self) -> MemoryObjectReceiveStream[ConnectionStatus]:
        """A stream of statuses from now on (the current one first, if any); it ends when the
        wrapper is closed. Each call gets its own stream."""
        send, receive = anyio.create_memory_object_stream[ConnectionStatus](math.inf)
        if self._closed:
            send.close()
            return receive
        if self.status is not None:
            send.send_nowait(self.status)
        self._watchers.sends.append(send)
        return receive

    def _publish(self, status: ConnectionStatus) -> None:
        self.status = status
        for send in list(self._watchers.sends):
            try:
                send.send_nowait(status)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._watchers.sends.remove(send)

    # --- event streams ---------------------------------------------------------------------------

    def events(self, after: Cursor | None = None) -> EventStream:
        """Every durable event after ``after`` (None: from the head at the first connection)."""
        return self._start(lambda o, c: o.events(c), after)

    def agent_events(self, after: Cursor | None = None) -> EventStream:
        return self._start(lambda o, c: o.agent_events(c), after)

    def conversation_events(self, after: Cursor | None, conversation_id: str) -> EventStream:
        """One conversation's durable events; ends after its Deleted, as the stream it reads."""
        return self._start(lambda o, c: o.conversation_events(c, conversation_id), after)

    def _start(self, open_stream: Any, after: Cursor | None) -> EventStream:
        if self._tg is None:
            raise RuntimeError("use ReconnectingOutbox as `async with ReconnectingOutbox(...) as r`")
        send, receive = anyio.create_memory_object_stream[CommonEvent](self._buffer)
        scope = anyio.CancelScope()
        if self._closed:
            send.close()
        else:
            self._tg.start_soon(self._run, open_stream, after, send, scope)
        return EventStream(receive, scope)

    async def _run(
        self,
        open_stream: Any,
        after: Cursor | None,
        send: MemoryObjectSendStream[CommonEvent],
        scope: anyio.CancelScope,
    ) -> None:
        with scope, send:
            last = after
            failures = 0  # consecutive attempts that never got connected
            while True:
                self._publish(Connecting(failures + 1))
                connected = False

                def on_open(start: Cursor | None) -> None:
                    nonlocal connected
                    connected = True
                    self._publish(Connected(start))

                try:
                    if last is None:
                        last = await self._outbox.current_cursor()
                    stream = self._open(open_stream, last, on_open)
                    try:
                        async for event in stream:
                            if not connected:
                                on_open(last)  # an outbox without an open hook
                            cursor = event.cursor
                            if cursor is not None and (
                                cursor.epoch == last.epoch and cursor.offset <= last.offset
                            ):
                                continue  # already delivered (a replay overlap)
                            try:
                                await send.send(event)
                            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                                return  # the consumer has gone
                            if cursor is not None:
                                last = self.last_cursor = cursor
                    finally:
                        await stream.aclose()
                except OutboxGapError as exc:
                    self._publish(Gap(exc))  # never retried: the caller must resync
                    return
                except TRANSIENT as exc:
                    cause: AgentikError = exc
                except AgentikError as exc:
                    self._publish(Failed(exc))  # 401, 404, 400...: a retry would fail the same
                    return
                else:
                    # The stream ended by itself (a conversation's, after its Deleted): so does
                    # this one. A dropped connection raises instead (AgentikConnectionError).
                    return
                failures = 0 if connected else failures + 1
                max_attempts = self.policy.max_attempts
                if max_attempts is not None and failures >= max_attempts:
                    self._publish(Failed(cause))
                    return
                delay = self.policy.delay(max(1, failures), self._rng)
                self._publish(Disconnected(delay, cause))
                await anyio.sleep(delay)

    def _open(self, open_stream: Any, after: Cursor, on_open: Any) -> Any:
        outbox: Any = self._outbox
        if isinstance(outbox, HttpOutbox):
            # Report Connected when the server confirms the subscription, not at the first event.
            outbox = _Hooked(outbox, on_open)
        else:
            # In-process: the stream is in place once opened (its cursor check runs first).
            on_open(after)
        return open_stream(outbox, after)


class _Hooked:
    """An HttpOutbox whose streams report their opening to ``on_open``."""

    def __init__(self, outbox: HttpOutbox, on_open: Any) -> None:
        self._outbox = outbox
        self._on_open = on_open

    def events(self, after: Cursor | None = None) -> Any:
        return self._outbox.events(after, on_open=self._on_open)

    def agent_events(self, after: Cursor | None = None) -> Any:
        return self._outbox.agent_events(after, on_open=self._on_open)

    def conversation_events(self, after: Cursor | None, conversation_id: str) -> Any:
        return self._outbox.conversation_events(after, conversation_id, on_open=self._on_open)
