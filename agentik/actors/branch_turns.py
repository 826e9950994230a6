"""Branch turns (docs/PROTOCOL.md "Branches"), a mixin of ``ConversationActor``: working memory
follows the current branch.

An edit's or a regenerate's turn, when it starts (in its place among the conversation's turns),
first replaces working memory after the system prompt by its branch's history as the journal
has it (``branches.memory_items``: compaction then runs as for any round that would not fit) and
closes the model session, which the next round opens from that memory. A switch is not a turn
of the model: its BranchPoint record and the new working memory are stored in one transaction.
"""

from __future__ import annotations

from agentik.actors import branches
from agentik.actors.branches import read_tree
from agentik.actors.deps import Deps
from agentik.actors.handle import ConversationHandle
from agentik.actors.memory import WorkingMemory
from agentik.actors.messages import Turn
from agentik.errors import AgentikError
from agentik.storage import ops
from agentik.wire import UserMessage


class BranchTurns:
    """What ``ConversationActor`` (which provides these attributes) does for branch turns."""

    h: ConversationHandle
    deps: Deps
    memory: WorkingMemory

    async def close_llm(self) -> None:
        raise NotImplementedError

    async def _memory_from(self) -> int:
        """The order_idx after the system prompt's (working memory's first item, kept by
        compaction too)."""
        items = await self.memory.items()
        return items[0][0] + 1 if items else 1

    async def _to_branch(self, turn: Turn) -> None:
        """Working memory for the edit or regenerate ``turn`` about to start: the history of
        its branch as it was when it was accepted (its own message left for its start). A
        regenerate's content is its user message's."""
        cid = self.h.conversation_id
        tree = await read_tree(self.deps.storage.reader, cid, until=turn.turn_id)
        path = tree.path()
        if turn.branch == "edit":
            path = path[:-1]  # its own message: its StartTurn puts it in
        elif path and isinstance(path[-1].message, UserMessage):
            turn.content = list(path[-1].message.content)
        await self.memory.write(ops.ResetMemory(
            conversation_id=cid, memory_from=await self._memory_from(),
            items=branches.memory_items(path)))
        await self.close_llm()

    async def _switch(self, turn: Turn) -> None:
        """Make the version ``turn.of`` current: its record and the branch's working memory, in
        one write; the caller hears the outcome through ``turn.done``."""
        cid = self.h.conversation_id
        try:
            assert turn.of is not None
            tree = await read_tree(self.deps.storage.reader, cid)
            path = tree.path(tree.descend(turn.of), current=False)
            turn.outcome = await self.memory.write(ops.SwitchBranch(
                conversation_id=cid, message_id=turn.turn_id, to=turn.of,
                memory_from=await self._memory_from(), items=branches.memory_items(path),
                idempotency=turn.idempotency))
            await self.close_llm()
        except AgentikError as exc:  # the caller's error (a message gone, a key reused, ...)
            turn.outcome = exc
        finally:
            turn.done.set()
