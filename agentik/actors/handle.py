"""``ConversationHandle``: what the registry hands out for a live conversation.

The handle outlives actor incarnations: the supervisor restarts a crashed actor with the same
handle, so the mailbox and its queued turns survive a crash. ``interrupt`` is not queued behind
turns: it cancels the running turn's scope directly.

``Keeper`` is the small protocol through which an actor tells whoever keeps its handle (the
``Registry``) that it is going idle or gone; the handle carries it, so nothing is patched into
``Deps``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import trio

from agentik import metrics
from agentik.actors import turn as logic
from agentik.actors.deps import AgentDeps, Deps
from agentik.actors.messages import MailboxMessage, Turn
from agentik.actors.pausing import Pauses
from agentik.errors import (
    AgentikError,
    BusyError,
    ConversationFailedError,
    MailboxFullError,
    NotFoundError,
    RuntimeClosedError,
    StorageError,
    StorageOutcomeUnknownError,
)
from agentik.ids import new_id
from agentik.storage import ops
from agentik.wire import (
    Content,
    End,
    InputAnswer,
    MessageContext,
    MessageRecord,
    Text,
    UserMessage,
    WorkingItem,
)


class HandleClosed(Exception):
    """The handle was passivated between lookup and send: look it up again (``Registry.submit``
    does)."""


class Keeper(Protocol):
    """What an actor asks of the keeper of its handle."""

    def passivate(self, handle: ConversationHandle) -> bool:
        """An idle actor asks to exit; False when a turn was queued meanwhile (keep serving)."""
        ...

    def forget(self, handle: ConversationHandle) -> None:
        """The actor is gone: the next lookup starts a fresh one."""
        ...

    def wake_at(self, conversation_id: str, deadline: float) -> None:
        """A passivated conversation's turn waits for a person until ``deadline`` (Unix
        seconds): load it again then, so its new actor stores the denial."""
        ...

    def unsettled(self, handle: ConversationHandle, pending: Sequence[ops.AnyOp]) -> None:
        """The actor was stopped before the store took its turn's ending: store ``pending``
        (in order, retried while the store refuses writes) before the conversation runs again."""
        ...


@dataclass(eq=False)
class ConversationHandle:
    conversation_id: str
    deps: Deps
    #: the agent the conversation belongs to: its backend, tools and busy policy
    agent: AgentDeps
    keeper: Keeper
    mailbox: trio.MemorySendChannel[MailboxMessage]
    inbox: trio.MemoryReceiveChannel[MailboxMessage]
    closed: bool = False
    failed: bool = False
    failed_until: float = 0.0
    current: Turn | None = None
    #: turns queued and not started yet, by id (``cancel_turn`` withdraws one)
    waiting: dict[str, Turn] = field(default_factory=dict)
    turn_scope: trio.CancelScope | None = None
    interrupt_requested: bool = False
    #: an interrupt of a turn that waited for a person, read back and not started again yet:
    #: its actor ends it as soon as it starts it (its pauses' calls get their failed results)
    interrupt_pending: bool = False
    actor_scope: trio.CancelScope | None = None
    #: the actor waits for its next turn in its mailbox loop (not running, storing or ending a
    #: turn, not crashed): with nothing queued either, a send's turn is the next thing the
    #: conversation does, so its start is stored with its message (one commit, not two)
    idle: bool = False
    exited: trio.Event = field(default_factory=trio.Event)
    crashes: deque[float] = field(default_factory=deque)
    #: the working memory of a conversation just created (its system prompt, as stored), for
    #: its first actor incarnation only (``take_memory``): a restarted one reads storage
    memory: list[tuple[int, WorkingItem]] | None = None
    #: the running turn's pauses: calls waiting for a person's answer (``pausing.py``)
    pauses: Pauses = field(init=False)

    def __post_init__(self) -> None:
        self.pauses = Pauses(self.deps.storage, self.conversation_id)

    def take_memory(self) -> list[tuple[int, WorkingItem]] | None:
        """The known working memory (once; None after, or when not known)."""
        memory, self.memory = self.memory, None
        return memory

    def busy(self) -> bool:
        """A turn is running, being stored or waiting in the mailbox."""
        return self.current is not None or self.queued() > 0

    async def submit(
        self,
        content: list[Content],
        context: MessageContext | None,
        *,
        on_busy: str | None = None,
        idempotency: ops.Idempotency | None = None,
    ) -> str:
        """Queue a turn and store its user message. Returns the message id once durable (for a
        replayed ``idempotency`` key: the first write's id, and nothing runs).

        While the running turn waits for the answer to a question, the message is that answer
        (its text; the id returned is the answer's record's).

        ``on_busy`` (default: the agent's busy policy) decides what a send to a busy conversation
        does: ``queue`` waits its turn, ``reject`` raises BusyError and stores nothing,
        ``interrupt`` interrupts the running turn and queues this one.

        Raises MailboxFullError, BusyError, ConversationFailedError, NotFoundError (deleted
        meanwhile), IdempotencyKeyReusedError, StorageError; HandleClosed if this handle was just
        passivated.
        """
        if self.pauses.question() is not None and not self.failed:
            return await self._answer_question(content)
        turn = self._queue(Turn(turn_id=new_id(), content=content, context=context), on_busy)
        return await self._store(turn, ops.AppendUserMessage(
            conversation_id=self.conversation_id, message_id=turn.turn_id,
            message=UserMessage(content=turn.content, context=turn.context),
            idempotency=idempotency,
            start=logic.user_item(turn.content) if turn.started else None))

    async def edit(self, of: str, content: list[Content], context: MessageContext | None, *,
                   on_busy: str | None = None, idempotency: ops.Idempotency | None = None) -> str:
        """As :meth:`submit`, for a new version of the user message ``of`` (docs/PROTOCOL.md
        "Branches"): its turn starts on the branch ``of`` is on, before ``of``."""
        turn = self._queue(Turn(turn_id=new_id(), content=content, context=context,
                                branch="edit", of=of), on_busy)
        return await self._store(turn, ops.AppendUserMessage(
            conversation_id=self.conversation_id, message_id=turn.turn_id,
            message=UserMessage(content=content, context=context), idempotency=idempotency,
            edit_of=of))

    async def regenerate(self, of: str, *, on_busy: str | None = None,
                         idempotency: ops.Idempotency | None = None) -> str:
        """Queue a new answer to the user message ``of``; returns its turn's id once stored."""
        turn = self._queue(Turn(turn_id=new_id(), content=[], context=None, branch="regenerate",
                                of=of), on_busy)
        return await self._store(turn, ops.Regenerate(
            conversation_id=self.conversation_id, turn_id=turn.turn_id, of=of,
            idempotency=idempotency))

    async def switch(self, to: str, *, on_busy: str | None = None,
                     idempotency: ops.Idempotency | None = None) -> str:
        """Make the version ``to`` current, in its place among the turns (the busy policy as
        for a send): returns its BranchPoint record's id once the actor has stored it."""
        turn = self._queue(Turn(turn_id=new_id(), content=[], context=None, branch="switch",
                                of=to, idempotency=idempotency), on_busy)
        turn.settle(True)  # nothing to store before its time: the actor stores it
        await turn.done.wait()
        if isinstance(turn.outcome, AgentikError):
            raise turn.outcome
        assert turn.outcome is not None
        return turn.outcome.result_id if isinstance(turn.outcome, ops.Replayed) else \
            turn.outcome.id

    def _queue(self, turn: Turn, on_busy: str | None) -> Turn:
        """Put ``turn`` in the mailbox, as ``on_busy`` (default: the agent's busy policy) says
        for a busy conversation: ``queue`` waits its turn, ``reject`` raises BusyError,
        ``interrupt`` interrupts the running turn and queues this one. Raises
        ConversationFailedError, MailboxFullError; HandleClosed."""
        if self.failed:
            raise ConversationFailedError(
                f"conversation {self.conversation_id!r} crashed too often and takes no more turns"
            )
        policy = on_busy or self.agent.profile.busy_policy
        busy = self.busy()
        if busy and policy == "reject":
            metrics.BUSY_REJECTIONS.inc()
            raise BusyError(f"conversation {self.conversation_id!r} is running a turn")
        handed = self.idle and not busy  # the actor waits in its mailbox: it gets this turn
        # a plain send to an idle conversation starts with its message; a branch turn first
        # moves working memory to its branch (the actor does, when it takes it)
        turn.started = handed and turn.branch is None
        try:
            self.mailbox.send_nowait(turn)
        except trio.WouldBlock:
            metrics.MAILBOX_REJECTIONS.inc()
            raise MailboxFullError(
                f"conversation {self.conversation_id!r} already has "
                f"{self.deps.config.mailbox_size} turns queued",
                retry_after=1.0,
            ) from None
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise HandleClosed() from None
        self.waiting[turn.turn_id] = turn  # until the actor takes it (run_turn)
        # Not idle from here on, even before the actor runs: the turn was handed to it directly
        # (the mailbox looks empty), and a second send must not start before this one; and it
        # is the conversation's current turn already, so a second send sees it busy (on_busy).
        self.idle = False
        if handed:
            self.current = turn
        if busy and policy == "interrupt":
            self.interrupt()
        return turn

    async def _answer_question(self, content: list[Content]) -> str:
        """A message sent while a question waits is its answer (its text): the answer's id."""
        question = self.pauses.question()
        assert question is not None
        call_id = question.request.call_id
        text = "\n".join(c.body for c in content if isinstance(c, Text))
        record = await self.pauses.answer(call_id, InputAnswer(call_id=call_id, text=text))
        assert record is not None  # the pause is open: it takes it, or raises
        return record.id

    async def _store(self, turn: Turn, op: ops.AppendUserMessage | ops.Regenerate) -> str:
        """Store the queued ``turn``'s user message (or regenerate record) and settle the turn
        (run it or skip it)."""
        ok = False
        try:
            # Shielded: once queued, the store must finish and settle the turn, or the actor
            # would wait on it and the turn row would dangle.
            with trio.CancelScope(shield=True):
                result: MessageRecord | ops.Replayed = await self.deps.storage.write(op)
            if isinstance(result, ops.Replayed):
                return result.result_id  # a retry that raced its first write: nothing runs
            ok = True
            return result.id
        finally:
            turn.settle(ok)

    async def cancel_turn(self, turn_id: str) -> bool:
        """Cancel one turn: one still waiting in the mailbox is withdrawn (it ends Interrupted
        at once, and the actor skips it when it comes to it: it is never run), the running one
        is interrupted. False when it is neither (it has ended, or is not this conversation's)."""
        waiting = self.waiting.get(turn_id)
        if waiting is not None and waiting.resume is not None:
            self.interrupt_pending = True  # a waiting turn read back: interrupted, not withdrawn
            return True
        if waiting is not None:
            if not waiting.withdrawn:
                waiting.withdrawn = True
                if not waiting.started:  # else the actor is about to take it: it ends it
                    await self._end_withdrawn(waiting)
            return True
        if self.current is not None and self.current.turn_id == turn_id:
            return self.interrupt()
        return False

    async def _end_withdrawn(self, turn: Turn) -> None:
        """Store a withdrawn turn's ending now rather than when its time comes: its turn row
        would stay open until then, and a restart meanwhile runs the open turns it finds. The
        actor skips the turn once this is stored, and ends it itself when it is not."""
        turn.withdrawal = done = trio.Event()
        try:
            with trio.CancelScope(shield=True):  # the actor waits on the outcome
                await turn.stored.wait()
                if not turn.store_ok:
                    return
                state = logic.TurnState(conversation_id=self.conversation_id,
                                        turn_id=turn.turn_id)
                (ending,) = logic.end(state, logic.Interrupted())  # nothing pending: one op
                assert isinstance(ending, ops.FinishTurn)
                turn.ending, turn.ended = ending, None
                await self.deps.storage.write(ending)
                turn.ended = True
        except NotFoundError:
            turn.ended = True  # deleted meanwhile: nothing left to end
        except StorageOutcomeUnknownError:
            turn.ended = None  # the actor stores it rechecked
        except (StorageError, RuntimeClosedError):
            turn.ended = False  # the actor ends it when it comes to it
        finally:
            done.set()
        if turn.ended:
            self.deps.storage.hub.publish_online(self.conversation_id, End(turn_id=turn.turn_id))

    def interrupt(self) -> bool:
        """Cancel the running turn, if any. Returns whether a turn was running."""
        if self.turn_scope is None:
            if any(turn.resume is not None for turn in self.waiting.values()):
                self.interrupt_pending = True
                return True
            return False
        self.interrupt_requested = True
        self.turn_scope.cancel()
        return True

    def queued(self) -> int:
        return self.mailbox.statistics().current_buffer_used
