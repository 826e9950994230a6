"""``AgentikAgent``: the :class:`agentik.agent.LocalAgent` interface over HTTP + SSE.

Every method is one request (docs/PROTOCOL.md §3); every event stream is one SSE response read
and parsed here. Runs on anyio through httpx2, so it works under trio and asyncio alike.

Who raises what (see :mod:`agentik.client.errors` for the status mapping): every call may raise
AuthError (401), AgentikConnectionError (server unreachable, connection cut), RuntimeClosedError
(503 while the server starts or stops, or this client is closed). Besides: NotFoundError for an
unknown conversation (except ``get_conversation`` -> None, ``delete_conversation`` -> False),
InvalidInputError for bad arguments, MailboxFullError (``retry_after``) from ``send``,
OutboxGapError (``oldest``, ``current``) from the durable ``events`` iterators at their first step
or in the middle (the server's ``event: gap`` frame).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx2
import msgspec

from agentik.client.errors import AgentikConnectionError, ServerError, error_from_response, gap_from_frame
from agentik.client.sse import parse_sse
from agentik.errors import InvalidInputError, NotFoundError, RuntimeClosedError
from agentik.protocol import (
    AgentInfo,
    ConversationView,
    CountResult,
    CreateConversationBody,
    CursorPair,
    InterruptResult,
    MessageAccepted,
    RenameConversationBody,
    SendMessageBody,
    ToolsStatus,
)
from agentik.wire import (
    AGENT_EVENT_TYPES,
    ChatSnapshot,
    CommonEvent,
    Content,
    ConversationRecord,
    ConversationsSnapshot,
    Cursor,
    Deleted,
    Image,
    MessageContext,
    MessageRecord,
    Text,
    decode_common_event,
    encode,
)

T = TypeVar("T")

#: called with the stream's start cursor (None for live streams) once the server has subscribed
OnOpen = Callable[[Cursor | None], None]

_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def _decode(raw: bytes, into: type[T]) -> T:
    decoder = _decoders.get(into)
    if decoder is None:
        decoder = _decoders[into] = msgspec.json.Decoder(into)
    try:
        result: T = decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ServerError(f"unexpected answer from the server: {exc}", 200) from None
    return result


def _content(content: Sequence[Content] | Content | str) -> list[Content]:
    """The same normalisation as the in-process agent: a str is one Text."""
    if isinstance(content, str):
        return [Text(body=content)]
    if isinstance(content, Text | Image):
        return [content]
    items = list(content)
    if not items:
        raise InvalidInputError("content must not be empty")
    return items


def _api_root(base_url: str) -> str:
    """Accept both ``http://host:8080`` and ``http://host:8080/agentik`` (the seeds' form)."""
    root = base_url.rstrip("/")
    return root.removesuffix("/agentik")


def _cid(conversation_id: str) -> str:
    return quote(conversation_id, safe="")


class HttpJournal:
    """Journal reads by seq (``GET /agentik/journal``)."""

    def __init__(self, agent: AgentikAgent) -> None:
        self._agent = agent

    async def list(
        self,
        conversation_id: str | None = None,
        after_seq: int = 0,
        up_to_seq: int | None = None,
        limit: int = 100,
    ) -> list[MessageRecord]:
        params: dict[str, Any] = {"after_seq": after_seq, "limit": limit}
        if conversation_id is not None:
            params["conversation_id"] = conversation_id
        if up_to_seq is not None:
            params["up_to_seq"] = up_to_seq
        raw = await self._agent._request("GET", "/agentik/journal", params=params)
        return _decode(raw, list[MessageRecord])

    async def count(self, conversation_id: str | None = None, after_seq: int = 0) -> int:
        params: dict[str, Any] = {"after_seq": after_seq}
        if conversation_id is not None:
            params["conversation_id"] = conversation_id
        raw = await self._agent._request("GET", "/agentik/journal/count", params=params)
        return _decode(raw, CountResult).count


