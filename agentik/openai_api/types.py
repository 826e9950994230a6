"""The OpenAI-compatible wire (docs/OPENAI.md): Chat Completions and Models, as msgspec structs.

Requests are decoded leniently (unknown members are ignored, as clients such as Open WebUI send
their own); what agentik cannot honour is refused by :mod:`agentik.openai_api.chat`. Answers are
encoded with ``omit_defaults`` off where OpenAI's shape has explicit nulls (``logprobs``,
``refusal``, ``usage`` of a streamed chunk).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class In(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Base of request structs: unknown members are ignored."""


class Out(msgspec.Struct, kw_only=True):
    """Base of answer structs."""


# --- requests ------------------------------------------------------------------------------------


class ImageUrl(In, kw_only=True):
    url: str
    detail: str | None = None


class ContentPart(In, kw_only=True):
    type: str
    text: str | None = None
    image_url: ImageUrl | None = None


class ChatMessage(In, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None


class StreamOptions(In, kw_only=True):
    include_usage: bool = False


class ChatRequest(In, kw_only=True):
    model: str
    messages: list[ChatMessage]
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    # asked for, but refused when agentik cannot honour them (chat.check_supported)
    n: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: Any = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, Any] | None = None
    prediction: Any = None


# --- answers -------------------------------------------------------------------------------------


class Model(Out, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "agentik"


class ModelList(Out, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Model]


class Usage(Out, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class FunctionCall(Out, kw_only=True):
    name: str
    arguments: str


class ToolCallOut(Out, kw_only=True):
    """A call of one of the caller's tools (``tools``), which the caller runs."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolCallDelta(Out, kw_only=True):
    index: int
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantOut(Out, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCallOut] | None = None


class Choice(Out, kw_only=True):
    index: int = 0
    message: AssistantOut
    finish_reason: str
    logprobs: None = None


class ChatCompletion(Out, kw_only=True):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None
    system_fingerprint: None = None


class Delta(Out, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(Out, kw_only=True):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(Out, kw_only=True):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    system_fingerprint: None = None
    usage: Usage | None = None


class ErrorObject(Out, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorAnswer(Out, kw_only=True):
    error: ErrorObject


_encoder = msgspec.json.Encoder()
encode = _encoder.encode
decode_chat_request = msgspec.json.Decoder(ChatRequest).decode
