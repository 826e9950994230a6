"""Server-Sent Events: the durable streams (``/agentik/events``,
``/agentik/conversations/{id}/events``) and the live stream (``/agentik/conversations/{id}/live``).

Everything that can fail is decided before the response starts (auth, cursor syntax, cursor
validity -> 410, unknown conversation -> 404), so errors are proper JSON answers, never a broken
stream. Then:

- A *pump* task pulls from the hub and turns each batch into SSE bytes; the response body
  (:class:`EventStream`, an :class:`agentik.sse.PumpBody`) takes every chunk already queued and
  sends it as ONE write; the pump lives in a nursery owned by the body (see :mod:`agentik.sse`).
  The live stream's body (:class:`LiveStream`) has no pump: it reads its online subscription
  itself (one task hop less per token; issue 13).
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

from collections.abc import Callable
from contextlib import aclosing
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, get_args

import trio
from quart import Blueprint, Response, request
from quart.wrappers.response import ResponseBody

from agentik import metrics
from agentik.agent import StoredEvent
from agentik.errors import InvalidInputError, NotFoundError, OutboxGapError
from agentik.sse import HEARTBEAT, OPENED, PUMP_BUFFER, SSE_TYPE, ChannelBody, Pump, PumpBody, frame
from agentik.web._state import WebState, log, state
from agentik.web.errors import detail_of
from agentik.web.types import EndedReason, ErrorBody, StreamEnded
from agentik.wire import CommonEvent, Cursor, Event, encode

if TYPE_CHECKING:
    from agentik.agent import LocalAgent, OnlineSubscription

bp = Blueprint("agentik_sse", __name__)

__all__ = ["HEARTBEAT", "OPENED", "PUMP_BUFFER", "SSE_TYPE", "EventStream", "LiveStream", "live_frame"]


class EventStream(PumpBody):
    """A durable stream's body: fed by a pump task (:class:`agentik.sse.PumpBody`). A hub
    subscriber whose pump waits on a full buffer overflows and falls back to the stored outbox."""

    def __init__(self, st: WebState, pump: Pump, heartbeat: float) -> None:
        super().__init__(pump, heartbeat)
        self._state = st

    def opened(self) -> None:
        self._state.stream_opened()
        metrics.SSE_CONNECTIONS.inc()

    def closed(self) -> None:
        metrics.SSE_CONNECTIONS.dec()
        self._state.stream_closed()


def durable_frames(epoch: str, batch: list[StoredEvent]) -> bytes:
    """SSE frames of a batch of stored events; ``data`` is the stored JSON, neither decoded nor
    re-encoded (the ``event:`` name is read from it alone: :meth:`StoredEvent.types_of`)."""
    prefix = epoch.encode() + b":"
    return b"".join([
        frame(ev.raw, _tag_name(tag), prefix + str(ev.offset).encode())
        for ev, tag in zip(batch, StoredEvent.types_of(batch), strict=True)
    ])


def gap_frame(exc: OutboxGapError) -> bytes:
    return frame(encode(ErrorBody(error=detail_of(exc))), b"gap")


def ended_frame(reason: EndedReason) -> bytes:
    return frame(encode(StreamEnded(reason=reason)), b"ended")


async def durable_pump(
    agent: LocalAgent,
    after: Cursor,
    conversation_id: str | None,
    send: trio.MemorySendChannel[bytes],
    *,
    kind: str | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    async with send:
        stream = agent.outbox.stored_batches(after, conversation_id=conversation_id, kind=kind)
        async with aclosing(stream):
            # The subscription is in place at the first step of the iteration, before its first
            # checkpoint, so it is registered by the time start() returns.
            task_status.started()
            try:
                async for batch in stream:
                    await send.send(durable_frames(after.epoch, batch))
                # A durable stream ends by itself only after its conversation's Deleted.
                await send.send(ended_frame("deleted"))
            except OutboxGapError as exc:
                await send.send(gap_frame(exc))
            except Exception:
                log.exception("event stream after %s failed", after)


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


class LiveStream(ChannelBody):
    """The live stream's body: it reads its online subscription itself, with no pump task or
    second channel in between (one task hop less per token than :class:`EventStream`). Every
    event already queued goes out in one write, each in its own frame, in order; none is waited
    for. Subscribed in ``__aenter__``, before the ``: connected`` chunk; unsubscribed in
    ``__aexit__``. The subscription ends only when its reader fell too far behind: then a last
    ``event: ended`` frame (reason ``overflow``) and the response ends.
    """

    last = ended_frame("overflow")

    def __init__(
        self,
        st: WebState,
        subscribe: Callable[[str], OnlineSubscription],
        conversation_id: str,
        heartbeat: float,
    ) -> None:
        super().__init__(heartbeat, live_frame)
        self._state = st
        self._subscribe = subscribe
        self._conversation_id = conversation_id
        self._sub: OnlineSubscription | None = None

    async def __aenter__(self) -> LiveStream:
        self._sub = self._subscribe(self._conversation_id)
        self._recv = self._sub.receive
        self._state.stream_opened()
        metrics.SSE_CONNECTIONS.inc()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._sub is not None
        self._sub.close()
        metrics.SSE_CONNECTIONS.dec()
        self._state.stream_closed()


def start_cursor(agent: LocalAgent) -> Cursor:
    """Where a durable stream starts: ``Last-Event-ID`` (a reconnecting EventSource) wins over
    ``?after=``; neither means from the current head. Raises InvalidInputError (bad syntax) or
    OutboxGapError (dead cursor), both before the response starts."""
    raw = request.headers.get("Last-Event-ID") or request.args.get("after")
    return agent.outbox.resumable(Cursor.parse(raw.strip()) if raw else None)


def stream_response(st: WebState, body: Pump | ResponseBody, after: Cursor | None) -> Response:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    if after is not None:
        headers["X-Agentik-Cursor"] = str(after)
    if request.method == "HEAD":
        # The headers only: a stream whose body is never sent would hold the connection.
        return Response(b"", status=200, headers=headers, content_type=SSE_TYPE)
    if not isinstance(body, ResponseBody):
        body = EventStream(st, body, st.heartbeat)
    response = Response(
        body, status=200, headers=headers,
        content_type=SSE_TYPE,
    )
    response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut the stream
    return response


async def _require_conversation(agent: LocalAgent, conversation_id: str) -> None:
    if await agent.get_conversation(conversation_id) is None:
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
    return stream_response(st, partial(durable_pump, agent, after, None, kind=kind), after)


@bp.get("/agentik/conversations/<conversation_id>/events")
async def conversation_events(conversation_id: str) -> Response:
    st = state()
    agent = st.require_agent()
    after = start_cursor(agent)
    resuming = bool(request.headers.get("Last-Event-ID") or request.args.get("after"))
    # A conversation deleted while the client was away is still streamed from its cursor, so the
    # client sees the Deleted event; otherwise an unknown id is a 404. In this order: a deletion
    # that has removed the row has also stored its events (one transaction).
    if await agent.get_conversation(conversation_id) is None and not (
        resuming and await agent.outbox.has_events_after(conversation_id, after)
    ):
        raise NotFoundError(f"conversation {conversation_id!r} not found")
    return stream_response(st, partial(durable_pump, agent, after, conversation_id), after)


@bp.get("/agentik/conversations/<conversation_id>/live")
async def live(conversation_id: str) -> Response:
    st = state()
    agent = st.require_agent()
    await _require_conversation(agent, conversation_id)
    body = LiveStream(st, agent.online_outbox.subscribe, conversation_id, st.heartbeat)
    return stream_response(st, body, None)
