"""The in-process ``Agent`` API: what ``open_runtime`` yields. The HTTP client library
(``agentik.client``) offers the same names over the wire, and the web facade maps its routes onto
exactly these calls.

Who raises what: NotFoundError (unknown conversation), MailboxFullError (send to a full mailbox),
ConversationFailedError (a conversation past its crash limit), OutboxGapError (dead cursor, from the
``events`` iterators at their first step), StorageError (SQLite failed; nothing stored),
RuntimeClosedError (the runtime is shutting down), InvalidInputError (bad arguments, content that
breaks :mod:`agentik.content`'s rules), PayloadTooLargeError (an image over the limit).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from agentik.actors.deps import Deps
from agentik.actors.registry import Registry
from agentik.agent_branches import BranchCalls
from agentik.agent_handles import (
    Journal,
    OnlineOutbox,
    Outbox,
    TaskRecords,
    check_limit,
    check_non_negative,
)
from agentik.agent_users import UserScope
from agentik.agent_webhooks import Webhooks
from agentik.api import ConversationView, as_content
from agentik.cluster import Peers
from agentik.config import BUSY_POLICIES
from agentik.content import check_content
from agentik.errors import InvalidInputError, NotFoundError, NotOwnerError, RuntimeClosedError
from agentik.llm.base import ToolSpec
from agentik.protocol import AgentEntry, AgentList
from agentik.storage import ops
from agentik.storage.hub import OnlineSubscription
from agentik.storage.types import StoredEvent
from agentik.wire import (
    ApprovalAnswer,
    ChatSnapshot,
    Content,
    ConversationRecord,
    ConversationsSnapshot,
    InputAnswer,
    MessageContext,
    MessageRecord,
    PauseAnswer,
)

if TYPE_CHECKING:
    from agentik.client.http import AgentikAgent
    from agentik.config import Config
    from agentik.storage.health import StorageHealth
    from agentik.storage.hub import EventHub

__all__ = [
    "Journal", "LocalAgent", "LocalConversation", "OnlineOutbox", "OnlineSubscription", "Outbox",
    "StoredEvent", "TaskRecords",
]

#: longest accepted Idempotency-Key
MAX_IDEMPOTENCY_KEY = 255


class LocalConversation(ConversationView["LocalAgent"]):
    """A handle on one conversation: ``send``, ``interrupt``, ``rename`` and ``close`` as
    :class:`agentik.api.ConversationView` makes them through the agent."""

    @property
    def supports_image_input(self) -> bool:
        deps = self._agent._deps
        return deps.agent_of(self.record.agent, self.id).llm.supports_images

    async def get_messages(
        self, after_seq: int = 0, offset: int = 0, limit: int = 100
    ) -> list[MessageRecord]:
        """The current branch's records (docs/PROTOCOL.md "Branches"), a page in seq order."""
        reader = self._agent._deps.storage.reader
        page = await self._agent.branch_messages(self.id, after_seq, offset, limit)
        if not page and await reader.get_conversation(self.id) is None:
            raise NotFoundError(f"conversation {self.id!r} not found")
        return page


