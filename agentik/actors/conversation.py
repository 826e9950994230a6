"""ConversationActor: the I/O shell around the pure turn logic in ``turn.py``.

One actor per live conversation. It owns its LiteConversation (kept across turns so an embedded
engine keeps its KV cache) and runs one turn at a time from its bounded mailbox. It decides
nothing about what to store: it asks ``turn.py`` (and ``compaction.py``) and moves the answers
between the LLM, the tools, storage and the hub. ``interrupt`` is not queued behind turns: the
handle cancels the running turn's scope directly, and the shielded ending stores what the user
already saw.

The ``ConversationHandle`` (``handle.py``) outlives actor incarnations: the supervisor
(``supervisor.py``) restarts a crashed actor with the same handle.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import aclosing
from typing import assert_never

import trio

from agentik.actors import compaction
from agentik.actors import turn as logic
from agentik.actors.handle import ConversationHandle
from agentik.actors.messages import Turn
from agentik.errors import LlmError, NotFoundError, RuntimeClosedError, StorageError, ToolError
from agentik.llm.base import LiteConversation, TextDelta, ToolSpec
from agentik.storage import ops
from agentik.storage.queries import working_memory
from agentik.wire import (
    Content,
    End,
    OnlineEvent,
    SystemItem,
    Text,
    ToolCallSpec,
    ToolResult,
    Working,
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
        """Run one turn in its own cancel scope (the handle's ``interrupt`` cancels it) and end
        it exactly once: with its answer, or through :meth:`_end`."""
        await turn.stored.wait()
        if not turn.store_ok:
            return
        state = logic.TurnState(conversation_id=self.h.conversation_id, turn_id=turn.turn_id)
        h = self.h
        h.current = turn
        h.interrupt_requested = False
        crashed = False
        failed: logic.Failed | None = None
        try:
            with trio.CancelScope() as scope:
                h.turn_scope = scope
                try:
                    failed = await self._turn_body(turn, state)
                except LlmError as exc:
                    failed = logic.Failed(exc.code, str(exc))
            h.turn_scope = None
            if scope.cancelled_caught:
                if not state.finished:
                    await self._end(state, logic.Interrupted())
            elif failed is not None:
                await self._end(state, failed)
            else:
                # Outside the turn's scope: an interrupt now has nothing to cancel, and the
                # turn's terminal record is already stored.
                await self._maybe_compact(state)
        except trio.Cancelled:
            # Not an interrupt: the runtime is shutting down or the conversation is being
            # deleted. Close the turn with a terminal record before going, unless it already has
            # one (the cancel may land after the answer, e.g. during compaction).
            if not state.finished:
                ending = logic.Interrupted() if h.interrupt_requested else logic.Cancelled()
                await self._end(state, ending)
            raise
        except Exception:
            crashed = True
            raise
        finally:
            h.turn_scope = None
            if not crashed:
                # After a bug `current` stays set, so the supervisor closes it with an Error.
                h.current = None

    async def _turn_body(self, turn: Turn, state: logic.TurnState) -> logic.Failed | None:
        """The turn's rounds; None when it ended with its answer stored, else how it failed."""
        deps = self.deps
        self.online(Working(turn_id=turn.turn_id))
        conv = await self._session()
        await deps.storage.write(logic.start(state, turn.content))
        content: Sequence[Content] | None = turn.content
        while True:
            logic.new_round(state)
            # aclosing: the backend's stream (and its HTTP response) is released at once even
            # when this loop is left by a cancel or an error, not whenever the GC gets to it.
            async with aclosing(conv.send_stream(content)) as stream:
                async for delta in stream:
                    for event in logic.apply_delta(state, delta):
                        self.online(event)
            content = None
            match logic.after_round(state, deps.config.max_tool_rounds):
                case logic.RunTools(op=op, calls=calls):
                    await deps.storage.write(op)
                    for call in calls:
                        result = await self._run_tool(state, call)
                        conv.add_tool_result(call.call_id, call.name, result.content)
                        await deps.storage.write(logic.tool_done(state, result))
                case logic.Answer(op=op):
                    # Shielded: an interrupt landing now must not store a second,
                    # "interrupted" ending for a turn whose answer is being committed.
                    with trio.CancelScope(shield=True):
                        await deps.storage.write(op)
                        self.online(End(turn_id=turn.turn_id))
                    return None
                case logic.Failed() as failed:
                    return failed

    async def _session(self) -> LiteConversation:
        """The model session for this turn: kept across turns, opened from working memory when
        there is none. MCP servers connect and change their tool lists in the background, and a
        session is opened with a fixed tool list, so a changed list means a new session."""
        tools = tuple(self.deps.tools.specs())
        if self.llm_conv is not None and tools != self.llm_tools:
            await self.close_llm()
        if self.llm_conv is None:
            items = await self.deps.storage.reader.run(working_memory, self.h.conversation_id)
            self.llm_conv = await self.deps.llm.open([item for _, item in items], list(tools))
            self.llm_tools = tools
        return self.llm_conv

    async def _run_tool(self, state: logic.TurnState, call: ToolCallSpec) -> ToolResult:
        """Run one tool call; every failure becomes an error result (ToolFailed), never an
        exception, so the turn goes on and the model hears what went wrong."""
        try:
            arguments = logic.parse_arguments(call.arguments)
        except logic.BadArguments as exc:
            return logic.tool_failure(state, call, str(exc))
        timeout = self.deps.config.tool_timeout
        try:
            with trio.fail_after(timeout):
                outcome = await self.deps.tools.call(call.name, arguments)
        except trio.TooSlowError:
            return logic.tool_failure(state, call, f"tool {call.name!r} timed out after {timeout:g} s")
        except ToolError as exc:
            return logic.tool_failure(state, call, str(exc))
        return logic.tool_result(state, call, outcome, self.deps.config.tool_result_cap)

    async def _end(self, state: logic.TurnState, ending: logic.Ending) -> None:
        """The one way a turn ends without its answer (failed, interrupted, cancelled, crashed):
        store the ops ``turn.end`` gives, then End. Shielded, and the model session is never
        reused (a failed or cancelled session may be mid-answer): the next turn opens a new one
        from working memory."""
        closing = logic.end(state, ending)
        with trio.CancelScope(shield=True):
            await self.close_llm()
            for op in closing:
                await self._store_ending(op)
            self.online(End(turn_id=state.turn_id))

    async def _store_ending(self, op: ops.AppendToolResult | ops.FinishTurn) -> None:
        try:
            await self.deps.storage.write(op)
        except NotFoundError:
            pass  # deleted meanwhile: nothing left to close
        except (StorageError, RuntimeClosedError) as exc:
            # The turn row stays open; the next start-up closes it with an Error record.
            log.error("could not store the end of turn %s (%s): %s",
                      self.h.conversation_id, type(op).__name__, exc)

    async def end_crashed(self, turn: Turn, exc: BaseException) -> None:
        """Close ``turn`` with a crash Error (the supervisor calls this after a bug, or for the
        queued turns of a conversation that failed)."""
        state = logic.TurnState(conversation_id=self.h.conversation_id, turn_id=turn.turn_id)
        await self._end(state, logic.Failed("crash", f"internal error: {type(exc).__name__}: {exc}"))

    async def _maybe_compact(self, state: logic.TurnState) -> None:
        """Summarise old turns when the context nears the model's window (see compaction.py)."""
        cid = self.h.conversation_id
        items = await self.deps.storage.reader.run(working_memory, cid)
        plan = compaction.plan_compaction(items, state.last_prompt_tokens,
                                          self.deps.llm.context_window)
        if plan is None:
            return
        summary: str | None = None
        try:
            summary = await self._summarise(compaction.transcript(plan.dropped))
        except LlmError as exc:
            log.warning("summarising %s for compaction failed (%s); dropping old turns", cid, exc)
        await self.deps.storage.write(compaction.compact_op(cid, plan, summary))
        # The live session still holds the long history: rebuild it from the compacted memory.
        await self.close_llm()

    async def _summarise(self, transcript: str) -> str | None:
        """The model's summary of ``transcript`` in a session of its own. Raises LlmError."""
        conv = await self.deps.llm.open([SystemItem(text=compaction.SUMMARY_PROMPT)], [])
        try:
            parts: list[str] = []
            async with aclosing(conv.send_stream([Text(body=transcript)])) as stream:
                async for delta in stream:
                    if isinstance(delta, TextDelta):
                        parts.append(delta.text)
            return "".join(parts).strip() or None
        finally:
            await conv.close()


__all__ = ["ConversationActor"]
