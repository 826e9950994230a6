"""One model session of the LiteRT-LM backend (see :mod:`agentik.llm.litert`).

A :class:`LiteRtConversation` keeps its history in the engine's message format and one engine
conversation holding that history in its KV cache, reused across rounds. A cancelled engine
conversation only ever answers "CANCELLED" again, and one that failed is in an unknown state, so
after either it is dropped and the next round re-creates it seeded with the history.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

import trio

from agentik.errors import (
    LlmConnectionError,
    LlmContextOverflowError,
    LlmError,
    LlmResponseError,
)
from agentik.llm.base import FinishDelta, LlmDelta, ToolSpec, UsageDelta
from agentik.llm.boundary import ErrorTable, map_exceptions
from agentik.llm.litert.format import ChunkParser, Message, tool_response, user_message
from agentik.llm.litert.round import STOP_TIMEOUT, Round, RoundFailed, RoundResult
from agentik.wire import Content

if TYPE_CHECKING:
    from agentik.llm.litert.engine import LiteRtLlm

__all__ = ["LiteRtConversation"]

log = logging.getLogger(__name__)


def _refused(exc: Exception) -> LlmError:
    return LlmResponseError(f"the LiteRT-LM engine refused the conversation: {exc}")


#: creating an engine conversation
_CREATE_ERRORS: ErrorTable = {Exception: _refused}


class LiteRtConversation:
    """One model session on the engine: its own history in the engine's message format and one
    engine conversation holding that history in its KV cache."""

    def __init__(self, llm: LiteRtLlm, messages: list[Message], tools: list[ToolSpec]) -> None:
        self._llm = llm
        #: everything the model has seen, in the engine's format (also what a rebuild seeds)
        self.messages = messages
        self.tools = tools
        self.engine_conv: Any = None
        self.generation: Round | None = None
        self._pending_results: list[dict[str, Any]] = []
        self._closed = False
        #: a round is running (or waiting for the engine) on this conversation
        self._busy = False
        #: an engine conversation is being created for this one (in a worker thread)
        self._creating = False
        #: the history changed under the engine conversation: rebuild it before the next round
        self._engine_conv_stale = False
        #: engine conversations created so far (1 unless a cancel or failure forced a rebuild)
        self.engine_conversations = 0
        #: the latest round's generation, kept for inspection (chunks produced, cancelled)
        self.last_round: Round | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def add_tool_result(self, call_id: str, name: str, result: str) -> None:
        # The engine's tool message carries the tool's name, not the call id: results go back
        # in call order, all of one round in one tool message.
        self._pending_results.append(tool_response(name, result))

    async def close(self) -> None:
        """Stop a running round, delete the engine conversation. Idempotent, never raises."""
        self._closed = True
        with trio.CancelScope(shield=True):
            generation = self.generation
            if generation is not None and not await generation.stop():
                self._leak()
                return
            await self._drop_engine_conv()
            if not self._creating:
                # (a creation in flight assigns after this: the engine's close must still find
                # this conversation; ensure_engine_conv forgets it once it has dropped that)
                self._llm.forget(self)

    def _leak(self) -> None:
        log.error("a LiteRT-LM engine thread did not stop within %g s after cancel; its "
                  "conversation and the engine are left open", STOP_TIMEOUT)
        self._llm.mark_leaked()
        self.engine_conv = None  # forgotten, never deleted: the stuck thread still uses it

    async def _drop_engine_conv(self) -> None:
        """Delete the engine conversation (a worker thread); the next round creates a new one."""
        if self.engine_conv is None and not self._creating:
            return
        try:
            await trio.to_thread.run_sync(self._llm.drop_engine_conv_sync, self)
        except Exception:
            log.exception("closing a LiteRT-LM conversation failed")

    async def ensure_engine_conv(self) -> Any:
        """The engine conversation, created (in a worker thread) from ``messages`` if there is
        none. Raises LlmConnectionError (backend closed) or LlmResponseError."""
        if self.engine_conv is not None:
            return self.engine_conv
        if self._llm.closed:
            raise LlmConnectionError("the LiteRT-LM backend is closed")

        self._creating = True
        try:
            # assigned in the thread: a caller cancelled meanwhile loses nothing, close() finds it
            with map_exceptions(_CREATE_ERRORS):
                await trio.to_thread.run_sync(self._llm.create_engine_conv_sync, self)
        finally:
            self._creating = False
            if self._closed:  # closed while it was being created: delete it, forget us
                with trio.CancelScope(shield=True):
                    await self._drop_engine_conv()
                self._llm.forget(self)
        if self._closed:
            raise LlmResponseError("the conversation is closed")
        self.engine_conversations += 1
        return self.engine_conv

    def _next_message(self, content: Sequence[Content] | None) -> Message:
        """The message this round sends. Tool results pending before a new user message are
        moved into the history (the engine takes one message per round), which forces a
        rebuild. Raises LlmResponseError when there is nothing to send."""
        results, self._pending_results = self._pending_results, []
        tool_message = {"role": "tool", "content": results} if results else None
        if content is None:
            if tool_message is None:
                raise LlmResponseError("nothing to send: no new message and no tool results")
            return tool_message
        if tool_message is not None:
            self.messages.append(tool_message)
            self._engine_conv_stale = True
        return user_message(content, supports_images=self._llm.supports_images)

    def _check_startable(self, content: Sequence[Content] | None) -> None:
        if self._closed:
            raise LlmResponseError("the conversation is closed")
        if self._llm.closed:
            raise LlmConnectionError("the LiteRT-LM backend is closed")
        if self._busy:
            raise LlmResponseError("a round is already running on this conversation")
        if content is None and not self._pending_results:
            raise LlmResponseError("nothing to send: no new message and no tool results")

    async def send_stream(
        self, content: Sequence[Content] | None, *, max_output_tokens: int | None = None
    ) -> AsyncGenerator[LlmDelta, None]:
        """Stream one round; see :meth:`agentik.llm.base.LiteConversation.send_stream`.

        Generates at most ``max_output_tokens`` (None: the backend's default budget); a round
        cut by that budget or by the window ends with ``FinishDelta("length")``. Usage is the
        engine's exact count. Waits for a free slot of the backend's limiter first. Raises
        LlmContextOverflowError (the message does not fit the window: nothing was generated),
        LlmResponseError (closed conversation, a round already running, an engine failure),
        LlmConnectionError (backend closed) or trio.Cancelled. Consume it with
        ``contextlib.aclosing``: leaving early cancels the engine's generation and waits for its
        thread before returning.
        """
        self._check_startable(content)
        # Set before the first await: a second round on this conversation fails at once.
        self._busy = True
        borrower = object()
        try:
            await self._llm.limiter.acquire_on_behalf_of(borrower)
        except BaseException:
            self._busy = False
            raise
        generation: Round | None = None
        completed = False
        try:
            limit = (max_output_tokens if max_output_tokens is not None
                     else self._llm.output_budget())
            generation = await self._start_round(content, limit)
            parser = ChunkParser()
            with map_exceptions(self._round_errors()):
                while (batch := await generation.next_batch()) is not None:
                    for chunk in batch:
                        for delta in parser.feed(chunk):
                            yield delta
            if generation.cancelled.is_set():
                raise LlmResponseError("the round was stopped: the conversation was closed")
            counts = generation.totals
            assert counts is not None
            self.messages.append(parser.assistant_message())
            completed = True
            yield UsageDelta(prompt_tokens=counts.prompt_tokens,
                             completion_tokens=counts.completion_tokens)
            yield FinishDelta(self._finish_reason(parser, counts, limit))
        finally:
            await self._end_round(generation, completed, borrower)

    async def _start_round(self, content: Sequence[Content] | None, limit: int | None) -> Round:
        """With the limiter's slot held: the round's message into the history, the engine
        conversation (re)built if needed, the generation started."""
        if self._closed:
            raise LlmResponseError("the conversation was closed while the round waited")
        # only now, with the slot held: a round cancelled while waiting consumed nothing
        message = self._next_message(content)
        if self._engine_conv_stale:
            self._engine_conv_stale = False
            await self._drop_engine_conv()
        try:
            # seeded with the history before this round's message (only if it is rebuilt)
            engine_conv = await self.ensure_engine_conv()
        finally:
            # part of the history from now on, whatever happens, like a request once sent
            self.messages.append(message)
        generation = Round(engine_conv, message, self._llm.context_window,
                           getattr(self._llm.engine, "tokenize", None), limit)
        self.generation = self.last_round = generation
        generation.start()
        return generation

    async def _end_round(self, generation: Round | None, completed: bool, borrower: object) -> None:
        """Shielded: a cancelled round must still stop the engine thread before the engine
        conversation is deleted and the limiter slot is given back."""
        with trio.CancelScope(shield=True):
            if generation is not None:
                if not generation.done.is_set() and not await generation.stop():
                    self._leak()
                self.generation = None
            if not completed:
                # cancelled or failed: this engine conversation is not reused
                await self._drop_engine_conv()
        self._llm.limiter.release_on_behalf_of(borrower)
        self._busy = False

    def _round_errors(self) -> ErrorTable:
        """How a failed round becomes an LlmError (raised into the stream)."""
        window = self._llm.context_window

        def round_failed(exc: Exception) -> LlmError:
            assert isinstance(exc, RoundFailed)
            if exc.window_full:
                size = f" ({exc.tokens} tokens)" if exc.tokens else ""
                return LlmContextOverflowError(
                    f"the prompt{size} does not fit the model's context window ({window} tokens)",
                    window=window, tokens=exc.tokens,
                )
            if exc.error is None:
                return LlmResponseError("the LiteRT-LM engine took no input and answered nothing")
            return LlmResponseError(f"the LiteRT-LM engine failed: {exc.error}")

        def failed(exc: Exception) -> LlmError:
            return LlmResponseError(f"the LiteRT-LM engine failed: {exc}")

        return {RoundFailed: round_failed, Exception: failed}

    def _finish_reason(
        self, parser: ChunkParser, counts: RoundResult, limit: int | None
    ) -> str:
        if parser.calls:
            return "tool_calls"
        window = self._llm.context_window
        if (limit is not None and counts.completion_tokens >= limit) or (
            window is not None and counts.total_tokens >= window
        ):
            return "length"
        return "stop"
