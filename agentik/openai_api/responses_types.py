"""The OpenAI-compatible wire of Responses and Conversations (docs/OPENAI.md), as msgspec structs.

Requests are decoded leniently (unknown members ignored); answers carry what the openai SDK
reads. One :class:`StreamEvent` struct holds every streamed event type (members a type does not
use are left out), since they differ only in which of the same few members they carry.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agentik.openai_api.types import ImageUrl


class In(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    pass


class Out(msgspec.Struct, kw_only=True):
    pass


# --- requests ------------------------------------------------------------------------------------


class InputPart(In, kw_only=True):
    type: str
    text: str | None = None
    image_url: str | ImageUrl | None = None


class InputItem(In, kw_only=True):
    type: str = "message"
    role: str = "user"
    content: str | list[InputPart] | None = None


class ConversationRef(In, kw_only=True):
    id: str


class ResponsesRequest(In, kw_only=True):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    conversation: str | ConversationRef | None = None
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    stream: bool = False
    metadata: dict[str, str] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    n: int | None = None
    text: dict[str, Any] | None = None


class ConversationCreate(In, kw_only=True):
    items: list[Any] | None = None
    metadata: dict[str, str] | None = None


class ConversationUpdate(In, kw_only=True):
    metadata: dict[str, str]


# --- answers -------------------------------------------------------------------------------------


class ContentOut(Out, kw_only=True, omit_defaults=True):
    type: str  # output_text | input_text | input_image
    text: str | None = None
    image_url: str | None = None
    annotations: list[Any] | None = None


class MessageItem(Out, kw_only=True):
    id: str
    type: Literal["message"] = "message"
    role: str
    status: str
    content: list[ContentOut]


class TokensDetails(Out, kw_only=True):
    cached_tokens: int = 0


class OutputDetails(Out, kw_only=True):
    reasoning_tokens: int = 0


class ResponseUsage(Out, kw_only=True):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: TokensDetails = msgspec.field(default_factory=TokensDetails)
    output_tokens_details: OutputDetails = msgspec.field(default_factory=OutputDetails)


class ResponseError(Out, kw_only=True):
    code: str
    message: str


class ConversationId(Out, kw_only=True):
    id: str


class ResponseObject(Out, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    created_at: float
    status: str  # queued | in_progress | completed | failed | cancelled
    background: bool
    error: ResponseError | None = None
    incomplete_details: None = None
    instructions: str | None = None
    metadata: dict[str, str] = {}
    model: str
    output: list[MessageItem]
    parallel_tool_calls: bool = False
    previous_response_id: str | None = None
    conversation: ConversationId | None = None
    store: bool = True
    temperature: None = None
    top_p: None = None
    tool_choice: str = "auto"
    tools: list[Any] = []
    usage: ResponseUsage | None = None
    completed_at: float | None = None


class StreamEvent(Out, kw_only=True, omit_defaults=True):
    type: str
    sequence_number: int
    response: ResponseObject | None = None
    output_index: int | None = None
    item: MessageItem | None = None
    item_id: str | None = None
    content_index: int | None = None
    part: ContentOut | None = None
    delta: str | None = None
    text: str | None = None
    logprobs: list[Any] | None = None


class Deleted(Out, kw_only=True):
    id: str
    object: str
    deleted: bool = True


class ConversationObject(Out, kw_only=True):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str]


class ItemList(Out, kw_only=True):
    object: Literal["list"] = "list"
    data: list[MessageItem]
    first_id: str | None
    last_id: str | None
    has_more: bool


_encoder = msgspec.json.Encoder()
encode = _encoder.encode
decode_responses_request = msgspec.json.Decoder(ResponsesRequest).decode
decode_conversation_create = msgspec.json.Decoder(ConversationCreate).decode
decode_conversation_update = msgspec.json.Decoder(ConversationUpdate).decode
