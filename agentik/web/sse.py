"""Server-Sent Events: the durable streams (``/agentik/events``,
``/agentik/conversations/{id}/events``) and the live stream (``/agentik/conversations/{id}/live``).

Everything that can fail is decided before the response starts (auth, cursor syntax, cursor
validity -> 410, unknown conversation -> 404), so errors are proper JSON answers, never a broken
stream. Then:

- The body (:class:`EventStream`, :class:`LiveStream`: :class:`agentik.sse.WakeBody`) reads its
  hub subscription itself, with no pump task and no channel of its own: what is queued goes out
  as ONE write, and the hub wakes the body when it queues more (``wake``).
- Quart answers the request (auth, errors, headers, access log), then *hands the stream off*:
  the response body Quart iterates is an empty placeholder, and :class:`AgentikApp` streams the
  real body in hypercorn's task for the request once Quart's tasks and request objects are gone
  (:class:`Handoff`, :func:`agentik.sse.serve_body`), waiting for the client's disconnect while
  idle. An idle stream costs one task and its subscription (issue 13: about 45 -> 27 KiB of
  server memory per idle connection; docs/BENCHMARKS.md).
- Silence for ``heartbeat`` seconds sends a comment, so proxies keep the connection open.
- Durable frames: ``id: EPOCH:OFFSET`` / ``event: <type>`` / ``data: <CommonEvent JSON>``. Live
  frames have no ``id:``. A cursor overtaken by eviction mid-stream gets a final ``event: gap``
  frame (data: the 410 body) and the stream ends; reconnecting with Last-Event-ID then gets 410.
- When the stream it reads ends by itself, a last ``event: ended`` frame says why (``data:
  {"reason": ...}``) and the response ends: a conversation's durable stream ends after that
  conversation's ``deleted`` event (the hub's rule), a live stream when its reader falls more than
  the subscriber buffer behind (the client reconnects). Any other end of the response (shutdown,
  a broken connection) has no such frame.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, get_args

import trio
from quart import Blueprint, Response, request
from quart.wrappers.response import ResponseBody

from agentik import metrics
from agentik.agent import StoredEvent
from agentik.errors import InvalidInputError, NotFoundError, OutboxGapError
from agentik.sse import HEARTBEAT, OPENED, PUMP_BUFFER, SSE_TYPE, WakeBody, drain, frame
from agentik.web._state import WebState, log, scope, state
from agentik.web.errors import detail_of
from agentik.web.types import EndedReason, ErrorBody, StreamEnded
from agentik.wire import CommonEvent, Cursor, Event, encode

if TYPE_CHECKING:
    from hypercorn.typing import (
        ASGIReceiveCallable,
        ASGIReceiveEvent,
        ASGISendCallable,
        ASGISendEvent,
    )

    from agentik.agent import LocalAgent, OnlineSubscription

bp = Blueprint("agentik_sse", __name__)

__all__ = [
    "HEARTBEAT", "OPENED", "PUMP_BUFFER", "SSE_TYPE", "EventStream", "Handoff", "LiveStream",
    "live_frame",
]

#: ``stored_batches`` of a durable stream, all but ``wake``
Batches = Callable[..., AsyncGenerator[list[StoredEvent], None]]


def _opened(st: WebState) -> None:
    """An SSE body is open: the app's open-stream count (graceful shutdown) and the gauge."""
    st.stream_opened()
    metrics.SSE_CONNECTIONS.inc()


def _closed(st: WebState) -> None:
    metrics.SSE_CONNECTIONS.dec()
    st.stream_closed()


