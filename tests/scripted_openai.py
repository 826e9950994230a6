"""A scripted, OpenAI-compatible chat-completions server for tests and benchmarks.

It is a real HTTP server (quart-trio served by ``hypercorn.trio.serve`` on ``127.0.0.1:0``), so
the real openai SDK talks to it over a socket::

    async with open_scripted_openai() as server:
        server.push(Reply("Hello world"), ToolCalls([("call_1", "add", '{"a": 1}')]))
        llm = OpenAiLlm(server.base_url, None, "m")
        ...
        assert server.requests[0]["messages"][-1]["content"] == "hi"

Each ``POST /v1/chat/completions`` consumes one scripted step from the queue (FIFO); when the
queue is empty the ``callable_default`` hook answers if set, else ``default`` (an :class:`Echo`).
Streams are SSE ``data: {chat.completion.chunk}`` events ending with ``data: [DONE]``, with a
final ``choices: []`` usage chunk when ``stream_options.include_usage`` is set.

Context-window mode (like llama.cpp, vLLM or OpenAI with a small model): set
``server.context_limit = N`` and every request whose prompt plus requested output
(``max_tokens`` / ``max_completion_tokens``) exceeds N of the server's tokens (:func:`count_tokens`:
a quarter of the characters, rounded up, plus 4 per message) is refused with HTTP 400
``context_length_exceeded`` "This model's maximum context length is N tokens. However, your
messages resulted in M tokens." (``context_error_text`` replaces that message, e.g. with
llama.cpp's wording); replies then stop at the requested output limit with finish_reason
``length`` and report the server's own prompt count as usage. ``refused`` counts the refusals.
With ``ignore_max_tokens`` set too it behaves like ``litert-lm serve``: it refuses only a prompt
over the limit (the requested output is not counted) and answers as long as the step says, cut
only where its window is full (prompt plus answer at the limit).
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import hypercorn.config
import hypercorn.trio
import trio
from quart import Response, request
from quart_trio import QuartTrio

__all__ = [
    "Echo",
    "Fail",
    "Hang",
    "Raw",
    "Reply",
    "ScriptedOpenAI",
    "Step",
    "ToolCalls",
    "count_tokens",
    "open_scripted_openai",
]


# --- steps ---------------------------------------------------------------------------------------


@dataclass
class Reply:
    """Stream ``text`` (a list = explicit chunks; a str = split into words, spaces kept).

    ``reasoning`` is streamed first in ``reasoning_field`` deltas (``reasoning_content`` like
    DeepSeek/vLLM, or ``reasoning`` like OpenRouter/Ollama). With ``gate``, the server sends the
    first text chunk, then waits for the event before sending the rest.
    """

    text: str | list[str] = ""
    chunk_delay: float = 0
    reasoning: str | list[str] | None = None
    usage: tuple[int, int] = (10, 5)
    gate: trio.Event | None = None
    reasoning_field: str = "reasoning_content"
    finish_reason: str = "stop"


@dataclass
class ToolCalls:
    """Stream tool calls ``[(call_id, name, arguments_json), ...]`` like OpenAI does: per call a
    first delta with index/id/name and ``arguments=''``, then argument fragments (one fragment
    when ``split_args`` is False); finish_reason ``tool_calls``."""

    calls: list[tuple[str, str, str]]
    text_before: str = ""
    split_args: bool = True
    usage: tuple[int, int] = (10, 5)
    chunk_delay: float = 0


@dataclass
class Fail:
    """Answer with an HTTP error carrying OpenAI's error JSON."""

    status: int = 500
    message: str = "boom"
    type: str | None = None
    code: str | None = None


@dataclass
class Hang:
    """Send headers (the role chunk) and ``text_before``, then never finish: block until the
    client disconnects or the server shuts down."""

    text_before: str = ""


@dataclass
class Raw:
    """Send each string as one SSE ``data:`` event verbatim (for malformed-stream tests); no
    ``[DONE]`` unless you include it."""

    events: list[str]


@dataclass
class Echo:
    """Reply ``prefix + <text of the last user message>``."""

    prefix: str = "echo: "
    chunk_delay: float = 0
    usage: tuple[int, int] = (10, 5)


Step = Reply | ToolCalls | Fail | Hang | Raw | Echo


# --- helpers -------------------------------------------------------------------------------------


