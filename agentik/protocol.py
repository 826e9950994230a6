"""Request bodies, response bodies and WebSocket frames of the HTTP facade (docs/PROTOCOL.md).

Pure msgspec, no web framework, and outside the ``agentik.web`` package (whose ``__init__``
builds the Quart app), so the client library can import these without pulling in quart.
``agentik.web.types`` re-exports everything here; ``agentik.web.openapi`` generates the OpenAPI
schemas from them. Conversations, messages, events and snapshots travel as the wire
structs of :mod:`agentik.wire` unchanged.

Cursors outside CommonEvent JSON (query parameters, SSE ids, the ``current``/``oldest`` fields
here) are the string ``EPOCH:OFFSET``; inside CommonEvent and snapshots they are the ``Cursor``
struct.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agentik.protocol_branches import BranchCommand
from agentik.wire import (
    CommonEvent,
    Content,
    MessageContext,
    Tagged,
    Wire,
)

# --- HTTP request bodies -------------------------------------------------------------------------


class CreateConversationBody(Wire, frozen=True, kw_only=True):
    """``POST /agentik/conversations``. An empty body means ``{}``."""

    temp: bool = False
    title: str | None = None
    #: the agent it belongs to (None: the default agent; GET /agentik/agents lists them)
    agent: str | None = None
    #: its system prompt in place of its agent's instructions
    instructions: str | None = None


class RenameConversationBody(Wire, frozen=True, kw_only=True):
    """``PATCH /agentik/conversations/{id}``; ``null`` clears the title."""

    title: str | None


class SendMessageBody(Wire, frozen=True, kw_only=True):
    """``POST /agentik/conversations/{id}/messages``."""

    content: list[Content]
    context: MessageContext | None = None
    #: what to do when the conversation is running a turn: queue | reject (409 busy) |
    #: interrupt; None: the server's AGENTIK_BUSY_POLICY
    on_busy: Literal["queue", "reject", "interrupt"] | None = None


# --- HTTP response bodies ------------------------------------------------------------------------


class Capabilities(Wire, frozen=True, kw_only=True):
    image_input: bool
    tools: list[str]


class AgentInfo(Wire, frozen=True, kw_only=True):
    """``GET /agentik``. ``id`` is the database epoch: it changes only with a new database."""

    id: str
    name: str
    version: str
    capabilities: Capabilities
    current: str
    oldest: str


class AgentEntry(Wire, frozen=True, kw_only=True):
    """One agent of the server (``GET /agentik/agents/{id}``): what a client may show."""

    id: str
    name: str
    description: str
    #: whether its model takes images
    image_input: bool
    #: the tools its model may call now (the names the model sees)
    tools: list[str]
    #: its A2A agent card (a path on this server)
    card_url: str
    #: whether it is the default agent (a conversation created without one belongs to it)
    default: bool = False


class AgentList(Wire, frozen=True, kw_only=True):
    """``GET /agentik/agents``: the agents in the agents file's order."""

    agents: list[AgentEntry]
    default: str


class CursorPair(Wire, frozen=True, kw_only=True):
    """``GET /agentik/cursor``: the head, and the oldest cursor that can still be resumed from."""

    current: str
    oldest: str


class MessageAccepted(Wire, frozen=True, kw_only=True):
    message_id: str


class InterruptBody(Wire, frozen=True, kw_only=True):
    """``POST /agentik/conversations/{id}/interrupt`` (an empty body: the running turn)."""

    #: cancel this turn (its user message's id): withdrawn while it waits behind another (it
    #: ends interrupted at once, never run), interrupted while it runs
    turn_id: str | None = None


class InterruptResult(Wire, frozen=True, kw_only=True):
    interrupted: bool


class ApprovalBody(Wire, frozen=True, kw_only=True):
    """``POST /agentik/conversations/{id}/approvals/{call_id}``: the person's yes or no."""

    approve: bool
    #: told to the model verbatim when they refuse
    reason: str | None = None


class InputBody(Wire, frozen=True, kw_only=True):
    """``POST /agentik/conversations/{id}/inputs/{call_id}``: the answer to a question, its
    ``text`` or a structured answer (``data``, an elicitation's schema)."""

    text: str | None = None
    data: dict[str, Any] | None = None


