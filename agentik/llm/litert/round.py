"""One generation of the LiteRT-LM backend, run in a worker thread.

``send_message_async`` of an engine conversation is a *blocking* generator fed by a C++ thread; a
:class:`Round` iterates it in a trio worker thread and hands each chunk to the event loop with
``TrioToken.run_sync_soon`` over an unbounded memory channel, so the loop never blocks and the
engine never waits for it. :meth:`Round.stop` calls ``cancel_process()`` and waits until that
thread has ended: only then may the engine conversation be deleted.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import outcome
import trio

from agentik.context import is_overflow_text, tokens_from_text
from agentik.llm.litert.format import Message, message_text

__all__ = ["STOP_TIMEOUT", "Round", "RoundFailed", "RoundResult"]

#: how long a cancelled round may take to stop its engine thread before we give up waiting
#: (cancel_process() stops decoding within milliseconds; this only bounds a stuck engine)
STOP_TIMEOUT = 30.0


class RoundFailed(Exception):
    """A round failed in the engine (``error`` None: it took no input); ``window_full`` says
    whether the context window was the cause, ``tokens`` the prompt's size when known."""

    def __init__(
        self, error: Exception | None, window_full: bool, tokens: int | None = None
    ) -> None:
        super().__init__(str(error) if error is not None else "the engine took no input")
        self.error = error
        self.window_full = window_full
        self.tokens = tokens


class RoundResult(NamedTuple):
    """What a finished round used, exactly, from the engine's own counts."""

    #: tokens in the context before generation (history + this round's message)
    prompt_tokens: int
    #: tokens generated
    completion_tokens: int
    #: tokens in the context after the round
    total_tokens: int
    chunks: int
    #: seconds from the start of the round to the first chunk (prefill, mostly)
    first_chunk_s: float | None


