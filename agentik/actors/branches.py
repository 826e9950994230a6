"""A conversation's tree of versions, read from its journal (docs/PROTOCOL.md "Branches"): pure.

The journal stays append-only: nothing in it is moved or rewritten. Its records, in seq order,
are enough to rebuild the tree, because each change of branch is a record of its own (a
``BranchPoint``) at the place it happened, and every answer-side record (tool call, result,
answer, error) names its turn:

- a user message follows the answer that is current when it is accepted (the turns of a
  conversation run in the order they were accepted, so that is the answer it continues);
- ``BranchPoint(edit, M)``: the answer current becomes the one M followed (the user message
  after it, the edit, is then M's sibling);
- ``BranchPoint(regenerate, U)`` (its record id is the turn's id): a new answer to the user
  message U, current from then on;
- ``BranchPoint(switch, X)``: the version X with the newest path below it becomes current;
- an answer-side record belongs to its turn (``turn_id``), wherever it lands in the journal (a
  message queued behind a running turn is journaled before that turn's answer).

A node of the tree is a user message or an answer (a turn: its records, possibly none yet); the
current branch is the path from the root to the current answer. The versions at a user message's
place are the user messages following the same answer; at an answer's place, the answers to the
same user message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import msgspec

from agentik.errors import InvalidInputError, NotFoundError
from agentik.ids import new_id
from agentik.storage.ops import SourcedItems
from agentik.wire import (
    AssistantItem,
    AssistantMessage,
    BranchPoint,
    Error,
    Message,
    MessageRecord,
    ToolCall,
    ToolCallSpec,
    ToolItem,
    ToolResult,
    UserItem,
    UserMessage,
    WorkingItem,
)

if TYPE_CHECKING:
    from agentik.storage.engine import ReaderEngine

#: records read a page
_PAGE = 1000


async def read_tree(reader: ReaderEngine, conversation_id: str, *, until: str | None = None
                    ) -> Tree:
    """The conversation's tree from its journal (every page), or as it was when the record
    ``until`` was stored (the records up to it)."""
    records: list[MessageRecord] = []
    after = 0
    while True:
        page = await reader.journal(conversation_id, after, None, _PAGE)
        for record in page:
            records.append(record)
            if record.id == until:
                return Tree(records)
        if len(page) < _PAGE:
            return Tree(records)
        after = page[-1].seq


class Tree:
    """The tree of one conversation's records (given in seq order)."""

    def __init__(self, records: Iterable[MessageRecord]) -> None:
        self.records: dict[str, MessageRecord] = {}
        #: user message id -> the answer (turn id) it follows (None: the conversation's start)
        self.parent: dict[str, str | None] = {}
        #: answer (turn id; None: the start) -> the user messages following it, oldest first
        self.after: dict[str | None, list[str]] = {None: []}
        #: user message id -> the answers to it (turn ids), oldest first
        self.answers: dict[str, list[str]] = {}
        #: turn id -> its user message's id; its records, in seq order
        self.user_of: dict[str, str] = {}
        self.turn_records: dict[str, list[MessageRecord]] = {}
        #: answer-side record id -> its turn
        self.turn_of: dict[str, str] = {}
        #: the current answer (None: nothing said yet)
        self.leaf: str | None = None
        self.branched = False
        #: the user messages that are edits (each journaled right after its BranchPoint)
        self.edits: set[str] = set()
        self._edit_next = False
        for record in records:
            self._add(record)

    def _add(self, record: MessageRecord) -> None:
        self.records[record.id] = record
        message = record.message
        if isinstance(message, UserMessage):
            rid = record.id
            if self._edit_next:
                self.edits.add(rid)
                self._edit_next = False
            self.parent[rid] = self.leaf
            self.after.setdefault(self.leaf, []).append(rid)
            self._answer(rid, rid)
        elif isinstance(message, BranchPoint):
            self.branched = True
            target = message.message_id
            if message.kind == "edit" and target in self.parent:
                self.leaf = self.parent[target]
                self._edit_next = True
            elif message.kind == "regenerate" and target in self.answers:
                self._answer(target, record.id)
            elif message.kind == "switch" and self.known(target):
                self.leaf = self.descend(target)
        else:
            turn = message.turn_id
            if turn is None or turn not in self.turn_records:
                turn = self.leaf  # a record naming no turn (or one before any) ends the branch
            if turn is not None:
                self.turn_records[turn].append(record)
                self.turn_of[record.id] = turn

    def _answer(self, user: str, turn: str) -> None:
        self.answers.setdefault(user, []).append(turn)
        self.user_of[turn] = user
        self.turn_records[turn] = []
        self.leaf = turn

    def known(self, message_id: str) -> bool:
        """Whether ``message_id`` is a version of this tree (a user message, an answer's record
        or a regenerate's turn)."""
        return message_id in self.parent or message_id in self.turn_of or \
            message_id in self.user_of

    def _node(self, message_id: str) -> str:
        """The answer (turn id) a version names: a user message's newest answer, a record's
        turn, a regenerate's turn. Raises NotFoundError."""
        if message_id in self.answers:
            return self.answers[message_id][-1]
        if message_id in self.turn_of:
            return self.turn_of[message_id]
        if message_id in self.user_of:
            return message_id
        raise NotFoundError(f"message {message_id!r} not found in this conversation")

    def descend(self, message_id: str) -> str:
        """The answer a switch to ``message_id`` makes current: its version with the newest
        path below it. Raises NotFoundError."""
        turn = self._node(message_id)
        while users := self.after.get(turn):
            turn = self.answers[users[-1]][-1]
        return turn

    def path(self, leaf: str | None = None, *, current: bool = True) -> list[MessageRecord]:
        """The records from the start to the answer ``leaf`` (default: the current one), in
        the order of the branch."""
        turn = self.leaf if current and leaf is None else leaf
        out: list[MessageRecord] = []
        while turn is not None:
            user = self.user_of[turn]
            out[:0] = [self.records[user], *self.turn_records[turn]]
            turn = self.parent[user]
        return out

    def path_to(self, message_id: str) -> list[MessageRecord]:
        """The records from the start up to and including ``message_id`` (a fork's history).
        Raises NotFoundError, InvalidInputError for a branch point."""
        if message_id in self.parent:  # a user message: what it followed, then it
            return [*self.path(self.parent[message_id], current=False),
                    self.records[message_id]]
        if message_id not in self.turn_of:
            if message_id in self.records:
                raise InvalidInputError(f"{message_id!r} is a branch point, not a message")
            raise NotFoundError(f"message {message_id!r} not found in this conversation")
        path = self.path(self.turn_of[message_id], current=False)
        return path[:path.index(self.records[message_id]) + 1]

    def versions(self, message_id: str) -> list[str]:
        """The versions at ``message_id``'s place, oldest first: user message ids, or turn
        ids. Raises NotFoundError."""
        if message_id in self.parent:
            return self.after[self.parent[message_id]]
        turn = self.turn_of.get(message_id) or (message_id if message_id in self.user_of else None)
        if turn is None:
            raise NotFoundError(f"message {message_id!r} not found in this conversation")
        return self.answers[self.user_of[turn]]

    def siblings(self, message_id: str) -> list[MessageRecord]:
        """Every version at ``message_id``'s place, oldest first: the user messages, or each
        answer's last record (an answer still being made has none yet: left out)."""
        versions = self.versions(message_id)
        if message_id in self.parent:
            out = [self.records[version] for version in versions]
        else:
            out = [records[-1] for version in versions if (records := self.turn_records[version])]
        return [_numbered(r, i, len(out)) for i, r in enumerate(out)]

    def listing(self) -> list[MessageRecord]:
        """The current branch as ``messages`` lists it: in seq order (as the journal, so a
        message queued behind a turn comes before that turn's answer), each record with its
        versions' count and index."""
        out = []
        for record in sorted(self.path(), key=lambda r: r.seq):
            if record.id in self.parent:
                key, versions = record.id, self.versions(record.id)
            else:
                key = self.turn_of[record.id]
                versions = [v for v in self.versions(record.id) if self.turn_records[v] or v == key]
            out.append(_numbered(record, versions.index(key), len(versions)))
        return out


