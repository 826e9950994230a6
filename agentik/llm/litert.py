"""The embedded LiteRT-LM backend (SPEC §7, ``AGENTIK_LLM_BACKEND=litert``).

This is the only module that imports ``litert_lm`` (the optional extra:
``pip install -e '.[litert]'``, package ``litert-lm-api``), and only lazily, so the core works
without it. Every engine error is converted here into the :class:`agentik.errors.LlmError` tree.

Threads and ownership:

- :class:`LiteRtLlm` owns the one ``litert_lm.Engine`` of the process. It is loaded once, lazily,
  by the first :meth:`LiteRtLlm.open` (or an explicit :meth:`LiteRtLlm.load`), in a worker
  thread. :meth:`LiteRtLlm.aclose` closes every conversation still open and only then the engine:
  an engine deleted under a live conversation segfaults the interpreter.
- :class:`LiteRtConversation` owns one engine conversation, kept across rounds so the engine
  reuses its KV cache. It also keeps the history in the engine's message format, so when its
  engine conversation must be dropped (a cancelled engine conversation only ever answers
  "CANCELLED" again, and one that failed is in an unknown state) the next round re-creates it
  seeded with that history.
- A round runs ``send_message_async`` (a *blocking* generator fed by a C++ thread) in a trio
  worker thread; each chunk is handed to the event loop with ``TrioToken.run_sync_soon`` over an
  unbounded memory channel, so the loop never blocks and the engine never waits for it. A
  cancelled round calls ``cancel_process()`` and waits until that thread has ended before the
  engine conversation is deleted.
- A ``trio.CapacityLimiter`` (``max_concurrency``, default 1) is held for each round from the
  first prefill to the last token; excess rounds wait their turn. Measured on 2 cores, three
  concurrent rounds on one engine took longer than the same three in a row, hence the default.

Model formats: the tools are described to the engine only when the model file says it supports
function calling (``ModelInfo.llm.supports_function_calling()``); the engine never runs them
(``automatic_tool_calling=False``): its tool calls come out as :class:`ToolCallDelta` and go
through agentik's tool loop, results go back as ``tool_response`` parts. Images are dropped with
a warning: the engine is set up for text only.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import threading
import uuid
import weakref
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import outcome
import trio

from agentik.errors import ConfigError, LlmConnectionError, LlmError, LlmResponseError
from agentik.llm.base import (
    FinishDelta,
    LiteConversation,
    LiteLlm,
    LlmDelta,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageDelta,
)
from agentik.wire import (
    AssistantItem,
    Content,
    Image,
    SummaryItem,
    SystemItem,
    Text,
    ToolItem,
    UserItem,
    WorkingItem,
)

if TYPE_CHECKING:
    from agentik.config import Config

__all__ = ["LiteRtConversation", "LiteRtLlm", "history_to_messages"]

log = logging.getLogger(__name__)

#: a chat message in the engine's JSON shape
Message = dict[str, Any]

#: how long a cancelled round may take to stop its engine thread before we give up waiting
#: (cancel_process() stops decoding within milliseconds; this only bounds a stuck engine)
STOP_TIMEOUT = 30.0

INSTALL_HINT = "pip install 'agentik[litert]' (the litert-lm-api package)"


def _import_litert() -> Any:
    """The ``litert_lm`` module. Raises ImportError when the extra is not installed."""
    import litert_lm

    return litert_lm


class LiteRtLlm:
    """A :class:`agentik.llm.base.LiteLlm` over an embedded LiteRT-LM engine.

    Constructing it does not touch the model; the engine loads on the first :meth:`open` (or
    :meth:`load`). ``temperature``/``top_k``/``top_p``/``seed`` build the engine's sampler (all
    None: the model's defaults); ``max_output_tokens`` caps one round (None: until the model stops
    or the context window is full).
    """

    #: the engine is created for text only (no vision backend): images are dropped
    supports_images = False

    def __init__(
        self,
        model_path: str | Path,
        *,
        threads: int = 2,
        max_concurrency: int = 1,
        cache_dir: str = ":nocache",
        max_output_tokens: int | None = None,
        context_window: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError("threads must be >= 1")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        self.model_path = str(model_path)
        self.threads = threads
        self.max_concurrency = max_concurrency
        # ":nocache" by default: otherwise the engine writes an XNNPACK cache file next to the
        # model, which fails (or litters) where models live on read-only storage.
        self.cache_dir = cache_dir
        self.max_output_tokens = max_output_tokens
        #: the window used for compaction: the configured one, else the model's (known once loaded)
        self.context_window: int | None = context_window
        self._configured_window = context_window
        self._sampler = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
        #: whether the model's format supports function calling (known once loaded)
        self.supports_tools = False
        #: rounds generating at once on the engine; the rest wait here
        self.limiter = trio.CapacityLimiter(max_concurrency)
        self._engine: Any = None
        self._load_lock = trio.Lock()
        self._closed = False
        #: set when an engine thread did not stop: the engine must then never be deleted
        self._leaked = False
        self._warned_tools = False
        #: serialises engine-level calls (create/delete a conversation, delete the engine) in
        #: worker threads; never taken on the event loop, never held while generating
        self._engine_lock = threading.Lock()
        self._conversations: set[LiteRtConversation] = set()
        _LIVE.add(self)

    @classmethod
    def from_config(cls, cfg: Config) -> LiteRtLlm:
        """The backend of ``cfg``. Checks, without loading anything: the ``litert_lm`` package is
        installed, ``litert_model_path`` names an existing file, the numbers are positive. Raises
        ConfigError naming the variable to set or the package to install."""
        try:
            _import_litert()
        except ImportError as exc:
            raise ConfigError(
                "AGENTIK_LLM_BACKEND",
                f"the litert backend needs the LiteRT-LM engine, which is not installed ({exc}): "
                f"{INSTALL_HINT}",
            ) from exc
        raw = cfg.litert_model_path
        if not raw:
            raise ConfigError(
                "AGENTIK_LITERT_MODEL_PATH",
                "not set: the litert backend needs the path of a .litertlm model file",
            )
        path = Path(raw).expanduser()
        if not path.is_file():
            what = "is a directory, not" if path.is_dir() else "does not exist: no"
            raise ConfigError(
                "AGENTIK_LITERT_MODEL_PATH", f"{str(path)!r} {what} a .litertlm model file"
            )
        threads = cfg.litert_threads
        if threads < 1:
            raise ConfigError("AGENTIK_LITERT_THREADS", f"must be >= 1, got {threads}")
        concurrency = cfg.litert_max_concurrency
        if concurrency < 1:
            raise ConfigError(
                "AGENTIK_LITERT_MAX_CONCURRENCY", f"must be >= 1, got {concurrency}"
            )
        max_output = cfg.litert_max_output_tokens or None
        return cls(
            path,
            threads=threads,
            max_concurrency=concurrency,
            max_output_tokens=max_output,
            context_window=cfg.context_window or None,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def loaded(self) -> bool:
        return self._engine is not None

    @property
    def engine(self) -> Any:
        """The ``litert_lm.Engine`` (None before :meth:`load`). For benchmarks and tests."""
        return self._engine

    async def load(self) -> None:
        """Load the engine now (in a worker thread) if it is not loaded yet; concurrent callers
        wait for the one load. Raises LlmConnectionError if the package is missing, the file
        is not a model, or the engine refuses it; a later call tries again."""
        if self._closed:
            raise LlmConnectionError("the LiteRT-LM backend is closed")
        if self._engine is not None:
            return
        async with self._load_lock:
            if self._engine is None and not self._closed:
                # Not abandoned on cancel: a half-loaded engine must not be left behind; the
                # thread assigns self._engine itself so a cancelled caller loses nothing.
                await trio.to_thread.run_sync(self._load_sync)

    def _load_sync(self) -> None:
        """Worker thread: read the model's metadata, then create the engine."""
        try:
            litert_lm = _import_litert()
        except ImportError as exc:
            raise LlmConnectionError(
                f"the LiteRT-LM engine is not installed ({exc}): {INSTALL_HINT}"
            ) from exc
        try:
            litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
            with litert_lm.ModelInfo(self.model_path) as info:
                if not info.is_llm_model:
                    raise LlmConnectionError(f"{self.model_path} is not a LiteRT-LM text model")
                window = int(info.max_context_tokens or 0) or None
                function_calling = bool(info.llm.supports_function_calling())
            engine = litert_lm.Engine(
                self.model_path,
                backend=litert_lm.Backend.CPU(thread_count=self.threads),
                cache_dir=self.cache_dir,
            )
        except LlmError:
            raise
        except Exception as exc:
            raise LlmConnectionError(
                f"cannot load the LiteRT-LM model {self.model_path}: {exc}"
            ) from exc
        self.supports_tools = function_calling
        if self._configured_window is None:
            self.context_window = window
        self._engine = engine
        log.info("loaded LiteRT-LM model %s (context %s tokens, function calling %s)",
                 self.model_path, window, function_calling)

    async def open(
        self, history: Sequence[WorkingItem], tools: Sequence[ToolSpec]
    ) -> LiteRtConversation:
        """A conversation seeded with ``history`` (its engine conversation is created now, in a
        worker thread; the history is prefilled with the first round). Raises
        LlmConnectionError (backend closed, engine cannot load) or LlmResponseError (the engine
        refused the conversation)."""
        await self.load()
        if self._closed:
            raise LlmConnectionError("the LiteRT-LM backend is closed")
        if tools and not self.supports_tools and not self._warned_tools:
            self._warned_tools = True
            log.warning("the model %s does not support function calling: the %d configured "
                        "tool(s) are not offered to it", self.model_path, len(tools))
        conv = LiteRtConversation(
            self,
            history_to_messages(history, supports_images=self.supports_images),
            list(tools) if self.supports_tools else [],
        )
        # Tracked before the engine conversation exists, so aclose() finds it whatever happens.
        self._conversations.add(conv)
        try:
            await conv._ensure_engine_conv()
        except BaseException:
            with trio.CancelScope(shield=True):
                await conv.close()
            raise
        return conv

    async def aclose(self) -> None:
        """Close every conversation still open, then the engine. Idempotent, never raises."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            for conv in list(self._conversations):
                await conv.close()  # stops running rounds first
            async with self._load_lock:  # a load in flight has finished
                pass
            try:
                await trio.to_thread.run_sync(self._close_engine_sync)
            except Exception:
                log.exception("closing the LiteRT-LM engine failed")

    def _close_engine_sync(self) -> None:
        """Worker thread (or interpreter exit): delete the conversations left (opened while
        closing, or never closed), then the engine; the other order segfaults."""
        with self._engine_lock:
            engine, self._engine = self._engine, None
            if engine is None:
                return
            for conv in list(self._conversations):
                if conv._generation is not None:
                    self._leaked = True  # a round still runs: its thread uses the engine
                    continue
                engine_conv, conv._engine_conv = conv._engine_conv, None
                if engine_conv is not None:
                    engine_conv.close()
            if self._leaked:
                log.error("not closing the LiteRT-LM engine: an engine thread did not stop")
                return
            engine.close()

    def _create_engine_conv(self, conv: LiteRtConversation) -> None:
        """Worker thread: give ``conv`` a new engine conversation seeded with its messages.
        Assigned under the engine lock, so closing the engine never misses it."""
        litert_lm = _import_litert()
        kwargs: dict[str, Any] = {
            # a copy: the engine's wrapper keeps the list it was given, ours grows
            "messages": list(conv.messages) or None,
            # our tool loop runs the tools, never the engine
            "automatic_tool_calling": False,
        }
        if conv.tools:
            kwargs["tools"] = [_described_tool(litert_lm, spec) for spec in conv.tools]
        sampler = {k: v for k, v in self._sampler.items() if v is not None}
        if sampler:
            kwargs["sampler_config"] = litert_lm.SamplerConfig(**sampler)
        if self.max_output_tokens is not None:
            kwargs["max_output_tokens"] = self.max_output_tokens
        with self._engine_lock:
            if self._engine is None or self._closed:
                raise LlmConnectionError("the LiteRT-LM backend is closed")
            if conv.closed:  # close() ran meanwhile: its drop already found nothing
                raise LlmResponseError("the conversation is closed")
            conv._engine_conv = self._engine.create_conversation(**kwargs)

    def _drop_engine_conv(self, conv: LiteRtConversation) -> None:
        """Worker thread: delete ``conv``'s engine conversation, if any. Taken and deleted under
        the engine lock, so it never races the engine's deletion nor a creation."""
        with self._engine_lock:
            engine_conv, conv._engine_conv = conv._engine_conv, None
            if engine_conv is not None:
                engine_conv.close()


