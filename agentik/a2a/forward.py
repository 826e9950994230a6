"""A2A on a PostgreSQL cluster (docs/A2A.md, docs/SCALEOUT.md): a request about a conversation
another live node owns is answered by that node, as if the caller had asked it.

The service finds out before it counts or stores anything (``Executor.claim`` raises
NotOwnerError for a message of an existing context or task and for a cancel); the route then
sends the JSON-RPC request as it came to the same endpoint of the owner, at the address the
owner advertises, as the caller (their own bearer token: ``agentik.cluster.CallerAuth``), and
answers what the owner answers: a JSON answer as it is, a stream relayed frame by frame, until
the owner's stream ends or the client goes away (which closes the owner's stream too).
The owner alone writes a conversation's records, its tasks among them: their offsets are
allocated under its lease, and its executions (the runs a cancel ends, the online text that
becomes artifact chunks) live in its process.

An owner that does not answer (it died, or is cut off), stops heartbeating while it is asked
(frozen: its connection stays open, its answer never comes; ``Peers.while_live``), or advertises
no address gets the JSON-RPC form of the native routes' 503 ``not_owner``
(:func:`agentik.a2a.errors.not_owner`); a live node takes the conversation over within the lease
TTL. A request is forwarded once at most (``Agentik-Forwarded``): two nodes that disagree for a
moment on who owns a conversation answer ``not_owner`` rather than pass it back and forth.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from functools import partial
from typing import Any

import trio
from quart import Response, request

from agentik.a2a import errors as e
from agentik.a2a.types import encode
from agentik.cluster import Peers, Relayed
from agentik.errors import NotOwnerError
from agentik.sse import SSE_TYPE, PumpBody, frame

#: the header of a request one node forwarded to another (never forwarded again)
FORWARDED = "Agentik-Forwarded"
JSON = "application/json"


def _error(request_id: Any, exc: NotOwnerError) -> bytes:
    return encode(e.error_response(request_id, e.not_owner(exc)))


async def forward(peers: Callable[[], Peers] | None, exc: NotOwnerError, request_id: Any,
                  body: bytes, heartbeat: float) -> Response:
    """The owner's answer to this request (``body``: as it came), or ``not_owner``."""
    if peers is None or request.headers.get(FORWARDED):
        return Response(_error(request_id, exc), status=200, content_type=JSON)
    headers = {
        "Content-Type": JSON, "A2A-Version": request.headers.get("A2A-Version", ""),
        "Accept": request.headers.get("Accept", "*/*"), "Accept-Encoding": "identity",
        FORWARDED: "1",
    }
    nodes = peers()
    try:
        # (its answer's head may come only with the whole answer: a SendMessage's turn)
        answer = await nodes.while_live(exc, partial(nodes.relay, exc, request.path, body, headers))
        if not answer.content_type.startswith("text/event-stream"):
            try:
                data = await nodes.while_live(exc, answer.read)
            finally:
                await answer.aclose()
            return Response(data, status=answer.status, content_type=answer.content_type or JSON)
    except NotOwnerError as err:  # no address, or the owner does not answer
        return Response(_error(request_id, err), status=200, content_type=JSON)
    response = Response(_RelayBody(nodes, exc, answer, request_id, heartbeat),
                        status=answer.status, content_type=SSE_TYPE,
                        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut the stream
    return response


class _RelayBody(PumpBody):
    """The owner's stream, whole frames as they come (a pump in the body's own nursery, as
    ``web._SseBody``); an owner gone before its end ends it with ``not_owner`` (the task goes
    on with the node that takes the conversation over), never with half a frame. A client
    that goes away cancels the pump, which closes the owner's stream."""

    def __init__(self, peers: Peers, exc: NotOwnerError, answer: Relayed, request_id: Any,
                 heartbeat: float) -> None:
        super().__init__(self._pump_frames, heartbeat, opened=b"")
        self._peers, self._exc, self._answer, self._id = peers, exc, answer, request_id

    async def _pump_frames(
        self, send: trio.MemorySendChannel[bytes],
        *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        task_status.started()
        async with send:
            try:
                await self._peers.while_live(self._exc, lambda: self._copy(send))
            except NotOwnerError as err:
                await send.send(frame(_error(self._id, err)))
            finally:
                await self._answer.aclose()

    async def _copy(self, send: trio.MemorySendChannel[bytes]) -> None:
        pending = b""
        async with aclosing(self._answer.chunks()) as chunks:
            async for chunk in chunks:
                pending += chunk
                end = pending.rfind(b"\n\n") + 2
                if end >= 2:
                    out, pending = pending[:end], pending[end:]
                    await send.send(out)
