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

import urllib.parse
import uuid
from collections.abc import AsyncGenerator, Sequence
from types import TracebackType
from typing import Any, cast

import anyio
import httpx2

from agentik import tracing
from agentik.api import as_content
from agentik.client.errors import AgentikConnectionError, error_from_response
from agentik.client.handles import (
    HttpConversation,
    HttpJournal,
    HttpOnlineOutbox,
    HttpOutbox,
    conversation_path,
    message_path,
)
from agentik.client.streams import OnOpen, decode_answer, read_durable, read_live
from agentik.client.webhooks import HttpWebhooks
from agentik.errors import NotFoundError, RuntimeClosedError, StorageError
from agentik.protocol import (
    AgentEntry,
    AgentInfo,
    AgentList,
    ApprovalBody,
    CreateConversationBody,
    InputBody,
    InterruptBody,
    InterruptResult,
    MessageAccepted,
    RenameConversationBody,
    SendMessageBody,
    ToolsStatus,
)
from agentik.protocol_branches import BranchBody, EditMessageBody, ForkBody, RegenerateBody
from agentik.wire import (
    ChatSnapshot,
    CommonEvent,
    Content,
    ConversationRecord,
    ConversationsSnapshot,
    Cursor,
    MessageContext,
    MessageRecord,
    encode,
)

__all__ = ["AgentikAgent", "HttpConversation", "HttpJournal", "HttpOnlineOutbox", "HttpOutbox"]


def _api_root(base_url: str) -> str:
    """Accept both ``http://host:8080`` and ``http://host:8080/agentik`` (the prefixed form)."""
    root = base_url.rstrip("/")
    return root.removesuffix("/agentik")