class CountResult(Wire, frozen=True, kw_only=True):
    count: int


class Usage(Wire, frozen=True, kw_only=True):
    """``GET /agentik/usage`` (docs/USERS.md): a user's model tokens this UTC day, their daily
    limit (None: none) and when the count starts again (ISO 8601, UTC midnight)."""

    user: str
    tokens_today: int
    tokens_per_day: int | None
    reset_at: str


class ToolsStatus(Wire, frozen=True, kw_only=True):
    servers: list[Any] = []


class Health(Wire, frozen=True, kw_only=True):
    status: str


class StorageReadiness(Wire, frozen=True, kw_only=True):
    """Whether storage accepts writes (the writer's last commit or probe). While it does not:
    ``error`` is the database's message, ``since`` the unix time of the first refused write."""

    writable: bool
    error: str | None = None
    since: float | None = None


class ToolServerProblem(Wire, frozen=True, kw_only=True):
    """An MCP server that is not connected because it failed (``state`` failed or retrying),
    with why (``error``)."""

    name: str
    state: str
    error: str | None = None


class Readiness(Wire, frozen=True, kw_only=True):
    """``GET /readyz``. ``status``: ``ready`` (200); ``degraded`` (200: serving, but the MCP
    servers in ``tools`` failed, so their tools are missing, or the model's server did not answer
    when last asked: ``model_reachable`` false, turns fail until it does, or a cluster node has
    no address the others can forward commands to: AGENTIK_NODE_URL); ``not_ready`` (503:
    the runtime is not running, storage refuses writes, or a cluster node cannot heartbeat its
    leases). ``reasons``: one line per problem, in that order.
    ``runtime``: starting | running | stopping | dead. ``storage`` is absent while the runtime
    is not running."""

    status: str
    runtime: str
    storage: StorageReadiness | None = None
    tools: list[ToolServerProblem] = []
    reasons: list[str] = []
    #: false when the model's server did not answer when last asked (asked at start-up, then
    #: every 10 s while it does not answer, every 60 s while it does)
    model_reachable: bool = True


class ErrorDetail(Wire, frozen=True, kw_only=True, omit_defaults=True):
    """``code`` is the AgentikError code (``invalid_input``, ``not_found``, ``gap``, ...).
    ``oldest``/``current`` are set for ``gap``, ``retry_after`` for ``mailbox_full``."""

    code: str
    message: str
    oldest: str | None = None
    current: str | None = None
    retry_after: float | None = None


class ErrorBody(Wire, frozen=True, kw_only=True):
    error: ErrorDetail


# --- WebSocket frames: client -> server ----------------------------------------------------------
# Every client frame carries ``id``, a client-chosen request id echoed in the answer. For
# ``subscribe`` the id also names the subscription.


class Subscribe(Tagged, frozen=True, kw_only=True):
    """``stream``: ``events`` (everything durable), ``agent`` (conversation list only),
    ``conversation`` (one conversation's durable events) or ``live`` (one conversation's online
    events). ``after`` is ``EPOCH:OFFSET`` (durable streams only; absent = from now). ``kind``
    filters an ``events`` stream on the server like ``GET /agentik/events?kind=``: ``agent``
    (the conversation list), ``conversation`` (inside conversations) or ``a2a`` (A2A tasks)."""

    id: str
    stream: Literal["events", "agent", "conversation", "live"]
    conversation_id: str | None = None
    after: str | None = None
    kind: Literal["agent", "conversation", "a2a"] | None = None


class Unsubscribe(Tagged, frozen=True, kw_only=True):
    id: str
    subscription: str


class Ping(Tagged, frozen=True, kw_only=True):
    id: str | None = None


class Pong(Tagged, frozen=True, kw_only=True):
    id: str | None = None


class CreateConversation(Tagged, frozen=True, kw_only=True, tag="create"):
    id: str
    temp: bool = False
    title: str | None = None
    agent: str | None = None
    instructions: str | None = None
    #: like the Idempotency-Key header of ``POST /agentik/conversations``
    idempotency_key: str | None = None


class GetConversation(Tagged, frozen=True, kw_only=True, tag="get"):
    id: str
    conversation_id: str