_LIVE: weakref.WeakSet[LiteRtLlm] = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for llm in list(_LIVE):
        if not llm.closed:
            try:
                llm._close_engine_sync()
            except Exception:  # never raise at exit
                log.debug("closing a LiteRT-LM engine at exit failed", exc_info=True)


def _described_tool(litert_lm: Any, spec: ToolSpec) -> Any:
    """A ``litert_lm.Tool`` that only describes ``spec``: with automatic tool calling off, the
    engine never executes it."""

    description = {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters or {"type": "object", "properties": {}},
        },
    }

    class _Described(litert_lm.Tool):
        def get_tool_description(self) -> dict[str, Any]:
            return description

        def execute(self, param: Mapping[str, Any]) -> Any:
            raise RuntimeError(f"tool {spec.name!r} runs in agentik's tool loop, not the engine")

    return _Described()


class _RoundFailed(Exception):
    """A round failed in the engine (``error`` None: it took no input); ``window_full`` says
    whether the context window was the cause."""

    def __init__(self, error: Exception | None, window_full: bool) -> None:
        super().__init__(str(error) if error is not None else "the engine took no input")
        self.error = error
        self.window_full = window_full


class _Round:
    """One generation on an engine conversation, in a worker thread.

    The thread iterates ``send_message_async`` and hands the chunks (message dicts) to the event
    loop with ``run_sync_soon``, coalesced: while a batch waits for the loop, new chunks join it
    rather than each costing a wake-up. Its result ``(tokens_before, tokens_after, chunks)`` or
    its exception follows as the last item. :meth:`stop` cancels it and waits for the thread.
    """

    def __init__(
        self,
        engine_conv: Any,
        message: Message,
        window: int | None = None,
        tokenize: Callable[[str], list[int]] | None = None,
    ) -> None:
        self.engine_conv = engine_conv
        self.message = message
        self.window = window
        self.tokenize = tokenize
        self.token = trio.lowlevel.current_trio_token()
        self.send, self.recv = trio.open_memory_channel[tuple[str, Any]](math.inf)
        self.done = trio.Event()
        self.cancelled = threading.Event()
        #: chunks the engine produced, also those drained after a cancel (for tests)
        self.chunks = 0
        self._batch: list[dict[str, Any]] = []
        self._batch_lock = threading.Lock()  # held for a list swap only

    def start(self) -> None:
        trio.lowlevel.start_thread_soon(self._run, self._deliver, name="agentik-litert-round")

    def _run(self) -> tuple[int, int, int]:
        """Worker thread. Returns ``(tokens_before, tokens_after, chunks)``; raises
        :class:`_RoundFailed`."""
        conv = self.engine_conv
        before = int(conv.token_count)
        try:
            for msg in conv.send_message_async(self.message):
                self.chunks += 1
                if self.cancelled.is_set():
                    # Drain: the C++ side is still feeding the queue until it acknowledges the
                    # cancel; the engine conversation may only be deleted after that.
                    continue
                self._post(dict(msg) if isinstance(msg, Mapping) else {"content": str(msg)})
        except Exception as exc:
            raise _RoundFailed(exc, self._window_full()) from exc
        after = int(conv.token_count)
        if self.chunks == 0 and after <= before and not self.cancelled.is_set():
            # The library swallows "Max number of tokens reached": a silent empty round.
            raise _RoundFailed(None, self._window_full())
        return before, after, self.chunks

    def _window_full(self) -> bool:
        """Worker thread: whether the tokens in use plus this message exceed the window (the
        engine reports a full window in several ways, or not at all)."""
        if self.window is None or self.tokenize is None:
            return False
        try:
            text = "".join(_texts(self.message.get("content")))
            for part in self.message.get("content") or ():
                if isinstance(part, Mapping) and part.get("type") == "tool_response":
                    text += str(part.get("response"))
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

    def _deliver(self, result: outcome.Outcome[tuple[int, int, int]]) -> None:
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


