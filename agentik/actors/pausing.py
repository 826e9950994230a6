"""A person in the loop, the waiting (docs/PROTOCOL.md, "A person in the loop"): the pauses of a
conversation's running turn, kept by its handle, and how an answer is taken.

A paused call is a journal record (``ApprovalRequest``, ``InputRequest``, stored with the round's
calls: ``ops.AppendToolCalls.pauses``) and its turn row is stored *waiting*, which start-up
recovery and a cluster's takeover leave as it is. So the pause outlives its actor: a new one (a
restart, another node) reads it back (:func:`load_waiting`) and waits again, with the same call
ids and deadlines.

One place decides an answer: the :class:`Pauses` of the conversation's handle, on the one node
that owns it, all in the trio thread. The first answer to an open pause claims it at once (no
await between the look and the claim) and is stored (``ops.AnswerPause``); the same answer again
gets the stored one; another, or any answer once the pause is closed (its turn ended: answered,
interrupted, denied by its deadline), is a ConflictError (409). An unknown call id is a
NotFoundError. So two clients answering at once get one answer stored, and the call runs once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec
import trio

from agentik import metrics
from agentik.actors.asking import NO_ANSWER
from agentik.actors.branches import read_tree
from agentik.errors import ConflictError, NotFoundError, RuntimeClosedError, StorageError
from agentik.ids import new_id
from agentik.storage import ops
from agentik.storage.actor import Storage
from agentik.storage.health import RETRY
from agentik.wire import (
    ApprovalAnswer,
    ApprovalRequest,
    BranchPoint,
    InputAnswer,
    InputRequest,
    MessageRecord,
    Pause,
    PauseAnswer,
    ToolCall,
    ToolCallSpec,
    ToolResult,
    UserMessage,
)

#: journal records read a page at a time (a resumed turn, an answer to a closed pause)
_PAGE = 1000


class Parked(Exception):
    """The actor was passivated while its turn waits (:meth:`Pauses.wait`): the turn stays
    waiting in storage, without a task; the next cold load resumes it."""


@dataclass(eq=False)
class Slot:
    """One pause of the running turn: its request, the answer that claimed it (being stored or
    stored), and the stored answer's record; ``settled`` is set each time a store ends."""

    request: Pause
    turn_id: str
    answer: PauseAnswer | None = None
    record: MessageRecord | None = None
    settled: trio.Event = field(default_factory=trio.Event)


@dataclass
class Resume:
    """A turn that waits for a person, read back from the journal: the rounds it had, its last
    round's calls still without a result (they run, in order, as their pauses are answered),
    its pauses."""

    rounds: int
    pending: list[ToolCallSpec]
    slots: list[Slot]


def same_answer(a: PauseAnswer, b: PauseAnswer) -> bool:
    """The person's answer, compared without the turn id it is stored with."""
    return msgspec.structs.replace(a, turn_id=None) == msgspec.structs.replace(b, turn_id=None)


def check_kind(request: Pause, answer: PauseAnswer) -> None:
    """An approval takes an approval's answer, a question an input's. Raises ConflictError."""
    if isinstance(request, ApprovalRequest) != isinstance(answer, ApprovalAnswer):
        waits = "an approval" if isinstance(request, ApprovalRequest) else "an answer"
        raise ConflictError(f"call {request.call_id!r} waits for {waits}, not this")


def answer_label(answer: PauseAnswer) -> str:
    """How a pause was answered, as ``agentik_pauses_total`` counts it."""
    if answer.timed_out:
        return "timed_out"
    if isinstance(answer, ApprovalAnswer):
        return "approved" if answer.approve else "refused"
    return "answered"


def timed_out(request: Pause) -> PauseAnswer:
    """The answer a pause gets when its deadline passes."""
    if isinstance(request, ApprovalRequest):
        return ApprovalAnswer(call_id=request.call_id, approve=False, reason=NO_ANSWER,
                              timed_out=True, turn_id=request.turn_id)
    return InputAnswer(call_id=request.call_id, timed_out=True, turn_id=request.turn_id)


