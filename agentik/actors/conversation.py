"""ConversationActor: the I/O shell around the pure turn logic in ``turn.py``.

One actor per live conversation. It owns its LiteConversation (kept across turns so an embedded
engine keeps its KV cache) and runs one turn at a time from its bounded mailbox. It decides
nothing about what to store: it asks ``turn.py`` (and ``compaction.py``) and moves the answers
between the LLM, the tools, storage and the hub. ``interrupt`` is not queued behind turns: the
handle cancels the running turn's scope directly, and the shielded ending stores what the user
already saw.

How a turn ends without its answer, and how its terminal record is stored (retried while the
store refuses writes), is in ``ending.py``. The ``ConversationHandle`` (``handle.py``) outlives
actor incarnations: the supervisor (``supervisor.py``) restarts a crashed actor with the same
handle.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from contextlib import aclosing
from typing import assert_never

import trio

from agentik import context as ctx
from agentik import metrics, tracing
from agentik.actors import asking, compaction, spans, summary
from agentik.actors import turn as logic
from agentik.actors.branch_turns import BranchTurns
from agentik.actors.ending import TurnEndings, turn_fields
from agentik.actors.handle import ConversationHandle
from agentik.actors.memory import WorkingMemory
from agentik.actors.messages import Turn
from agentik.actors.pausing import Parked
from agentik.actors.tool_phase import ToolPhase
from agentik.errors import (
    LlmContextOverflowError,
    LlmError,
)
from agentik.llm.base import LiteConversation, ToolSpec
from agentik.wire import (
    Content,
    OnlineEvent,
    Working,
)

log = logging.getLogger(__name__)


class _TooBig(Exception):
    """The current turn cannot fit the context window: it fails with ``message``, and its
    working-memory items from ``forget_from`` on are removed (the journal keeps them)."""

    def __init__(self, message: str, forget_from: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.forget_from = forget_from


class ConversationActor(TurnEndings, ToolPhase, BranchTurns):
    """One incarnation; the supervisor makes a new one after a crash."""

    def __init__(self, handle: ConversationHandle) -> None:
        self.h = handle
        self.deps = handle.deps
        #: the conversation's agent: its backend and the tools it may use
        self.agent = handle.agent
        #: read once, then kept in step with this actor's writes (all through memory.write)
        self.memory = WorkingMemory(handle.deps.storage, handle.conversation_id,
                                    handle.take_memory())
        self.llm_conv: LiteConversation | None = None
        self.llm_tools: tuple[ToolSpec, ...] = ()
        #: perf_counter at the running turn's start; None once its first delta was timed
        self._awaiting_first_token: float | None = None

    def online(self, event: OnlineEvent) -> None:
        self.deps.storage.hub.publish_online(self.h.conversation_id, event)

    async def run(self) -> None:
        """Serve turns until passivated (idle) or stopped. Raises on a bug (the supervisor
        restarts); cancellation propagates."""
        try:
            while True:
                with trio.move_on_after(self.deps.config.idle_timeout) as idle:
                    self.h.idle = True  # a send now may start its turn with its message
                    try:
                        msg = await self.h.inbox.receive()
                    except trio.EndOfChannel:
                        return  # the mailbox was closed: the conversation is being stopped
                    finally:
                        self.h.idle = False
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
        it exactly once: with its answer, or through :meth:`_end`. Every write of the turn is
        retried while the store refuses writes (``write_until_stored``): a full disk pauses the
        turn, it never loses its end."""
        h = self.h
        if not await self._take(turn):
            return
        if turn.branch == "switch":
            try:
                await self._switch(turn)
            finally:
                h.current = None
            return
        state = logic.TurnState(conversation_id=self.h.conversation_id, turn_id=turn.turn_id)
        if turn.withdrawn:
            await self._withdrawn(turn, state)
            return
        if turn.branch is not None:
            await self._to_branch(turn)
        h.interrupt_requested, h.interrupt_pending = h.interrupt_pending, False
        with spans.turn(self.agent.profile, h.conversation_id, turn) as span:
            await self._run_turn(turn, state, span)

    async def _run_turn(self, turn: Turn, state: logic.TurnState, span: tracing.Span) -> None:
        h = self.h
        crashed = self.paused = False
        failed: logic.Failed | None = None
        answer: logic.Answer | None = None
        started = self._awaiting_first_token = time.perf_counter()
        outcome = "crashed"
        try:
            with trio.CancelScope() as scope:
                h.turn_scope = scope
                if h.interrupt_requested:  # interrupted while it waited to start again
                    scope.cancel()
                try:
                    ended = await self._turn_body(turn, state)
                except LlmError as exc:
                    metrics.LLM_ERRORS.labels(exc.code).inc()
                    failed = logic.Failed(exc.code, str(exc))
                else:
                    if isinstance(ended, logic.Answer):
                        answer = ended
                    else:
                        failed = ended
            h.pauses.close()  # before its end is stored: a later answer is too late (409)
            h.turn_scope = None
            outcome = "completed"
            outcome = await self._close(state, answer, scope.cancelled_caught, failed)
        except trio.Cancelled:
            outcome = "cancelled"
            h.pauses.close()
            # Not an interrupt: the runtime is shutting down or the conversation is being
            # deleted. Close the turn with a terminal record before going, unless it already has
            # one (the cancel may land after the answer), or it waits for a person: stored
            # waiting, it waits on in the next actor (a restart, another node).
            if self.paused and not h.interrupt_requested:
                outcome = "paused"
            elif not state.finished:
                ending = logic.Interrupted() if h.interrupt_requested else logic.Cancelled()
                outcome = "interrupted" if h.interrupt_requested else "cancelled"
                await self._end(state, ending)
            else:
                outcome = "completed"
            raise
        except Parked:  # passivated while it waits: stored waiting, resumed at the next load
            h.pauses.close()
            outcome = "paused"
        except Exception:
            crashed = True
            raise
        finally:
            spans.ended(span, state, outcome, failed)
            if outcome != "paused":  # left waiting (stored): it ends in a later actor
                metrics.TURNS.labels(outcome).inc()
                metrics.TURN_DURATION.observe(time.perf_counter() - started)
            self._awaiting_first_token = None
            h.turn_scope = None
            h.pauses.close()
            if not crashed:
                # After a bug `current` stays set, so the supervisor closes it with an Error.
                h.current = None

    async def _take(self, turn: Turn) -> bool:
        """Make ``turn`` the current one once its message is stored; False when the store
        failed (the turn is skipped)."""
        h = self.h
        h.current = turn  # busy from here on (a send's on_busy sees it), even while it is stored
        await turn.stored.wait()
        h.waiting.pop(turn.turn_id, None)  # from here cancel_turn interrupts it
        if not turn.store_ok:
            h.current = None
            if turn.started:
                self.memory.invalidate()  # never stored; dropped all the same, to be safe
            return False
        return True

    async def _close(self, state: logic.TurnState, answer: logic.Answer | None,
                     interrupted: bool, failed: logic.Failed | None) -> str:
        """Store how the turn ended (its answer, or through :meth:`_end`); the outcome's label.
        Called outside the turn's scope: an interrupt landing while the answer is committed
        must not store a second, "interrupted" ending."""
        if answer is not None:
            await self._store_answer(state, answer.op)
        elif interrupted:
            if not state.finished:
                await self._end(state, logic.Interrupted())
                return "interrupted"
        elif failed is not None:
            await self._end(state, failed)
            return "failed"
        return "completed"

    async def _turn_body(self, turn: Turn, state: logic.TurnState) -> logic.Answer | logic.Failed:
        """The turn's rounds: its Answer (the caller stores it) or how it failed. A write the
        store refuses is retried until stored; one cut by an interrupt is undone in ``state``
        (see ``turn.calls_not_stored``), so the ending records only what was stored."""
        deps = self.deps
        self.online(Working(turn_id=turn.turn_id))
        tools = tuple(self.agent.tools.specs())
        if self.agent.profile.ask_user:
            tools += (asking.ASK_USER_SPEC,)
        client = asking.client_specs(turn.context, {t.name for t in tools})
        self.client_tools = frozenset(t.name for t in client)  # their calls wait for results
        tools += client
        if self.llm_conv is not None and tools != self.llm_tools:
            # MCP servers connect and change their tool lists in the background, and a session
            # is opened with a fixed tool list, so a changed list means a new session.
            await self.close_llm()
        content: Sequence[Content] | None = turn.content
        if turn.resume is not None:  # it waited for a person: on from its calls
            with trio.CancelScope(shield=True):  # its state whole before an interrupt ends it
                items = await self.memory.items()
            texts = asking.round_texts([item for _, item in items])
            logic.resumed(state, turn.resume.rounds, turn.resume.pending, texts)
            await self.run_tools(state, turn.resume.pending)
            content = None
        else:
            start = logic.start(state, turn.content, item=turn.branch != "regenerate")
            if turn.started:
                self.memory.stored(start)  # committed with its message (ops.AppendUserMessage)
            else:
                await self.memory.write(start)
        while True:
            logic.new_round(state)
            try:
                await self._round(state, tools, content)
            except _TooBig as too_big:
                return logic.Failed("context_window", too_big.message,
                                    forget_from=too_big.forget_from)
            content = None
            seen = await self.seen_call_ids()
            match logic.after_round(state, deps.config.max_tool_rounds, self.pause_policy(), seen):
                case logic.RunTools(op=op, calls=calls, renamed=renamed):
                    if renamed:  # the session knows the model's ids: a new one, from memory
                        await self.close_llm()
                    self.h.pauses.open(state.turn_id, op.pauses)  # answers taken from now on
                    try:
                        await self.memory.write(op)
                    except trio.Cancelled:
                        logic.calls_not_stored(state)
                        self.h.pauses.close()
                        raise
                    await self.run_tools(state, calls)
                case logic.Answer() as answer:
                    return answer
                case logic.Failed() as failed:
                    return failed

    async def _round(
        self, state: logic.TurnState, tools: tuple[ToolSpec, ...],
        content: Sequence[Content] | None,
    ) -> None:
        """One model round, made to fit the context window first; a backend-reported overflow
        (our count said it fits: an estimate, or a window just learned) compacts and retries the
        round once. Raises _TooBig when the current turn alone cannot fit."""
        first = content is not None
        max_output = await self._prepare_round(tools, first_round=first)
        try:
            await self._stream_round(state, content, max_output)
        except LlmContextOverflowError as exc:
            if state.round_text or state.calls:
                raise  # the model already answered something: nothing to retry
            log.info("conversation %s: the backend reported a context overflow (%s); "
                     "compacting and retrying the round", self.h.conversation_id, exc,
                     extra=turn_fields(self.h.conversation_id, state.turn_id))
            await self.close_llm()
            max_output = await self._prepare_round(tools, first_round=first, force=True,
                                                   reported=exc.tokens)
            await self._stream_round(state, content, max_output)

    async def _stream_round(
        self, state: logic.TurnState, content: Sequence[Content] | None, max_output: int | None
    ) -> None:
        assert self.llm_conv is not None
        # aclosing: the backend's stream (and its HTTP response) is released at once even
        # when this loop is left by a cancel or an error, not whenever the GC gets to it.
        stream = self.llm_conv.send_stream(content, max_output_tokens=max_output)
        # per delta (a model's token): the hub's publish and this conversation's id looked up once
        publish, cid = self.deps.storage.hub.publish_online, self.h.conversation_id
        apply_delta = logic.apply_delta
        with spans.chat(self.agent.profile, state):
            async with aclosing(stream):
                async for delta in stream:
                    if self._awaiting_first_token is not None:
                        metrics.TIME_TO_FIRST_TOKEN.observe(
                            time.perf_counter() - self._awaiting_first_token)
                        self._awaiting_first_token = None
                    for event in apply_delta(state, delta):
                        publish(cid, event)

    # --- context (docs/CONTEXT.md; the decisions are agentik.context's) ----------------

    def _budget(self) -> ctx.Budget | None:
        llm = self.agent.llm
        if not llm.context_window:
            return None
        return ctx.make_budget(llm.context_window, exact=llm.exact_tokens,
                               output=llm.max_output_tokens,
                               summary=self.deps.config.summary_max_tokens or None)

    async def _prepare_round(
        self,
        tools: tuple[ToolSpec, ...],
        *,
        first_round: bool,
        force: bool = False,
        reported: int | None = None,
    ) -> int | None:
        """Make the next round fit the context window and have a model session for it: count
        working memory (which holds this turn's message and tool results), compact when the
        round would not fit (or when ``force``: the backend said it did not), then open the
        session from the (compacted) memory if there is none (kept across turns otherwise, so
        the engine keeps its KV cache). Returns the round's output budget. Raises _TooBig.
        This is also what recovers a conversation an earlier version let outgrow the window:
        its next round, after a cold load too, compacts it."""
        for attempt in range(3):
            items = await self.memory.items()
            budget = self._budget()
            plain = [item for _, item in items]
            counts = await self.agent.llm.count_tokens(plain) if budget else [0] * len(plain)
            decision = ctx.decide(items, counts, budget, force=force and attempt == 0)
            if ctx.last_resort(decision, attempt):
                decision = ctx.decide(items, counts, budget, force=True, summarise=False)
            if isinstance(decision, ctx.TooBig):
                if reported and decision.tokens < reported:  # the backend counted more
                    extra = reported - decision.tokens
                    decision = dataclasses.replace(
                        decision, tokens=reported, message_tokens=decision.message_tokens + extra)
                raise _TooBig(ctx.too_big_message(decision, exact=self.agent.llm.exact_tokens),
                              compaction.turn_start(items))
            if isinstance(decision, ctx.Fits):
                if self.llm_conv is None:
                    history, results = compaction.session_history(plain, first_round=first_round)
                    conv = await self.agent.llm.open(history, list(tools))
                    for result in results:
                        conv.add_tool_result(result.call_id, result.name, result.content)
                    self.llm_conv, self.llm_tools = conv, tools
                return decision.max_output
            assert budget is not None
            await self.close_llm()  # its KV cache holds the old turns: rebuilt after compaction
            await self._compact(decision, budget)
        raise _TooBig("the conversation does not fit the model's context window even after "
                      "compaction: send a shorter message", None)

    async def _compact(self, plan: ctx.Compact, budget: ctx.Budget) -> None:
        """Replace the plan's old turns by the model's summary, or drop them without one when it
        cannot be made or does not fit (see compaction.py, summary.py)."""
        cid = self.h.conversation_id
        with spans.compaction(cid, len(plan.dropped)):
            with spans.summary(self.agent.profile, cid):
                text = await summary.make_summary(self.agent.llm, cid, plan, budget)
            await self.memory.write(compaction.compact_op(cid, plan, text))


__all__ = ["ConversationActor", "turn_fields"]