def _numbered(record: MessageRecord, index: int, count: int) -> MessageRecord:
    if count == 1:
        return record
    return msgspec.structs.replace(record, siblings=count, sibling_index=index)


def memory_items(path: Iterable[MessageRecord]) -> SourcedItems:
    """Working memory (after the system prompt) for a branch's records: what the model sees of
    that history (the ``source_message_id`` of each item alongside). A round's tool calls are one
    assistant item, as the turn stores them; errors are not for the model."""
    items: list[tuple[WorkingItem, str | None]] = []
    calls: list[ToolCallSpec] = []
    for record in path:
        message = record.message
        if calls and not isinstance(message, ToolCall):
            items.append((AssistantItem(content=[], tool_calls=calls), None))
            calls = []
        match message:
            case UserMessage(content=content):
                items.append((UserItem(content=content), record.id))
            case ToolCall(call_id=call_id, name=name, arguments=arguments):
                calls.append(ToolCallSpec(call_id=call_id, name=name, arguments=arguments))
            case ToolResult(call_id=call_id, name=name, content=text):
                items.append((ToolItem(call_id=call_id, name=name, content=text), record.id))
            case AssistantMessage(content=content) if content:
                items.append((AssistantItem(content=content), record.id))
            case _:
                pass  # an empty answer, an error, a branch point: nothing the model sees
    if calls:
        items.append((AssistantItem(content=[], tool_calls=calls), None))
    return tuple(items)


def copies(tree: Tree, path: Iterable[MessageRecord]) -> tuple[tuple[str, Message], ...]:
    """A fork's records: ``path``'s messages with new ids, each answer-side record naming its
    new user message as its turn (a regenerate's answer too: in the fork it is the one)."""
    ids: dict[str, str] = {}
    out: list[tuple[str, Message]] = []
    for record in path:
        message = record.message
        if isinstance(message, UserMessage):
            ids[record.id] = new_id()
            out.append((ids[record.id], message))
        elif isinstance(message, AssistantMessage | ToolCall | ToolResult | Error):
            turn = tree.turn_of[record.id]
            out.append((new_id(), msgspec.structs.replace(
                message, turn_id=ids[tree.user_of[turn]])))
    return tuple(out)