class Pauses:
    """The open pauses of one conversation's running turn, by call id."""

    def __init__(self, storage: Storage, conversation_id: str) -> None:
        self.storage = storage
        self.conversation_id = conversation_id
        self.slots: dict[str, Slot] = {}

    def open(self, turn_id: str, pauses: Sequence[tuple[str, Pause]]) -> None:
        """The round's pauses, open from before they are stored: an answer that comes while
        they are is taken (its write is queued after theirs)."""
        for _, request in pauses:
            self.slots[request.call_id] = Slot(request=request, turn_id=turn_id)

    def add(self, slots: Sequence[Slot]) -> None:
        self.slots.update((slot.request.call_id, slot) for slot in slots)

    def close(self) -> None:
        """The turn ended (or its pauses were not stored): later answers are 409 (404 for a
        pause never stored), as the journal says (:func:`answered_before`)."""
        self.slots.clear()

    def question(self) -> Slot | None:
        """A question still waiting for its answer (the next message sent answers it; not a
        client-side tool's call, whose result is no message, nor a form a tool server asks)."""
        for slot in self.slots.values():
            request = slot.request
            if (isinstance(request, InputRequest) and request.tool is None
                    and request.schema is None and slot.answer is None):
                return slot
        return None

    async def answer(self, call_id: str, answer: PauseAnswer) -> MessageRecord | None:
        """Take ``answer`` for the open pause ``call_id`` and store it; the stored answer. None
        when no pause of the running turn has that id (the caller asks the journal). Raises
        ConflictError (another answer took it), StorageError (not stored: the pause stays
        open), NotFoundError (the conversation was deleted)."""
        slot = self.slots.get(call_id)
        if slot is None:
            return None
        check_kind(slot.request, answer)
        while slot.answer is not None:
            if not same_answer(slot.answer, answer):
                raise ConflictError(f"call {call_id!r} was already answered otherwise")
            if slot.record is not None:
                return slot.record
            await slot.settled.wait()  # the first one is being stored: its outcome
        slot.answer = msgspec.structs.replace(answer, turn_id=slot.turn_id)
        resume = all(s.answer is not None for s in self.slots.values() if s.turn_id == slot.turn_id)
        op = ops.AnswerPause(conversation_id=self.conversation_id, message_id=new_id(),
                             answer=slot.answer, turn_id=slot.turn_id, resume=resume)
        done = slot.settled  # what the actor and the same answer's callers wait on
        try:
            with trio.CancelScope(shield=True):  # the actor waits on its outcome
                slot.record = await self.storage.write(op)
        except BaseException:
            slot.answer = None  # not stored: the pause is open again
            raise
        finally:
            slot.settled = trio.Event()  # for the next attempt
            done.set()
        metrics.PAUSES.labels(answer_label(slot.answer)).inc()
        return slot.record

    async def wait(self, slot: Slot, idle: float, park: Callable[[], bool]) -> PauseAnswer:
        """The stored answer of ``slot``; its deadline passing stores the denial (unless a
        person's answer took it first). After ``idle`` seconds without an answer, ``park()``
        may passivate the actor (True): then Parked is raised, the turn is left waiting in
        storage (the next cold load reads it back). Raises StorageError when the denial cannot
        be stored."""
        deadline = slot.request.deadline
        while slot.record is None:
            if deadline is not None and time.time() >= deadline and slot.answer is None:
                try:
                    await self.answer(slot.request.call_id, timed_out(slot.request))
                except ConflictError:
                    pass  # a person's answer came first
                except (StorageError, RuntimeClosedError):
                    await trio.sleep(RETRY.maximum)  # the store refuses writes: again, later
                continue
            due = (trio.current_time() + max(0.0, deadline - time.time())
                   if deadline is not None and slot.answer is None else float("inf"))
            quiet = trio.current_time() + idle
            with trio.move_on_at(min(due, quiet)):
                await slot.settled.wait()
            if slot.answer is None and trio.current_time() >= quiet and park():
                raise Parked()
        answer = slot.record.message
        assert isinstance(answer, ApprovalAnswer | InputAnswer)
        return answer


