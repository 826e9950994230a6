"""Reading the server's answers: JSON bodies into wire types, and SSE responses into events.

A durable stream (``read_durable``) ends normally only at the server's ``event: ended`` frame
(the stream ended by itself, e.g. after its conversation's Deleted); an ``event: gap`` frame
raises OutboxGapError; any other end (a shutdown, a cut) raises AgentikConnectionError so that
the caller resumes from its last cursor. A live stream (``read_live``) ends at ``ended`` or at
any clean end of the response (live events are never resumed).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

import httpx2
import msgspec

from agentik.client.errors import (
    AgentikConnectionError,
    ServerError,
    error_from_response,
    gap_from_frame,
)
from agentik.client.sse import SseFrame, parse_sse
from agentik.wire import AGENT_EVENT_TYPES, CommonEvent, Cursor, decode_common_event

T = TypeVar("T")

#: called with the stream's start cursor (None for live streams) once the server has subscribed
OnOpen = Callable[[Cursor | None], None]

_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def decode_answer(raw: bytes, into: type[T]) -> T:
    """A JSON answer as ``into``. Raises ServerError for a body that is not one."""
    decoder = _decoders.get(into)
    if decoder is None:
        decoder = _decoders[into] = msgspec.json.Decoder(into)
    try:
        result: T = decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ServerError(f"unexpected answer from the server: {exc}", 200) from None
    return result


def decode_event(data: str) -> CommonEvent:
    try:
        return decode_common_event(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ServerError(f"malformed event from the server: {exc}", 200) from None


async def _frames(
    http: httpx2.AsyncClient, path: str, params: dict[str, str], limits: httpx2.Timeout,
    on_open: Callable[[httpx2.Response], None],
) -> AsyncGenerator[SseFrame, None]:
    """The SSE frames of ``GET path`` (comments other than ``connected`` dropped); ``on_open``
    gets the response when the server says the subscription is in place."""
    async with http.stream(
        "GET", path, params=params, timeout=limits, headers={"Accept": "text/event-stream"}
    ) as response:
        if response.status_code != 200:
            raise error_from_response(response.status_code, await response.aread(), response.headers)
        async for frame in parse_sse(response.aiter_bytes()):
            if frame.comment is not None:
                if frame.comment == "connected":
                    on_open(response)
                continue
            yield frame


async def read_durable(
    http: httpx2.AsyncClient,
    path: str,
    after: Cursor | None,
    limits: httpx2.Timeout,
    on_open: OnOpen | None,
    check: Callable[[], None],
    kind: str | None = None,
) -> AsyncGenerator[CommonEvent, None]:
    """``check()`` runs at the first step (e.g. raising for a closed client). ``kind``: the
    server-side filter (``?kind=``)."""
    check()

    def opened(response: httpx2.Response) -> None:
        if on_open is not None:
            header = response.headers.get("X-Agentik-Cursor")
            on_open(Cursor.parse(header) if header else after)

    params = {} if after is None else {"after": str(after)}
    if kind is not None:
        params["kind"] = kind
    frames = _frames(http, path, params, limits, opened)
    try:
        async for frame in frames:
            if frame.event == "gap":
                raise gap_from_frame(frame.data)
            if frame.event == "ended":
                return  # the stream ended by itself (after its conversation's Deleted)
            yield decode_event(frame.data)
    except httpx2.TransportError as exc:
        raise AgentikConnectionError(f"event stream {path} broke: {exc or type(exc).__name__}") from exc
    finally:
        await frames.aclose()
    # A clean end the protocol does not announce: the server is shutting down.
    raise AgentikConnectionError(f"the server ended the event stream {path}")


async def read_live(
    http: httpx2.AsyncClient,
    path: str,
    limits: httpx2.Timeout,
    on_open: OnOpen | None,
    check: Callable[[], None],
) -> AsyncGenerator[CommonEvent, None]:
    """``check()`` runs at the first step (e.g. raising for a closed client)."""
    check()

    def opened(response: httpx2.Response) -> None:
        if on_open is not None:
            on_open(None)

    frames = _frames(http, path, {}, limits, opened)
    try:
        async for frame in frames:
            if frame.event == "ended":
                return  # the reader fell too far behind
            yield decode_event(frame.data)
    except httpx2.TransportError as exc:
        raise AgentikConnectionError(f"live stream {path} broke: {exc or type(exc).__name__}") from exc
    finally:
        await frames.aclose()


async def agent_only(events: AsyncGenerator[CommonEvent, None]) -> AsyncGenerator[CommonEvent, None]:
    """The conversation-list events of ``events`` (the server has no agent-only SSE route)."""
    try:
        async for event in events:
            if isinstance(event.event, AGENT_EVENT_TYPES):
                yield event
    finally:
        await events.aclose()