class HttpOutbox:
    """Durable events by cursor over SSE. Each ``events`` call opens one stream when first
    iterated; close it with ``aclose()`` (or ``contextlib.aclosing``) when you stop early.

    The iterators raise OutboxGapError for a dead cursor (410 before the stream, or an
    ``event: gap`` frame during it) and AgentikConnectionError when the connection breaks or the
    server ends the stream (e.g. at shutdown): resume with the cursor of the last event you
    applied, or let :class:`~agentik.client.ReconnectingOutbox` do it. A conversation's stream
    ends normally after that conversation's ``Deleted`` event.
    """

    def __init__(self, agent: AgentikAgent) -> None:
        self._agent = agent

    async def cursors(self) -> CursorPair:
        raw = await self._agent._request("GET", "/agentik/cursor")
        return _decode(raw, CursorPair)

    async def current_cursor(self) -> Cursor:
        return Cursor.parse((await self.cursors()).current)

    async def oldest_cursor(self) -> Cursor:
        return Cursor.parse((await self.cursors()).oldest)

    def events(
        self, after: Cursor | None = None, *, on_open: OnOpen | None = None
    ) -> AsyncGenerator[CommonEvent, None]:
        """Every durable event (agent and conversation) after ``after`` (None: from now)."""
        return self._agent._durable("/agentik/events", after, None, on_open)

    def agent_events(
        self, after: Cursor | None = None, *, on_open: OnOpen | None = None
    ) -> AsyncGenerator[CommonEvent, None]:
        """Conversation-list events only: Created, Deleted, Renamed, Touched.

        The server has no agent-only SSE route, so this filters the full stream client-side."""
        return self._agent._agent_only(self.events(after, on_open=on_open))

    def conversation_events(
        self, after: Cursor | None, conversation_id: str, *, on_open: OnOpen | None = None
    ) -> AsyncGenerator[CommonEvent, None]:
        """One conversation's durable events, including its own Renamed/Touched/Deleted."""
        path = f"/agentik/conversations/{_cid(conversation_id)}/events"
        return self._agent._durable(path, after, conversation_id, on_open)


class HttpOnlineOutbox:
    def __init__(self, agent: AgentikAgent) -> None:
        self._agent = agent

    def online_events(
        self, conversation_id: str, *, on_open: OnOpen | None = None
    ) -> AsyncGenerator[CommonEvent, None]:
        """Live-only events (Working, StartResponse, AppendText, End, ...); no cursor, no replay.
        Ends when the server ends the stream (a reader too far behind); AgentikConnectionError
        when the connection breaks. What was streamed while disconnected is lost: the durable
        AssistantMessage always carries the whole answer."""
        path = f"/agentik/conversations/{_cid(conversation_id)}/live"
        return self._agent._live(path, on_open)


class HttpConversation(ConversationView):
    """A handle on one conversation (like :class:`agentik.agent.LocalConversation`)."""

    def __init__(self, agent: AgentikAgent, record: ConversationRecord) -> None:
        self._agent = agent
        self.record = record
        self._closed = False

    @property
    def supports_image_input(self) -> bool | None:
        """From the agent info, once fetched (``await agent.info()``); None before."""
        return self._agent.supports_image_input

    async def send(
        self, content: Sequence[Content] | Content | str, context: MessageContext | None = None
    ) -> str:
        """Queue a user message; returns its id once the server stored it (202). The answer
        arrives as events. Raises MailboxFullError, NotFoundError, ConversationFailedError."""
        return await self._agent.send(self.id, content, context)

    async def interrupt(self) -> bool:
        """Cancel the running turn (Interrupted event). Returns whether a turn was running."""
        return await self._agent.interrupt(self.id)

    async def get_messages(
        self, after_seq: int = 0, offset: int = 0, limit: int = 100
    ) -> list[MessageRecord]:
        params = {"after_seq": after_seq, "offset": offset, "limit": limit}
        raw = await self._agent._request(
            "GET", f"/agentik/conversations/{_cid(self.id)}/messages", params=params
        )
        return _decode(raw, list[MessageRecord])

    async def rename(self, title: str | None) -> ConversationRecord:
        self.record = await self._agent.rename_conversation(self.id, title)
        return self.record

    async def close(self) -> None:
        """Release this handle (idempotent). The conversation itself stays; see delete."""
        self._closed = True


