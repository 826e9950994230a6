"""How a turn ends: the ConversationActor's endings, a mixin of ``ConversationActor``.

A turn ends once, with its answer or through ``_end`` (failed, interrupted, cancelled, crashed:
the ops ``turn.end`` gives keep what the user saw). Every op of an ending is stored with
``Storage.write_until_stored``: while the store refuses writes (a full disk, a read-only
database) it is retried with bounded backoff, so the turn gets its terminal record as soon as
the store accepts writes again, without a restart. Only a cancel between attempts (shutdown,
the conversation stopped) ends the retries: the ops not stored are then handed to the registry,
which goes on storing them (``Registry.unsettled``); at a shutdown, start-up recovery closes
the turn instead.

A turn ends with exactly one terminal record, also when an attempt's outcome is unknown
(PostgreSQL, the connection lost with its commit in flight: StorageOutcomeUnknownError): the
retries are then of the op's rechecked form (``ops.rechecked``), which stores nothing if the
first attempt was stored and returns what is, so the answer is never stored twice nor followed
by a storage Error. The op handed over after a cancel was attempted: it is handed over
rechecked too (its outcome may be that unknown one).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio

from agentik import metrics
from agentik.actors import turn as logic
from agentik.actors.deps import Deps
from agentik.actors.handle import ConversationHandle
from agentik.actors.memory import WorkingMemory
from agentik.actors.messages import Turn
from agentik.errors import NotFoundError, RuntimeClosedError, StorageError
from agentik.storage import ops
from agentik.wire import End, OnlineEvent

log = logging.getLogger("agentik.actors.conversation")


def turn_fields(conversation_id: str, turn_id: str | None) -> dict[str, str | None]:
    """A turn line's context for structured logs (AGENTIK_LOG_FORMAT=json)."""
    return {"conversation_id": conversation_id, "turn_id": turn_id}


class TurnEndings:
    """The endings of ``ConversationActor`` (which provides these attributes and methods)."""

    h: ConversationHandle
    deps: Deps
    memory: WorkingMemory

    async def close_llm(self) -> None:
        raise NotImplementedError

    def online(self, event: OnlineEvent) -> None:
        raise NotImplementedError

    async def _end(self, state: logic.TurnState, ending: logic.Ending) -> None:
        """The one way a turn ends without its answer (failed, interrupted, cancelled, crashed):
        store the ops ``turn.end`` gives, then End. The model session is never reused (a failed
        or cancelled session may be mid-answer): the next turn opens a new one from working
        memory."""
        closing = logic.end(state, ending)
        with trio.CancelScope(shield=True):
            await self.close_llm()
        try:
            for i, op in enumerate(closing):
                try:
                    await self._store_ending(op)
                except trio.Cancelled:
                    self._hand_over([ops.rechecked(op), *closing[i + 1:]])
                    raise
        finally:
            self.online(End(turn_id=state.turn_id))

    def _hand_over(self, pending: Sequence[ops.AnyOp]) -> None:
        """The actor is stopped (deleted, shut down) while the store refuses its turn's ending:
        the registry stores ``pending`` for it (see ``Registry.unsettled``)."""
        log.warning("conversation %s stopped before its turn's end was stored: handed over",
                    self.h.conversation_id, extra=turn_fields(self.h.conversation_id, None))
        self.h.keeper.unsettled(self.h, pending)

    async def _store_answer(self, state: logic.TurnState, op: ops.FinishTurn) -> None:
        """Store the answer (retried while the store refuses writes, rechecked after an unknown
        outcome: module docstring), then End. If the database refuses the answer itself (not
        the store being full), the turn ends with that error: nothing of the answer is stored
        then (a rechecked retry that found it stored returns, it does not fail)."""
        try:
            await self.memory.write(op)
        except StorageError as exc:
            log.error("the answer of turn %s could not be stored: %s", state.turn_id, exc,
                      extra=turn_fields(self.h.conversation_id, state.turn_id))
            await self._end(state, logic.Failed("storage", f"the answer could not be stored: {exc}"))
            return
        except NotFoundError:
            pass  # deleted meanwhile
        except RuntimeClosedError as exc:  # storage stopped: the next start-up closes the turn
            log.error("the answer of turn %s could not be stored: %s", state.turn_id, exc,
                      extra=turn_fields(self.h.conversation_id, state.turn_id))
        except trio.Cancelled:
            self._hand_over([ops.rechecked(op)])
            self.online(End(turn_id=state.turn_id))
            raise
        except BaseException:
            self.online(End(turn_id=state.turn_id))
            raise
        self.online(End(turn_id=state.turn_id))

    async def _store_ending(self, op: ops.AppendToolResult | ops.FinishTurn) -> None:
        """Store one op of a turn's ending, retried while the store refuses writes: the turn
        gets its terminal record as soon as the store accepts writes again. Only a cancel
        (shutdown, the conversation stopped) ends the retries (Cancelled: the caller hands the
        rest over to the registry)."""
        fields = turn_fields(self.h.conversation_id, getattr(op, "turn_id", None))
        try:
            await self.memory.write(op)
        except NotFoundError:
            pass  # deleted meanwhile: nothing left to close
        except (StorageError, RuntimeClosedError) as exc:
            # The turn row stays open; the next start-up closes it with an Error record.
            log.error("could not store the end of turn %s (%s): %s",
                      self.h.conversation_id, type(op).__name__, exc, extra=fields)

    async def _withdrawn(self, turn: Turn, state: logic.TurnState) -> None:
        """A turn cancelled while it waited (``ConversationHandle.cancel_turn``) ends
        Interrupted without a model round: the journal keeps its message and an empty
        interrupted answer; working memory gets nothing (but the user item stored with the
        message of a turn handed straight to the actor). The handle stored that ending when
        it could; this stores it otherwise (rechecked when that write's outcome is unknown)."""
        if turn.withdrawal is not None:
            await turn.withdrawal.wait()
        try:
            if turn.ended:
                return
            if turn.ended is None and turn.ending is not None:
                try:
                    await self._store_ending(ops.rechecked(turn.ending))
                finally:
                    self.online(End(turn_id=turn.turn_id))
                return
            start = logic.start(state, turn.content)
            if turn.started:
                self.memory.stored(start)
            await self._end(state, logic.Interrupted())
        finally:
            metrics.TURNS.labels("interrupted").inc()
            self.h.current = None

    async def end_crashed(self, turn: Turn, exc: BaseException) -> None:
        """Close ``turn`` with a crash Error (the supervisor calls this after a bug, or for the
        queued turns of a conversation that failed)."""
        state = logic.TurnState(conversation_id=self.h.conversation_id, turn_id=turn.turn_id)
        await self._end(state, logic.Failed("crash", f"internal error: {type(exc).__name__}: {exc}"))
