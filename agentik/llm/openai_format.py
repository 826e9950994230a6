"""Pure code of the OpenAI-compatible backend, the chat-completions wire format both ways:
working memory and tool specs as request JSON (the final step of
:func:`agentik.llm.history.render_history`) with the tool-call rule OpenAI enforces on a message
list (:func:`sanitize_messages`); the streamed chunks as LlmDeltas (:class:`RoundReader`). No I/O."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from agentik.errors import LlmResponseError
from agentik.llm.base import (
    FinishDelta,
    LlmDelta,
    ReasoningDelta,
    TextDelta,
    ToolCallAssembler,
    ToolCallDelta,
    ToolSpec,
    UsageDelta,
)
from agentik.llm.history import render_history, user_parts
from agentik.wire import Content, Image, Text, ToolCallSpec, WorkingItem

__all__ = [
    "CHUNK",
    "FORMAT",
    "Chunk",
    "Message",
    "OpenAiFormat",
    "RoundReader",
    "history_to_messages",
    "sanitize_messages",
    "tools_to_openai",
    "user_message",
]

log = logging.getLogger(__name__)

#: chat message in OpenAI's JSON shape
Message = dict[str, Any]


# --- messages out -------------------------------------------------------------------------------

class OpenAiFormat:
    """Chat-completions messages: plain strings where a text suffices, content parts otherwise."""

    def system(self, text: str) -> Message:
        return {"role": "system", "content": text}

    def user(self, parts: Sequence[Content]) -> Message:
        """One text part as a string, else a list of content parts."""
        if len(parts) == 1 and isinstance(parts[0], Text):  # the common case, fast
            return {"role": "user", "content": parts[0].body}
        out: list[dict[str, Any]] = []
        for item in parts:
            if isinstance(item, Text):
                out.append({"type": "text", "text": item.body})
            elif isinstance(item, Image):
                url = f"data:{item.mime};base64,{item.data}"
                out.append({"type": "image_url", "image_url": {"url": url}})
        if all(part["type"] == "text" for part in out) and len(out) <= 1:
            return {"role": "user", "content": out[0]["text"] if out else ""}
        return {"role": "user", "content": out}

    def assistant(self, text: str, calls: Sequence[ToolCallSpec]) -> Message:
        message: Message = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in calls
            ]
        return message

    def tool(self, call_id: str, name: str, content: str) -> Message:
        # OpenAI's tool message has no name; the call id ties it to its call.
        return {"role": "tool", "tool_call_id": call_id, "content": content}


FORMAT = OpenAiFormat()


def user_message(content: Sequence[Content], *, supports_images: bool) -> Message:
    """A user chat message (images dropped, with a warning, unless the model takes them)."""
    return FORMAT.user(user_parts(content, supports_images=supports_images))


def history_to_messages(
    history: Sequence[WorkingItem], *, supports_images: bool = True
) -> list[Message]:
    """Convert working memory to chat messages (sanitised, see :func:`sanitize_messages`)."""
    return sanitize_messages(render_history(history, FORMAT, supports_images=supports_images))


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


# --- stream chunks in ---------------------------------------------------------------------------


# gc=False: decoded from JSON, these never form a reference cycle, and one chunk a token is
# decoded into four or five of them (the collector need not track them)


class _Fn(msgspec.Struct, gc=False):
    name: str | None = None
    arguments: str | None = None


class _ToolCallFragment(msgspec.Struct, gc=False):
    index: int | None = None
    id: str | None = None
    function: _Fn | None = None


class Delta(msgspec.Struct, gc=False):
    content: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_ToolCallFragment] | None = None


class _Choice(msgspec.Struct, gc=False):
    index: int | None = 0
    delta: Delta | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = 0
    completion_tokens: int | None = 0


class Chunk(msgspec.Struct, gc=False):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None


#: decodes one ``data:`` line of the stream
CHUNK = msgspec.json.Decoder(Chunk)


class RoundReader:
    """One round's decoded chunks as LlmDeltas; accumulates the answer for the history."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls = ToolCallAssembler()
        self.finished = False

    def deltas(self, chunk: Chunk) -> list[LlmDelta]:
        """The chunk's deltas, in order (a list, not a generator: one chunk a token, most with
        one text delta)."""
        if chunk.error is not None:
            raise LlmResponseError(f"error in the LLM stream: {chunk.error!r}")
        out: list[LlmDelta] = []
        for choice in chunk.choices or ():
            if choice.index not in (0, None):
                continue
            if choice.delta is not None:
                self._delta(choice.delta, out)
            if choice.finish_reason is not None:
                out.extend(self.finish(str(choice.finish_reason)))
        usage = chunk.usage
        if usage is not None:
            out.append(UsageDelta(
                prompt_tokens=int(usage.prompt_tokens or 0),
                completion_tokens=int(usage.completion_tokens or 0),
            ))
        return out

    def finish(self, reason: str | None) -> list[LlmDelta]:
        """The round's end: ids for calls the server sent without one (so their results can be
        matched), then the FinishDelta."""
        out: list[LlmDelta] = [*self.calls.name_missing_ids()]
        if reason is not None:
            self.finished = True
        out.append(FinishDelta(reason))
        return out

    def _delta(self, delta: Delta, out: list[LlmDelta]) -> None:
        reasoning = delta.reasoning_content or delta.reasoning
        if reasoning:
            out.append(ReasoningDelta(reasoning))
        for piece in (delta.content, delta.refusal):
            if piece:
                self.text.append(piece)
                out.append(TextDelta(piece))
        for fragment in delta.tool_calls or ():
            if not isinstance(fragment.index, int):
                raise LlmResponseError(f"tool call delta without an integer index: {fragment!r}")
            function = fragment.function
            call = ToolCallDelta(
                index=fragment.index,
                id=fragment.id or None,
                name=(function.name if function is not None else None) or None,
                arguments=(function.arguments if function is not None else None) or "",
            )
            self.calls.add(call)
            out.append(call)

    def message(self) -> Message:
        """The assistant's message for the history."""
        return FORMAT.assistant("".join(self.text), self.calls.calls())