class AgentikAgent:
    """The Agent interface over HTTP: ``async with AgentikAgent(id, base_url, token) as agent``.

    ``id`` is this client's identity, sent as ``X-Client-Id`` on every request (generate it once
    per installation and keep it); it is ``client_id`` here, while ``agent.id`` is the server's
    agent id (its database epoch) once known. ``base_url`` is the server root
    (``http://host:8080``; a trailing ``/agentik`` is accepted). ``token`` is sent as
    ``Authorization: Bearer``. Entering does no I/O; ``await agent.info()`` checks the server.

    ``timeout`` bounds each plain request; ``stream_read_timeout`` bounds silence on an event
    stream (the server sends a heartbeat every 15 s, so a longer silence means a dead link and
    ends the stream with AgentikConnectionError). ``transport`` is for tests; ``auth`` (an
    ``httpx2.Auth``) sets each request's credentials instead of ``token`` (a cluster node
    forwarding a command as its caller, ``agentik.cluster``).
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
        write_retries: int = 2,
        auth: httpx2.Auth | None = None,
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
            auth=auth,
            # Streams are long-lived; don't let a pool limit make the N+1st wait forever.
            limits=httpx2.Limits(max_connections=None, max_keepalive_connections=20),
        )
        #: times a send or a create is sent again (same Idempotency-Key) after no answer or a 503
        self.write_retries = write_retries
        self._closed = False
        self._info: AgentInfo | None = None
        self._epoch: str | None = None
        self.journal = HttpJournal(self)
        self.outbox = HttpOutbox(self)
        self.online_outbox = HttpOnlineOutbox(self)
        self.webhooks = HttpWebhooks(self)  # admins: docs/WEBHOOKS.md

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
        self._info = decode_answer(await self._request("GET", "/agentik"), AgentInfo)
        self._epoch = self._info.id
        return self._info

    async def tools(self) -> list[Any]:
        """``GET /agentik/tools``: the MCP servers with their state and tools."""
        return decode_answer(await self._request("GET", "/agentik/tools"), ToolsStatus).servers

    # --- conversations ---------------------------------------------------------------------------

    async def agents(self) -> AgentList:
        """``GET /agentik/agents``: the server's agents and the default one's id."""
        return decode_answer(await self._request("GET", "/agentik/agents"), AgentList)

    async def get_agent(self, agent_id: str) -> AgentEntry:
        """``GET /agentik/agents/{id}``. Raises NotFoundError (its message lists the ids)."""
        path = "/agentik/agents/" + urllib.parse.quote(agent_id, safe="")
        return decode_answer(await self._request("GET", path), AgentEntry)

    async def create_conversation(
        self, temp: bool = False, title: str | None = None, *, idempotency_key: str | None = None,
        agent: str | None = None, instructions: str | None = None,
    ) -> HttpConversation:
        """A conversation of ``agent`` (None: the default one) whose system prompt is
        ``instructions`` when given. Idempotent like :meth:`send`: a retry never makes a second
        conversation. Raises NotFoundError for an unknown agent."""
        body = encode(CreateConversationBody(temp=temp, title=title, agent=agent,
                                             instructions=instructions))
        raw = await self._idempotent_write("/agentik/conversations", body, idempotency_key)
        return HttpConversation(self, decode_answer(raw, ConversationRecord))

    async def get_conversation(self, conversation_id: str) -> HttpConversation | None:
        """None if there is no such conversation."""
        try:
            raw = await self._request("GET", conversation_path(conversation_id))
        except NotFoundError:
            return None
        return HttpConversation(self, decode_answer(raw, ConversationRecord))

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Delete it and everything of it. Returns False if it did not exist."""
        try:
            await self._request("DELETE", conversation_path(conversation_id))
        except NotFoundError:
            return False
        return True

    async def rename_conversation(self, conversation_id: str, title: str | None) -> ConversationRecord:
        """Raises NotFoundError."""
        body = encode(RenameConversationBody(title=title))
        raw = await self._request(
            "PATCH", conversation_path(conversation_id), content=body
        )
        return decode_answer(raw, ConversationRecord)

    async def interrupt(self, conversation_id: str) -> bool:
        raw = await self._request("POST", f"{conversation_path(conversation_id)}/interrupt")
        return decode_answer(raw, InterruptResult).interrupted

    async def approve(self, conversation_id: str, call_id: str, approve: bool = True,
                      reason: str | None = None) -> MessageRecord:
        """The approval a paused call waits for; the stored answer. Raises NotFoundError,
        ConflictError (answered otherwise, or its turn has ended)."""
        raw = await self._request(
            "POST", f"{conversation_path(conversation_id)}/approvals/{urllib.parse.quote(call_id, safe='')}",
            content=encode(ApprovalBody(approve=approve, reason=reason)))
        return decode_answer(raw, MessageRecord)

    async def answer(self, conversation_id: str, call_id: str, text: str | None = None, *,
                     data: dict[str, Any] | None = None) -> MessageRecord:
        """The answer to a paused call's question (``text``, or ``data``); as :meth:`approve`."""
        raw = await self._request(
            "POST", f"{conversation_path(conversation_id)}/inputs/{urllib.parse.quote(call_id, safe='')}",
            content=encode(InputBody(text=text, data=data)))
        return decode_answer(raw, MessageRecord)

    async def cancel_turn(self, conversation_id: str, turn_id: str) -> bool:
        """Cancel one turn (its user message's id): withdrawn while it waits behind another
        (it ends interrupted at once, never run), interrupted while it runs. False when it
        has ended."""
        raw = await self._request("POST", f"{conversation_path(conversation_id)}/interrupt",
                                  content=encode(InterruptBody(turn_id=turn_id)))
        return decode_answer(raw, InterruptResult).interrupted

    async def send(
        self,
        conversation_id: str,
        content: Sequence[Content] | Content | str,
        context: MessageContext | None = None,
        *,
        on_busy: str | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Queue a user message; returns its id. Every send carries an ``Idempotency-Key`` (a
        fresh one unless given) and is sent again with the same key, up to ``write_retries``
        times, when no answer came (connection lost, timeout) or the server said 503: a retry of
        a send that was in fact stored returns the first message's id and stores nothing."""
        body = encode(SendMessageBody(content=as_content(content), context=context,
                                      on_busy=cast(Any, on_busy)))  # the server validates it
        raw = await self._idempotent_write(
            f"{conversation_path(conversation_id)}/messages", body, idempotency_key)
        return decode_answer(raw, MessageAccepted).message_id

    # --- branches (docs/PROTOCOL.md "Branches") ------------------------------------------------

    async def edit(
        self, conversation_id: str, message_id: str, content: Sequence[Content] | Content | str,
        context: MessageContext | None = None, *, on_busy: str | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """A new version of the user message ``message_id``, answered on its branch; returns
        the new message's id. Idempotent and retried like :meth:`send`."""
        body = encode(EditMessageBody(content=as_content(content), context=context,
                                      on_busy=cast(Any, on_busy)))
        raw = await self._idempotent_write(
            f"{message_path(conversation_id, message_id)}/edit", body, idempotency_key)
        return decode_answer(raw, MessageAccepted).message_id

    async def regenerate(self, conversation_id: str, message_id: str, *,
                         on_busy: str | None = None, idempotency_key: str | None = None) -> str:
        """A new answer to the user message ``message_id`` answers (or is); returns its turn's
        id. Idempotent and retried like :meth:`send`."""
        raw = await self._idempotent_write(
            f"{message_path(conversation_id, message_id)}/regenerate",
            encode(RegenerateBody(on_busy=cast(Any, on_busy))), idempotency_key)
        return decode_answer(raw, MessageAccepted).message_id

    async def switch_branch(self, conversation_id: str, message_id: str, *,
                            on_busy: str | None = None, idempotency_key: str | None = None
                            ) -> ChatSnapshot:
        """Make the version ``message_id`` current (the newest path below it); returns the
        conversation as it then is."""
        raw = await self._idempotent_write(
            f"{conversation_path(conversation_id)}/branch",
            encode(BranchBody(message_id=message_id, on_busy=cast(Any, on_busy))),
            idempotency_key)
        return decode_answer(raw, ChatSnapshot)

    async def fork(self, conversation_id: str, message_id: str, *, title: str | None = None,
                   idempotency_key: str | None = None) -> HttpConversation:
        """A new conversation whose history is this one's up to ``message_id``."""
        raw = await self._idempotent_write(
            f"{conversation_path(conversation_id)}/fork",
            encode(ForkBody(message_id=message_id, title=title)), idempotency_key)
        return HttpConversation(self, decode_answer(raw, ConversationRecord))

    async def siblings(self, conversation_id: str, message_id: str) -> list[MessageRecord]:
        """Every version at ``message_id``'s place, oldest first."""
        raw = await self._request("GET", f"{message_path(conversation_id, message_id)}/siblings")
        return decode_answer(raw, list[MessageRecord])

    async def _idempotent_write(self, path: str, body: bytes, key: str | None) -> bytes:
        headers = {"Idempotency-Key": key or uuid.uuid4().hex}
        for attempt in range(self.write_retries + 1):
            try:
                return await self._request("POST", path, content=body, headers=headers)
            except (AgentikConnectionError, RuntimeClosedError, StorageError):
                if attempt == self.write_retries or self._closed:
                    raise
                await anyio.sleep(min(0.25 * 2**attempt, 2.0))
        raise AssertionError("unreachable")

    async def conversations_snapshot(self, offset: int = 0, limit: int = 100) -> ConversationsSnapshot:
        """The conversation list at a cursor: every change <= cursor is in it."""
        raw = await self._request(
            "GET", "/agentik/conversations", params={"offset": offset, "limit": limit}
        )
        snapshot = decode_answer(raw, ConversationsSnapshot)
        self._epoch = snapshot.cursor.epoch
        return snapshot

    async def chat_snapshot(self, conversation_id: str) -> ChatSnapshot:
        """One conversation and all its messages at a cursor. Raises NotFoundError."""
        raw = await self._request("GET", f"{conversation_path(conversation_id)}/snapshot")
        snapshot = decode_answer(raw, ChatSnapshot)
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
        content: bytes | None = None, headers: dict[str, str] | None = None,
    ) -> bytes:
        self._check_open()
        if tracing.enabled():  # a node forwarding a command: the owner's spans join its trace
            headers = dict(headers or {})
            tracing.inject(headers)
        try:
            response = await self._http.request(
                method, path, params=params, content=content, headers=headers)
        except httpx2.TransportError as exc:
            raise self._unreachable(exc) from exc
        if response.status_code >= 400:
            raise error_from_response(response.status_code, response.content, response.headers)
        return response.content

    def _durable(
        self, path: str, after: Cursor | None, on_open: OnOpen | None, *, kind: str | None = None
    ) -> AsyncGenerator[CommonEvent, None]:
        return read_durable(
            self._http, path, after, self._stream_timeout, on_open, self._check_open, kind
        )

    def _live(self, path: str, on_open: OnOpen | None) -> AsyncGenerator[CommonEvent, None]:
        return read_live(self._http, path, self._stream_timeout, on_open, self._check_open)
