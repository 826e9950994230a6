"""A round's tool calls, run in order: the ConversationActor's tool phase, a mixin of
``ConversationActor`` (as ``ending.py``'s endings are).

A call that waits for a person (docs/PROTOCOL.md, "A person in the loop"; the rules in
``asking.py``, the waiting in ``pausing.py``) runs only once its pause is answered: approved, the
tool runs; refused, denied by its deadline, or answered (a question), its result says so, and
the tool never runs. Each result goes to the model session (when there is one: a resumed turn
opens its session from working memory after its calls) and to storage.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import trio

from agentik.actors import asking, spans
from agentik.actors import turn as logic
from agentik.actors.deps import AgentDeps, Deps
from agentik.actors.handle import ConversationHandle
from agentik.actors.memory import WorkingMemory
from agentik.actors.pausing import Slot
from agentik.errors import ToolError
from agentik.ids import new_id
from agentik.llm.base import LiteConversation
from agentik.storage import ops
from agentik.tools.base import CALL_META, ELICIT, Elicited
from agentik.wire import AssistantItem, InputAnswer, InputRequest, ToolCallSpec, ToolResult


class ToolPhase:
    """The tool phase of ``ConversationActor`` (which provides these attributes)."""

    h: ConversationHandle
    deps: Deps
    agent: AgentDeps
    memory: WorkingMemory
    llm_conv: LiteConversation | None
    #: the conversation's call ids so far (read from working memory at the first round with
    #: calls): a reused one is replaced (``asking.unique_calls``)
    call_ids: set[str] | None = None
    #: the running turn waits for a person: a shutdown leaves it waiting, not ended
    paused: bool = False
    #: the running turn's client-side tools (``MessageContext.tools``): a call waits for its result
    client_tools: frozenset[str] = frozenset()

    def pause_policy(self) -> asking.PausePolicy:
        """Which of this round's calls wait for a person, and until when."""
        profile = self.agent.profile
        timeout = profile.approval_timeout
        return asking.PausePolicy(needs_approval=profile.needs_approval,
                                  ask_user=profile.ask_user, client_tools=self.client_tools,
                                  deadline=time.time() + timeout if timeout else None)

    async def seen_call_ids(self) -> set[str]:
        if self.call_ids is None:
            self.call_ids = {call.call_id for _, item in await self.memory.items()
                             if isinstance(item, AssistantItem) for call in item.tool_calls}
        return self.call_ids

    async def run_tools(self, state: logic.TurnState, calls: list[ToolCallSpec]) -> None:
        """Run ``calls`` in order, each result to the model and to storage. A write cut by an
        interrupt leaves the call pending (its ending gives it a ToolFailed)."""
        for call in calls:
            result = await self._tool_or_answer(state, call)
            if self.llm_conv is not None:
                self.llm_conv.add_tool_result(call.call_id, call.name, result.content)
            try:
                await self.memory.write(logic.tool_done(state, result))
            except trio.Cancelled:
                logic.result_not_stored(state, call)
                raise

    async def _tool_or_answer(self, state: logic.TurnState, call: ToolCallSpec) -> ToolResult:
        """The call's result: its pause's answer first when it has one."""
        slot = self.h.pauses.slots.get(call.call_id)
        if slot is None:
            if call.name == asking.ASK_USER and self.agent.profile.ask_user:
                return logic.tool_failure(state, call, "ask_user needs a question: "
                                          '{"question": "...", "choices": ["...", ...]}')
            return await self._run_tool(state, call)
        self.paused = True  # left set when cancelled: the turn's ending reads it
        answer = await self.h.pauses.wait(slot, self.deps.config.idle_timeout,
                                          partial(self._park, slot))
        self.paused = False
        result = asking.paused_result(state.turn_id, call, answer)
        return result if result is not None else await self._run_tool(state, call)

    def _park(self, slot: Slot) -> bool:
        """Idle while the turn waits: passivate the actor as an idle one is (not while a turn is
        queued behind), leaving the turn waiting in storage; a deadline is kept by the keeper,
        which loads the conversation again then (its new actor stores the denial)."""
        h = self.h
        if not h.keeper.passivate(h):
            return False
        if slot.request.deadline is not None:
            h.keeper.wake_at(h.conversation_id, slot.request.deadline)
        return True

    async def _run_tool(self, state: logic.TurnState, call: ToolCallSpec) -> ToolResult:
        """Run one tool call; every failure becomes an error result (ToolFailed), never an
        exception, so the turn goes on and the model hears what went wrong."""
        with spans.tool(call) as span:
            return spans.tool_done(span, call, await self._call_tool(state, call))

    async def _call_tool(self, state: logic.TurnState, call: ToolCallSpec) -> ToolResult:
        try:
            arguments = logic.parse_arguments(call.arguments)
        except logic.BadArguments as exc:
            return logic.tool_failure(state, call, str(exc))
        timeout = self.deps.config.tool_timeout
        token = CALL_META.set({"agentik/call_id": call.call_id,
                               "agentik/conversation_id": self.h.conversation_id})
        asks = ELICIT.set(partial(self._elicit, state))
        try:
            with trio.fail_after(timeout):
                outcome = await self.agent.tools.call(call.name, arguments)
        except trio.TooSlowError:
            return logic.tool_failure(state, call, f"tool {call.name!r} timed out after {timeout:g} s")
        except ToolError as exc:
            return logic.tool_failure(state, call, str(exc))
        finally:
            CALL_META.reset(token)
            ELICIT.reset(asks)
        return logic.tool_result(state, call, outcome, self.deps.config.tool_result_cap)

    async def _elicit(self, state: logic.TurnState, message: str, schema: dict[str, Any]
                      ) -> Elicited:
        """A tool server asks the person a question during a call (MCP elicitation; run in the
        server's session task while the call waits): stored as a pause of the running turn
        (``input_requested`` with the schema, answered by the same routes), but the turn row
        stays running, as the call does: a restart ends the turn as any running one (the MCP
        request cannot outlive the process), and its question with it."""
        request = InputRequest(call_id=f"elicit_{new_id()}", question=message, schema=schema,
                               deadline=self.pause_policy().deadline, turn_id=state.turn_id)
        pause = ((new_id(), request),)
        self.h.pauses.open(state.turn_id, pause)
        try:
            await self.memory.write(ops.AppendToolCalls(
                conversation_id=self.h.conversation_id, calls=(), item=None, pauses=pause))
            # never parked: the call it came from is running (the actor cannot go)
            answer = await self.h.pauses.wait(self.h.pauses.slots[request.call_id],
                                              float("inf"), lambda: False)
        finally:
            self.h.pauses.slots.pop(request.call_id, None)
        assert isinstance(answer, InputAnswer)
        return asking.elicited(answer)
