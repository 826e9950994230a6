"""WebSocket ``/agentik/ws``: one socket for commands and any number of subscriptions.

Frames are JSON text messages, the msgspec tagged structs of ``agentik.web.types`` (documented in
docs/PROTOCOL.md). One nursery per socket holds:

- the reader (this handler's own task): reads a frame, runs a command to completion and queues
  its reply, so commands are answered in the order they were sent;
- the writer: the only task that writes to the socket, fed by a bounded channel. A client that
  does not read makes the writer wait, then the subscriptions wait, and a durable subscription's
  hub buffer overflows, which makes it fall back to the stored outbox — the runtime never waits;
- the pinger: a ``ping`` frame every ``heartbeat`` seconds;
- one task per subscription, each in its own cancel scope (unsubscribe cancels it).
A message over ``config.max_body_bytes`` closes the socket with 1009. A disconnect cancels the
handler; cancellation arrives wrapped in exception groups here, so cleanup is in ``finally``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, assert_never

import msgspec
import trio
from quart import Blueprint, Response, websocket

from agentik import metrics, tracing
from agentik.agent import LocalAgent
from agentik.api import decode_client_json
from agentik.errors import AgentikError, InvalidInputError, NotFoundError, RuntimeClosedError, http_status
from agentik.protocol_branches import BRANCH_COMMANDS
from agentik.users import SHARED_ADMIN, Principal
from agentik.web import branches, pauses
from agentik.web._state import WebState, error_response, log, log_request, state
from agentik.web.errors import detail_of
from agentik.web.types import (
    ClientFrame,
    CreateConversation,
    DeleteConversation,
    Ended,
    EndedReason,
    ErrorDetail,
    ErrorFrame,
    GetConversation,
    GetSnapshot,
    InterruptResult,
    InterruptTurn,
    ListConversations,
    MessageAccepted,
    Ping,
    Pong,
    RenameConversation,
    Reply,
    SendMessage,
    Subscribe,
    SubscribeResult,
    Unsubscribe,
)
from agentik.wire import Cursor, encode

bp = Blueprint("agentik_ws", __name__)

#: frames queued for the writer before producers wait
OUT_BUFFER = 16
#: events frames are split above this size (a single bigger event gets a frame of its own)
FRAME_BYTES = 512 * 1024
#: subscriptions one socket may hold
MAX_SUBSCRIPTIONS = 64
#: WebSocket close code for a message that is too big (RFC 6455)
CLOSE_TOO_BIG = 1009

_decode_frame = msgspec.json.Decoder(ClientFrame).decode
PING = encode(Ping())


def _request_id(raw: str | bytes) -> str | None:
    """Best effort: the ``id`` of a frame that failed validation, to address the error to it."""
    try:
        data = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    if isinstance(data, dict) and isinstance(data.get("id"), str):
        return data["id"]
    return None


def decode_frame(raw: str | bytes) -> ClientFrame:
    """Raises InvalidInputError with msgspec's message (or TOO_DEEP)."""
    return decode_client_json(_decode_frame, raw)


def _events_frame(subscription: bytes, raws: list[bytes]) -> bytes:
    # Spliced from the stored CommonEvent JSON: replayed events are never re-encoded.
    return (
        b'{"type":"events","subscription":' + subscription + b',"events":['
        + b",".join(raws) + b"]}"
    )


def events_frames(subscription: bytes, raws: list[bytes], limit: int = FRAME_BYTES) -> list[bytes]:
    """One frame for everything queued, split so that a frame stays under ``limit`` bytes
    unless a single event is bigger (clients cap message sizes; trio-websocket at 1 MiB)."""
    frames: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    for raw in raws:
        if chunk and size + len(raw) > limit:
            frames.append(_events_frame(subscription, chunk))
            chunk, size = [], 0
        chunk.append(raw)
        size += len(raw) + 1
    if chunk:
        frames.append(_events_frame(subscription, chunk))
    return frames


