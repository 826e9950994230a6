"""The spans of a turn (docs/OBSERVABILITY.md), named and attributed as the OpenTelemetry GenAI
semantic conventions say: ``invoke_agent {agent}``, ``chat {model}`` per model round,
``execute_tool {tool}`` per tool call, and ``compaction``. Each is one cheap no-op while traces
are off (``agentik.tracing``); the actor only wraps its steps in them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import msgspec

from agentik import tracing
from agentik.actors import turn as logic
from agentik.actors.messages import Turn
from agentik.profiles import Profile
from agentik.wire import Text, ToolCallSpec, ToolResult


def turn(profile: Profile, conversation_id: str, msg: Turn) -> AbstractContextManager[tracing.Span]:
    """The turn's span, a child of its sender's (the request that sent its message)."""
    if not tracing.enabled():
        return tracing.NOOP
    return _turn(profile, conversation_id, msg)


@contextmanager
def _turn(profile: Profile, conversation_id: str, msg: Turn) -> Iterator[tracing.Span]:
    with tracing.span(f"invoke_agent {profile.id}", parent=msg.trace, attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": profile.id,
        "gen_ai.agent.name": profile.name, "gen_ai.conversation.id": conversation_id,
        "gen_ai.request.model": profile.model, "agentik.turn_id": msg.turn_id,
    }) as span:
        if tracing.content():
            span.set_content("gen_ai.input.messages", _messages("user", [
                part.body for part in msg.content if isinstance(part, Text)]))
        yield span


def ended(span: tracing.Span, state: logic.TurnState, outcome: str,
          failed: logic.Failed | None) -> None:
    """What the turn's span learns at its end: token totals, how it ended."""
    if not tracing.enabled():
        return
    span.set("agentik.turn.outcome", outcome)
    span.set("agentik.turn.rounds", state.rounds)
    if state.saw_usage:
        span.set("gen_ai.usage.input_tokens", state.prompt_tokens)
        span.set("gen_ai.usage.output_tokens", state.completion_tokens)
    if failed is not None:
        span.set("error.type", failed.code)
        span.fail(failed.message)


def chat(profile: Profile, state: logic.TurnState) -> AbstractContextManager[tracing.Span]:
    """One model round: ``chat {model}``; its usage and finish reason read off ``state``."""
    if not tracing.enabled():
        return tracing.NOOP
    return _chat(profile, state)


@contextmanager
def _chat(profile: Profile, state: logic.TurnState) -> Iterator[tracing.Span]:
    before = (state.prompt_tokens, state.completion_tokens)
    with tracing.span(f"chat {profile.model}", kind="client", attributes={
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": _provider(profile),
        "gen_ai.request.model": profile.model, "gen_ai.conversation.id": state.conversation_id,
    }) as span:
        try:
            yield span
        finally:
            if state.saw_usage:
                span.set("gen_ai.usage.input_tokens", state.prompt_tokens - before[0])
                span.set("gen_ai.usage.output_tokens", state.completion_tokens - before[1])
            if state.finish_reason:
                span.set("gen_ai.response.finish_reasons", (state.finish_reason,))
            if tracing.content():
                span.set_content("gen_ai.output.messages", _messages(
                    "assistant", ["".join(state.round_text)], state.finish_reason or "stop"))


def tool(call: ToolCallSpec) -> AbstractContextManager[tracing.Span]:
    """One tool call: ``execute_tool {tool}``."""
    if not tracing.enabled():
        return tracing.NOOP
    span = tracing.span(f"execute_tool {call.name}", attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.call_id, "gen_ai.tool.type": "function"})
    return span


def tool_done(span: tracing.Span, call: ToolCallSpec, result: ToolResult) -> ToolResult:
    """Record the tool's result on its span (its text only where content may be recorded)."""
    if tracing.enabled():
        span.set_content("gen_ai.tool.call.arguments", call.arguments)
        span.set_content("gen_ai.tool.call.result", result.content)
        if result.is_error:
            span.set("error.type", "tool_error")
            span.fail(result.content[:200])
    return result


def summary(profile: Profile, conversation_id: str) -> AbstractContextManager[tracing.Span]:
    """The model round that summarises old turns for a compaction: a ``chat`` of its own."""
    if not tracing.enabled():
        return tracing.NOOP
    return tracing.span(f"chat {profile.model}", kind="client", attributes={
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": _provider(profile),
        "gen_ai.request.model": profile.model, "gen_ai.conversation.id": conversation_id,
        "agentik.chat.purpose": "summary"})


def compaction(conversation_id: str, items: int) -> AbstractContextManager[tracing.Span]:
    if not tracing.enabled():
        return tracing.NOOP
    return tracing.span("compaction", attributes={
        "gen_ai.conversation.id": conversation_id, "agentik.compaction.items": items})


def _messages(role: str, texts: list[str], finish_reason: str | None = None) -> str:
    """One message in the GenAI conventions' JSON shape (role, text parts, finish reason)."""
    message: dict[str, object] = {
        "role": role, "parts": [{"type": "text", "content": text} for text in texts]}
    if finish_reason is not None:
        message["finish_reason"] = finish_reason
    return msgspec.json.encode([message]).decode()


def _provider(profile: Profile) -> str:
    # an OpenAI-compatible server is spoken to as OpenAI; the embedded engine is ours
    return "openai" if profile.backend == "openai" else "agentik.litert"
