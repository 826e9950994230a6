"""The ops of branches (docs/PROTOCOL.md "Branches"), members of :data:`agentik.storage.ops.AnyOp`
(import them from there; kept here to keep ``ops.py`` within its size). Defined once, for both
engines, in ``storage/apply.py``; none needs a primitive of its own."""

from __future__ import annotations

from agentik.storage.op_base import Idempotency, Op, Replayed
from agentik.wire import Message, MessageRecord, WorkingItem

#: working-memory items with the message each came from (``source_message_id``)
SourcedItems = tuple[tuple[WorkingItem, str | None], ...]


class Regenerate(Op[MessageRecord | Replayed], frozen=True, kw_only=True):
    """A new answer to the user message ``of``: its BranchPoint record (id ``turn_id``, event
    ``branch_changed``) and its turn, queued (a ``StartTurn`` with no item starts it)."""

    conversation_id: str
    turn_id: str
    of: str
    idempotency: Idempotency | None = None


class SwitchBranch(Op[MessageRecord | Replayed], frozen=True, kw_only=True):
    """Make the version ``to`` current: its BranchPoint record (``message_id``, event
    ``branch_changed``) and working memory from ``memory_from`` on replaced by ``items`` (the
    branch's history), in one transaction."""

    conversation_id: str
    message_id: str
    to: str
    memory_from: int
    items: SourcedItems
    idempotency: Idempotency | None = None


class ResetMemory(Op[None], frozen=True, kw_only=True):
    """Working memory from ``memory_from`` on replaced by ``items`` (an edit's or regenerate's
    turn starting on its branch: no event, its BranchPoint was journaled when it was accepted)."""

    conversation_id: str
    memory_from: int
    items: SourcedItems


class ForkConversation(Op[str | Replayed], frozen=True, kw_only=True):
    """A new conversation (as ``CreateConversation`` makes one, never temporary) whose history
    is ``messages`` (copies of another's branch with new ids: each record is its own
    conversation's, with its seq; docs/PROTOCOL.md says why) and whose working memory after its
    system prompt is ``items``. Returns its id."""

    conversation_id: str
    title: str | None
    system_prompt: str
    agent: str
    instructions: str | None
    owner: str | None
    messages: tuple[tuple[str, Message], ...]
    items: SourcedItems
    idempotency: Idempotency | None = None
