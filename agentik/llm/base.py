"""The LLM backend protocol: ``LiteLlm.open(history, tools) -> LiteConversation`` (docs/ARCHITECTURE.md,
"LLM backends").

A ``LiteConversation`` is one live model session. It owns its own copy of the history: after a
round it has appended the assistant's answer (text and tool calls) itself, and
``add_tool_result`` appends a tool answer; ``send_stream(None)`` then continues after tool results.

Contract every backend keeps:
- ``send_stream`` is an async iterator of :data:`LlmDelta`; it raises only
  :class:`agentik.errors.LlmError` subclasses (third-party errors are converted inside the
  backend) or ``trio.Cancelled``. It always releases its connection/stream, also when the consumer
  stops early or is cancelled.
- A round is interrupted by cancelling its consumer (a trio cancel scope); there is no separate
  interrupt call.
- After a failure or a cancellation the conversation is not reused: the actor calls ``close()`` and
  opens a new one from working memory.
- ``close()`` is idempotent and never raises.

Context (docs/CONTEXT.md): ``context_window`` is the window the backend knows (the
engine reports it on load; the openai backend reads it where the server's model listing says,
else learns it from a server's overflow answer; the configured ``AGENTIK_CONTEXT_WINDOW``
overrides). ``count_tokens`` counts working-memory items
(with the model's tokenizer when ``exact_tokens``, else :func:`agentik.context.estimate_item`).
``send_stream(..., max_output_tokens=n)`` generates at most ``n`` tokens (None: the backend's
default budget, :func:`agentik.context.output_budget`), ending with ``FinishDelta("length")`` when
cut. A prompt that does not fit raises :class:`agentik.errors.LlmContextOverflowError`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgspec

from agentik.wire import Content, ToolCallSpec, WorkingItem


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A function offered to the model: OpenAI function-calling shape."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = {}


# The deltas hold strings and numbers only: never in a reference cycle, so the collector need not
# track them (gc=False: one or more a token).


class TextDelta(msgspec.Struct, frozen=True, gc=False):
    text: str


class ReasoningDelta(msgspec.Struct, frozen=True, gc=False):
    text: str


class ToolCallDelta(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A fragment of a tool call. ``index`` identifies the call within the round; ``id`` and
    ``name`` are set (assigned, never appended) when present; ``arguments`` is appended."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class UsageDelta(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class FinishDelta(msgspec.Struct, frozen=True, gc=False):
    reason: str | None


LlmDelta = TextDelta | ReasoningDelta | ToolCallDelta | UsageDelta | FinishDelta


@dataclass
class _Call:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ToolCallAssembler:
    """The one place where :class:`ToolCallDelta` fragments become tool calls: a backend uses it
    for the answer it keeps in its own history, the turn loop for what it stores.

    ``index`` identifies the call within the round; ``id`` and ``name`` are assigned, never
    appended, when present (some servers, llama.cpp for one, repeat them in every fragment);
    ``arguments`` are appended.
    """

    def __init__(self) -> None:
        self._calls: dict[int, _Call] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def add(self, delta: ToolCallDelta) -> None:
        call = self._calls.setdefault(delta.index, _Call())
        if delta.id:
            call.id = delta.id
        if delta.name:
            call.name = delta.name
        if delta.arguments:
            call.arguments.append(delta.arguments)

    def name_missing_ids(self) -> list[ToolCallDelta]:
        """Give each call still without an id the id ``call_<index>``; returns the deltas that
        announce them (a backend yields them, so its consumer learns the same ids)."""
        named = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call.id:
                call.id = f"call_{index}"
                named.append(ToolCallDelta(index=index, id=call.id))
        return named

    def calls(self) -> list[ToolCallSpec]:
        """The calls in index order. One without an id gets a random one; one without a name
        keeps an empty name (it fails as an unknown tool, which the model is told); empty
        arguments are ``{}``."""
        return [
            ToolCallSpec(
                call_id=call.id or f"call_{uuid.uuid4().hex[:12]}",
                name=call.name,
                arguments="".join(call.arguments) or "{}",
            )
            for _, call in sorted(self._calls.items())
        ]


class LiteConversation(Protocol):
    def send_stream(
        self, content: Sequence[Content] | None, *, max_output_tokens: int | None = None
    ) -> AsyncGenerator[LlmDelta, None]:
        """Stream one model round. ``content`` is the user's new message, or None to continue
        after tool results; at most ``max_output_tokens`` are generated. Raises LlmError on
        backend failure (LlmContextOverflowError: the prompt does not fit the window)."""
        ...

    def add_tool_result(self, call_id: str, name: str, result: str) -> None: ...

    async def close(self) -> None: ...


class LiteLlm(Protocol):
    #: whether Image content reaches the model (else it is dropped with a warning)
    supports_images: bool
    #: the model's context window in tokens, if known (drives the output budget and compaction)
    context_window: int | None
    #: whether count_tokens uses the model's own tokenizer (else a pessimistic estimate)
    exact_tokens: bool
    #: the configured output budget per round (None: the default share of the window)
    max_output_tokens: int | None

    async def count_tokens(self, items: Sequence[WorkingItem]) -> list[int]:
        """Tokens each item takes in the model's context (template tokens included)."""
        ...

    async def open(
        self, history: Sequence[WorkingItem], tools: Sequence[ToolSpec]
    ) -> LiteConversation:
        """Start a session seeded with ``history``. Raises LlmError."""
        ...

    async def aclose(self) -> None:
        """Release process-wide resources (HTTP client, engine). Idempotent."""
        ...


@runtime_checkable
class Surveyed(Protocol):
    """A backend whose server can be asked whether it answers (the openai backend): the runtime
    asks now and then and ``/readyz`` says so (:class:`ModelHealth`)."""

    async def survey(self) -> str | None:
        """None when the server answers, else why not (one line naming the endpoint)."""
        ...


@dataclass
class ModelHealth:
    """Whether the model's server answered when the runtime last asked (``/readyz``): ``error``
    says why not. ``checked`` stays False for a backend nobody asks (an embedded engine, a test
    stand-in) and until the first answer."""

    error: str | None = None
    checked: bool = False
