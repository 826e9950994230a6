"""Pure code of the LiteRT-LM backend: working memory as the engine's messages (the final step of
:func:`agentik.llm.history.render_history`), and the engine's streamed message dicts as
:data:`agentik.llm.base.LlmDelta`, and a tool spec as the engine's tool description. No engine, no
threads, no trio."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentik.llm.base import (
    LlmDelta,
    ReasoningDelta,
    TextDelta,
    ToolCallAssembler,
    ToolCallDelta,
    ToolSpec,
)
from agentik.llm.history import render_history, user_parts
from agentik.wire import Content, Image, Text, ToolCallSpec, WorkingItem

__all__ = [
    "FORMAT",
    "ChunkParser",
    "LiteRtFormat",
    "Message",
    "history_to_messages",
    "message_text",
    "tool_response",
    "user_message",
]

log = logging.getLogger(__name__)

#: a chat message in the engine's JSON shape
Message = dict[str, Any]


def _text_part(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def tool_response(name: str, content: str) -> dict[str, Any]:
    """A tool result as a part of a ``tool`` message (the engine matches results by name)."""
    return {"type": "tool_response", "name": name, "response": content}


class LiteRtFormat:
    """The engine's messages: content is always a list of parts (what the chat templates
    expect), tool-call arguments are objects."""

    def system(self, text: str) -> Message:
        return {"role": "system", "content": [_text_part(text)]}

    def user(self, parts: Sequence[Content]) -> Message:
        out: list[dict[str, Any]] = []
        for item in parts:
            if isinstance(item, Text):
                out.append(_text_part(item.body))
            elif isinstance(item, Image):
                out.append({"type": "image", "blob": item.data})
        # the chat templates iterate over the parts: never send an empty list
        return {"role": "user", "content": out or [_text_part("")]}

    def assistant(self, text: str, calls: Sequence[ToolCallSpec]) -> Message:
        message: Message = {"role": "assistant", "content": [_text_part(text)]}
        if calls:
            message["tool_calls"] = [
                {"id": call.call_id, "type": "function",
                 "function": {"name": call.name, "arguments": _arguments_dict(call.arguments)}}
                for call in calls
            ]
        return message

    def tool(self, call_id: str, name: str, content: str) -> Message:
        return {"role": "tool", "content": [tool_response(name, content)]}


FORMAT = LiteRtFormat()


def user_message(content: Sequence[Content], *, supports_images: bool) -> Message:
    """A user message; images are dropped (with a warning) unless the engine takes them."""
    return FORMAT.user(user_parts(content, supports_images=supports_images))


def history_to_messages(
    history: Sequence[WorkingItem], *, supports_images: bool = False
) -> list[Message]:
    """Working memory as the engine's messages (``create_conversation(messages=...)``).

    Consecutive tool results become one ``tool`` message of ``tool_response`` parts, the shape a
    live round sends them in.
    """
    messages: list[Message] = []
    for message in render_history(history, FORMAT, supports_images=supports_images):
        if message["role"] == "tool" and messages and messages[-1]["role"] == "tool":
            messages[-1]["content"].extend(message["content"])
        else:
            messages.append(message)
    return messages


def message_text(message: Message) -> str:
    """The text of a message as the model reads it: its text parts and its tool responses."""
    text = "".join(_texts(message.get("content")))
    for part in message.get("content") or ():
        if isinstance(part, Mapping) and part.get("type") == "tool_response":
            text += str(part.get("response"))
    return text


class ChunkParser:
    """Turns the engine's streamed message dicts into LlmDeltas and accumulates the answer."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls = ToolCallAssembler()
        self._count = 0

    def feed(self, chunk: Mapping[str, Any]) -> Iterable[LlmDelta]:
        for channel, value in (chunk.get("channels") or {}).items():
            if isinstance(value, str) and value and channel != "content":
                yield ReasoningDelta(value)
        for piece in _texts(chunk.get("content")):
            if piece:
                self.text.append(piece)
                yield TextDelta(piece)
        for raw in chunk.get("tool_calls") or ():
            call = _tool_call(raw, self._count)
            if call is None:
                log.warning("ignored a malformed tool call from the engine: %r", raw)
                continue
            self._count += 1
            self.calls.add(call)
            yield call

    def assistant_message(self) -> Message:
        """The answer as the engine's message, for the history."""
        return FORMAT.assistant("".join(self.text), self.calls.calls())


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


def _tool_call(raw: Any, index: int) -> ToolCallDelta | None:
    """A complete tool call of the engine as one delta (arguments as JSON text); None if it has
    no name."""
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
    return ToolCallDelta(index=index, id=call_id, name=name, arguments=json.dumps(dict(arguments)))


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


def described_tool(litert_lm: Any, spec: ToolSpec) -> Any:
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


