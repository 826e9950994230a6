"""Messages a conversation actor takes from its mailbox: a closed union, dispatched with ``match``.

``Turn`` is queued by ``send`` *before* the user message is stored, so the mailbox slot doubles as
the reservation that makes "mailbox full" (429) exact: a message is only stored when it is certain
to run. The actor waits for ``stored`` before it starts the turn and skips it if the store failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from opentelemetry.context import Context

from agentik import tracing
from agentik.actors.pausing import Resume
from agentik.errors import AgentikError
from agentik.storage import ops
from agentik.wire import Content, MessageContext, MessageRecord


@dataclass(eq=False)
class Turn:
    turn_id: str  # the user message's id
    #: the send's list, as the stored message and its working-memory item carry it
    content: list[Content]
    context: MessageContext | None
    #: started with its message, in the same commit (``ops.AppendUserMessage.start``: the
    #: conversation was idle, see ``ConversationHandle.submit``): the actor stores no StartTurn
    started: bool = False
    stored: trio.Event = field(default_factory=trio.Event)
    store_ok: bool = False
    #: cancelled while it waited in the mailbox (``ConversationHandle.cancel_turn``): never run
    withdrawn: bool = False
    #: set once the handle has tried to store the withdrawn turn's ending itself (``ending``);
    #: ``ended``: stored (True), not stored (False), or the outcome is unknown (None)
    withdrawal: trio.Event | None = None
    ending: ops.FinishTurn | None = None
    ended: bool | None = False
    #: a turn that waited for a person when its last actor went (``pausing.load_waiting``): it
    #: goes on from its pauses rather than from its message
    resume: Resume | None = None
    #: a branch turn (docs/PROTOCOL.md "Branches"): "edit" (its message is a new version of
    #: another), "regenerate" (a new answer to the user message ``of``; ``content`` is read when
    #: it starts) or "switch" (no model: the version ``of`` becomes current, stored by the actor,
    #: which then sets ``done`` with the BranchPoint record or the error refusing it)
    branch: str | None = None
    of: str | None = None
    idempotency: ops.Idempotency | None = None
    done: trio.Event = field(default_factory=trio.Event)
    outcome: MessageRecord | ops.Replayed | AgentikError | None = None
    #: the sender's trace context (its request's span), taken along to the actor's task, where
    #: the turn's span is its child (None while traces are off)
    trace: Context | None = field(default_factory=tracing.carry)

    def settle(self, ok: bool) -> None:
        self.store_ok = ok
        self.stored.set()


#: everything a conversation's mailbox carries (a closed union, matched with ``assert_never``;
#: interrupt and stop do not queue: they cancel scopes directly, see ``ConversationHandle``)
MailboxMessage = Turn
