"""The engine of the LiteRT-LM backend: :class:`LiteRtLlm` owns the one ``litert_lm.Engine`` of
the process (lazy load in a worker thread, the concurrency limiter, the engine lock) and the
engine-level calls: create and delete an engine conversation, delete the engine.

This is the only module that imports ``litert_lm``, and only lazily (:func:`import_litert`).
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from agentik.context import estimate_item, item_text, output_budget
from agentik.errors import (
    ConfigError,
    LlmConnectionError,
    LlmError,
    LlmResponseError,
    missing_extra,
)
from agentik.llm.base import ToolSpec
from agentik.llm.boundary import ErrorTable, map_exceptions
from agentik.llm.litert.conversation import LiteRtConversation
from agentik.llm.litert.format import Message, described_tool, history_to_messages
from agentik.wire import WorkingItem

if TYPE_CHECKING:
    from agentik.config import Config

__all__ = ["INSTALL_HINT", "LiteRtLlm", "import_litert"]

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install -e '.[litert]' (the litert-lm-api package)"


def import_litert() -> Any:
    """The ``litert_lm`` module. Raises ImportError when the extra is not installed."""
    import litert_lm

    return litert_lm


class LiteRtLlm:
    """A :class:`agentik.llm.base.LiteLlm` over an embedded LiteRT-LM engine.

    Constructing it does not touch the model; the engine loads on the first :meth:`open` (or
    :meth:`load`). ``temperature``/``top_k``/``top_p``/``seed`` build the engine's sampler (all
    None: the model's defaults); ``max_output_tokens`` is the default output budget of a round
    (None: a quarter of the window, see :func:`agentik.context.output_budget`); a round may ask
    for another.
    """

    #: the engine is created for text only (no vision backend): images are dropped
    supports_images = False
    #: count_tokens uses the model's own tokenizer and chat template
    exact_tokens = True

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
        #: chat-template tokens (per message, once per prompt), measured on load
        self._template_tokens = (8, 4)
        _LIVE.add(self)

    @classmethod
    def from_config(cls, cfg: Config) -> LiteRtLlm:
        """The backend of ``cfg``. Checks, without loading anything: the ``litert_lm`` package is
        installed, ``litert_model_path`` names an existing file, the numbers are positive. Raises
        ConfigError naming the variable to set or the package to install."""
        try:
            import_litert()
        except ImportError as exc:
            raise missing_extra("AGENTIK_LLM_BACKEND", "the litert backend needs the LiteRT-LM "
                                "engine (the litert-lm-api package)", "litert", exc) from None
        raw = cfg.litert_model_path
        if not raw:
            raise ConfigError(
                "AGENTIK_LITERT_MODEL_PATH",
                "not set: the litert backend needs the path of a .litertlm model file",
            )
        path = Path(raw).expanduser()
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "does not exist"
            raise ConfigError(
                "AGENTIK_LITERT_MODEL_PATH",
                f"{str(path)!r} {what}: set it to the path of a .litertlm model file",
            )
        threads = cfg.litert_threads
        if threads < 1:
            raise ConfigError("AGENTIK_LITERT_THREADS", f"must be >= 1, got {threads}")
        concurrency = cfg.litert_max_concurrency
        if concurrency < 1:
            raise ConfigError(
                "AGENTIK_LITERT_MAX_CONCURRENCY", f"must be >= 1, got {concurrency}"
            )
        max_output = cfg.litert_max_output_tokens or cfg.max_output_tokens or None
        return cls(
            path,
            threads=threads,
            max_concurrency=concurrency,
            max_output_tokens=max_output,
            context_window=cfg.context_window or None,
            temperature=cfg.temperature,
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

    def _load_errors(self) -> ErrorTable:
        """How a failed load becomes an LlmError."""

        def not_installed(exc: Exception) -> LlmError:
            return LlmConnectionError(
                f"the LiteRT-LM engine is not installed ({exc}): {INSTALL_HINT}"
            )

        def cannot_load(exc: Exception) -> LlmError:
            return LlmConnectionError(f"cannot load the LiteRT-LM model {self.model_path}: {exc}")

        return {ImportError: not_installed, Exception: cannot_load}

    def _load_sync(self) -> None:
        """Worker thread: read the model's metadata, then create the engine."""
        with map_exceptions(self._load_errors()):
            litert_lm = import_litert()
            litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
            with litert_lm.ModelInfo(self.model_path) as info:
                if not info.is_llm_model:
                    raise LlmConnectionError(f"{self.model_path} is not a LiteRT-LM text model")
                window = int(info.max_context_tokens or 0) or None
                dynamic = bool(info.is_dynamic_context)
                function_calling = bool(info.llm.supports_function_calling())
            engine = litert_lm.Engine(
                self.model_path,
                backend=litert_lm.Backend.CPU(thread_count=self.threads),
                cache_dir=self.cache_dir,
            )
        self.supports_tools = function_calling
        configured = self._configured_window
        if configured is None or (window is not None and configured > window and not dynamic):
            if configured is not None:
                log.warning("AGENTIK_CONTEXT_WINDOW=%d is larger than the model's context window "
                            "(%d tokens): using %d", configured, window, window)
            self.context_window = window
        else:
            self.context_window = configured
        try:
            self._measure_template(engine)
        except Exception:  # keep the defaults: counts are then a little high, never low
            log.debug("measuring the chat template's tokens failed", exc_info=True)
        self._engine = engine
        log.info("loaded LiteRT-LM model %s (context %s tokens, function calling %s)",
                 self.model_path, window, function_calling)

    def _measure_template(self, engine: Any) -> None:
        """Worker thread: how many tokens the chat template adds per message and once per
        prompt (the generation prompt), by rendering one and two short messages."""
        def rendered(history: list[Message]) -> int:
            with engine.create_conversation(messages=history or None,
                                            automatic_tool_calling=False) as conv:
                return len(engine.tokenize(conv.render_message_to_string(_probe())))

        text = len(engine.tokenize(_PROBE_TEXT))
        one = rendered([])
        two = rendered([_probe()])
        per_message = two - one
        self._template_tokens = (max(0, per_message - text), max(0, one - per_message) + 1)

    def output_budget(self) -> int | None:
        """The output budget of a round: AGENTIK_LITERT_MAX_OUTPUT_TOKENS, else the default
        share of the window (see :func:`agentik.context.output_budget`)."""
        return output_budget(self.context_window, self.max_output_tokens)

    async def count_tokens(self, items: Sequence[WorkingItem]) -> list[int]:
        """Tokens each item takes, with the model's tokenizer (in a worker thread): its text
        plus the chat template's tokens per message; the first item also carries the
        once-per-prompt tokens (BOS, the generation prompt). Before the engine is loaded:
        the estimate."""
        engine = self._engine
        if engine is None:
            return [estimate_item(item, images=self.supports_images) for item in items]
        per_message, once = self._template_tokens

        def count() -> list[int]:
            counts = [len(engine.tokenize(item_text(item))) + per_message for item in items]
            if counts:
                counts[0] += once
            return counts

        try:
            return await trio.to_thread.run_sync(count)
        except Exception:  # the engine is closing: the estimate keeps the turn going
            log.debug("tokenizing with the engine failed; estimating", exc_info=True)
            return [estimate_item(item, images=self.supports_images) for item in items]

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
            await conv.ensure_engine_conv()
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
                if conv.generation is not None:
                    self._leaked = True  # a round still runs: its thread uses the engine
                    continue
                engine_conv, conv.engine_conv = conv.engine_conv, None
                if engine_conv is not None:
                    engine_conv.close()
            if self._leaked:
                log.error("not closing the LiteRT-LM engine: an engine thread did not stop")
                return
            engine.close()

    def create_engine_conv_sync(self, conv: LiteRtConversation) -> None:
        """Worker thread: give ``conv`` a new engine conversation seeded with its messages.
        Assigned under the engine lock, so closing the engine never misses it."""
        litert_lm = import_litert()
        kwargs: dict[str, Any] = {
            # a copy: the engine's wrapper keeps the list it was given, ours grows
            "messages": list(conv.messages) or None,
            # our tool loop runs the tools, never the engine
            "automatic_tool_calling": False,
        }
        if conv.tools:
            kwargs["tools"] = [described_tool(litert_lm, spec) for spec in conv.tools]
        sampler = {k: v for k, v in self._sampler.items() if v is not None}
        if sampler:
            kwargs["sampler_config"] = litert_lm.SamplerConfig(**sampler)
        with self._engine_lock:
            if self._engine is None or self._closed:
                raise LlmConnectionError("the LiteRT-LM backend is closed")
            if conv.closed:  # close() ran meanwhile: its drop already found nothing
                raise LlmResponseError("the conversation is closed")
            conv.engine_conv = self._engine.create_conversation(**kwargs)

    def forget(self, conv: LiteRtConversation) -> None:
        """``conv`` holds no engine conversation any more: closing the engine need not find it."""
        self._conversations.discard(conv)

    def mark_leaked(self) -> None:
        """An engine thread did not stop: the engine must then never be deleted."""
        self._leaked = True

    def drop_engine_conv_sync(self, conv: LiteRtConversation) -> None:
        """Worker thread: delete ``conv``'s engine conversation, if any. Taken and deleted under
        the engine lock, so it never races the engine's deletion nor a creation."""
        with self._engine_lock:
            engine_conv, conv.engine_conv = conv.engine_conv, None
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


_PROBE_TEXT = "Hello there."


def _probe() -> Message:
    return {"role": "user", "content": [{"type": "text", "text": _PROBE_TEXT}]}
