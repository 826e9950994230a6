"""Branches of a conversation in the in-process Agent API (docs/PROTOCOL.md "Branches"):
edit, regenerate, switch, fork, siblings and the current branch's messages; a mixin of
:class:`~agentik.agent.LocalAgent`.

What a version is and where the current branch goes is the journal's tree
(``actors/branches.py``), read here to check a request (which message, which user message an
answer answers) before anything is queued; the conversation's actor then moves working memory
when the branch turn's time comes (``actors/branch_turns.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentik.actors import branches
from agentik.actors.branches import read_tree
from agentik.agent_handles import MAX_PAGE, check_limit, check_non_negative
from agentik.api import as_content
from agentik.config import BUSY_POLICIES
from agentik.content import check_content
from agentik.errors import InvalidInputError, NotFoundError, NotOwnerError
from agentik.ids import new_id
from agentik.storage import ops
from agentik.wire import (
    ChatSnapshot,
    Content,
    MessageContext,
    MessageRecord,
    UserMessage,
)

if TYPE_CHECKING:
    from agentik.actors.deps import Deps
    from agentik.actors.registry import Registry
    from agentik.agent import LocalConversation
    from agentik.agent_users import UserScope
    from agentik.cluster import Peers
    from agentik.config import Config


class BranchCalls:
    """The branch calls of ``LocalAgent`` (which provides these attributes and methods)."""

    _deps: Deps
    _registry: Registry
    peers: Peers
    users: UserScope

    @property
    def config(self) -> Config:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def _idempotency(self, key: str | None, scope: str, body: object,
                     user: str | None = None) -> ops.Idempotency | None:
        raise NotImplementedError

    async def chat_snapshot(self, conversation_id: str, *, user: str | None = None
                            ) -> ChatSnapshot:
        raise NotImplementedError

    async def get_conversation(self, conversation_id: str, *, user: str | None = None
                               ) -> LocalConversation | None:
        raise NotImplementedError

    async def _tree(self, conversation_id: str, user: str | None) -> branches.Tree:
        self._check_open()
        await self.users.require(conversation_id, user)
        if await self._deps.storage.reader.get_conversation(conversation_id) is None:
            raise NotFoundError(f"conversation {conversation_id!r} not found")
        return await read_tree(self._deps.storage.reader, conversation_id)

    @staticmethod
    def _check_busy(on_busy: str | None) -> None:
        if on_busy is not None and on_busy not in BUSY_POLICIES:
            raise InvalidInputError(f"on_busy must be one of {', '.join(BUSY_POLICIES)}, "
                                    f"got {on_busy!r}")

    async def edit(
        self, conversation_id: str, message_id: str, content: Sequence[Content] | Content | str,
        context: MessageContext | None = None, *, on_busy: str | None = None,
        idempotency_key: str | None = None, user: str | None = None,
    ) -> str:
        """A new version of the user message ``message_id`` with ``content``, answered on the
        branch the message is on (a sibling of it: the current branch moves to it). Returns the
        new message's id (its turn's). The busy policy and an Idempotency-Key as for a send.
        Raises NotFoundError, InvalidInputError (not a user message), and what a send raises."""
        items = as_content(content)
        self._check_busy(on_busy)
        check_content(items, self.config.image_rules)
        tree = await self._tree(conversation_id, user)
        record = tree.records.get(message_id)
        if record is None:
            raise NotFoundError(f"message {message_id!r} not found in this conversation")
        if not isinstance(record.message, UserMessage):
            raise InvalidInputError(f"message {message_id!r} is not a user message: only what "
                                    "the user wrote can be edited (regenerate an answer)")
        idem = self._idempotency(idempotency_key, f"edit:{conversation_id}:{message_id}",
                                 [items, context], user)
        try:
            return await self._registry.submit_to(conversation_id, lambda h: h.edit(
                message_id, items, context, on_busy=on_busy, idempotency=idem), idem)
        except NotOwnerError as exc:
            return await self.peers.forward(exc, lambda o: o.edit(
                conversation_id, message_id, items, context, on_busy=on_busy,
                idempotency_key=idempotency_key))

    async def regenerate(
        self, conversation_id: str, message_id: str, *, on_busy: str | None = None,
        idempotency_key: str | None = None, user: str | None = None,
    ) -> str:
        """A new answer to the user message ``message_id`` answers (an answer's id, or the user
        message's own): a sibling of the answers it has, current from then on. Returns the new
        turn's id. The busy policy and an Idempotency-Key as for a send. Raises NotFoundError."""
        self._check_busy(on_busy)
        tree = await self._tree(conversation_id, user)
        versions = tree.versions(message_id)  # NotFoundError for a message not in it
        of = message_id if message_id in tree.parent else tree.user_of[versions[0]]
        idem = self._idempotency(idempotency_key, f"regenerate:{conversation_id}:{message_id}",
                                 [], user)
        try:
            return await self._registry.submit_to(conversation_id, lambda h: h.regenerate(
                of, on_busy=on_busy, idempotency=idem), idem)
        except NotOwnerError as exc:
            return await self.peers.forward(exc, lambda o: o.regenerate(
                conversation_id, message_id, on_busy=on_busy, idempotency_key=idempotency_key))

    async def switch_branch(
        self, conversation_id: str, message_id: str, *, on_busy: str | None = None,
        idempotency_key: str | None = None, user: str | None = None,
    ) -> ChatSnapshot:
        """Make the version ``message_id`` current, with the newest path below it, once the
        conversation's earlier turns are done (the busy policy as for a send); the model then
        sees that branch's history. Returns the conversation as it then is. Raises
        NotFoundError."""
        self._check_busy(on_busy)
        tree = await self._tree(conversation_id, user)
        if not tree.known(message_id):
            raise NotFoundError(f"message {message_id!r} not found in this conversation")
        idem = self._idempotency(idempotency_key, f"branch:{conversation_id}", [message_id],
                                 user)
        try:
            await self._registry.submit_to(conversation_id, lambda h: h.switch(
                message_id, on_busy=on_busy, idempotency=idem), idem)
        except NotOwnerError as exc:
            return await self.peers.forward(exc, lambda o: o.switch_branch(
                conversation_id, message_id, on_busy=on_busy, idempotency_key=idempotency_key))
        return await self.chat_snapshot(conversation_id, user=user)

    async def fork(
        self, conversation_id: str, message_id: str, *, title: str | None = None,
        idempotency_key: str | None = None, user: str | None = None, owner: str | None = None,
    ) -> LocalConversation:
        """A new conversation of the same agent (and instructions; ``owner``'s) whose history is
        this one's up to and including ``message_id`` (any version: the path to it). Its
        records are copies with their own ids and seqs (docs/PROTOCOL.md says why); both go on
        independently. Raises NotFoundError."""
        tree = await self._tree(conversation_id, user)
        path = tree.path_to(message_id)
        idem = self._idempotency(idempotency_key, f"fork:{conversation_id}",
                                 [message_id, title], owner)
        if idem is not None:
            replayed = await self._registry._replayed(idem)
            if replayed is not None:
                return await self._forked(replayed)
        source = await self._deps.storage.reader.get_conversation(conversation_id)
        assert source is not None  # _tree found it
        profile = self._deps.agent_of(source.agent, source.id).profile
        copies = branches.copies(tree, path)
        fork_id = new_id()
        records = [MessageRecord(id=i, seq=0, conversation_id=fork_id, created_at=0.0, message=m)
                   for i, m in copies]
        result: str | ops.Replayed = await self._deps.storage.write(ops.ForkConversation(
            conversation_id=fork_id, title=title if title is not None else source.title,
            system_prompt=profile.instructions if source.instructions is None
            else source.instructions, agent=profile.id, instructions=source.instructions,
            owner=owner, messages=copies, items=branches.memory_items(records), idempotency=idem))
        return await self._forked(result.result_id if isinstance(result, ops.Replayed)
                                  else result)

    async def _forked(self, fork_id: str) -> LocalConversation:
        conv = await self.get_conversation(fork_id)
        if conv is None:
            raise NotFoundError(f"conversation {fork_id!r} not found")
        return conv

    async def siblings(self, conversation_id: str, message_id: str, *, user: str | None = None
                       ) -> list[MessageRecord]:
        """Every version at ``message_id``'s place, oldest first (user messages; or each
        answer's last record), numbered. Raises NotFoundError."""
        return (await self._tree(conversation_id, user)).siblings(message_id)

    async def current_branch(self, conversation_id: str) -> list[MessageRecord]:
        """Every record of the current branch, in seq order (the snapshot's): one read of the
        tree when it has branches, else its journal's pages."""
        reader = self._deps.storage.reader
        if await reader.branched(conversation_id):
            return (await read_tree(reader, conversation_id)).listing()
        messages: list[MessageRecord] = []
        after = 0
        while True:
            page = await reader.get_messages(conversation_id, after, 0, MAX_PAGE)
            messages.extend(page)
            if len(page) < MAX_PAGE:
                return messages
            after = page[-1].seq

    async def branch_messages(self, conversation_id: str, after_seq: int = 0, offset: int = 0,
                              limit: int = 100) -> list[MessageRecord]:
        """The current branch's records with seq > ``after_seq``, in seq order, a page (what
        ``messages`` lists); a conversation never branched reads its journal's page."""
        after_seq, offset = check_non_negative("after_seq", after_seq), \
            check_non_negative("offset", offset)
        limit = check_limit(limit)
        reader = self._deps.storage.reader
        if not await reader.branched(conversation_id):
            return await reader.get_messages(conversation_id, after_seq, offset, limit)
        listing = (await read_tree(reader, conversation_id)).listing()
        return [r for r in listing if r.seq > after_seq][offset:offset + limit]
