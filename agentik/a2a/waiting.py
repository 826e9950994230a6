"""A task whose turn waits for a person, the executor's part (docs/A2A.md, "A task that asks"; a
mixin of :class:`~agentik.a2a.runtime.AgentikExecutor`; the pure rules in
:mod:`agentik.a2a.pauses`).

- When its turn pauses (an ``approval_requested`` / ``input_requested`` event of the turn, or an
  answer after which another of its pauses still waits), the execution reports INPUT_REQUIRED
  with the first pause still open, read from the journal (a replay after a restart sees
  requests that were answered since: the journal says which still wait), and ends.
- A follow-up message on the task answers that pause through the Agent API (as the native
  answer routes do: the same 200 / 409), then the execution follows the turn on: to its next
  pause, or to its end (COMPLETED, FAILED, CANCELED). A follow-up that is no answer (an
  approval needs a yes or a no) asks again. An answer another client gave first (409) is no
  failure: the journal says how the turn went on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import trio

from agentik.a2a.executor import CALLER, RequestContext, TaskUpdater
from agentik.a2a.pauses import Waiting, answer_of, ask_metadata, ask_parts
from agentik.a2a.types import Part
from agentik.errors import ConflictError, NotFoundError
from agentik.turns import (
    AnswerStep,
    ErrorStep,
    PartialStep,
    ending_in,
    open_pauses,
    turn_records,
)
from agentik.wire import (
    ApprovalAnswer,
    Cursor,
    PauseAnswer,
)

if TYPE_CHECKING:
    from agentik.a2a.runtime import _Online, _Turn
    from agentik.agent import LocalAgent


class _Executor(Protocol):
    agent: LocalAgent
    _turns: dict[str, _Turn]

    async def _online_side(self, cid: str, turn: _Turn, updater: TaskUpdater, online: _Online,
                           *, task_status: trio.TaskStatus[None] = ...) -> None: ...

    async def _watch_durable(self, cid: str, cursor: Cursor, turn: _Turn, updater: TaskUpdater,
                             online: _Online) -> None: ...

    async def _final_text(self, turn: _Turn, updater: TaskUpdater, answer: str) -> None: ...


class Asking:
    """The executor's handling of a paused turn (see the module docstring)."""

    async def ask_if_waiting(self: _Executor, cid: str, turn: _Turn, updater: TaskUpdater,
                             online: _Online) -> bool:
        """Report INPUT_REQUIRED for the turn's first pause still open, if any (True: the
        execution ends, its follow-up answers it)."""
        if turn.pause_seq is None:
            return False
        records = await turn_records(self.agent, cid, turn.pause_seq)
        waiting = open_pauses(records, turn.turn_id)
        if not waiting:
            return False
        request = waiting[0]
        seq = next(r.seq for r in records if r.message == request)
        await online.stop()
        message = updater.agent_message(ask_parts(request))
        message.metadata = ask_metadata(request, seq)
        await updater.require_input(message)
        return True

    async def follow_up(self: _Executor, request: RequestContext, updater: TaskUpdater,
                        waiting: Waiting, turn: _Turn, online: _Online) -> None:
        """A follow-up on a task whose turn waits: answer the pause, follow the turn on."""
        cid = request.conversation_id
        assert cid is not None
        turn.turn_id, turn.pause_seq = waiting.turn_id, waiting.seq
        turn.running = True  # a cancel interrupts the waiting turn
        turn.known.set()
        for artifact in (request.task.artifacts if request.task else []):
            if artifact.name == "answer":  # the text streamed before the pause
                turn.artifact_id = artifact.artifact_id
                turn.sent = "".join(p.text or "" for p in artifact.parts)
        cursor = await self.agent.outbox.current_cursor()
        async with trio.open_nursery() as nursery:
            # the live text is followed from before the answer: none of it is missed
            await nursery.start(self._online_side, cid, turn, updater, online)
            try:
                if not await Asking._answer(self, request, updater, waiting, turn, online):
                    await self._watch_durable(cid, cursor, turn, updater, online)
            finally:
                online.scope.cancel()

    async def _answer(self: _Executor, request: RequestContext, updater: TaskUpdater,
                      waiting: Waiting, turn: _Turn, online: _Online) -> bool:
        """Give the follow-up's answer; True when the execution said its final word here (the
        turn asks again, or had ended), False when the turn goes on (followed from then)."""
        cid = request.conversation_id
        assert cid is not None
        records = await turn_records(self.agent, cid, waiting.seq)
        pause = next((p for p in open_pauses(records, waiting.turn_id)
                      if p.call_id == waiting.call_id), None)
        if pause is not None:
            answer = answer_of(pause, request.message)
            if isinstance(answer, str):  # no answer: ask again
                await online.stop()
                message = updater.agent_message([Part(text=answer), *ask_parts(pause)[1:]])
                message.metadata = ask_metadata(pause, waiting.seq)
                await updater.require_input(message)
                return True
            try:
                await _give(self.agent, cid, answer)
            except ConflictError:
                pass  # another client answered first, or the turn ended: the journal says
            records = await turn_records(self.agent, cid, waiting.seq)
        if await Asking.ask_if_waiting(self, cid, turn, updater, online):
            return True
        match ending_in(records, turn.turn_id):  # the turn ended before this follow-up
            case AnswerStep(text=text):
                await online.stop()
                await self._final_text(turn, updater, text)
                await updater.complete(updater.agent_message([Part(text=text)]))
            case ErrorStep(error=error):
                await online.stop()
                await updater.fail(updater.agent_message([Part(text=error.message)]))
            case PartialStep(text=text):
                await online.stop()
                await updater.canceled(updater.agent_message([Part(text=text)]) if text else None)
            case None:
                return False
        return True


async def _give(agent: LocalAgent, cid: str, answer: PauseAnswer) -> None:
    user = CALLER.get().user
    try:
        if isinstance(answer, ApprovalAnswer):
            await agent.approve(cid, answer.call_id, answer.approve, answer.reason, user=user)
        else:
            await agent.answer(cid, answer.call_id, answer.text, data=answer.data, user=user)
    except NotFoundError:
        raise ConflictError("the conversation or its pause is gone") from None
