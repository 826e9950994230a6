"""Registry: owns the map conversation id -> live ConversationHandle.

It creates conversations, cold-loads them from storage on demand, and forgets them when they are
passivated, deleted or failed. All its state changes happen between awaits of the one trio thread,
so "look up, else start" is atomic; a per-id loading event makes concurrent cold loads of the same
id share one actor. It is the ``Keeper`` of every handle it hands out.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import trio

from agentik import metrics
from agentik.actors.branches import read_tree
from agentik.actors.deps import AgentDeps, Deps
from agentik.actors.handle import ConversationHandle, HandleClosed
from agentik.actors.messages import MailboxMessage, Turn
from agentik.actors.pausing import answered_before, load_waiting
from agentik.actors.supervisor import supervise
from agentik.errors import (
    NotFoundError,
    RuntimeClosedError,
    StorageError,
    StorageUnavailableError,
)
from agentik.ids import new_id
from agentik.storage import ops
from agentik.storage.health import RETRY
from agentik.wire import (
    BranchPoint,
    Content,
    ConversationRecord,
    MessageContext,
    MessageRecord,
    PauseAnswer,
    SystemItem,
    UserMessage,
    WorkingItem,
)

log = logging.getLogger(__name__)

#: lookups a send makes when the handle it found keeps being passivated under it
_SUBMIT_ATTEMPTS = 3


class Registry:
    def __init__(self, deps: Deps, nursery: trio.Nursery) -> None:
        self.deps = deps
        self.nursery = nursery
        self.live: dict[str, ConversationHandle] = {}
        self._loading: dict[str, trio.Event] = {}
        #: conversation id -> the ending ops a stopped actor left unstored (``unsettled``), and
        #: the event set once they are stored or dropped
        self._unsettled: dict[str, tuple[list[ops.AnyOp], trio.Event]] = {}
        #: (deadline, conversation id) of passivated turns waiting for a person (``wake_at``)
        self._wakeups: list[tuple[float, str]] = []
        self._wakeup_added = trio.Event()

    async def _start(
        self, conversation_id: str, agent: AgentDeps,
        memory: list[tuple[int, WorkingItem]] | None = None,
    ) -> ConversationHandle:
        """Start the conversation's actor for its ``agent``; ``memory``: its working memory when
        known (a conversation just created: its first turn then reads none)."""
        await self._settled(conversation_id)
        leases = self.deps.storage.leases
        if leases is not None:  # a PostgreSQL cluster: own it first (NotOwnerError if not ours)
            await leases.claim(conversation_id)
        queued = [] if memory is not None else await self._queued(conversation_id)
        waiting = None if memory is not None else await load_waiting(self.deps.storage,
                                                                     conversation_id)
        if waiting is not None:  # it waited for a person: it comes first, and waits again
            turn_id, user, resume = waiting
            paused = Turn(turn_id=turn_id, content=list(user.content), context=user.context,
                          started=True, trace=None, resume=resume)
            paused.settle(True)
            queued.insert(0, paused)
            log.info("conversation %s: turn %s waits for a person again", conversation_id,
                     turn_id, extra={"conversation_id": conversation_id, "turn_id": turn_id})
        send, recv = trio.open_memory_channel[MailboxMessage](
            max(self.deps.config.mailbox_size, len(queued)))
        for turn in queued:  # before any send can queue behind them: they came first
            send.send_nowait(turn)
        handle = ConversationHandle(conversation_id, self.deps, agent, self, send, recv,
                                    memory=memory)
        handle.waiting.update((turn.turn_id, turn) for turn in queued)  # cancel_turn finds them
        if waiting is not None:
            handle.pauses.add(waiting[2].slots)  # answers are taken before the actor runs
        self.live[conversation_id] = handle
        metrics.LIVE_CONVERSATIONS.inc()
        await self.nursery.start(partial(supervise, handle))
        return handle

    async def _queued(self, conversation_id: str) -> list[Turn]:
        """The turns accepted (202) and not started when the conversation's last actor went (a
        kill, a restart, a node lost): they run first, in order, as stored turns."""
        rows = await self.deps.storage.reader.queued_turns(conversation_id)
        turns = []
        # which are edits: the tree knows (a restart's rare path: the journal is read once)
        edits = (await read_tree(self.deps.storage.reader, conversation_id)).edits if rows else ()
        for turn_id, message in rows:
            # trace=None: their senders' contexts died with the process; not whoever woke us
            if isinstance(message, BranchPoint):  # a regenerate's (docs/PROTOCOL.md "Branches")
                turn = Turn(turn_id=turn_id, content=[], context=None, trace=None,
                            branch="regenerate", of=message.message_id)
            else:
                assert isinstance(message, UserMessage)  # else a turn row's is its user message
                turn = Turn(turn_id=turn_id, content=list(message.content),
                            context=message.context, trace=None,
                            branch="edit" if turn_id in edits else None)
            turn.settle(True)
            turns.append(turn)
        if turns:
            log.info("conversation %s: %d accepted turns resumed", conversation_id, len(turns),
                     extra={"conversation_id": conversation_id})
        return turns

    async def resume_queued(self) -> None:
        """Start-up: load every conversation with queued turns, so they are answered without
        waiting for a send (one another live node owns is left to it)."""
        for conversation_id in await self.deps.storage.reader.conversations_with_queued_turns():
            await self.resume(conversation_id)

    async def resume(self, conversation_id: str) -> None:
        """Load the conversation (its queued turns run); a conversation this node cannot own
        now is skipped, its owner runs them."""
        try:
            await self.get(conversation_id)
        except (StorageError, RuntimeClosedError) as exc:  # NotOwnerError, LeaseLostError too
            log.info("conversation %s: its queued turns are not resumed here: %s",
                     conversation_id, exc, extra={"conversation_id": conversation_id})

    async def create(
        self, *, temp: bool, title: str | None = None, idempotency: ops.Idempotency | None = None,
        agent: str | None = None, instructions: str | None = None, owner: str | None = None,
    ) -> ConversationRecord:
        """Store a new conversation of ``agent`` (None: the default one) with its system prompt
        (``instructions``, else its agent's), atomically, and start its actor. A replayed
        ``idempotency`` key returns the conversation its first write made. Raises StorageError,
        IdempotencyKeyReusedError, NotFoundError (an unknown agent; replay of a deleted one)."""
        profile = self.deps.profiles.get(agent)
        if idempotency is not None:
            replayed = await self._replayed(idempotency)
            if replayed is not None:
                return await self._replayed_conversation(replayed)
        conversation_id = new_id()
        system_prompt = profile.instructions if instructions is None else instructions
        result: ConversationRecord | ops.Replayed = await self.deps.storage.write(
            ops.CreateConversation(
                conversation_id=conversation_id, title=title, is_temporal=temp,
                system_prompt=system_prompt, idempotency=idempotency,
                agent=profile.id, instructions=instructions, owner=owner,
            )
        )
        if isinstance(result, ops.Replayed):
            return await self._replayed_conversation(result.result_id)
        # Its working memory is what that write stored: the system prompt, the first item
        # (order_idx 1 in both writers), so the actor need not read it back (issue 13).
        await self._start(conversation_id, self.deps.agents[profile.id],
                          memory=[(1, SystemItem(text=system_prompt))])
        return result

    async def _replayed(self, idem: ops.Idempotency) -> str | None:
        """The result id stored under ``idem.key`` (None: not stored, or expired). The writer
        checks again inside its transaction; this read only spares the common retry a write.
        Raises IdempotencyKeyReusedError."""
        stored = await self.deps.storage.reader.idempotency_key(idem.key, time.time())
        replayed = ops.replay(stored, idem)
        return None if replayed is None else replayed.result_id

    async def _replayed_conversation(self, conversation_id: str) -> ConversationRecord:
        record = await self.deps.storage.reader.get_conversation(conversation_id)
        if record is None:
            raise NotFoundError(f"conversation {conversation_id!r} (made by this "
                                "Idempotency-Key) was deleted")
        return record

    async def get(self, conversation_id: str) -> ConversationHandle | None:
        """The live handle, cold-loading the conversation if it exists. None if unknown."""
        while True:
            handle = self.live.get(conversation_id)
            if handle is not None and handle.failed and time.monotonic() >= handle.failed_until:
                self.forget(handle)  # the circuit opens again: a fresh actor gets a new chance
                handle = None
            if handle is not None and not handle.closed:
                return handle
            loading = self._loading.get(conversation_id)
            if loading is None:
                break
            await loading.wait()
        event = self._loading[conversation_id] = trio.Event()
        try:
            record = await self.deps.storage.reader.get_conversation(conversation_id)
            if record is None:
                return None
            return await self._start(
                conversation_id, self.deps.agent_of(record.agent, conversation_id))
        finally:
            del self._loading[conversation_id]
            event.set()

    async def submit(
        self,
        conversation_id: str,
        content: list[Content],
        context: MessageContext | None,
        *,
        on_busy: str | None = None,
        idempotency: ops.Idempotency | None = None,
    ) -> str:
        """Queue a turn on the conversation (cold-loading it) and store its user message; returns
        the stored message's id (a replayed ``idempotency`` key: the first one's, nothing runs).
        A handle passivated between lookup and send is looked up again. Raises NotFoundError,
        MailboxFullError, BusyError, ConversationFailedError, IdempotencyKeyReusedError,
        StorageError, RuntimeClosedError."""
        return await self.submit_to(conversation_id, lambda handle: handle.submit(
            content, context, on_busy=on_busy, idempotency=idempotency), idempotency)

    async def submit_to(self, conversation_id: str,
                        call: Callable[[ConversationHandle], Awaitable[str]],
                        idempotency: ops.Idempotency | None) -> str:
        """``call`` on the conversation's handle (cold-loading it; a replayed ``idempotency``
        key returns the first write's id and calls nothing), looked up again when it was
        passivated meanwhile: a send, an edit, a regenerate, a switch. Raises NotFoundError,
        RuntimeClosedError and what ``call`` raises."""
        if idempotency is not None:
            replayed = await self._replayed(idempotency)
            if replayed is not None:
                return replayed
        for _ in range(_SUBMIT_ATTEMPTS):
            handle = await self.get(conversation_id)
            if handle is None:
                raise NotFoundError(f"conversation {conversation_id!r} not found")
            try:
                return await call(handle)
            except HandleClosed:
                continue
        raise RuntimeClosedError(f"conversation {conversation_id!r} keeps closing")

    async def answer(self, conversation_id: str, call_id: str, answer: PauseAnswer
                     ) -> MessageRecord:
        """Answer the pause ``call_id`` of the conversation's running turn (cold-loading it: a
        turn that waits is read back with its pauses); the stored answer (``pausing.py``: the
        same answer again gets it again). Raises NotFoundError (no such conversation or pause),
        ConflictError (answered otherwise, or its turn has ended), NotOwnerError, StorageError."""
        handle = await self.get(conversation_id)
        if handle is None:
            raise NotFoundError(f"conversation {conversation_id!r} not found")
        record = await handle.pauses.answer(call_id, answer)
        if record is None:
            record = await answered_before(self.deps.storage, conversation_id, call_id, answer)
        return record

    async def cancel_turn(self, conversation_id: str, turn_id: str) -> bool:
        """Withdraw the turn ``turn_id`` while it waits, or interrupt it while it runs
        (``ConversationHandle.cancel_turn``); False when it does neither here (ended, unknown,
        or its conversation is passivated: no turn waits then, but one that waits for a person,
        loaded to end it). Raises NotOwnerError when another node owns the conversation,
        NotFoundError for an unknown one."""
        handle = await self._live_or_waiting(conversation_id)
        if handle is not None:
            return await handle.cancel_turn(turn_id)
        if self.deps.storage.leases is not None:
            await self.deps.storage.leases.check_remote(conversation_id)
        if await self.deps.storage.reader.get_conversation(conversation_id) is None:
            raise NotFoundError(f"conversation {conversation_id!r} not found")
        return False

    async def interrupt(self, conversation_id: str) -> bool:
        """Cancel the conversation's running turn (or its turn waiting for a person, passivated
        or not); False when none runs. Raises NotFoundError."""
        handle = await self._live_or_waiting(conversation_id)
        if handle is not None:
            return handle.interrupt()
        if self.deps.storage.leases is not None:  # a cluster: its turn may run on its owner
            await self.deps.storage.leases.check_remote(conversation_id)
        if await self.deps.storage.reader.get_conversation(conversation_id) is None:
            raise NotFoundError(f"conversation {conversation_id!r} not found")
        return False

    async def _live_or_waiting(self, conversation_id: str) -> ConversationHandle | None:
        """The live handle; else, when the conversation has a turn waiting for a person, the
        handle of the actor loaded for it (an interrupt ends that turn); else None."""
        handle = self.live.get(conversation_id)
        if handle is None and await self.deps.storage.reader.waiting_turn(conversation_id):
            handle = await self.get(conversation_id)
        return handle

    def passivate(self, handle: ConversationHandle) -> bool:
        """Called by an idle actor. Succeeds only with an empty mailbox; closing the mailbox in
        the same step makes a sender holding the old handle retry through ``get``."""
        if handle.queued():
            return False
        handle.closed = True
        handle.mailbox.close()
        self.forget(handle)
        return True

    def wake_at(self, conversation_id: str, deadline: float) -> None:
        """Keeper: load the passivated conversation at its waiting turn's ``deadline``."""
        heapq.heappush(self._wakeups, (deadline, conversation_id))
        self._wakeup_added.set()

    async def run_wakeups(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                          ) -> None:
        """The one timer of the passivated turns that wait with a deadline (``wake_at``): at
        each deadline their conversation is loaded, and its actor stores the denial. (After a
        restart, start-up loads every waiting conversation: its actor keeps the time.)"""
        task_status.started()
        while True:
            self._wakeup_added = trio.Event()
            due = (trio.current_time() + self._wakeups[0][0] - time.time() if self._wakeups
                   else float("inf"))
            with trio.move_on_at(due):
                await self._wakeup_added.wait()
            while self._wakeups and self._wakeups[0][0] <= time.time():
                _, conversation_id = heapq.heappop(self._wakeups)
                if conversation_id not in self.live:
                    await self.resume(conversation_id)

    def unsettled(self, handle: ConversationHandle, pending: Sequence[ops.AnyOp]) -> None:
        """Keeper: an actor stopped (a delete, a lease lost, a shutdown) while the store refused
        its turn's ending. A task stores ``pending`` in order, retried until stored (a deleted
        conversation's are dropped), so the turn gets its terminal record without a restart;
        the conversation is not loaded again before (``_settled``)."""
        cid = handle.conversation_id
        if cid in self._unsettled:
            self._unsettled[cid][0].extend(pending)
            return
        self._unsettled[cid] = (list(pending), trio.Event())
        self.nursery.start_soon(self._settle, cid)

    async def _settle(self, conversation_id: str) -> None:
        pending, done = self._unsettled[conversation_id]
        try:
            while pending:
                try:
                    await self.deps.storage.write_until_stored(pending[0])
                except NotFoundError:
                    pass  # deleted meanwhile: nothing left to close
                except (StorageError, RuntimeClosedError) as exc:  # start-up recovery closes it
                    log.error("could not store the end of a turn of %s: %s", conversation_id, exc,
                              extra={"conversation_id": conversation_id})
                    return
                pending.pop(0)
        finally:
            del self._unsettled[conversation_id]
            done.set()

    async def _settled(self, conversation_id: str) -> None:
        """Before a conversation runs again: the ending its stopped actor left is stored. Raises
        StorageUnavailableError (503) instead of waiting while the store refuses writes."""
        entry = self._unsettled.get(conversation_id)
        if entry is None:
            return
        health = self.deps.storage.health
        if health.writable:
            with trio.move_on_after(2 * RETRY.maximum):  # a retry's wait, at most
                await entry[1].wait()
        if conversation_id in self._unsettled:
            raise StorageUnavailableError(
                f"conversation {conversation_id!r} is still closing a turn the store refused"
                + (f": {health.error}" if health.error else ""))

    def forget(self, handle: ConversationHandle) -> None:
        handle.closed = True
        if self.live.get(handle.conversation_id) is handle:
            del self.live[handle.conversation_id]
            metrics.LIVE_CONVERSATIONS.dec()

    async def stop(self, conversation_id: str) -> None:
        """Cancel the conversation's actor (its turn ends with a terminal record) and wait."""
        handle = self.live.get(conversation_id)
        if handle is None:
            return
        handle.closed = True
        # Cancel first, then close: an idle actor must see the cancellation, not an
        # EndOfChannel it would take for a crash.
        if handle.actor_scope is not None:
            handle.actor_scope.cancel()
        handle.mailbox.close()
        await handle.exited.wait()
        self.forget(handle)
