"""The OpenAI-compatible backend (SPEC §7): chat completions over the official ``openai`` SDK.

This is the only module that imports ``openai``: every SDK error is converted here into the
:class:`agentik.errors.LlmError` tree.

- :class:`OpenAiLlm` owns one ``openai.AsyncOpenAI`` client (one connection pool) for the process;
  ``aclose()`` closes it. Under trio the SDK's ``__del__`` cleanup does nothing useful, so the
  client must be closed explicitly.
- :class:`OpenAiConversation` keeps its own list of chat messages. Each ``send_stream`` is one
  streamed ``chat.completions.create`` call; after a complete round the assistant's message (text
  and tool calls) is appended to that list, and ``add_tool_result`` appends tool answers.

The request's ``timeout`` is an ``httpx2.Timeout``: its read timeout bounds the wait for each
chunk, so a server that stops sending mid-stream fails the turn with ``LlmTimeoutError``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import httpx2
import msgspec
import openai

from agentik.errors import (
    LlmAuthError,
    LlmConnectionError,
    LlmError,
    LlmResponseError,
    LlmTimeoutError,
)
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

__all__ = ["OpenAiConversation", "OpenAiLlm", "history_to_messages", "sanitize_messages"]

log = logging.getLogger(__name__)

#: chat message in OpenAI's JSON shape
Message = dict[str, Any]

#: the longest we wait to establish a connection, whatever the read timeout is
_CONNECT_TIMEOUT = 30.0

_REASONING_FIELDS = ("reasoning_content", "reasoning")


class _Fn(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    function: _Fn | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None


class _Choice(msgspec.Struct):
    index: int | None = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = 0
    completion_tokens: int | None = 0


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None


_CHUNK = msgspec.json.Decoder(_Chunk)


class OpenAiLlm:
    """A :class:`agentik.llm.base.LiteLlm` over an OpenAI-compatible chat-completions endpoint."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        model: str,
        timeout: float = 120.0,
        max_retries: int = 2,
        context_window: int | None = None,
        supports_images: bool = True,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.context_window = context_window
        self.supports_images = supports_images
        self._closed = False
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            # the SDK refuses to start without a key; local servers do not need one
            api_key=api_key or "none",
            timeout=httpx2.Timeout(timeout, connect=min(timeout, _CONNECT_TIMEOUT)),
            max_retries=max_retries,
        )

    @classmethod
    def from_config(cls, cfg: Config) -> OpenAiLlm:
        return cls(
            base_url=cfg.openai_base_url,
            api_key=cfg.openai_api_key,
            model=cfg.openai_model,
            timeout=cfg.llm_timeout,
            max_retries=cfg.llm_max_retries,
            context_window=cfg.context_window or None,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def endpoint(self) -> str:
        """The base URL the client talks to (for messages)."""
        return str(self.client.base_url)

    async def open(
        self, history: Sequence[WorkingItem], tools: Sequence[ToolSpec]
    ) -> OpenAiConversation:
        if self._closed:
            raise LlmConnectionError("the OpenAI backend is closed")
        messages = history_to_messages(history, supports_images=self.supports_images)
        return OpenAiConversation(self, messages, tools_to_openai(tools))

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
        # OpenAI's tool message has no name; the call id ties it to its call.
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})

    async def interrupt(self) -> None:
        """Nothing to do: the actor cancels a running ``send_stream`` with a trio scope, which
        closes the HTTP response at once."""

    async def close(self) -> None:
        self._closed = True

    async def send_stream(
        self, content: Sequence[Content] | None
    ) -> AsyncGenerator[LlmDelta, None]:
        """Stream one round; see :meth:`agentik.llm.base.LiteConversation.send_stream`.

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
        kwargs: dict[str, Any] = {
            "model": self._llm.model,
            # The SDK would walk every message through its TypedDict transform (about 0.17 ms
            # per message: 1.7 s for 10k); they are plain wire dicts already, so pass them as
            # extra_body, which replaces the (empty) transformed list in the request body as is.
            "messages": [],
            "extra_body": {"messages": sanitize_messages(self.messages)},
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.tools:
            kwargs["tools"] = self.tools

        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        finished = False
        try:
            streaming = self._llm.client.chat.completions.with_streaming_response
            async with streaming.create(**kwargs) as response:
                async for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = _CHUNK.decode(data)
                    if chunk.error is not None:
                        raise LlmResponseError(f"error in the LLM stream: {chunk.error!r}")
                    usage = getattr(chunk, "usage", None)
                    for choice in chunk.choices or ():
                        if choice.index not in (0, None):
                            continue
                        delta = choice.delta
                        if delta is not None:
                            for out in _delta_events(delta, text, calls):
                                yield out
                        if choice.finish_reason is not None:
                            for out in _missing_ids(calls):
                                yield out
                            finished = True
                            yield FinishDelta(str(choice.finish_reason))
                    if usage is not None:
                        yield UsageDelta(
                            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
                        )
        except LlmError:
            raise
        except openai.OpenAIError as exc:
            raise convert_error(exc, self._llm.endpoint) from exc
        except httpx2.TimeoutException as exc:  # mid-stream: the raw response is not wrapped
            raise LlmTimeoutError(
                f"the LLM endpoint {self._llm.endpoint} did not answer in time"
            ) from exc
        except httpx2.TransportError as exc:
            raise LlmConnectionError(
                f"the LLM endpoint {self._llm.endpoint} broke the stream: {exc}"
            ) from exc
        except (ValueError, TypeError, AttributeError, KeyError, msgspec.MsgspecError) as exc:
            raise LlmResponseError(
                f"malformed answer from the LLM endpoint {self._llm.endpoint}: {exc}"
            ) from exc

        if not finished:
            log.warning("the LLM stream from %s ended without a finish_reason", self._llm.endpoint)
            for out in _missing_ids(calls):
                yield out
            yield FinishDelta(None)
        assistant: Message = {"role": "assistant", "content": "".join(text)}
        if calls:
            assistant["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for _, call in sorted(calls.items())
            ]
        self.messages.append(assistant)


# --- stream parsing ------------------------------------------------------------------------------


def _delta_events(
    delta: Any, text: list[str], calls: dict[int, dict[str, str]]
) -> Iterable[LlmDelta]:
    """The LlmDeltas of one choice delta; accumulates text and tool calls for the history."""
    reasoning = _reasoning_of(delta)
    if reasoning:
        yield ReasoningDelta(reasoning)
    piece = getattr(delta, "content", None)
    if isinstance(piece, str) and piece:
        text.append(piece)
        yield TextDelta(piece)
    refusal = getattr(delta, "refusal", None)
    if isinstance(refusal, str) and refusal:
        text.append(refusal)
        yield TextDelta(refusal)
    for fragment in getattr(delta, "tool_calls", None) or ():
        index = fragment.index
        if not isinstance(index, int):
            raise LlmResponseError(f"tool call delta without an integer index: {fragment!r}")
        call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        call_id = fragment.id or None
        function = fragment.function
        name = (function.name if function is not None else None) or None
        arguments = (function.arguments if function is not None else None) or ""
        # some servers (llama.cpp) repeat id and name in every delta: assign, never append
        if call_id is not None:
            call["id"] = call_id
        if name is not None:
            call["name"] = name
        call["arguments"] += arguments
        yield ToolCallDelta(index=index, id=call_id, name=name, arguments=arguments)


def _missing_ids(calls: dict[int, dict[str, str]]) -> Iterable[LlmDelta]:
    """Give an id to calls the server sent without one, so their results can be matched."""
    for index, call in sorted(calls.items()):
        if not call["id"]:
            call["id"] = f"call_{index}"
            yield ToolCallDelta(index=index, id=call["id"])


def _reasoning_of(delta: Any) -> str | None:
    for name in _REASONING_FIELDS:
        value = getattr(delta, name, None)
        if value is None:
            extra = getattr(delta, "model_extra", None)
            if isinstance(extra, dict):
                value = extra.get(name)
        if isinstance(value, str) and value:
            return value
    return None


# --- error conversion ----------------------------------------------------------------------------


def convert_error(exc: openai.OpenAIError, endpoint: str) -> LlmError:
    """Map an openai SDK error to the agentik LlmError tree with a helpful message."""
    if isinstance(exc, openai.APITimeoutError):  # before APIConnectionError: it subclasses it
        return LlmTimeoutError(f"the LLM endpoint {endpoint} did not answer in time")
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return LlmConnectionError(f"cannot reach the LLM endpoint {endpoint}{detail}")
    if isinstance(exc, openai.APIStatusError):
        message = _server_message(exc)
        text = f"the LLM endpoint {endpoint} answered HTTP {exc.status_code}: {message}"
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            return LlmAuthError(text)
        return LlmResponseError(text)
    if isinstance(exc, openai.APIError):
        return LlmResponseError(
            f"the LLM endpoint {endpoint} answered with an error: {_server_message(exc)}"
        )
    return LlmResponseError(f"the LLM request to {endpoint} failed: {exc}")


def _server_message(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
        return json.dumps(body)[:500]
    if isinstance(body, str) and body:
        return body[:500]
    return exc.message


# --- history conversion --------------------------------------------------------------------------


def tools_to_openai(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters or {"type": "object", "properties": {}},
            },
        }
        for tool in tools
    ]


def user_message(content: Sequence[Content], *, supports_images: bool) -> Message:
    """A user chat message: one text part as a string, else a list of content parts."""
    parts: list[dict[str, Any]] = []
    dropped = 0
    for item in content:
        if isinstance(item, Text):
            parts.append({"type": "text", "text": item.body})
        elif isinstance(item, Image):
            if supports_images:
                url = f"data:{item.mime};base64,{item.data}"
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                dropped += 1
    if dropped:
        log.warning("dropped %d image(s): the model does not accept images", dropped)
    if all(part["type"] == "text" for part in parts) and len(parts) <= 1:
        return {"role": "user", "content": parts[0]["text"] if parts else ""}
    return {"role": "user", "content": parts}


def _assistant_text(content: Sequence[Content]) -> str:
    texts = [item.body for item in content if isinstance(item, Text)]
    if len(texts) != len(content):
        log.warning("dropped image(s) from an assistant message: chat completions take none")
    return "".join(texts)


def history_to_messages(
    history: Sequence[WorkingItem], *, supports_images: bool = True
) -> list[Message]:
    """Convert working memory to chat messages (sanitised, see :func:`sanitize_messages`)."""
    messages: list[Message] = []
    for item in history:
        if isinstance(item, SystemItem):
            messages.append({"role": "system", "content": item.text})
        elif isinstance(item, SummaryItem):
            messages.append(
                {"role": "system", "content": f"Summary of earlier conversation: {item.text}"}
            )
        elif isinstance(item, UserItem):
            messages.append(user_message(item.content, supports_images=supports_images))
        elif isinstance(item, AssistantItem):
            message: Message = {"role": "assistant", "content": _assistant_text(item.content)}
            if item.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call in item.tool_calls
                ]
            messages.append(message)
        elif isinstance(item, ToolItem):
            messages.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": item.content}
            )
    return sanitize_messages(messages)


def sanitize_messages(messages: Sequence[Message]) -> list[Message]:
    """Make a message list OpenAI accepts about tool calls (returns new list; input untouched).

    OpenAI requires every assistant ``tool_calls`` entry to be answered by a tool message in the
    run of tool messages right after it, and every tool message to answer such a call. So: a
    tool call without an answer is dropped; a tool message answering no call of the preceding
    assistant message (or a duplicate answer) is dropped; an assistant message left with neither
    text nor tool calls is dropped.
    """
    out: list[Message] = []
    i = 0
    n = len(messages)
    while i < n:
        message = messages[i]
        i += 1
        role = message.get("role")
        if role == "tool":
            log.debug("dropped a tool message for unknown call %r", message.get("tool_call_id"))
            continue
        if role != "assistant" or not message.get("tool_calls"):
            out.append(message)
            continue
        answers: list[Message] = []
        while i < n and messages[i].get("role") == "tool":
            answers.append(messages[i])
            i += 1
        answered = {answer.get("tool_call_id") for answer in answers}
        calls = [call for call in message["tool_calls"] if call.get("id") in answered]
        if len(calls) != len(message["tool_calls"]):
            log.debug(
                "dropped %d unanswered tool call(s)", len(message["tool_calls"]) - len(calls)
            )
        kept = dict(message)
        if calls:
            kept["tool_calls"] = calls
        else:
            kept.pop("tool_calls", None)
        if kept.get("content") is None:
            kept["content"] = ""
        if calls or kept["content"]:
            out.append(kept)
        call_ids = {call.get("id") for call in calls}
        seen: set[Any] = set()
        for answer in answers:
            call_id = answer.get("tool_call_id")
            if call_id in call_ids and call_id not in seen:
                seen.add(call_id)
                out.append(answer)
    return out


if TYPE_CHECKING:  # static proof that the classes implement the backend protocol

    def _implements(llm: OpenAiLlm, conv: OpenAiConversation) -> tuple[LiteLlm, LiteConversation]:
        return llm, conv
