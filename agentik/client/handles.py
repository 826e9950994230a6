"""The handles of :class:`~agentik.client.AgentikAgent`: ``agent.journal``, ``agent.outbox``,
``agent.online_outbox`` and one conversation (``HttpConversation``), the same names as the
in-process agent's. Each call is one request through the agent's transport.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from agentik.api import ConversationView
from agentik.client.streams import OnOpen, agent_only, decode_answer
from agentik.protocol import CountResult, CursorPair
from agentik.wire import CommonEvent, Cursor, MessageRecord

if TYPE_CHECKING:
    from agentik.client.http import AgentikAgent


def conversation_path(conversation_id: str) -> str:
    return f"/agentik/conversations/{quote(conversation_id, safe='')}"


def message_path(conversation_id: str, message_id: str) -> str:
    return f"{conversation_path(conversation_id)}/messages/{quote(message_id, safe='')}"


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
        return decode_answer(raw, list[MessageRecord])

    async def count(self, conversation_id: str | None = None, after_seq: int = 0) -> int:
        params: dict[str, Any] = {"after_seq": after_seq}
        if conversation_id is not None:
            params["conversation_id"] = conversation_id
        raw = await self._agent._request("GET", "/agentik/journal/count", params=params)
        return decode_answer(raw, CountResult).count


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
        return decode_answer(raw, CursorPair)

    async def current_cursor(self) -> Cursor:
        return Cursor.parse((await self.cursors()).current)

    async def oldest_cursor(self) -> Cursor:
        return Cursor.parse((await self.cursors()).oldest)

    def events(
        self, after: Cursor | None = None, *, on_open: OnOpen | None = None
    ) -> AsyncGenerator[CommonEvent, None]:
        """Every durable event (agent and conversation) after ``after`` (None: from now)."""
        return self._agent._durable("/agentik/events", after, on_open)

    def agent_events(
        self, after: Cursor | None = None, *, on_open: OnOpen | None = None
    ) -> AsyncGenerator[CommonEvent, None]:
        """Conversation-list events only: Created, Deleted, Renamed, Touched. The server filters
        (``?kind=agent``); the client checks again, for servers older than the filter."""
        return agent_only(self._agent._durable("/agentik/events", after, on_open, kind="agent"))

    def conversation_events(
        self, after: Cursor | None, conversation_id: str, *, on_open: OnOpen | None = None
    ) -> AsyncGenerator[CommonEvent, None]:
        """One conversation's durable events, including its own Renamed/Touched/Deleted."""
        path = f"{conversation_path(conversation_id)}/events"
        return self._agent._durable(path, after, on_open)


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
        path = f"{conversation_path(conversation_id)}/live"
        return self._agent._live(path, on_open)


class HttpConversation(ConversationView["AgentikAgent"]):
    """A handle on one conversation (like :class:`agentik.agent.LocalConversation`): ``send``,
    ``interrupt``, ``rename`` and ``close`` as :class:`agentik.api.ConversationView` makes them
    (``send`` returns once the server stored the message: 202; see :meth:`AgentikAgent.send` for
    the idempotency key and the retries)."""

    @property
    def supports_image_input(self) -> bool | None:
        """From the agent info, once fetched (``await agent.info()``); None before."""
        return self._agent.supports_image_input

    async def get_messages(
        self, after_seq: int = 0, offset: int = 0, limit: int = 100
    ) -> list[MessageRecord]:
        params = {"after_seq": after_seq, "offset": offset, "limit": limit}
        raw = await self._agent._request(
            "GET", f"{conversation_path(self.id)}/messages", params=params
        )
        return decode_answer(raw, list[MessageRecord])
