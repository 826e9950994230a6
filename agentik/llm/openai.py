"""The OpenAI-compatible backend: chat completions over the official ``openai`` SDK
(docs/ARCHITECTURE.md, "LLM backends").

This module and :mod:`agentik.llm.openai_errors` are the only ones that import ``openai``: every
SDK and transport error is converted into the :class:`agentik.errors.LlmError` tree by one table
(:func:`~agentik.llm.openai_errors.error_table`) at one boundary, the streamed request.

- :class:`OpenAiLlm` owns one ``openai.AsyncOpenAI`` client (one connection pool) for the process;
  ``aclose()`` closes it. Under trio the SDK's ``__del__`` cleanup does nothing useful, so the
  client must be closed explicitly.
- :class:`OpenAiConversation` keeps its own list of chat messages (the shape is
  :mod:`agentik.llm.openai_format`). Each ``send_stream`` is one streamed chat-completions
  request (sent by :mod:`agentik.llm.openai_http` through the SDK's HTTP client); after a
  complete round the assistant's message (text and tool calls) is appended to that list, and
  ``add_tool_result`` appends tool answers.

The request's ``timeout`` is an ``httpx2.Timeout``: its read timeout bounds the wait for each
chunk, so a server that stops sending mid-stream fails the turn with ``LlmTimeoutError``. The
wait for the response (until its headers) is bounded as a whole by the same timeout, retries
included: the retries are ours (:func:`~agentik.llm.openai_errors.retry_delay` says what is
retried, as the SDK would; :func:`agentik.llm.boundary.retry_within` makes a retry only when it
can still finish in time), and nothing is retried once the response has started.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Sequence
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import httpx2
import openai
import trio

from agentik.context import (
    estimate_item,
    estimate_tokens,
    learned_window,
    output_budget,
)
from agentik.errors import (
    LlmConnectionError,
    LlmContextOverflowError,
    LlmError,
    LlmResponseError,
    LlmTimeoutError,
)
from agentik.llm.base import LiteConversation, LiteLlm, LlmDelta, ToolSpec
from agentik.llm.boundary import map_exceptions, retry_within
from agentik.llm.openai_errors import error_table, retry_delay
from agentik.llm.openai_format import (
    CHUNK,
    FORMAT,
    Message,
    RoundReader,
    history_to_messages,
    sanitize_messages,
    tools_to_openai,
    user_message,
)
from agentik.llm.openai_http import ChatEndpoint, data_lines
from agentik.llm.openai_window import survey
from agentik.wire import Content, WorkingItem

if TYPE_CHECKING:
    from agentik.config import Config

__all__ = [
    "OpenAiConversation",
    "OpenAiLlm",
    "error_table",
    "history_to_messages",
    "sanitize_messages",
]

log = logging.getLogger(__name__)

#: the longest we wait to establish a connection, whatever the read timeout is
_CONNECT_TIMEOUT = 30.0
#: the longest we read on after ``[DONE]`` to keep the connection for the next round
_DRAIN_TIMEOUT = 1.0


class OpenAiLlm:
    """A :class:`agentik.llm.base.LiteLlm` over an OpenAI-compatible chat-completions endpoint.

    ``context_window`` is the configured one (AGENTIK_CONTEXT_WINDOW), else what the server's
    model listing says (read by the first :meth:`survey` it answers; vLLM, llama.cpp, LM Studio
    and Ollama say it, :mod:`agentik.llm.openai_window`), else None until a context-overflow
    refusal (HTTP 400 ``context_length_exceeded`` / "maximum context length is N tokens")
    teaches it, for every conversation of the process. Token counts are
    :func:`agentik.context.estimate_item`.
    """

    #: counts are an estimate (the server's tokenizer is unknown)
    exact_tokens = False

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        model: str,
        timeout: float = 120.0,
        max_retries: int = 2,
        context_window: int | None = None,
        supports_images: bool = True,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
    ) -> None:
        self.base_url = base_url
        #: sent with every request when set (the agent's temperature)
        self.temperature = temperature
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.context_window = context_window
        #: the output budget per round (AGENTIK_MAX_OUTPUT_TOKENS); None: a share of the window
        self.max_output_tokens = max_output_tokens
        self.supports_images = supports_images
        self._closed = False
        self._api_key = api_key
        #: whether a survey reached the server once (its window is asked for only then)
        self._window_asked = False
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            # the SDK refuses to start without a key; local servers do not need one
            api_key=api_key or "none",
            timeout=httpx2.Timeout(timeout, connect=min(timeout, _CONNECT_TIMEOUT)),
            # retries are made by send_stream within AGENTIK_LLM_TIMEOUT (retry_delay); the
            # SDK's own would each get the whole timeout again
            max_retries=0,
        )
        #: the client's base URL as text, for messages (the URL is fixed; made once, not per
        #: request: each str() of an httpx2 URL rebuilds it)
        self._endpoint = str(self.client.base_url)
        #: how this backend's third-party errors become LlmErrors
        self.errors = error_table(self.endpoint)
        #: the streamed request, sent through the client's HTTP client (openai_http)
        self.chat = ChatEndpoint(self.client)

    @classmethod
    def from_config(cls, cfg: Config) -> OpenAiLlm:
        return cls(
            base_url=cfg.openai_base_url,
            api_key=cfg.openai_api_key,
            model=cfg.openai_model,
            timeout=cfg.llm_timeout,
            max_retries=cfg.llm_max_retries,
            context_window=cfg.context_window or None,
            max_output_tokens=cfg.max_output_tokens or None,
            temperature=cfg.temperature,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    async def count_tokens(self, items: Sequence[WorkingItem]) -> list[int]:
        return [estimate_item(item, images=self.supports_images) for item in items]

    def output_budget(self) -> int | None:
        """Tokens a round may generate: AGENTIK_MAX_OUTPUT_TOKENS, else the default share of the
        window once it is known, else None (the server's default)."""
        return output_budget(self.context_window, self.max_output_tokens)

    def learn_overflow(self, exc: LlmContextOverflowError, sent_tokens: int) -> None:
        """A server refused a request as too long: remember its window (named in the answer,
        else a bound below what was refused: ``sent_tokens`` is our estimate of it) and put it
        on the error."""
        known = self.context_window
        learned = learned_window(known, exc.window, sent_tokens)
        if known is None or learned < known:
            log.warning("the LLM endpoint %s refused a request as too long: its context window "
                        "is %s%d tokens", self.endpoint, "" if exc.window else "at most ", learned)
            self.context_window = learned
        exc.window = self.context_window

    async def survey(self) -> str | None:
        """Whether the server answers (None, else why not: ``/readyz``). The first time it does,
        the model's window is read where the server says, unless it is known already."""
        want = self.context_window is None and not self._window_asked
        found = await survey(self.endpoint, self._api_key, self.model, want_window=want)
        if found.error is None and want:
            self._window_asked = True
            if found.window and self.context_window is None:
                log.info("the LLM endpoint %s: %s has a context window of %d tokens (from %s)",
                         self.endpoint, self.model, found.window, found.source)
                self.context_window = found.window
        return found.error

    @property
    def endpoint(self) -> str:
        """The base URL the client talks to (for messages)."""
        return self._endpoint

    async def open(
        self, history: Sequence[WorkingItem], tools: Sequence[ToolSpec]
    ) -> OpenAiConversation:
        if self._closed:
            raise LlmConnectionError("the OpenAI backend is closed")
        messages = history_to_messages(history, supports_images=self.supports_images)
        return OpenAiConversation(self, messages, tools_to_openai(tools))

    async def probe(self) -> str:
        """``agentik check``: list the endpoint's models, or, where it lists none (or has no
        models route), make a one-token request. Returns what was found; raises LlmError (its
        message names the endpoint)."""
        try:
            with map_exceptions(self.errors):
                ids = [m.id async for m in self.client.models.list()]
        except LlmResponseError:
            ids = []  # a server without GET /models: ask the model itself
        if ids:
            found = "listed" if self.model in ids else "not listed (it may still answer)"
            return f"{self.endpoint}: {len(ids)} model(s); {self.model} {found}"
        with map_exceptions(self.errors):
            await self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        return f"{self.endpoint}: {self.model} answered a one-token request"

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.client.close()
        except Exception:  # never raise from cleanup
            log.exception("closing the OpenAI client failed")


class OpenAiConversation:
    """One model session: its own message list, one streamed request per round."""

    def __init__(
        self, llm: OpenAiLlm, messages: list[Message], tools: list[dict[str, Any]]
    ) -> None:
        self._llm = llm
        self.messages = messages
        self.tools = tools
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def add_tool_result(self, call_id: str, name: str, result: str) -> None:
        self.messages.append(FORMAT.tool(call_id, name, result))

    async def close(self) -> None:
        self._closed = True

    async def send_stream(
        self, content: Sequence[Content] | None, *, max_output_tokens: int | None = None
    ) -> AsyncGenerator[LlmDelta, None]:
        """Stream one round; see :meth:`agentik.llm.base.LiteConversation.send_stream`.

        ``max_output_tokens`` (None: the backend's budget, if any) is sent as
        ``max_completion_tokens`` (the current name; ``litert-lm serve`` honours only it). A
        context-overflow refusal raises LlmContextOverflowError and teaches the backend the
        window.

        An async generator: consume it with ``contextlib.aclosing`` (or a trio cancel scope) so an
        early exit closes the HTTP response at once rather than at garbage collection.
        """
        if self._closed:
            raise LlmResponseError("the conversation is closed")
        if self._llm.closed:
            raise LlmConnectionError("the OpenAI backend is closed")
        if content is not None:
            self.messages.append(
                user_message(content, supports_images=self._llm.supports_images)
            )
        reader = RoundReader()
        done = False  # the server's "[DONE]"
        limit = max_output_tokens if max_output_tokens is not None else self._llm.output_budget()
        try:
            with map_exceptions(self._llm.errors):
                async with AsyncExitStack() as stack:
                    response = await self._open(stack, limit)
                    # identity-encoded (an SSE stream normally is): the raw bytes, without the
                    # decoder layer of aiter_bytes (one async generator less per chunk)
                    body = (response.aiter_bytes() if "content-encoding" in response.headers
                            else response.aiter_raw())
                    rest = b""
                    while not done:
                        chunk = await anext(body, None)  # None: the body ended
                        datas, rest = data_lines(rest, b"\n" if chunk is None else chunk)
                        for data in datas:
                            if data == b"[DONE]":
                                done = True
                                break
                            for delta in reader.deltas(CHUNK.decode(data)):
                                yield delta
                        if chunk is None:
                            break
                    if done:
                        # Read the body to its end (normally nothing is left after [DONE]): a
                        # response closed unread closes its connection, so every round would
                        # open a new one (issue 13: a connect, a resolve in a thread, a handshake
                        # per turn). A server that keeps sending gets its connection closed.
                        with trio.move_on_after(_DRAIN_TIMEOUT):
                            async for _ in body:
                                pass
        except LlmContextOverflowError as exc:
            sent = sum(estimate_tokens(json.dumps(m.get("content"))) + 8
                       for m in self.messages) + (limit or 0)
            self._llm.learn_overflow(exc, sent)
            raise
        for delta in self._unfinished(reader, done):
            yield delta
        self.messages.append(reader.message())

    async def _open(self, stack: AsyncExitStack, limit: int | None) -> httpx2.Response:
        """This round's streamed response, its headers read, closed by ``stack``.

        AGENTIK_LLM_TIMEOUT bounds the whole wait for it, retries included: they are ours (the
        SDK's max_retries is 0), and one is made only when it can still finish in time
        (agentik.llm.boundary.retry_within)."""
        body = self._body(limit)

        async def attempt() -> httpx2.Response:
            return await self._llm.chat.open(stack, body)

        return await retry_within(
            attempt, deadline=trio.current_time() + self._llm.timeout,
            max_retries=self._llm.max_retries, retry_delay=retry_delay,
            timed_out=self._timed_out, what=f"the LLM request to {self._llm.endpoint}",
        )

    def _unfinished(self, reader: RoundReader, done: bool) -> list[LlmDelta]:
        """The round's last deltas when the body ended without a finish_reason."""
        if reader.finished:
            return []
        if not done:
            # The body ended with neither a finish_reason nor [DONE]: the server died (or the
            # connection was cut) mid-answer. What was streamed is not the answer: fail the
            # round, so the turn keeps the partial text marked interrupted and stores the error.
            raise LlmConnectionError(
                f"the LLM stream from {self._llm.endpoint} ended before the answer was complete "
                "(no finish_reason, no [DONE])"
            )
        log.warning("the LLM stream from %s ended without a finish_reason", self._llm.endpoint)
        return list(reader.finish(None))

    def _timed_out(self, attempts: int) -> LlmError:
        tries = "" if attempts == 1 else f" ({attempts} attempts)"
        return LlmTimeoutError(
            f"the LLM endpoint {self._llm.endpoint} did not answer within "
            f"{self._llm.timeout:g} s{tries} (AGENTIK_LLM_TIMEOUT, retries included)"
        )

    def _body(self, max_output_tokens: int | None) -> dict[str, Any]:
        """This round's request body (``messages`` are plain wire dicts already: the SDK's
        TypedDict transform, about 0.17 ms per message, is not needed)."""
        body: dict[str, Any] = {
            "model": self._llm.model,
            "messages": sanitize_messages(self.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.tools:
            body["tools"] = self.tools
        if max_output_tokens is not None:
            body["max_completion_tokens"] = max_output_tokens
        if self._llm.temperature is not None:
            body["temperature"] = self._llm.temperature
        return body


if TYPE_CHECKING:  # static proof that the classes implement the backend protocol

    def _implements(llm: OpenAiLlm, conv: OpenAiConversation) -> tuple[LiteLlm, LiteConversation]:
        return llm, conv