class LocalAgent(BranchCalls):
    """The in-process Agent (its branch calls: ``agent_branches.py``)."""

    def __init__(self, deps: Deps, registry: Registry, peers: Peers, hooks: Webhooks) -> None:
        self._deps = deps
        self._registry = registry
        #: clients of the other cluster nodes (forwarded commands, A2A requests); runtime-closed
        self.peers = peers
        self._closed = False
        #: whose each conversation is, streams filtered to a user's own, the users' limits
        self.users = UserScope(deps.storage)
        self.journal = Journal(deps, self.users)
        self.outbox = Outbox(deps, self.users)
        self.online_outbox = OnlineOutbox(deps)
        #: every tool of the server (NoTools, FunctionTools, the MCP registry); each agent's
        #: turns run through its allowed part of it (``get_agent(id).tools`` names them)
        self.tools = deps.tools
        self.webhooks = hooks  # subscriptions and A2A push configs (docs/WEBHOOKS.md)

    @property
    def id(self) -> str:
        return self._deps.storage.epoch

    @property
    def config(self) -> Config:
        return self._deps.config

    @property
    def hub(self) -> EventHub:
        """The event hub (durable fan-out by cursor, online fan-out)."""
        return self._deps.storage.hub

    @property
    def storage_health(self) -> StorageHealth:
        """Whether storage accepts writes (``writable``, ``error``, ``since``): ``/readyz``."""
        return self._deps.storage.health

    @property
    def model_error(self) -> str | None:
        """Why the model's server did not answer when last asked (``/readyz``: a degraded
        reason; with several agents, each one whose model does not answer, named); None while
        they answer, or when nobody asks (an embedded engine)."""
        models = self._deps.models
        if len(models) <= 1:
            return next((m.error for m in models.values()), None)
        errors = [f"agent {agent!r}: {m.error}" for agent, m in models.items() if m.error]
        return "; ".join(errors) or None

    @property
    def lease_error(self) -> str | None:
        """PostgreSQL cluster: why this node cannot hold conversation leases now (its heartbeat
        fails, or it stopped its actors for want of one in time), so it cannot run
        conversations: ``/readyz``. None while it heartbeats, and always on SQLite."""
        leases = self._deps.storage.leases
        return None if leases is None else leases.not_ready()

    @property
    def wants_node_address(self) -> bool:
        """PostgreSQL cluster without AGENTIK_NODE_URL: whether this node would advertise an
        address it learns now (:meth:`learn_node_address`); always False on SQLite."""
        leases = self._deps.storage.leases
        return leases is not None and leases.wants_addr

    def learn_node_address(self, addr: str | None) -> None:
        """The base URL a request reached this node at (None: it told none, e.g. a UNIX
        socket): advertised to the other nodes for forwarded commands unless AGENTIK_NODE_URL
        is set (docs/SCALEOUT.md)."""
        leases = self._deps.storage.leases
        if leases is not None:
            leases.learn_addr(addr)

    @property
    def node_address_problem(self) -> str | None:
        """PostgreSQL cluster: why other nodes cannot forward commands here (no
        AGENTIK_NODE_URL and no address learned yet): ``/readyz`` names the setting."""
        leases = self._deps.storage.leases
        return None if leases is None else leases.addr_problem()

    @property
    def task_records(self) -> TaskRecords:
        """Durable task records under the shared counter (the A2A facade's tasks, docs/A2A.md)."""
        return TaskRecords(self._deps.storage, self.users)

    @property
    def supports_image_input(self) -> bool:
        return self._deps.llm.supports_images

    def mark_closed(self) -> None:
        """Refuse every later call (RuntimeClosedError); ``open_runtime`` calls this as it leaves."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeClosedError("the runtime is closed")

    async def create_conversation(
        self, temp: bool = False, title: str | None = None, *, idempotency_key: str | None = None,
        agent: str | None = None, instructions: str | None = None, owner: str | None = None,
    ) -> LocalConversation:
        """A conversation of ``agent`` (None: the default one), whose system prompt is
        ``instructions`` when given, else its agent's. An ``idempotency_key`` already used to
        create one returns that conversation (the keys of each ``owner`` are their own).
        ``owner``: the user it belongs to (None: no user's; admins and in-process callers reach
        it). Raises NotFoundError (an unknown agent: the message names the known ones)."""
        self._check_open()
        key = [temp, title] if agent is None and instructions is None else [
            temp, title, agent, instructions]  # a key's fingerprint as before agents existed
        idem = self._idempotency(idempotency_key, "create", key, owner)
        record = await self._registry.create(temp=temp, title=title, idempotency=idem,
                                             agent=agent, instructions=instructions, owner=owner)
        return LocalConversation(self, record)

    def agents(self) -> AgentList:
        """The server's agents (the agents file's order) and the default one's id."""
        profiles = self._deps.profiles
        return AgentList(agents=[self.get_agent(i) for i in profiles.ids],
                         default=profiles.default)

    def agent_of(self, stored: str) -> str:
        """The id of the agent that answers a conversation stored as ``stored``'s (the default
        one when that agent is no longer configured)."""
        return stored if stored in self._deps.agents else self._deps.profiles.default

    def agent_tools(self, agent_id: str | None = None) -> Sequence[ToolSpec]:
        """The tools one agent's model may call now (None: the default agent's). Raises
        NotFoundError."""
        return self._deps.agents[self._deps.profiles.get(agent_id).id].tools.specs()

    def get_agent(self, agent_id: str | None = None) -> AgentEntry:
        """What a client may show of one agent (None: the default one). Raises NotFoundError
        naming the known ids."""
        profile = self._deps.profiles.get(agent_id)
        part = self._deps.agents[profile.id]
        return AgentEntry(
            id=profile.id, name=profile.name, description=profile.description,
            image_input=part.llm.supports_images, tools=[s.name for s in part.tools.specs()],
            card_url=f"/a2a/{profile.id}/.well-known/agent-card.json",
            default=profile.id == self._deps.profiles.default)

    def _idempotency(
        self, key: str | None, scope: str, body: object, user: str | None = None
    ) -> ops.Idempotency | None:
        """The stored form of an Idempotency-Key: the key and a fingerprint of the request
        (route, conversation, body), so the same key with another request is refused."""
        if key is None:
            return None
        if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY or not key.isprintable():
            raise InvalidInputError(
                f"an idempotency key must be 1..{MAX_IDEMPOTENCY_KEY} printable characters")
        digest = hashlib.sha256(scope.encode() + b"\0" + msgspec.json.encode(body)).hexdigest()
        if user is not None:  # a user's keys never meet another's (the length: no ambiguity)
            key = f"user:{len(user)}:{user}:{key}"
        return ops.Idempotency(key=key, fingerprint=digest, ttl=self.config.idempotency_ttl)

    async def get_conversation(
        self, conversation_id: str, *, user: str | None = None
    ) -> LocalConversation | None:
        """None when unknown, or (``user``) not that user's."""
        self._check_open()
        if not await self.users.owns(conversation_id, user):
            return None
        record = await self._deps.storage.reader.get_conversation(conversation_id)
        return None if record is None else LocalConversation(self, record)

    async def delete_conversation(self, conversation_id: str, *, user: str | None = None) -> bool:
        """Stop its actor (a running turn gets its terminal record), then delete everything of it
        in one transaction (ConversationClosing, Deleted). Returns False if it did not exist (or
        is not ``user``'s)."""
        self._check_open()
        if not await self.users.owns(conversation_id, user):
            return False
        await self._registry.stop(conversation_id)
        try:
            deleted: bool = await self._deps.storage.write(
                ops.DeleteConversation(conversation_id=conversation_id)
            )
        except NotOwnerError as exc:  # a cluster: the owner stops its actor and deletes
            return await self.peers.forward(exc, lambda o: o.delete_conversation(conversation_id))
        return deleted

    async def rename_conversation(
        self, conversation_id: str, title: str | None, *, user: str | None = None
    ) -> ConversationRecord:
        """Raises NotFoundError (also for another ``user``'s)."""
        self._check_open()
        await self.users.require(conversation_id, user)
        try:
            record: ConversationRecord = await self._deps.storage.write(
                ops.RenameConversation(conversation_id=conversation_id, title=title)
            )
        except NotOwnerError as exc:
            return await self.peers.forward(
                exc, lambda o: o.rename_conversation(conversation_id, title))
        return record

    async def interrupt(self, conversation_id: str, *, user: str | None = None) -> bool:
        """Cancel the running turn (Interrupted event). Returns whether a turn was running.
        Raises NotFoundError (also for another ``user``'s)."""
        self._check_open()
        await self.users.require(conversation_id, user)
        try:
            return await self._registry.interrupt(conversation_id)
        except NotOwnerError as exc:
            return await self.peers.forward(exc, lambda o: o.interrupt(conversation_id))

    async def cancel_turn(
        self, conversation_id: str, turn_id: str, *, user: str | None = None
    ) -> bool:
        """Cancel one turn (``turn_id``: its user message's id): withdrawn while it waits
        behind another turn (it ends Interrupted at once, stored before this returns, and is
        never run), interrupted while it runs.
        False when it has ended. In a cluster the conversation's owner does it. Raises
        NotFoundError (also for another ``user``'s)."""
        self._check_open()
        await self.users.require(conversation_id, user)
        try:
            return await self._registry.cancel_turn(conversation_id, turn_id)
        except NotOwnerError as exc:
            return await self.peers.forward(
                exc, lambda o: o.cancel_turn(conversation_id, turn_id))

    async def own(self, conversation_id: str, *, user: str | None = None) -> None:
        """PostgreSQL cluster: run the conversation here (claimed, its actor loaded, as a send
        would) unless another live node owns it: NotOwnerError, and a front door that cannot
        forward piecemeal (A2A) sends its whole request there. Nothing to do on one node, nor
        for a conversation unknown or not ``user``'s."""
        if self._deps.storage.leases is not None and await self.users.owns(conversation_id, user):
            await self._registry.get(conversation_id)

    async def approve(self, conversation_id: str, call_id: str, approve: bool = True,
                      reason: str | None = None, *, user: str | None = None) -> MessageRecord:
        """See :meth:`agentik.api.ConversationView.approve` (``_answer``: a cluster forwards)."""
        return await self._answer(conversation_id, ApprovalAnswer(
            call_id=call_id, approve=approve, reason=reason), user, lambda o: o.approve(
            conversation_id, call_id, approve, reason))

    async def answer(self, conversation_id: str, call_id: str, text: str | None = None, *,
                     data: dict[str, Any] | None = None, user: str | None = None
                     ) -> MessageRecord:
        """See :meth:`agentik.api.ConversationView.answer`: ``text`` or ``data``, one."""
        if (text is None) == (data is None):
            raise InvalidInputError("an answer holds either text or data")
        return await self._answer(conversation_id, InputAnswer(
            call_id=call_id, text=text, data=data), user, lambda o: o.answer(
            conversation_id, call_id, text, data=data))

    async def _answer(self, conversation_id: str, answer: PauseAnswer, user: str | None,
                      forward: Callable[[AgentikAgent], Awaitable[MessageRecord]]
                      ) -> MessageRecord:  # Registry.answer, on the conversation's owner
        self._check_open()
        ops.check_looked_up(answer.call_id)
        await self.users.require(conversation_id, user)
        try:
            return await self._registry.answer(conversation_id, answer.call_id, answer)
        except NotOwnerError as exc:
            return await self.peers.forward(exc, forward)

    async def send(
        self,
        conversation_id: str,
        content: Sequence[Content] | Content | str,
        context: MessageContext | None = None,
        *,
        on_busy: str | None = None,
        idempotency_key: str | None = None,
        user: str | None = None,
    ) -> str:
        """See :meth:`agentik.api.ConversationView.send`: queue the message on the conversation's
        actor; returns the stored message's id. ``user``: refused as unknown unless the
        conversation is theirs. In a cluster, a conversation owned by another live node gets it
        through its owner."""
        items = as_content(content)  # the one list kept from here on
        self._check_open()
        if on_busy is not None and on_busy not in BUSY_POLICIES:
            raise InvalidInputError(f"on_busy must be one of {', '.join(BUSY_POLICIES)}, "
                                    f"got {on_busy!r}")
        check_content(items, self.config.image_rules)  # every front door's content, once
        await self.users.require(conversation_id, user)
        idem = self._idempotency(
            idempotency_key, f"send:{conversation_id}", [items, context], user)
        try:
            return await self._registry.submit(
                conversation_id, items, context, on_busy=on_busy, idempotency=idem)
        except NotOwnerError as exc:
            return await self.peers.forward(exc, lambda o: o.send(
                conversation_id, items, context, on_busy=on_busy,
                idempotency_key=idempotency_key))

    async def conversations_snapshot(
        self, offset: int = 0, limit: int = 100, *, user: str | None = None
    ) -> ConversationsSnapshot:
        """The conversation list (``user``'s only, if given) at a cursor: every change <= cursor
        is in it."""
        cursor = self._deps.storage.hub.current_cursor()  # cursor FIRST, then state
        offset, limit = check_non_negative("offset", offset), check_limit(limit)
        reader = self._deps.storage.reader
        conversations = await (
            reader.list_conversations(offset, limit) if user is None
            else reader.list_conversations_of(user, offset, limit))
        return ConversationsSnapshot(cursor=cursor, conversations=conversations)

    async def chat_snapshot(self, conversation_id: str, *, user: str | None = None) -> ChatSnapshot:
        """One conversation and its messages at a cursor. Raises NotFoundError (also for another
        ``user``'s)."""
        cursor = self._deps.storage.hub.current_cursor()  # cursor FIRST, then state
        await self.users.require(conversation_id, user)
        record = await self._deps.storage.reader.get_conversation(conversation_id)
        if record is None:
            raise NotFoundError(f"conversation {conversation_id!r} not found")
        messages = await self.current_branch(conversation_id)
        return ChatSnapshot(cursor=cursor, conversation=record, messages=messages)
