"""``WorkingMemory``: a conversation actor's copy of its working memory (issue 13).

Before, every round read the conversation's whole working memory from storage (a worker-thread
hop, a query and a decode of every item: O(history) per round). The actor is the only writer of
its conversation's working memory while it runs (creation, recovery and lease claims happen
before an actor starts; a deleted or fenced-out conversation's actor is stopped), and every one of
its writes goes through :meth:`WorkingMemory.write` (``Storage.write_until_stored``), so the copy
is read once per actor incarnation and then kept in step with the actor's own writes:

- the ops that append one item (a turn's user message, a round's tool calls, a tool result, the
  answer) append it in the copy with the index the writers give it (the highest ``order_idx`` + 1,
  on SQLite and PostgreSQL alike), once the write has returned, i.e. is durable;
- the ops that remove or rewrite items (``Compact``, a ``FinishTurn`` with ``forget_from``) and any
  write that raised (refused, failed, cancelled: it may or may not be stored, or be stored later
  by the registry, see ``actors/ending.py``) drop the copy: the next read goes to storage again;
- any other op leaves the copy alone only if it cannot touch working memory.

A conversation the registry has just created starts with its copy given (``items``): its working
memory is the system prompt the creating write stored with it, at ``order_idx`` 1 (both writers
number a conversation's items from its highest + 1), so its first turn reads nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from agentik.storage import ops
from agentik.wire import WorkingItem

if TYPE_CHECKING:
    from agentik.storage.actor import Storage

Items = list[tuple[int, WorkingItem]]


R = TypeVar("R")

class WorkingMemory:
    """One conversation's working memory as (order_idx, item), read once, kept by own writes."""

    def __init__(self, storage: Storage, conversation_id: str, items: Items | None = None) -> None:
        """``items``: the working memory as stored, when the caller knows it (a conversation
        just created, module docstring); None: read it from storage when first needed."""
        self._storage = storage
        self._conversation_id = conversation_id
        self._items: Items | None = items

    async def items(self) -> Items:
        """The working memory in ``order_idx`` order (a copy: the caller may keep it)."""
        if self._items is None:
            self._items = await self._storage.reader.working_memory(self._conversation_id)
        return list(self._items)

    def invalidate(self) -> None:
        self._items = None

    def stored(self, op: ops.AnyOp) -> None:
        """``op`` was stored by another write of this actor's conversation, one this actor
        ordered (a turn's start stored with its user message, ``ops.AppendUserMessage.start``):
        the copy is brought in step as if :meth:`write` had stored it."""
        self._applied(op)

    async def write(self, op: ops.Op[R]) -> R:
        """``storage.write_until_stored(op)``, and the copy brought in step with it (module
        docstring). Raises what that raises."""
        try:
            result = await self._storage.write_until_stored(op)
        except BaseException:
            self._items = None
            raise
        self._applied(op)  # type: ignore[arg-type]  # an Op is an AnyOp (a closed union)
        return result

    def _applied(self, op: ops.AnyOp) -> None:
        if self._items is None:
            return
        item: WorkingItem | None = None
        match op:
            case ops.StartTurn() | ops.AppendToolCalls() | ops.AppendToolResult():
                item = op.item
            case ops.FinishTurn():
                if op.forget_from is not None:
                    self._items = None
                    return
                if op.assistant is not None:  # the writers store the item only with an answer
                    item = op.item
            case ops.RenameConversation() | ops.AppendUserMessage() | ops.PutA2ATask():
                return
            case _:
                self._items = None
                return
        if item is not None:
            last = self._items[-1][0] if self._items else 0
            self._items.append((last + 1, item))