class ListConversations(Tagged, frozen=True, kw_only=True, tag="list"):
    id: str
    offset: int = 0
    limit: int = 100


class SendMessage(Tagged, frozen=True, kw_only=True, tag="send"):
    id: str
    conversation_id: str
    content: list[Content]
    context: MessageContext | None = None
    #: queue | reject | interrupt, as in ``POST …/messages`` (None: AGENTIK_BUSY_POLICY)
    on_busy: Literal["queue", "reject", "interrupt"] | None = None
    #: like the Idempotency-Key header of ``POST …/messages``
    idempotency_key: str | None = None
    #: a W3C trace context, like the traceparent header of ``POST …/messages``: the send's span
    #: (and so its turn's) joins that trace (docs/OBSERVABILITY.md)
    traceparent: str | None = None


class InterruptTurn(Tagged, frozen=True, kw_only=True, tag="interrupt"):
    id: str
    conversation_id: str
    #: as in ``POST …/interrupt``: this turn, queued or running (None: the running turn)
    turn_id: str | None = None


class Approve(Tagged, frozen=True, kw_only=True, tag="approve"):
    """As ``POST …/approvals/{call_id}``; the reply's result is the stored answer's record."""

    id: str
    conversation_id: str
    call_id: str
    approve: bool
    reason: str | None = None


class Answer(Tagged, frozen=True, kw_only=True, tag="answer"):
    """As ``POST …/inputs/{call_id}``; the reply's result is the stored answer's record."""

    id: str
    conversation_id: str
    call_id: str
    text: str | None = None
    data: dict[str, Any] | None = None


class RenameConversation(Tagged, frozen=True, kw_only=True, tag="rename"):
    id: str
    conversation_id: str
    title: str | None


class DeleteConversation(Tagged, frozen=True, kw_only=True, tag="delete"):
    id: str
    conversation_id: str


class GetSnapshot(Tagged, frozen=True, kw_only=True, tag="snapshot"):
    id: str
    conversation_id: str


Command = (
    CreateConversation | GetConversation | ListConversations | SendMessage | InterruptTurn
    | Approve | Answer | RenameConversation | DeleteConversation | GetSnapshot | BranchCommand
)

ClientFrame = Subscribe | Unsubscribe | Ping | Pong | Command

# --- WebSocket frames: server -> client ----------------------------------------------------------


class Reply(Tagged, frozen=True, kw_only=True):
    """The answer to a command: ``result`` is what the matching HTTP route returns (a
    ConversationRecord, a snapshot, ``{"message_id"}``, ...; ``null`` for delete/unsubscribe)."""

    id: str
    result: Any = None


class ErrorFrame(Tagged, frozen=True, kw_only=True, tag="error"):
    """A failed command (``id`` = its request id; ``null`` when the frame could not be read) or a
    subscription that ended with an error (``subscription`` set; e.g. ``gap``)."""

    id: str | None = None
    subscription: str | None = None
    error: ErrorDetail


class Events(Tagged, frozen=True, kw_only=True):
    """Events of one subscription, in order; everything queued at once goes in one frame."""

    subscription: str
    events: list[CommonEvent]


#: why a stream ended by itself: ``deleted`` (its conversation was deleted; after the Deleted
#: event) or ``overflow`` (a live stream fell too far behind)
EndedReason = Literal["deleted", "overflow"]


class Ended(Tagged, frozen=True, kw_only=True):
    """A subscription ended by itself; ``reason``: an :data:`EndedReason`."""

    subscription: str
    reason: str


class StreamEnded(Wire, frozen=True, kw_only=True):
    """The data of the SSE ``event: ended`` frame, the last frame of a stream that ended by
    itself; ``reason``: an :data:`EndedReason`."""

    reason: str


ServerFrame = Reply | ErrorFrame | Events | Ended | Ping | Pong


class SubscribeResult(Wire, frozen=True, kw_only=True):
    """``result`` of a subscribe reply: the cursor the stream starts after (null for live)."""

    subscription: str
    after: str | None = None


decode_client_frame = msgspec.json.Decoder(ClientFrame).decode
decode_server_frame = msgspec.json.Decoder(ServerFrame).decode