async def answered_before(storage: Storage, conversation_id: str, call_id: str,
                          answer: PauseAnswer) -> MessageRecord:
    """An answer to a pause that is not open (its turn ended, or another actor holds it no
    more): the stored answer when it is the same one (an answer repeated: 200 again);
    ConflictError when the pause was answered otherwise, or never (the turn ended without it);
    NotFoundError when the conversation never had a pause ``call_id``."""
    request: Pause | None = None
    stored: MessageRecord | None = None
    for record in await _journal(storage, conversation_id, 0):
        message = record.message
        if isinstance(message, ApprovalRequest | InputRequest) and message.call_id == call_id:
            request, stored = message, None  # the latest one (ids are unique but for old ones)
        elif (request is not None and isinstance(message, ApprovalAnswer | InputAnswer)
              and message.call_id == call_id):
            stored = record
    if request is None:
        raise NotFoundError(f"no call {call_id!r} waits for an answer in conversation "
                            f"{conversation_id!r}")
    check_kind(request, answer)
    if stored is not None:
        given = stored.message
        assert isinstance(given, ApprovalAnswer | InputAnswer)
        if same_answer(given, answer) and not given.timed_out:
            return stored
        raise ConflictError(f"call {call_id!r} was already answered otherwise")
    raise ConflictError(f"call {call_id!r} no longer waits: its turn has ended")


async def load_waiting(storage: Storage, conversation_id: str
                       ) -> tuple[str, UserMessage, Resume] | None:
    """The conversation's turn that waits for a person, read back from the journal: (turn id,
    its user message, what it resumes with); None when no turn waits."""
    waiting = await storage.reader.waiting_turn(conversation_id)
    if waiting is None:
        return None
    turn_id, seq = waiting
    records = await _journal(storage, conversation_id, seq - 1)
    user = records[0].message if records else None
    if isinstance(user, BranchPoint):  # a regenerate's turn: the user message it answers
        user = (await read_tree(storage.reader, conversation_id)).records[user.message_id].message
    if not isinstance(user, UserMessage):
        return None  # its message is gone (cannot be: it is kept with the turn row)
    return turn_id, user, resume_of(turn_id, records[1:])


def resume_of(turn_id: str, records: Sequence[MessageRecord]) -> Resume:
    """What a waiting turn resumes with, from its journal records after its user message
    (pure): its rounds (a run of calls is one), its calls without a result, its pauses and
    their answers."""
    rounds, in_calls = 0, False
    calls: dict[str, ToolCallSpec] = {}
    slots: dict[str, Slot] = {}
    for record in records:
        message = record.message
        if getattr(message, "turn_id", turn_id) != turn_id:
            continue
        if isinstance(message, ToolCall):
            rounds += 0 if in_calls else 1
            in_calls = True
            calls[message.call_id] = ToolCallSpec(call_id=message.call_id, name=message.name,
                                                  arguments=message.arguments)
            continue
        in_calls = isinstance(message, ApprovalRequest | InputRequest) and in_calls
        if isinstance(message, ToolResult):
            calls.pop(message.call_id, None)
        elif isinstance(message, ApprovalRequest | InputRequest):
            slots[message.call_id] = Slot(request=message, turn_id=turn_id)
        elif isinstance(message, ApprovalAnswer | InputAnswer) and message.call_id in slots:
            slots[message.call_id].answer, slots[message.call_id].record = message, record
    return Resume(rounds=rounds, pending=list(calls.values()), slots=list(slots.values()))


async def _journal(storage: Storage, conversation_id: str, after_seq: int) -> list[MessageRecord]:
    out: list[MessageRecord] = []
    while True:
        page = await storage.reader.get_messages(conversation_id, after_seq, 0, _PAGE)
        out.extend(page)
        if len(page) < _PAGE:
            return out
        after_seq = page[-1].seq