class LiteRtConversation:
    """One model session on the engine: its own history in the engine's message format and one
    engine conversation holding that history in its KV cache."""

    def __init__(self, llm: LiteRtLlm, messages: list[Message], tools: list[ToolSpec]) -> None:
        self._llm = llm
        #: everything the model has seen, in the engine's format (also what a rebuild seeds)
        self.messages = messages
        self.tools = tools
        self._engine_conv: Any = None
        self._generation: _Round | None = None
        self._pending_results: list[dict[str, Any]] = []
        self._closed = False
        self._interrupted = False
        #: a round is running (or waiting for the engine) on this conversation
        self._busy = False
        #: an engine conversation is being created for this one (in a worker thread)
        self._creating = False
        #: the history changed under the engine conversation: rebuild it before the next round
        self._engine_conv_stale = False
        #: engine conversations created so far (1 unless a cancel or failure forced a rebuild)
        self.engine_conversations = 0
        #: the latest round's generation, kept for inspection (chunks produced, cancelled)
        self.last_round: _Round | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def add_tool_result(self, call_id: str, name: str, result: str) -> None:
        # The engine's tool message carries the tool's name, not the call id: results go back
        # in call order, all of one round in one tool message.
        self._pending_results.append({"type": "tool_response", "name": name, "response": result})

    async def interrupt(self) -> None:
        """Stop the running round, if any: its stream ends with ``FinishDelta("interrupted")``
        and the engine conversation is rebuilt for the next round. (The actor interrupts by
        cancelling the consuming task instead, which works the same way.)"""
        generation = self._generation
        if generation is not None:
            self._interrupted = True
            await trio.to_thread.run_sync(generation.cancel_now)

    async def close(self) -> None:
        """Stop a running round, delete the engine conversation. Idempotent, never raises."""
        self._closed = True
        with trio.CancelScope(shield=True):
            generation = self._generation
            if generation is not None and not await generation.stop():
                self._leak()
                return
            await self._drop_engine_conv()
            if not self._creating:
                # (a creation in flight assigns after this: the engine's close must still find
                # this conversation; _ensure_engine_conv forgets it once it has dropped that)
                self._llm._conversations.discard(self)

    def _leak(self) -> None:
        log.error("a LiteRT-LM engine thread did not stop within %g s after cancel; its "
                  "conversation and the engine are left open", STOP_TIMEOUT)
        self._llm._leaked = True
        self._engine_conv = None  # forgotten, never deleted: the stuck thread still uses it

    async def _drop_engine_conv(self) -> None:
        """Delete the engine conversation (a worker thread); the next round creates a new one."""
        if self._engine_conv is None and not self._creating:
            return
        try:
            await trio.to_thread.run_sync(self._llm._drop_engine_conv, self)
        except Exception:
            log.exception("closing a LiteRT-LM conversation failed")

    async def _ensure_engine_conv(self) -> Any:
        """The engine conversation, created (in a worker thread) from ``messages`` if there is
        none. Raises LlmConnectionError (backend closed) or LlmResponseError."""
        if self._engine_conv is not None:
            return self._engine_conv
        if self._llm.closed:
            raise LlmConnectionError("the LiteRT-LM backend is closed")

        self._creating = True
        try:
            # assigned in the thread: a caller cancelled meanwhile loses nothing, close() finds it
            await trio.to_thread.run_sync(self._llm._create_engine_conv, self)
        except LlmError:
            raise
        except Exception as exc:
            raise LlmResponseError(f"the LiteRT-LM engine refused the conversation: {exc}") from exc
        finally:
            self._creating = False
            if self._closed:  # closed while it was being created: delete it, forget us
                with trio.CancelScope(shield=True):
                    await self._drop_engine_conv()
                self._llm._conversations.discard(self)
        if self._closed:
            raise LlmResponseError("the conversation is closed")
        self.engine_conversations += 1
        return self._engine_conv

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

    async def send_stream(
        self, content: Sequence[Content] | None
    ) -> AsyncGenerator[LlmDelta, None]:
        """Stream one round; see :meth:`agentik.llm.base.LiteConversation.send_stream`.

        Waits for a free slot of the backend's limiter first. Raises LlmResponseError (closed
        conversation, a round already running, an engine failure, a full context window),
        LlmConnectionError (backend closed) or trio.Cancelled. Consume it with
        ``contextlib.aclosing``: leaving early cancels the engine's generation and waits for its
        thread before returning.
        """
        if self._closed:
            raise LlmResponseError("the conversation is closed")
        if self._llm.closed:
            raise LlmConnectionError("the LiteRT-LM backend is closed")
        if self._busy:
            raise LlmResponseError("a round is already running on this conversation")
        if content is None and not self._pending_results:
            raise LlmResponseError("nothing to send: no new message and no tool results")
        # Set before the first await: a second round on this conversation fails at once.
        self._busy = True
        try:
            borrower = object()
            await self._llm.limiter.acquire_on_behalf_of(borrower)
        except BaseException:
            self._busy = False
            raise
        generation: _Round | None = None
        completed = False
        try:
            if self._closed:
                raise LlmResponseError("the conversation was closed while the round waited")
            # only now, with the slot held: a round cancelled while waiting consumed nothing
            message = self._next_message(content)
            if self._engine_conv_stale:
                self._engine_conv_stale = False
                await self._drop_engine_conv()
            try:
                # seeded with the history before this round's message (only if it is rebuilt)
                engine_conv = await self._ensure_engine_conv()
            finally:
                # part of the history from now on, whatever happens, like a request once sent
                self.messages.append(message)
            engine = self._llm.engine
            generation = _Round(engine_conv, message, self._llm.context_window,
                                getattr(engine, "tokenize", None))
            self._generation = self.last_round = generation
            self._interrupted = False
            parser = _ChunkParser()
            generation.start()
            while True:
                kind, payload = await generation.recv.receive()
                if kind == "chunks":
                    for chunk in payload:
                        for delta in parser.feed(chunk):
                            yield delta
                    continue
                result: outcome.Outcome[tuple[int, int, int]] = payload
                if isinstance(result, outcome.Error):
                    raise self._round_error(result.error) from result.error
                _, after, chunks = result.unwrap()
                break
            if generation.cancelled.is_set():
                if self._interrupted:
                    yield FinishDelta("interrupted")
                    return
                raise LlmResponseError("the round was stopped: the conversation was closed")
            self.messages.append(parser.assistant_message())
            completed = True
            yield UsageDelta(prompt_tokens=max(after - chunks, 0), completion_tokens=chunks)
            yield FinishDelta(self._finish_reason(parser, chunks, after))
        finally:
            # Shielded: a cancelled round must still stop the engine thread before the engine
            # conversation is deleted and the limiter slot is given back.
            with trio.CancelScope(shield=True):
                if generation is not None:
                    if not generation.done.is_set() and not await generation.stop():
                        self._leak()
                    self._generation = None
                if not completed:
                    # cancelled, interrupted or failed: this engine conversation is not reused
                    await self._drop_engine_conv()
            self._llm.limiter.release_on_behalf_of(borrower)
            self._busy = False

    def _round_error(self, exc: BaseException) -> LlmError:
        """The LlmError for a failed round (raised into the stream)."""
        if isinstance(exc, _RoundFailed):
            if exc.window_full:
                return LlmResponseError(
                    f"the model's context window ({self._llm.context_window} tokens) is full: "
                    f"the conversation must be compacted or shortened ({exc})"
                )
            if exc.error is None:
                return LlmResponseError("the LiteRT-LM engine took no input and answered nothing")
            exc = exc.error
        return LlmResponseError(f"the LiteRT-LM engine failed: {exc}")

    def _finish_reason(self, parser: _ChunkParser, chunks: int, tokens: int) -> str:
        if parser.calls:
            return "tool_calls"
        limit = self._llm.max_output_tokens
        window = self._llm.context_window
        if (limit is not None and chunks >= limit) or (window is not None and tokens >= window):
            return "length"
        return "stop"