class EventStream(WakeBody):
    """A durable stream's body: it steps the hub's stream (``batches(wake=self.wake)``, which
    never waits for live events) itself. A reader that does not keep up (its writes block)
    stops stepping, so its hub subscriber overflows and falls back to the stored outbox.
    Subscribed in ``__aenter__`` (its first step, which may read a page of the outbox), before
    the ``: connected`` chunk."""

    def __init__(self, st: WebState, batches: Batches, after: Cursor, heartbeat: float) -> None:
        super().__init__(heartbeat)
        self._state = st
        self._batches = batches
        self._after = after
        #: every frame's id is ``<epoch>:<offset>``
        self._prefix = after.epoch.encode() + b":"
        self._stream: AsyncGenerator[list[StoredEvent], None] | None = None
        #: what the first step read, for the first step() after ": connected"
        self._pending = b""
        self._done = False

    async def __aenter__(self) -> EventStream:
        self._stream = self._batches(wake=self.wake)
        self._pending = await self.step()
        _opened(self._state)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._stream is not None
        try:
            with trio.CancelScope(shield=True):
                await self._stream.aclose()  # unsubscribes (its finally)
        finally:
            _closed(self._state)

    async def step(self) -> bytes:
        """The next batch of the hub's stream as its SSE frames (after what the first step read);
        ``data`` is the stored JSON, neither decoded nor re-encoded (the ``event:`` name is read
        from it alone: :meth:`StoredEvent.types_of`). ``b""``: nothing queued (live and idle), or
        the stream failed."""
        if self._pending:
            chunk, self._pending = self._pending, b""
            return chunk
        if self._done:
            raise StopAsyncIteration
        assert self._stream is not None
        try:
            batch = await self._stream.__anext__()
        except StopAsyncIteration:
            # A durable stream ends by itself only after its conversation's Deleted.
            self._done = True
            return ended_frame("deleted")
        except OutboxGapError as exc:
            self._done = True
            return gap_frame(exc)
        except Exception:
            log.exception("event stream after %s failed", self._after)
            self._done = True
            return b""
        if not batch:
            return b""
        prefix = self._prefix
        return b"".join([
            frame(ev.raw, _tag_name(tag), prefix + str(ev.offset).encode())
            for ev, tag in zip(batch, StoredEvent.types_of(batch), strict=True)
        ])

    async def catch_up(self, write: Callable[[bytes], Awaitable[bool]]) -> bool:
        """A backlog (the first step read events) is replayed by a pump task, so the next page
        is read while the last one is written (as every durable stream did before issue 13's
        hand-off); the pump, its channel and its nursery are gone once the stream is live and
        idle. A stream that starts at the head has none of them."""
        if not self._pending:
            return True
        send, recv = trio.open_memory_channel[bytes](PUMP_BUFFER)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, send)
            if not await drain(recv, write):
                nursery.cancel_scope.cancel()
                return False
        return True

    async def _pump(self, send: trio.MemorySendChannel[bytes]) -> None:
        async with send:
            chunk, self._pending = self._pending, b""
            while chunk:
                await send.send(chunk)
                if self._done:
                    return
                chunk = await self.step()  # b"": nothing queued (live and idle), or failed


def gap_frame(exc: OutboxGapError) -> bytes:
    return frame(encode(ErrorBody(error=detail_of(exc))), b"gap")


def ended_frame(reason: EndedReason) -> bytes:
    return frame(encode(StreamEnded(reason=reason)), b"ended")


#: event class -> its ``event:`` name as bytes, built once (no per-frame tag lookup and encode)
_TAGS: dict[type, bytes] = {
    cls: str(cls.__struct_config__.tag).encode() for cls in get_args(Event)
}
#: the same by tag (a stored event's ``type``)
_TAG_NAMES: dict[str, bytes] = {name.decode(): name for name in _TAGS.values()}


def _tag_name(tag: str) -> bytes:
    name = _TAG_NAMES.get(tag)
    return tag.encode() if name is None else name


def live_frame(ev: CommonEvent) -> bytes:
    return frame(encode(ev), _TAGS[type(ev.event)])


class LiveStream(WakeBody):
    """The live stream's body: it reads its online subscription itself, with no pump task or
    second channel in between. Every event already queued goes out in one write, each in its
    own frame, in order; none is waited for. Subscribed in ``__aenter__``, before the
    ``: connected`` chunk; unsubscribed in ``__aexit__``. The subscription ends only when its
    reader fell too far behind: then a last ``event: ended`` frame (reason ``overflow``) and the
    response ends.
    """

    last = ended_frame("overflow")
    parks = True  # a model's tokens come close together (agentik.sse: parking)

    def __init__(
        self,
        st: WebState,
        subscribe: Callable[[str, Callable[[], None]], OnlineSubscription],
        conversation_id: str,
        heartbeat: float,
    ) -> None:
        super().__init__(heartbeat)
        self._state = st
        self._subscribe = subscribe
        self._conversation_id = conversation_id
        self._sub: OnlineSubscription | None = None
        self._ended = False

    async def step(self) -> bytes:
        if self._ended:
            raise StopAsyncIteration
        sub = self._sub
        assert sub is not None
        if not sub.events and not sub.ended:
            return b""
        parts = [live_frame(ev) for ev in sub.events]
        sub.events.clear()
        if sub.ended:
            self._ended = True
            parts.append(self.last)
        return b"".join(parts)

    async def __aenter__(self) -> LiveStream:
        self._sub = self._subscribe(self._conversation_id, self.wake)
        _opened(self._state)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._sub is not None
        self._sub.close()
        _closed(self._state)


def start_cursor(agent: LocalAgent) -> Cursor:
    """Where a durable stream starts: ``Last-Event-ID`` (a reconnecting EventSource) wins over
    ``?after=``; neither means from the current head. Raises InvalidInputError (bad syntax) or
    OutboxGapError (dead cursor), both before the response starts."""
    raw = request.headers.get("Last-Event-ID") or request.args.get("after")
    return agent.outbox.resumable(Cursor.parse(raw.strip()) if raw else None)


#: the ASGI scope key of the request's :class:`Handoff` (set by AgentikApp for HTTP requests)
HANDOFF = "agentik.handoff"


