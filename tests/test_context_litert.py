"""Context management on the embedded engine with the real 270M model (1,024-token window),
configured as a new user would: only AGENTIK_LLM_BACKEND and AGENTIK_LITERT_MODEL_PATH (plus a
database path of the test's own). See docs/CONTEXT.md."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import trio

import agentik
from agentik import Config
from agentik.wire import AssistantMessage, CommonEvent, Cursor, Error
from tests.models import REAL

needs_real = pytest.mark.skipif(
    not (importlib.util.find_spec("litert_lm") is not None and REAL.is_file()),
    reason=f"needs litert_lm and the model {REAL}",
)

QUESTIONS = [
    "What is the capital of France?",
    "Tell me about the history of Paris.",
    "Write a poem about the sea.",
    "Tell me about elephants.",
    "What should I cook for dinner tonight?",
    "Write a short story about a dragon who is afraid of the dark.",
    "Explain how a bicycle works.",
    "Tell me about the planets of the solar system.",
    "Write a poem about autumn leaves.",
    "What are good habits for learning a new language?",
    "Tell me about the Roman empire.",
    "Write a letter to a friend who lives far away.",
]


async def take_until(
    it: AsyncIterator[CommonEvent], stop: Callable[[CommonEvent], bool], seconds: float
) -> list[CommonEvent]:
    out: list[CommonEvent] = []
    with trio.fail_after(seconds):
        async for ev in it:
            out.append(ev)
            if stop(ev):
                return out
    return out


async def turn(agent: agentik.LocalAgent, conv: agentik.LocalConversation, text: str,
               seconds: float = 120) -> list[CommonEvent]:
    cursor = await agent.outbox.current_cursor()
    await conv.send(text)
    return await take_until(agent.outbox.conversation_events(cursor, conv.id),
                            lambda e: e.type == "touched", seconds)


def the_config(tmp_path: Path) -> Config:
    return Config.from_env({
        "AGENTIK_LLM_BACKEND": "litert",
        "AGENTIK_LITERT_MODEL_PATH": str(REAL),
        "AGENTIK_DB_PATH": str(tmp_path / "agentik.db"),
    })


@pytest.mark.slow  # ~150 s: twelve long answers on the real model
@needs_real
async def test_a_long_conversation_on_the_270m_model_never_dies_of_its_window(
    tmp_path: Path,
) -> None:
    config = the_config(tmp_path)
    assert config.context_window == 0 and config.litert_max_output_tokens == 0  # not configured
    async with agentik.open_runtime(config) as agent:
        conv = await agent.create_conversation()
        start = Cursor(epoch=agent.id, offset=0)
        generated = 0
        for question in QUESTIONS:
            events = await turn(agent, conv, question)
            types = [e.type for e in events]
            assert "error" not in types, events
            answer = next(e.event.record.message for e in events  # type: ignore[union-attr]
                          if e.type == "assistant_message")
            assert isinstance(answer, AssistantMessage) and answer.tokens is not None
            assert answer.finish_reason in ("stop", "length")
            # an answer never eats the window: at most the default budget, a quarter of it
            assert answer.tokens.completion <= 256
            generated += answer.tokens.completion
        assert generated > 1024, generated  # more than the window, over the conversation
        events = await take_until(agent.outbox.conversation_events(start, conv.id),
                                  lambda e: e.type == "compaction_triggered", 5)
        assert events[-1].type == "compaction_triggered"
        records = await agent.journal.list(conversation_id=conv.id, limit=1000)
        answers = [r for r in records if isinstance(r.message, AssistantMessage)]
        assert len(answers) == 12 and not any(isinstance(r.message, Error) for r in records)

        # a message far larger than the window: a clear error, never the engine's own text
        big = " ".join(["word"] * 3000)
        events = await turn(agent, conv, big)
        assert [e.type for e in events] == ["user_message", "error", "touched"]
        error = events[1].event.record.message  # type: ignore[union-attr]
        assert isinstance(error, Error) and error.code == "context_window"
        assert error.message.startswith("the message is ")
        assert "tokens; the model's window is 1024" in error.message
        assert "INVALID_ARGUMENT" not in error.message
        # ... and the next one is answered
        events = await turn(agent, conv, "Sorry, that was too long. What is 2 + 2?")
        assert [e.type for e in events][-2:] == ["assistant_message", "touched"]
        conv_id = conv.id

    # after a restart the conversation cold-loads and answers
    async with agentik.open_runtime(config) as agent:
        conv2 = await agent.get_conversation(conv_id)
        assert conv2 is not None
        events = await turn(agent, conv2, "Are you still there? Tell me about the moon.")
        types = [e.type for e in events]
        assert "error" not in types and types[-2:] == ["assistant_message", "touched"]