class AgentikAgent:
    """The Agent interface over HTTP: ``async with AgentikAgent(id, base_url, token) as agent``.

    ``id`` is this client's identity, sent as ``X-Client-Id`` on every request (generate it once
    per installation and keep it); it is ``client_id`` here, while ``agent.id`` is the server's
    agent id (its database epoch) once known. ``base_url`` is the server root
    (``http://host:8080``; a trailing ``/agentik`` is accepted). ``token`` is sent as
    ``Authorization: Bearer``. Entering does no I/O; ``await agent.info()`` checks the server.

    ``timeout`` bounds each plain request; ``stream_read_timeout`` bounds silence on an event
    stream (the server sends a heartbeat every 15 s, so a longer silence means a dead link and
    ends the stream with AgentikConnectionError). ``transport`` is for tests.
    """

    def __init__(
        self,
        id: str,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        stream_read_timeout: float | None = 45.0,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.client_id = id
        self.base_url = _api_root(base_url)
        headers = {"X-Client-Id": id, "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._timeout = httpx2.Timeout(timeout)
        self._stream_timeout = httpx2.Timeout(timeout, read=stream_read_timeout)
        self._http = httpx2.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=self._timeout, transport=transport,
            # Streams are long-lived; don't let a pool limit make the N+1st wait forever.
            limits=httpx2.Limits(max_connections=None, max_keepalive_connections=20),
        )
        self._closed = False
        self._info: AgentInfo | None = None
        self._epoch: str | None = None
        self.journal = HttpJournal(self)
        self.outbox = HttpOutbox(self)
        self.online_outbox = HttpOnlineOutbox(self)

    # --- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> AgentikAgent:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP client (idempotent). Open streams end with their connections."""
        if not self._closed:
            self._closed = True
            await self._http.aclose()

    # --- agent info ------------------------------------------------------------------------------

    @property
    def id(self) -> str | None:
        """The server's agent id (its database epoch), once a call has shown it."""
        return self._epoch

    @property
    def supports_image_input(self) -> bool | None:
        return None if self._info is None else self._info.capabilities.image_input

    async def info(self) -> AgentInfo:
        """``GET /agentik``: id, name, version, capabilities, cursors. Also a quick check that
        the server is there and takes our token (AgentikConnectionError / AuthError)."""
        self._info = _decode(await self._request("GET", "/agentik"), AgentInfo)
        self._epoch = self._info.id
        return self._info

    async def tools(self) -> list[Any]:
        """``GET /agentik/tools``: the MCP servers with their state and tools."""
        return _decode(await self._request("GET", "/agentik/tools"), ToolsStatus).servers

    # --- conversations ---------------------------------------------------------------------------

    async def create_conversation(self, temp: bool = False, title: str | None = None) -> HttpConversation:
        body = encode(CreateConversationBody(temp=temp, title=title))
        raw = await self._request("POST", "/agentik/conversations", content=body)
        return HttpConversation(self, _decode(raw, ConversationRecord))

    async def get_conversation(self, conversation_id: str) -> HttpConversation | None:
        """None if there is no such conversation."""
        try:
            raw = await self._request("GET", f"/agentik/conversations/{_cid(conversation_id)}")
        except NotFoundError:
            return None
        return HttpConversation(self, _decode(raw, ConversationRecord))

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Delete it and everything of it. Returns False if it did not exist."""
        try:
            await self._request("DELETE", f"/agentik/conversations/{_cid(conversation_id)}")
        except NotFoundError:
            return False
        return True

    async def rename_conversation(self, conversation_id: str, title: str | None) -> ConversationRecord:
        """Raises NotFoundError."""
        body = encode(RenameConversationBody(title=title))
        raw = await self._request(
            "PATCH", f"/agentik/conversations/{_cid(conversation_id)}", content=body
        )
        return _decode(raw, ConversationRecord)

    async def interrupt(self, conversation_id: str) -> bool:
        raw = await self._request("POST", f"/agentik/conversations/{_cid(conversation_id)}/interrupt")
        return _decode(raw, InterruptResult).interrupted

    async def send(
        self,
        conversation_id: str,
        content: Sequence[Content] | Content | str,
        context: MessageContext | None = None,
    ) -> str:
        body = encode(SendMessageBody(content=_content(content), context=context))
        raw = await self._request(
            "POST", f"/agentik/conversations/{_cid(conversation_id)}/messages", content=body
        )
        return _decode(raw, MessageAccepted).message_id

    async def conversations_snapshot(self, offset: int = 0, limit: int = 100) -> ConversationsSnapshot:
        """The conversation list at a cursor: every change <= cursor is in it."""
        raw = await self._request(
            "GET", "/agentik/conversations", params={"offset": offset, "limit": limit}
        )
        snapshot = _decode(raw, ConversationsSnapshot)
        self._epoch = snapshot.cursor.epoch
        return snapshot

    async def chat_snapshot(self, conversation_id: str) -> ChatSnapshot:
        """One conversation and all its messages at a cursor. Raises NotFoundError."""
        raw = await self._request("GET", f"/agentik/conversations/{_cid(conversation_id)}/snapshot")
        snapshot = _decode(raw, ChatSnapshot)
        self._epoch = snapshot.cursor.epoch
        return snapshot

    # --- transport -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeClosedError("this AgentikAgent is closed")

    def _unreachable(self, exc: BaseException) -> AgentikConnectionError:
        why = str(exc) or type(exc).__name__
        return AgentikConnectionError(f"cannot reach the agentik server at {self.base_url}: {why}")

    async def _request(
        self, method: str, path: str, *, params: dict[str, Any] | None = None,
        content: bytes | None = None,
    ) -> bytes:
        self._check_open()
        try:
            response = await self._http.request(method, path, params=params, content=content)
        except httpx2.TransportError as exc:
            raise self._unreachable(exc) from exc
        if response.status_code >= 400:
            raise error_from_response(response.status_code, response.content, response.headers)
        return response.content

    async def _durable(
        self, path: str, after: Cursor | None, conversation_id: str | None, on_open: OnOpen | None
    ) -> AsyncGenerator[CommonEvent, None]:
        self._check_open()
        params = {} if after is None else {"after": str(after)}
        try:
            async with self._http.stream(
                "GET", path, params=params, timeout=self._stream_timeout,
                headers={"Accept": "text/event-stream"},
            ) as response:
                if response.status_code != 200:
                    raise error_from_response(
                        response.status_code, await response.aread(), response.headers
                    )
                header = response.headers.get("X-Agentik-Cursor")
                start = Cursor.parse(header) if header else after
                async for frame in parse_sse(response.aiter_bytes()):
                    if frame.comment is not None:
                        if frame.comment == "connected" and on_open is not None:
                            on_open(start)
                        continue
                    if frame.event == "gap":
                        raise gap_from_frame(frame.data)
                    try:
                        event = decode_common_event(frame.data)
                    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                        raise ServerError(f"malformed event from the server: {exc}", 200) from None
                    yield event
                    if (
                        conversation_id is not None
                        and isinstance(event.event, Deleted)
                        and event.event.conversation_id == conversation_id
                    ):
                        return  # the server ends a conversation's stream after its deletion
        except httpx2.TransportError as exc:
            raise AgentikConnectionError(f"event stream {path} broke: {exc or type(exc).__name__}") from exc
        # A clean end the protocol does not announce: the server is shutting down.
        raise AgentikConnectionError(f"the server ended the event stream {path}")

    async def _agent_only(
        self, events: AsyncGenerator[CommonEvent, None]
    ) -> AsyncGenerator[CommonEvent, None]:
        try:
            async for event in events:
                if isinstance(event.event, AGENT_EVENT_TYPES):
                    yield event
        finally:
            await events.aclose()

    async def _live(self, path: str, on_open: OnOpen | None) -> AsyncGenerator[CommonEvent, None]:
        self._check_open()
        try:
            async with self._http.stream(
                "GET", path, timeout=self._stream_timeout, headers={"Accept": "text/event-stream"}
            ) as response:
                if response.status_code != 200:
                    raise error_from_response(
                        response.status_code, await response.aread(), response.headers
                    )
                async for frame in parse_sse(response.aiter_bytes()):
                    if frame.comment is not None:
                        if frame.comment == "connected" and on_open is not None:
                            on_open(None)
                        continue
                    try:
                        event = decode_common_event(frame.data)
                    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                        raise ServerError(f"malformed event from the server: {exc}", 200) from None
                    yield event
        except httpx2.TransportError as exc:
            raise AgentikConnectionError(f"live stream {path} broke: {exc or type(exc).__name__}") from exc

