"""ConversationActor: the I/O shell around the pure turn logic in ``turn.py``.

One actor per live conversation. It owns its LiteConversation (kept across turns so an embedded
engine keeps its KV cache) and runs one turn at a time from its bounded mailbox. ``interrupt`` is
not queued behind turns: the handle cancels the running turn's scope directly, and the shielded
cleanup stores what the user already saw.

The ``ConversationHandle`` (``handle.py``) outlives actor incarnations: the supervisor
(``supervisor.py``) restarts a crashed actor with the same handle.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from contextlib import aclosing
from typing import assert_never

import trio

from agentik.actors import turn as logic
from agentik.actors.handle import ConversationHandle
from agentik.actors.messages import Turn
from agentik.errors import (
    LlmError,
    NotFoundError,
    RuntimeClosedError,
    StorageError,
    ToolError,
)
from agentik.llm.base import LiteConversation, TextDelta, ToolSpec
from agentik.storage import ops
from agentik.storage.queries import working_memory
from agentik.wire import (
    Content,
    End,
    Error,
    OnlineEvent,
    SummaryItem,
    SystemItem,
    Text,
    ToolCall,
    ToolCallSpec,
    ToolItem,
    ToolResult,
    UserItem,
    Working,
    encode,
)

log = logging.getLogger(__name__)


class ConversationActor:
    """One incarnation; the supervisor makes a new one after a crash."""

    def __init__(self, handle: ConversationHandle) -> None:
        self.h = handle
        self.deps = handle.deps
        self.llm_conv: LiteConversation | None = None
        self.llm_tools: tuple[ToolSpec, ...] = ()

    def online(self, event: OnlineEvent) -> None:
        self.deps.storage.hub.publish_online(self.h.conversation_id, event)

    async def run(self) -> None:
        """Serve turns until passivated (idle) or stopped. Raises on a bug (the supervisor
        restarts); cancellation propagates."""
        try:
            while True:
                with trio.move_on_after(self.deps.config.idle_timeout) as idle:
                    try:
                        msg = await self.h.inbox.receive()
                    except trio.EndOfChannel:
                        return  # the mailbox was closed: the conversation is being stopped
                if idle.cancelled_caught:
                    if self.h.keeper.passivate(self.h):
                        return
                    continue
                match msg:
                    case Turn():
                        await self.run_turn(msg)
                    case _:
                        assert_never(msg)
        finally:
            await self.close_llm()

    async def close_llm(self) -> None:
        conv, self.llm_conv = self.llm_conv, None
        if conv is not None:
            with trio.CancelScope(shield=True):
                try:
                    await conv.close()
                except Exception:
                    log.exception("closing the LLM session of %s failed", self.h.conversation_id)

    async def run_turn(self, turn: Turn) -> None:
        await turn.stored.wait()
        if not turn.store_ok:
            return
        state = logic.TurnState(turn_id=turn.turn_id)
        h = self.h
        h.current = turn
        h.interrupt_requested = False
        crashed = False
        completed = False
        try:
            with trio.CancelScope() as scope:
                h.turn_scope = scope
                try:
                    completed = await self._turn_body(turn, state)
                except LlmError as exc:
                    await self._fail_turn(turn, state, exc.code, str(exc))
            h.turn_scope = None
            if scope.cancelled_caught and not state.finished:
                await self._end_cancelled(turn, state, interrupted=True)
            elif completed:
                # Outside the turn's scope: an interrupt now has nothing to cancel, and the
                # turn's terminal record is already stored.
                await self._maybe_compact(state)
        except trio.Cancelled:
            # Not an interrupt: the runtime is shutting down or the conversation is being
            # deleted. Close the turn with a terminal record before going, unless it already has
            # one (the cancel may land after the answer, e.g. during compaction).
            if not state.finished:
                await self._end_cancelled(turn, state, interrupted=h.interrupt_requested)
            raise
        except Exception:
            crashed = True
            raise
        finally:
            h.turn_scope = None
            if not crashed:
                # After a bug `current` stays set, so the supervisor closes it with an Error.
                h.current = None

    async def _turn_body(self, turn: Turn, state: logic.TurnState) -> bool:
        """One turn; True when it ended with an answer (False: it ended as failed)."""
        cid = self.h.conversation_id
        deps = self.deps
        self.online(Working(turn_id=turn.turn_id))
        tools = tuple(deps.tools.specs())
        if self.llm_conv is not None and tools != self.llm_tools:
            # MCP servers connect and change their tool lists in the background; a session is
            # opened with a fixed tool list, so a change means a new session (from memory).
            await self.close_llm()
        if self.llm_conv is None:
            history = [item for _, item in await deps.storage.reader.run(working_memory, cid)]
            self.llm_conv = await deps.llm.open(history, list(tools))
            self.llm_tools = tools
        await deps.storage.write(
            ops.StartTurn(conversation_id=cid, turn_id=turn.turn_id,
                          item=UserItem(content=list(turn.content)))
        )
        content: Sequence[Content] | None = turn.content
        while True:
            logic.new_round(state)
            # aclosing: the backend's stream (and its HTTP response) is released at once even
            # when this loop is left by a cancel or an error, not whenever the GC gets to it.
            async with aclosing(self.llm_conv.send_stream(content)) as stream:
                async for delta in stream:
                    for event in logic.apply_delta(state, delta):
                        self.online(event)
            content = None
            calls = logic.round_tool_calls(state)
            if not calls:
                break
            if state.rounds > deps.config.max_tool_rounds:
                await self._fail_turn(
                    turn, state, "tool_rounds",
                    f"the model asked for tools more than {deps.config.max_tool_rounds} times "
                    "in one turn",
                )
                return False
            await deps.storage.write(
                ops.AppendToolCalls(
                    conversation_id=cid,
                    calls=tuple(
                        (uuid.uuid4().hex,
                         ToolCall(call_id=c.call_id, name=c.name, arguments=c.arguments,
                                  turn_id=turn.turn_id))
                        for c in calls
                    ),
                    item=logic.round_item(state, calls),
                )
            )
            state.round_recorded = True
            state.pending_calls = list(calls)
            for call in calls:
                result = await self._run_tool(call, turn.turn_id)
                self.llm_conv.add_tool_result(call.call_id, call.name, result.content)
                await deps.storage.write(
                    ops.AppendToolResult(
                        conversation_id=cid, message_id=uuid.uuid4().hex, result=result,
                        item=ToolItem(call_id=call.call_id, name=call.name, content=result.content),
                    )
                )
                state.pending_calls.remove(call)
        answer = logic.final_message(state)
        assert answer is not None
        # Shielded: an interrupt landing now must not store a second, "interrupted" ending for a
        # turn whose answer is already being committed.
        with trio.CancelScope(shield=True):
            state.finished = True
            await deps.storage.write(
                ops.FinishTurn(conversation_id=cid, turn_id=turn.turn_id,
                               assistant=(uuid.uuid4().hex, answer),
                               item=logic.final_item(state))
            )
            self.online(End(turn_id=turn.turn_id))
        return True

    async def _maybe_compact(self, state: logic.TurnState) -> None:
        """Summarise old turns when the context nears the model's window (SPEC §5). Working
        memory only: the journal keeps everything. If the summary cannot be made, the old turns
        are dropped without one (the seeds' v1 behaviour) rather than overflowing the window."""
        cid = self.h.conversation_id
        deps = self.deps
        items = await deps.storage.reader.run(working_memory, cid)
        plan = logic.plan_compaction(items, state.last_prompt_tokens, deps.llm.context_window)
        if plan is None:
            return
        summary: str | None = None
        try:
            conv = await deps.llm.open([SystemItem(text=logic.SUMMARY_PROMPT)], [])
            try:
                parts: list[str] = []
                transcript = [Text(body=logic.transcript(plan.dropped))]
                async with aclosing(conv.send_stream(transcript)) as stream:
                    async for delta in stream:
                        if isinstance(delta, TextDelta):
                            parts.append(delta.text)
                summary = "".join(parts).strip() or None
            finally:
                await conv.close()
        except LlmError as exc:
            log.warning("summarising %s for compaction failed (%s); dropping old turns", cid, exc)
        await deps.storage.write(
            ops.Compact(conversation_id=cid, before_order_idx=plan.before_order_idx,
                        summary=SummaryItem(text=summary) if summary else None,
                        dropped=len(plan.dropped))
        )
        # The live session still holds the long history: rebuild it from the compacted memory.
        await self.close_llm()

    async def _run_tool(self, call: ToolCallSpec, turn_id: str) -> ToolResult:
        """Run one tool call; every failure becomes an error result (ToolFailed), never an
        exception, so the turn goes on and the model hears what went wrong."""

        def failed(message: str) -> ToolResult:
            return ToolResult(call_id=call.call_id, name=call.name, content=message,
                              is_error=True, turn_id=turn_id)

        try:
            arguments = logic.parse_arguments(call.arguments)
        except logic.BadArguments as exc:
            return failed(str(exc))
        timeout = self.deps.config.tool_timeout
        try:
            with trio.fail_after(timeout):
                outcome = await self.deps.tools.call(call.name, arguments)
        except trio.TooSlowError:
            return failed(f"tool {call.name!r} timed out after {timeout:g} s")
        except ToolError as exc:
            return failed(str(exc))
        cap = self.deps.config.tool_result_cap
        structured = outcome.structured
        # Untrusted and possibly huge: structured content is kept only when it fits the cap
        # (the text content, which the model sees, is always there, cut to the cap).
        if structured is not None and len(encode(structured)) > cap:
            structured = None
        return ToolResult(
            call_id=call.call_id, name=call.name, content=logic.cap_text(outcome.content, cap),
            is_error=outcome.is_error, structured=structured, turn_id=turn_id,
        )

    async def _fail_turn(self, turn: Turn, state: logic.TurnState, code: str, message: str) -> None:
        """A failed turn: keep what the user saw, journal the Error, End; the LLM session is
        rebuilt from working memory on the next turn."""
        await self.close_llm()
        partial = logic.final_message(state, interrupted=True)
        text_item = logic.final_item(state) if partial is not None else None
        state.finished = True
        with trio.CancelScope(shield=True):
            await self._close_pending_calls(state, "the turn ended before this tool call finished")
            await self.finish_safely(
                ops.FinishTurn(
                    conversation_id=self.h.conversation_id, turn_id=turn.turn_id,
                    assistant=(uuid.uuid4().hex, partial) if partial is not None else None,
                    item=text_item if text_item is not None and text_item.content else None,
                    error=(uuid.uuid4().hex, Error(message=message, code=code, turn_id=turn.turn_id)),
                )
            )
            self.online(End(turn_id=turn.turn_id))

    async def _end_cancelled(self, turn: Turn, state: logic.TurnState, *, interrupted: bool) -> None:
        await self.close_llm()  # a cancelled session may be mid-answer: never reuse it
        partial = logic.final_message(state, interrupted=True)
        text_item = logic.final_item(state)
        error = None
        if not interrupted:
            error = (uuid.uuid4().hex,
                     Error(message="turn cancelled: the server is shutting down or the "
                           "conversation was closed", code="cancelled", turn_id=turn.turn_id))
        state.finished = True
        with trio.CancelScope(shield=True):
            await self._close_pending_calls(state, "the turn ended before this tool call finished")
            await self.finish_safely(
                ops.FinishTurn(
                    conversation_id=self.h.conversation_id, turn_id=turn.turn_id,
                    assistant=(uuid.uuid4().hex, partial) if partial is not None else None,
                    item=text_item if partial is not None and text_item.content else None,
                    interrupted=interrupted, error=error,
                )
            )
            self.online(End(turn_id=turn.turn_id))

    async def _close_pending_calls(self, state: logic.TurnState, why: str) -> None:
        """Give every stored tool call of the round a ToolFailed, so no client shows a call
        that never ends and the model's history has an answer for each call."""
        for call in state.pending_calls:
            result = ToolResult(call_id=call.call_id, name=call.name, content=why, is_error=True,
                                turn_id=state.turn_id)
            try:
                await self.deps.storage.write(ops.AppendToolResult(
                    conversation_id=self.h.conversation_id, message_id=uuid.uuid4().hex,
                    result=result, item=ToolItem(call_id=call.call_id, name=call.name, content=why)))
            except (NotFoundError, StorageError, RuntimeClosedError) as exc:
                log.warning("could not close tool call %s: %s", call.call_id, exc)
        state.pending_calls = []

    async def finish_safely(self, op: ops.FinishTurn) -> None:
        try:
            await self.deps.storage.write(op)
        except NotFoundError:
            pass  # deleted meanwhile: nothing left to close
        except (StorageError, RuntimeClosedError) as exc:
            # The turn row stays open; the next start-up closes it with an Error record.
            log.error("could not store the end of turn %s: %s", op.turn_id, exc)

    async def end_crashed(self, turn: Turn, exc: BaseException) -> None:
        """Close ``turn`` with a crash Error (the supervisor calls this after a bug)."""
        with trio.CancelScope(shield=True):
            await self.finish_safely(
                ops.FinishTurn(
                    conversation_id=self.h.conversation_id, turn_id=turn.turn_id,
                    error=(uuid.uuid4().hex,
                           Error(message=f"internal error: {type(exc).__name__}: {exc}",
                                 code="crash", turn_id=turn.turn_id)),
                )
            )
            self.online(End(turn_id=turn.turn_id))


__all__ = ["ConversationActor"]