class Round:
    """One generation on an engine conversation, in a worker thread.

    The thread iterates ``send_message_async`` and hands the chunks (message dicts) to the event
    loop with ``run_sync_soon``, coalesced: while a batch waits for the loop, new chunks join it
    rather than each costing a wake-up. Its :class:`RoundResult` or its exception follows as the
    last item. :meth:`stop` cancels it and waits for the thread.
    """

    def __init__(
        self,
        engine_conv: Any,
        message: Message,
        window: int | None = None,
        tokenize: Callable[[str], list[int]] | None = None,
        max_output_tokens: int | None = None,
    ) -> None:
        self.engine_conv = engine_conv
        self.message = message
        self.window = window
        self.tokenize = tokenize
        self.max_output_tokens = max_output_tokens
        #: tokens this round's message adds to the context (known before sending)
        self.new_tokens: int | None = None
        self.token = trio.lowlevel.current_trio_token()
        self.send, self.recv = trio.open_memory_channel[tuple[str, Any]](math.inf)
        self.done = trio.Event()
        self.cancelled = threading.Event()
        #: chunks the engine produced, also those drained after a cancel (for tests)
        self.chunks = 0
        #: the thread's result once it has ended without error
        self.totals: RoundResult | None = None
        self._batch: list[dict[str, Any]] = []
        self._batch_lock = threading.Lock()  # held for a list swap only

    async def next_batch(self) -> list[dict[str, Any]] | None:
        """Event loop: the next chunks the engine produced, or None once the thread has ended
        (then ``totals`` holds its :class:`RoundResult`). Raises what the
        thread raised (:class:`RoundFailed`)."""
        kind, payload = await self.recv.receive()
        if kind == "chunks":
            batch: list[dict[str, Any]] = payload
            return batch
        self.totals = payload.unwrap()
        return None

    def start(self) -> None:
        trio.lowlevel.start_thread_soon(self._run, self._deliver, name="agentik-litert-round")

    def _run(self) -> RoundResult:
        """Worker thread. Returns the round's exact token counts; raises :class:`RoundFailed`
        (``window_full`` before anything is sent when the message cannot fit: the engine would
        refuse it with INVALID_ARGUMENT and be unusable afterwards)."""
        conv = self.engine_conv
        start = time.perf_counter()
        first_chunk: float | None = None
        before = int(conv.token_count)
        prompt: int | None = None
        if self.tokenize is not None:
            try:
                # what the engine will prefill: the message rendered by the chat template (with
                # the pending seeded history on a new engine conversation), plus BOS if empty
                rendered = conv.render_message_to_string(self.message)
                self.new_tokens = len(self.tokenize(rendered)) + (1 if before == 0 else 0)
                prompt = before + self.new_tokens
            except Exception:
                prompt = None
        if prompt is not None and self.window is not None and prompt >= self.window:
            raise RoundFailed(None, True, prompt)
        kwargs: dict[str, Any] = {}
        if self.max_output_tokens is not None:
            kwargs["max_output_tokens"] = self.max_output_tokens
        try:
            for msg in conv.send_message_async(self.message, **kwargs):
                if first_chunk is None:
                    first_chunk = time.perf_counter() - start
                self.chunks += 1
                if self.cancelled.is_set():
                    # Drain: the C++ side is still feeding the queue until it acknowledges the
                    # cancel; the engine conversation may only be deleted after that.
                    continue
                self._post(dict(msg) if isinstance(msg, Mapping) else {"content": str(msg)})
        except Exception as exc:
            full = self._window_full() or is_overflow_text(str(exc))
            raise RoundFailed(exc, full, prompt or tokens_from_text(str(exc))) from exc
        after = int(conv.token_count)
        if self.chunks == 0 and after <= before and not self.cancelled.is_set():
            # The library swallows "Max number of tokens reached": a silent empty round.
            raise RoundFailed(None, self._window_full(), prompt)
        if prompt is None or prompt > after:
            prompt = max(after - self.chunks, 0)  # no tokenizer: chunks are about tokens
        return RoundResult(prompt, after - prompt, after, self.chunks, first_chunk)

    def _window_full(self) -> bool:
        """Worker thread: whether the tokens in use plus this message exceed the window (the
        engine reports a full window in several ways, or not at all)."""
        if self.window is None or self.tokenize is None:
            return False
        try:
            text = message_text(self.message)
            return int(self.engine_conv.token_count) + len(self.tokenize(text)) >= self.window
        except Exception:
            return False

    def _post(self, chunk: dict[str, Any]) -> None:
        """Worker thread: queue a chunk; wake the loop only if no batch is already waiting."""
        with self._batch_lock:
            first = not self._batch
            self._batch.append(chunk)
        if first:
            try:
                self.token.run_sync_soon(self._flush)
            except trio.RunFinishedError:  # nobody listens any more
                self.cancel_now()

    def _flush(self) -> None:
        """Event loop: pass the waiting batch on."""
        with self._batch_lock:
            batch, self._batch = self._batch, []
        if batch:
            self._put(("chunks", batch))

    def _put(self, item: tuple[str, Any]) -> None:
        """Event loop (a run_sync_soon callback must never raise)."""
        try:
            self.send.send_nowait(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def _deliver(self, result: outcome.Outcome[RoundResult]) -> None:
        """Worker thread, after ``_run``: hand the result over and mark the thread done."""

        def finish() -> None:
            self._flush()
            self._put(("done", result))
            self.done.set()

        try:
            self.token.run_sync_soon(finish)
        except trio.RunFinishedError:
            pass

    def cancel_now(self) -> None:
        """Any thread: ask the engine to stop this generation (idempotent)."""
        if not self.cancelled.is_set():
            self.cancelled.set()
            self.engine_conv.cancel_process()

    async def stop(self) -> bool:
        """Cancel and wait until the thread has ended (up to STOP_TIMEOUT); shield the caller.
        Returns whether it ended."""
        if not self.done.is_set():
            await trio.to_thread.run_sync(self.cancel_now)
            with trio.move_on_after(STOP_TIMEOUT):
                await self.done.wait()
        return self.done.is_set()