def split_words(text: str) -> list[str]:
    """Split into word chunks keeping all whitespace: ``"a b  c"`` -> ``["a ", "b  ", "c"]``."""
    return [part for part in re.split(r"(?<=\s)(?=\S)", text) if part]


def _split_args(arguments: str) -> list[str]:
    if len(arguments) <= 1:
        return [arguments]
    size = max(1, -(-len(arguments) // 3))
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message of a chat-completions request body."""
    for message in reversed(body.get("messages") or []):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(
                part.get("text", "")
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            )
        return ""
    return ""


def count_tokens(body: dict[str, Any]) -> int:
    """The scripted server's own token count of a request's messages: a quarter of the
    characters of each message's text (rounded up) plus 4 per message."""
    total = 0
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        text = json.dumps(message.get("content") or "") if not isinstance(
            message.get("content"), str) else message["content"]
        text += json.dumps(message.get("tool_calls") or "")
        total += -(-len(text) // 4) + 4
    return total


def requested_output(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return int(value) if isinstance(value, int) and value > 0 else None


def _sse(data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


# --- the server ----------------------------------------------------------------------------------


class ScriptedOpenAI:
    """State and ASGI app of one scripted server (see the module docstring)."""

    def __init__(self) -> None:
        self.base_url: str = ""
        #: JSON bodies of every /v1/chat/completions request, in arrival order
        self.requests: list[dict[str, Any]] = []
        #: the client address (host, port) of each of those requests: one TCP connection per port
        self.peers: list[Any] = []
        #: the HTTP headers of each of those requests (lower-case names)
        self.headers: list[dict[str, str]] = []
        #: answers requests when the queue is empty and ``callable_default`` is None
        self.default: Step = Echo()
        #: if set, answers requests when the queue is empty: ``fn(body) -> step``
        self.callable_default: Callable[[dict[str, Any]], Step] | None = None
        #: context-window mode (see the module docstring): None = no limit
        self.context_limit: int | None = None
        #: replaces the 400's message in context-window mode (``{limit}``, ``{tokens}`` filled in)
        self.context_error_text: str | None = None
        #: context-window mode: ``max_tokens`` / ``max_completion_tokens`` ignored (see above)
        self.ignore_max_tokens = False
        #: requests refused for exceeding ``context_limit``
        self.refused = 0
        #: fields added to the model's ``/v1/models`` entry (e.g. vLLM's ``max_model_len``)
        self.model_fields: dict[str, Any] = {}
        #: JSON answers of routes at the server's root, by path (e.g. llama.cpp's ``props``,
        #: Ollama's ``api/show``); any other root path answers 404
        self.root_routes: dict[str, Any] = {}
        #: every ``/v1/models`` and root route request: (method, path)
        self.side_requests: list[tuple[str, str]] = []
        self._queue: deque[Step] = deque()
        self._closing = trio.Event()
        self._request_arrived = trio.Event()
        self._streams_changed = trio.Event()
        self._active_streams = 0
        self._counter = 0
        self.app = self._make_app()

    # scripting ----------------------------------------------------------------------------------

    def push(self, *steps: Step) -> None:
        """Queue steps; each request consumes the oldest one."""
        self._queue.extend(steps)

    @property
    def pending(self) -> int:
        """Steps queued and not yet consumed."""
        return len(self._queue)

    async def wait_requests(self, n: int) -> None:
        """Wait until at least ``n`` chat-completions requests have arrived."""
        while len(self.requests) < n:
            await self._request_arrived.wait()

    @property
    def active_streams(self) -> int:
        """Streaming responses currently being sent (a client disconnect ends one)."""
        return self._active_streams

    async def wait_idle(self) -> None:
        """Wait until no streaming response is in progress."""
        while self._active_streams:
            await self._streams_changed.wait()

    def _streams_delta(self, n: int) -> None:
        self._active_streams += n
        self._streams_changed.set()
        self._streams_changed = trio.Event()

    # internals ----------------------------------------------------------------------------------

    def _next_step(self, body: dict[str, Any]) -> Step:
        if self._queue:
            return self._queue.popleft()
        if self.callable_default is not None:
            return self.callable_default(body)
        return self.default

    async def _wait_or_closing(self, event: trio.Event) -> None:
        """Wait for ``event`` or server shutdown, whichever comes first."""
        if event.is_set() or self._closing.is_set():
            return
        async with trio.open_nursery() as nursery:

            async def waiter(ev: trio.Event) -> None:
                await ev.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(waiter, event)
            nursery.start_soon(waiter, self._closing)

    def _make_app(self) -> QuartTrio:
        app = QuartTrio(__name__)

        @app.get("/v1/models")
        async def models() -> Any:
            self.side_requests.append(("GET", "v1/models"))
            entry = {"id": "scripted", "object": "model", **self.model_fields}
            return {"object": "list", "data": [entry]}

        @app.route("/<path:path>", methods=["GET", "POST"])
        async def root_route(path: str) -> Any:
            self.side_requests.append((request.method, path))
            if path in self.root_routes:
                return self.root_routes[path]
            return _error_body(404, f"no route {path}"), 404

        @app.post("/v1/chat/completions")
        async def chat_completions() -> Any:
            body = await request.get_json(force=True, silent=True)
            if not isinstance(body, dict):
                return _error_body(400, "request body is not a JSON object"), 400
            self.requests.append(body)
            self.peers.append(request.scope.get("client"))
            self.headers.append({k.lower(): v for k, v in request.headers.items()})
            self._request_arrived.set()
            self._request_arrived = trio.Event()
            if self.context_limit is not None:
                prompt = count_tokens(body)
                tokens = prompt + (0 if self.ignore_max_tokens else requested_output(body) or 0)
                if tokens > self.context_limit:
                    self.refused += 1
                    text = self.context_error_text or (
                        "This model's maximum context length is {limit} tokens. However, your "
                        "messages resulted in {tokens} tokens. Please reduce the length of the "
                        "messages."
                    )
                    message = text.format(limit=self.context_limit, tokens=tokens)
                    return _error_body(400, message, "invalid_request_error",
                                       "context_length_exceeded"), 400
            step = self._next_step(body)
            if isinstance(step, Echo):
                step = Reply(
                    step.prefix + last_user_text(body), chunk_delay=step.chunk_delay,
                    usage=step.usage,
                )
            if isinstance(step, Fail):
                return _error_body(step.status, step.message, step.type, step.code), step.status
            if self.context_limit is not None and isinstance(step, Reply):
                prompt = count_tokens(body)
                limit = (self.context_limit - prompt if self.ignore_max_tokens
                         else requested_output(body))
                step = _limited(step, prompt, limit)

            self._counter += 1
            chunk_id = f"chatcmpl-scripted-{self._counter}"
            model = str(body.get("model") or "scripted")
            if not body.get("stream"):
                return await self._complete(step, chunk_id, model)

            options = body.get("stream_options") or {}
            include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
            response = Response(
                self._tracked(self._stream(step, chunk_id, model, include_usage)),
                status=200,
                mimetype="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
            response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut long streams
            return response

        return app

    async def _complete(self, step: Step, chunk_id: str, model: str) -> Any:
        """A non-streaming ``chat.completion``."""
        message: dict[str, Any] = {"role": "assistant", "content": "", "refusal": None}
        finish = "stop"
        usage = (10, 5)
        if isinstance(step, Reply):
            message["content"] = step.text if isinstance(step.text, str) else "".join(step.text)
            if step.reasoning is not None:
                reasoning = step.reasoning
                message[step.reasoning_field] = (
                    reasoning if isinstance(reasoning, str) else "".join(reasoning)
                )
            finish, usage = step.finish_reason, step.usage
        elif isinstance(step, ToolCalls):
            message["content"] = step.text_before or None
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in step.calls
            ]
            finish, usage = "tool_calls", step.usage
        elif isinstance(step, Hang):
            await self._closing.wait()
            return _error_body(503, "server shutting down"), 503
        elif isinstance(step, Raw):
            return Response("".join(step.events), status=200, mimetype="application/json")
        return {
            "id": chunk_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
            "usage": _usage(usage),
        }

    async def _tracked(self, body: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
        """Count the stream as active while it is being sent (ends on disconnect too)."""
        self._streams_delta(1)
        try:
            async with aclosing(body):
                async for data in body:
                    yield data
        finally:
            self._streams_delta(-1)

    async def _stream(
        self, step: Step, chunk_id: str, model: str, include_usage: bool
    ) -> AsyncGenerator[bytes, None]:
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data: dict[str, Any] = {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                data["usage"] = None
            return _sse(data)

        def tail(finish: str, usage: tuple[int, int]) -> list[bytes]:
            out = [chunk({}, finish)]
            if include_usage:
                out.append(
                    _sse(
                        {
                            "id": chunk_id,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model,
                            "system_fingerprint": None,
                            "choices": [],
                            "usage": _usage(usage),
                        }
                    )
                )
            out.append(_sse("[DONE]"))
            return out

        async def delay(seconds: float) -> None:
            if seconds > 0:
                await trio.sleep(seconds)

        if isinstance(step, Raw):
            for event in step.events:
                yield _sse(event)
            return

        if isinstance(step, Hang):
            yield chunk({"role": "assistant", "content": ""})
            if step.text_before:
                yield chunk({"content": step.text_before})
            await self._closing.wait()
            return

        if isinstance(step, Reply):
            yield chunk({"role": "assistant", "content": ""})
            if step.reasoning is not None:
                parts = (
                    split_words(step.reasoning)
                    if isinstance(step.reasoning, str)
                    else list(step.reasoning)
                )
                for part in parts:
                    await delay(step.chunk_delay)
                    yield chunk({step.reasoning_field: part})
            texts = split_words(step.text) if isinstance(step.text, str) else list(step.text)
            for i, text in enumerate(texts):
                await delay(step.chunk_delay)
                yield chunk({"content": text})
                if i == 0 and step.gate is not None:
                    await self._wait_or_closing(step.gate)
                    if self._closing.is_set():
                        return
            if not texts and step.gate is not None:
                await self._wait_or_closing(step.gate)
            for data in tail(step.finish_reason, step.usage):
                yield data
            return

        if isinstance(step, ToolCalls):
            if step.text_before:
                yield chunk({"role": "assistant", "content": ""})
                for text in split_words(step.text_before):
                    await delay(step.chunk_delay)
                    yield chunk({"content": text})
            else:
                yield chunk({"role": "assistant", "content": None})
            for index, (call_id, name, arguments) in enumerate(step.calls):
                await delay(step.chunk_delay)
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
                fragments = _split_args(arguments) if step.split_args else [arguments]
                for fragment in fragments:
                    await delay(step.chunk_delay)
                    yield chunk(
                        {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}
                    )
            for data in tail("tool_calls", step.usage):
                yield data
            return

        raise TypeError(f"unknown step {step!r}")  # pragma: no cover


def _limited(step: Reply, prompt: int, limit: int | None) -> Reply:
    """Context-window mode: the reply cut at the requested output (a word chunk costs a quarter
    of its characters), finish_reason ``length`` if cut; usage is the server's own count."""
    texts = split_words(step.text) if isinstance(step.text, str) else list(step.text)
    kept: list[str] = []
    used = 0
    finish = step.finish_reason
    for text in texts:
        cost = -(-len(text) // 4)
        if limit is not None and used + cost > limit:
            finish = "length"
            break
        kept.append(text)
        used += cost
    return Reply(kept, chunk_delay=step.chunk_delay, reasoning=step.reasoning,
                 usage=(prompt, used), gate=step.gate, reasoning_field=step.reasoning_field,
                 finish_reason=finish)


def _usage(usage: tuple[int, int]) -> dict[str, int]:
    prompt, completion = usage
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _error_body(
    status: int, message: str, type_: str | None = None, code: str | None = None
) -> dict[str, Any]:
    if type_ is None:
        type_ = {
            401: "invalid_request_error",
            403: "invalid_request_error",
            404: "invalid_request_error",
            429: "rate_limit_exceeded",
        }.get(status, "server_error" if status >= 500 else "invalid_request_error")
    if code is None and status == 401:
        code = "invalid_api_key"
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


@asynccontextmanager
async def open_scripted_openai(
    *, graceful_timeout: float = 0.2
) -> AsyncIterator[ScriptedOpenAI]:
    """Serve a :class:`ScriptedOpenAI` on ``127.0.0.1:<free port>`` for the ``async with`` body.

    On exit every hanging or gated stream is released and hypercorn shuts down. Connections still
    open after ``graceful_timeout`` (e.g. idle keep-alive connections of a client that is not
    closed yet) are cut; the exit is bounded even if the server does not stop by itself.
    """
    server = ScriptedOpenAI()
    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = graceful_timeout
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            partial(hypercorn.trio.serve, server.app, config, shutdown_trigger=stop.wait)
        )
        server.base_url = binds[0].rstrip("/") + "/v1"
        try:
            yield server
        finally:
            server._closing.set()
            stop.set()
            nursery.cancel_scope.deadline = trio.current_time() + graceful_timeout + 2.0