class _ChunkParser:
    """Turns the engine's streamed message dicts into LlmDeltas and accumulates the answer."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: list[dict[str, Any]] = []

    def feed(self, chunk: Mapping[str, Any]) -> Iterable[LlmDelta]:
        for channel, value in (chunk.get("channels") or {}).items():
            if isinstance(value, str) and value and channel != "content":
                yield ReasoningDelta(value)
        for piece in _texts(chunk.get("content")):
            if piece:
                self.text.append(piece)
                yield TextDelta(piece)
        for raw in chunk.get("tool_calls") or ():
            call = _tool_call(raw)
            if call is None:
                log.warning("ignored a malformed tool call from the engine: %r", raw)
                continue
            index = len(self.calls)
            self.calls.append(call)
            yield ToolCallDelta(
                index=index, id=call["id"], name=call["function"]["name"],
                arguments=json.dumps(call["function"]["arguments"]),
            )

    def assistant_message(self) -> Message:
        message: Message = {
            "role": "assistant", "content": [{"type": "text", "text": "".join(self.text)}],
        }
        if self.calls:
            message["tool_calls"] = self.calls
        return message


def _texts(content: Any) -> Iterable[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                yield part
            elif isinstance(part, Mapping) and part.get("type") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    yield text


def _tool_call(raw: Any) -> dict[str, Any] | None:
    """A tool call of the engine normalised to ``{"id", "type", "function": {"name",
    "arguments": dict}}``; None if it has no name."""
    if not isinstance(raw, Mapping):
        return None
    function = raw.get("function", raw)
    if not isinstance(function, Mapping):
        return None
    name = function.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        arguments = _arguments_dict(arguments)
    if not isinstance(arguments, Mapping):
        arguments = {}
    call_id = raw.get("id")
    if not isinstance(call_id, str) or not call_id:
        # the engine's calls carry no id: make one so results can be matched in memory
        call_id = f"call_{uuid.uuid4().hex[:16]}"
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": dict(arguments)}}


def _arguments_dict(arguments: str) -> dict[str, Any]:
    """JSON arguments text as a dict (the engine's format takes objects); ``{}`` when empty,
    ``{"arguments": text}`` when it is not a JSON object, so nothing is silently lost."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


# --- history conversion --------------------------------------------------------------------------


def _text_part(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def user_message(content: Sequence[Content], *, supports_images: bool) -> Message:
    """A user message; images are dropped (with a warning) unless the engine takes them."""
    parts: list[dict[str, Any]] = []
    dropped = 0
    for item in content:
        if isinstance(item, Text):
            parts.append(_text_part(item.body))
        elif isinstance(item, Image):
            if supports_images:
                parts.append({"type": "image", "blob": item.data})
            else:
                dropped += 1
    if dropped:
        log.warning("dropped %d image(s): the model does not accept images", dropped)
    # the chat templates iterate over the parts: never send an empty list
    return {"role": "user", "content": parts or [_text_part("")]}


def history_to_messages(
    history: Sequence[WorkingItem], *, supports_images: bool = False
) -> list[Message]:
    """Working memory as the engine's messages (``create_conversation(messages=...)``).

    Content is always a list of ``{"type": "text"}`` parts (what the chat templates expect);
    assistant tool calls carry their arguments as objects; consecutive tool results become one
    ``tool`` message of ``tool_response`` parts, the shape a live round sends them in.
    """
    messages: list[Message] = []
    for item in history:
        if isinstance(item, SystemItem):
            messages.append({"role": "system", "content": [_text_part(item.text)]})
        elif isinstance(item, SummaryItem):
            messages.append({
                "role": "system",
                "content": [_text_part(f"Summary of earlier conversation: {item.text}")],
            })
        elif isinstance(item, UserItem):
            messages.append(user_message(item.content, supports_images=supports_images))
        elif isinstance(item, AssistantItem):
            texts = [c.body for c in item.content if isinstance(c, Text)]
            if len(texts) != len(item.content):
                log.warning("dropped image(s) from an assistant message: the model takes none")
            message: Message = {"role": "assistant", "content": [_text_part("".join(texts))]}
            if item.tool_calls:
                message["tool_calls"] = [
                    {"id": call.call_id, "type": "function",
                     "function": {"name": call.name, "arguments": _arguments_dict(call.arguments)}}
                    for call in item.tool_calls
                ]
            messages.append(message)
        elif isinstance(item, ToolItem):
            part = {"type": "tool_response", "name": item.name, "response": item.content}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "tool":
                last["content"].append(part)
            else:
                messages.append({"role": "tool", "content": [part]})
    return messages


if TYPE_CHECKING:  # static proof that the classes implement the backend protocol

    def _implements(llm: LiteRtLlm, conv: LiteRtConversation) -> tuple[LiteLlm, LiteConversation]:
        return llm, conv