class Session:
    def __init__(self, st: WebState, agent: LocalAgent, who: Principal = SHARED_ADMIN) -> None:
        self.st = st
        self.agent = agent
        #: the socket's principal; ``user`` is whose conversations it reaches (None: all)
        self.who = who
        self.user = None if who.is_admin else who.user
        self.max_bytes = st.cfg.max_body_bytes
        self.out_send, self.out_recv = trio.open_memory_channel[bytes](OUT_BUFFER)
        #: subscription id -> (its cancel scope, set once its task has finished)
        self.subs: dict[str, tuple[trio.CancelScope, trio.Event]] = {}
        self.nursery: trio.Nursery | None = None

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self.writer)
            nursery.start_soon(self.pinger)
            await self.reader()
            nursery.cancel_scope.cancel()

    async def send(self, frame: Any) -> None:
        await self.out_send.send(encode(frame))

    # --- tasks -----------------------------------------------------------------------------------

    async def writer(self) -> None:
        try:
            async for frame in self.out_recv:
                await websocket.send(frame.decode())  # text frames: JSON for browsers
        except Exception as exc:  # the peer went away mid-write
            log.debug("websocket write failed: %r", exc)
            assert self.nursery is not None
            self.nursery.cancel_scope.cancel()

    async def pinger(self) -> None:
        while True:
            await trio.sleep(self.st.heartbeat)
            await self.out_send.send(PING)

    async def reader(self) -> None:
        while True:
            raw = await websocket.receive()
            if raw is None:
                # Quart gives None for an empty frame (``bytes or text``): treat it as empty
                # bytes, which decode_frame answers with an error frame.
                raw = b""
            size = len(raw) if isinstance(raw, bytes) else len(raw.encode())
            if size > self.max_bytes:
                await websocket.close(
                    CLOSE_TOO_BIG, f"message of {size} bytes is over {self.max_bytes}"
                )
                return
            try:
                frame = decode_frame(raw)
            except InvalidInputError as exc:
                await self.send(ErrorFrame(id=_request_id(raw), error=detail_of(exc)))
                continue
            await self.handle(frame)

    # --- frames ----------------------------------------------------------------------------------

    async def handle(self, frame: ClientFrame) -> None:
        if isinstance(frame, Ping):
            await self.send(Pong(id=frame.id))
            return
        if isinstance(frame, Pong):
            return
        try:
            if isinstance(frame, Subscribe):
                await self.subscribe(frame)
                return
            parent = tracing.child_of(getattr(frame, "traceparent", None))  # linked to the socket
            with tracing.span(f"ws {type(frame).__name__}", kind="server", parent=parent,
                              links=(tracing.carry(),)):
                result = await self.command(frame)
        except AgentikError as exc:
            await self.send(ErrorFrame(id=frame.id, error=detail_of(exc)))
            return
        except Exception:
            log.exception("websocket command %s failed", type(frame).__name__)
            await self.send(
                ErrorFrame(id=frame.id, error=ErrorDetail(code="internal", message="internal error"))
            )
            return
        await self.send(Reply(id=frame.id, result=result))

    async def command(self, frame: Any) -> Any:
        """Run one command; returns the reply's ``result``. Raises AgentikError."""
        agent, user, who = self.agent, self.user, self.who
        if isinstance(frame, CreateConversation):
            await agent.users.before_create(who.user, who.limits)
            return (await agent.create_conversation(
                temp=frame.temp, title=frame.title, idempotency_key=frame.idempotency_key,
                agent=frame.agent, instructions=frame.instructions, owner=who.user)).record
        if isinstance(frame, GetConversation):
            conv = await agent.get_conversation(frame.conversation_id, user=user)
            if conv is None:
                raise NotFoundError(f"conversation {frame.conversation_id!r} not found")
            return conv.record
        if isinstance(frame, ListConversations):
            return await agent.conversations_snapshot(
                offset=frame.offset, limit=frame.limit, user=user)
        if isinstance(frame, SendMessage):
            await agent.users.before_send(who.user, who.limits)
            message_id = await agent.send(
                frame.conversation_id, frame.content, frame.context, on_busy=frame.on_busy,
                idempotency_key=frame.idempotency_key, user=user)
            return MessageAccepted(message_id=message_id)
        if isinstance(frame, InterruptTurn):
            cid = frame.conversation_id
            return InterruptResult(interrupted=await (
                agent.interrupt(cid, user=user) if frame.turn_id is None
                else agent.cancel_turn(cid, frame.turn_id, user=user)))
        if (answered := await pauses.ws_answer(agent, frame, user)) is not None:
            return answered  # approve, answer
        if isinstance(frame, RenameConversation):
            return await agent.rename_conversation(frame.conversation_id, frame.title, user=user)
        if isinstance(frame, DeleteConversation):
            if not await agent.delete_conversation(frame.conversation_id, user=user):
                raise NotFoundError(f"conversation {frame.conversation_id!r} not found")
            return None
        if isinstance(frame, GetSnapshot):
            return await agent.chat_snapshot(frame.conversation_id, user=user)
        if isinstance(frame, BRANCH_COMMANDS):
            return await branches.command(agent, frame, who, user)
        if isinstance(frame, Unsubscribe):
            entry = self.subs.pop(frame.subscription, None)
            if entry is None:
                raise NotFoundError(f"no subscription {frame.subscription!r}")
            scope, finished = entry
            scope.cancel()
            # Answer once it is gone: after the reply no frame of it follows, and the hub has
            # forgotten its subscriber.
            await finished.wait()
            return None
        assert_never(frame)

    # --- subscriptions ---------------------------------------------------------------------------

    async def subscribe(self, frame: Subscribe) -> None:
        """Validate, then start the subscription; its reply is queued before any of its events.
        Raises InvalidInputError, NotFoundError, OutboxGapError (answered as error frames)."""
        if frame.id in self.subs:
            raise InvalidInputError(f"subscription id {frame.id!r} is already in use")
        if len(self.subs) >= MAX_SUBSCRIPTIONS:
            raise InvalidInputError(f"at most {MAX_SUBSCRIPTIONS} subscriptions per socket")
        conversation_id = frame.conversation_id
        if frame.stream in ("conversation", "live"):
            if not conversation_id:
                raise InvalidInputError(f"a {frame.stream} subscription needs conversation_id")
            if await self.agent.get_conversation(conversation_id, user=self.user) is None:
                raise NotFoundError(f"conversation {conversation_id!r} not found")
        after: Cursor | None = None
        source: AsyncIterator[Any]
        to_raws: Callable[[Any], list[bytes]]
        if frame.stream == "live":
            if frame.after:
                raise InvalidInputError("live streams have no cursor: drop `after`")
            assert conversation_id is not None
            source = self.agent.online_outbox.online_events(conversation_id)
            to_raws = _live_raws
            # A live stream ends by itself only when its reader fell too far behind.
            reason: EndedReason = "overflow"
        else:
            outbox = self.agent.outbox
            after = outbox.resumable(Cursor.parse(frame.after) if frame.after else None)
            kind = "agent" if frame.stream == "agent" else None
            if frame.kind is not None:
                if frame.stream != "events":
                    raise InvalidInputError("`kind` filters an events subscription only")
                kind = frame.kind
            cid = conversation_id if frame.stream == "conversation" else None
            source = outbox.stored_batches(after, conversation_id=cid, kind=kind, user=self.user)
            to_raws = _durable_raws
            # A durable stream ends by itself only after its conversation's Deleted.
            reason = "deleted"
        scope = trio.CancelScope()
        finished = trio.Event()
        self.subs[frame.id] = (scope, finished)
        replied = trio.Event()
        assert self.nursery is not None
        await self.nursery.start(
            self.pump, frame.id, scope, finished, source, to_raws, reason, replied
        )
        await self.send(
            Reply(
                id=frame.id,
                result=SubscribeResult(
                    subscription=frame.id, after=None if after is None else str(after)
                ),
            )
        )
        replied.set()

    async def pump(
        self,
        sub_id: str,
        scope: trio.CancelScope,
        finished: trio.Event,
        source: AsyncIterator[Any],
        to_raws: Callable[[Any], list[bytes]],
        reason: EndedReason,
        replied: trio.Event,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """One subscription. ``started`` once the hub subscriber is registered: the hub does
        that in the first step of the iteration, before its first checkpoint."""
        key = encode(sub_id)
        try:
            with scope:
                async with aclosing(source):  # type: ignore[type-var]
                    task_status.started()
                    try:
                        async for item in source:
                            await replied.wait()
                            for data in events_frames(key, to_raws(item)):
                                await self.out_send.send(data)
                        await replied.wait()
                        await self.send(Ended(subscription=sub_id, reason=reason))
                    except AgentikError as exc:  # OutboxGapError, RuntimeClosedError
                        await replied.wait()
                        await self.send(ErrorFrame(subscription=sub_id, error=detail_of(exc)))
                    except Exception:
                        log.exception("websocket subscription %r failed", sub_id)
                        await replied.wait()
                        await self.send(
                            ErrorFrame(
                                subscription=sub_id,
                                error=ErrorDetail(code="internal", message="subscription failed"),
                            )
                        )
        finally:
            entry = self.subs.get(sub_id)
            if entry is not None and entry[0] is scope:
                del self.subs[sub_id]
            finished.set()


def _durable_raws(batch: Any) -> list[bytes]:
    return [ev.raw for ev in batch]


def _live_raws(event: Any) -> list[bytes]:
    return [encode(event)]


@bp.websocket("/agentik/ws")
async def ws() -> Response | None:
    started = time.perf_counter()
    st = state()
    status = 101
    try:
        try:
            agent = st.require_agent()
            if st.authenticator is None:
                raise RuntimeClosedError("the runtime is not running")
            who = await st.authenticator.caller(
                websocket.headers.get("Authorization"), websocket.args.get("access_token"),
                allow_query=True,
            )
        except AgentikError as exc:
            # Not accepted yet: the client gets a plain HTTP error answer.
            status = http_status(exc)
            return error_response(exc)
        await websocket.accept()
        st.stream_opened()
        metrics.WS_CONNECTIONS.inc()
        try:
            await Session(st, agent, who).run()
        finally:
            metrics.WS_CONNECTIONS.dec()
            st.stream_closed()
        return None
    finally:
        log_request(
            "WS", websocket.path, websocket.query_string, status,
            websocket.headers.get("X-Client-Id"), started, st.secrets,
        )
