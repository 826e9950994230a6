"""Pure code of the LiteRT-LM backend: working memory as the engine's messages, and the engine's
streamed message dicts as :data:`agentik.llm.base.LlmDelta`. No engine, no threads, no trio."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentik.llm.base import LlmDelta, ReasoningDelta, TextDelta, ToolCallDelta
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

__all__ = ["ChunkParser", "Message", "history_to_messages", "message_text", "user_message"]

log = logging.getLogger(__name__)

#: a chat message in the engine's JSON shape
Message = dict[str, Any]


class ChunkParser:
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



def message_text(message: Message) -> str:
    """The text of a message as the model reads it: its text parts and its tool responses."""
    text = "".join(_texts(message.get("content")))
    for part in message.get("content") or ():
        if isinstance(part, Mapping) and part.get("type") == "tool_response":
            text += str(part.get("response"))
    return text