class Handoff:
    """One HTTP request's hand-off of its SSE body from Quart to the app (module docstring).

    :meth:`wrap_send` is the ``send`` Quart gets: once the placeholder body was entered (Quart
    has sent *this* response's start), the body message that would end the response is held
    back, and :attr:`body` is what the app streams after Quart returns. :meth:`wrap_receive`
    notes a disconnect Quart read first (then there is nothing to stream)."""

    __slots__ = ("body", "disconnected")

    def __init__(self) -> None:
        self.body: WakeBody | None = None
        self.disconnected = False

    def wrap_send(self, send: ASGISendCallable) -> ASGISendCallable:
        async def send_unless_handed_off(message: ASGISendEvent) -> None:
            if (
                self.body is not None
                and message["type"] == "http.response.body"
                and not message.get("more_body", False)
            ):
                return  # the app ends the response after the stream
            await send(message)

        return send_unless_handed_off

    def wrap_receive(self, receive: ASGIReceiveCallable) -> ASGIReceiveCallable:
        async def receive_noting_disconnect() -> ASGIReceiveEvent:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
            return message

        return receive_noting_disconnect


class _Placeholder(ResponseBody):
    """What Quart iterates instead of a handed-off body: nothing (and no length, so the
    response stays chunked). Entering it hands the body over."""

    def __init__(self, handoff: Handoff, body: WakeBody) -> None:
        self._handoff = handoff
        self._body: WakeBody | None = body

    async def __aenter__(self) -> _Placeholder:
        self._handoff.body, self._body = self._body, None
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    def __aiter__(self) -> _Placeholder:
        return self

    async def __anext__(self) -> bytes:
        raise StopAsyncIteration


def stream_response(st: WebState, body: WakeBody, after: Cursor | None) -> Response:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    if after is not None:
        headers["X-Agentik-Cursor"] = str(after)
    if request.method == "HEAD":
        # The headers only: a stream whose body is never sent would hold the connection.
        return Response(b"", status=200, headers=headers, content_type=SSE_TYPE)
    handoff = request.scope.get(HANDOFF)
    response = Response(
        _Placeholder(handoff, body) if isinstance(handoff, Handoff) else body,
        status=200, headers=headers,
        content_type=SSE_TYPE,
    )
    response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut the stream
    return response


async def _require_conversation(agent: LocalAgent, conversation_id: str) -> None:
    if await agent.get_conversation(conversation_id, user=scope()) is None:
        raise NotFoundError(f"conversation {conversation_id!r} not found")


#: ``?kind=`` of ``/agentik/events`` (and ``kind`` of a WebSocket ``events`` subscription): the
#: outbox kinds. ``agent``: the conversation list (created, renamed, touched, deleted);
#: ``conversation``: what happens inside conversations (messages, tool calls, errors, ...);
#: ``a2a``: A2A task records (``task_updated``), which are in neither of the other two.
EVENT_KINDS = ("agent", "conversation", "a2a")


def kind_param(raw: str | None) -> str | None:
    """A valid event kind, None for none. Raises InvalidInputError."""
    if raw is None or raw == "":
        return None
    if raw not in EVENT_KINDS:
        raise InvalidInputError(f"kind must be one of {', '.join(EVENT_KINDS)}, got {raw!r}")
    return raw


@bp.get("/agentik/events")
async def events() -> Response:
    st = state()
    agent = st.require_agent()
    kind = kind_param(request.args.get("kind"))
    after = start_cursor(agent)
    batches = partial(agent.outbox.stored_batches, after, kind=kind, user=scope())
    return stream_response(st, EventStream(st, batches, after, st.heartbeat), after)


@bp.get("/agentik/conversations/<conversation_id>/events")
async def conversation_events(conversation_id: str) -> Response:
    st = state()
    agent = st.require_agent()
    after = start_cursor(agent)
    resuming = bool(request.headers.get("Last-Event-ID") or request.args.get("after"))
    # A conversation deleted while the client was away is still streamed from its cursor, so the
    # client sees the Deleted event; otherwise an unknown id is a 404. In this order: a deletion
    # that has removed the row has also stored its events (one transaction).
    # Another user's conversation, deleted or not, answers as an unknown id.
    if not await agent.users.owns(conversation_id, scope()) or (
        await agent.get_conversation(conversation_id) is None
        and not (resuming and await agent.outbox.has_events_after(conversation_id, after))
    ):
        raise NotFoundError(f"conversation {conversation_id!r} not found")
    batches = partial(agent.outbox.stored_batches, after, conversation_id=conversation_id)
    return stream_response(st, EventStream(st, batches, after, st.heartbeat), after)


@bp.get("/agentik/conversations/<conversation_id>/live")
async def live(conversation_id: str) -> Response:
    st = state()
    agent = st.require_agent()
    await _require_conversation(agent, conversation_id)
    body = LiveStream(st, agent.online_outbox.subscribe, conversation_id, st.heartbeat)
    return stream_response(st, body, None)
