"""The behaviour contract every LLM backend keeps (agentik.llm.base), run against each backend:

- ``openai``: the real openai SDK against the scripted OpenAI-compatible server;
- ``litert``: the embedded LiteRT-LM engine with the tiny random-weights model (skipped with a
  reason when the model files or the ``litert`` extra are missing).

A backend plugs in through a :class:`Harness`, which only knows how to build it, how to make the
next round long, and how to check what the model saw. Everything else is backend-agnostic.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

import pytest
import trio

from agentik.errors import LlmError
from agentik.llm.base import (
    FinishDelta,
    LiteConversation,
    LiteLlm,
    LlmDelta,
    TextDelta,
    UsageDelta,
)
from agentik.wire import AssistantItem, Content, SystemItem, Text, UserItem, WorkingItem
from tests.models import TINY
from tests.scripted_openai import Hang, ScriptedOpenAI, open_scripted_openai


def litert_skip_reason() -> str | None:
    if importlib.util.find_spec("litert_lm") is None:
        return "litert_lm is not installed: pip install -e '.[litert]'"
    if not TINY.is_file():
        return f"the LiteRT-LM test model is missing: {TINY}"
    return None


def user(text: str) -> list[Content]:
    return [Text(body=text)]


def text_of(deltas: Sequence[LlmDelta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, TextDelta))


def usage_of(deltas: Sequence[LlmDelta]) -> UsageDelta:
    usages = [d for d in deltas if isinstance(d, UsageDelta)]
    assert len(usages) == 1, deltas
    return usages[0]


async def collect(conv: LiteConversation, content: Sequence[Content] | None) -> list[LlmDelta]:
    with trio.fail_after(20):
        async with aclosing(conv.send_stream(content)) as stream:
            return [delta async for delta in stream]


class Harness:
    name = ""
    llm: LiteLlm

    async def make_next_round_long(self) -> None:
        """The next conversation's rounds run long enough to be cancelled mid-stream."""

    async def make_rounds_short(self) -> None:
        """Undo :meth:`make_next_round_long` for conversations opened from now on."""

    async def assert_saw(
        self, conv: LiteConversation, rounds: list[list[LlmDelta]], texts: list[str]
    ) -> None:
        """The last round's model context held ``texts`` (history, earlier rounds, new message)."""
        raise NotImplementedError

    async def assert_released(self) -> None:
        """After ``aclose()`` nothing of the backend is left running or open."""
        raise NotImplementedError


class OpenAiHarness(Harness):
    name = "openai"

    def __init__(self, server: ScriptedOpenAI) -> None:
        from agentik.llm.openai import OpenAiLlm

        self.server = server
        self.openai = OpenAiLlm(server.base_url, "k", "m", max_retries=0, timeout=10.0)
        self.llm = self.openai

    async def make_next_round_long(self) -> None:
        self.server.push(Hang(text_before="partial "))

    async def assert_saw(
        self, conv: LiteConversation, rounds: list[list[LlmDelta]], texts: list[str]
    ) -> None:
        seen = [_message_text(m) for m in self.server.requests[-1]["messages"]]
        position = 0
        for text in texts:
            matches = [i for i, s in enumerate(seen) if i >= position and text in s]
            assert matches, f"{text!r} not in the request after message {position}: {seen}"
            position = matches[0] + 1

    async def assert_released(self) -> None:
        assert self.openai.closed
        assert self.openai.client.is_closed()
        with trio.fail_after(5):
            await self.server.wait_idle()


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


class LiteRtHarness(Harness):
    """The engine shows what it holds through its token counts: a round's prompt_tokens is the
    whole KV cache before the answer, so it must cover every text the model should have seen."""

    name = "litert"

    def __init__(self) -> None:
        from agentik.llm.litert import LiteRtLlm

        self.litert = LiteRtLlm(TINY, threads=2, max_output_tokens=12, temperature=0.0, top_k=1)
        self.llm = self.litert

    async def make_next_round_long(self) -> None:
        self.litert.max_output_tokens = None  # random weights never stop: up to the window

    async def make_rounds_short(self) -> None:
        self.litert.max_output_tokens = 12

    async def tokens(self, text: str) -> int:
        engine = self.litert.engine
        return len(await trio.to_thread.run_sync(engine.tokenize, text))

    async def assert_saw(
        self, conv: LiteConversation, rounds: list[list[LlmDelta]], texts: list[str]
    ) -> None:
        needed = sum([await self.tokens(text) for text in texts])
        last = usage_of(rounds[-1])
        assert last.prompt_tokens >= needed, (last, needed)
        if len(rounds) > 1:
            # the KV cache grew by the previous rounds: prompt and answer stayed in it
            previous = usage_of(rounds[-2])
            assert last.prompt_tokens >= previous.prompt_tokens + previous.completion_tokens
        # the control: the same last message alone is a much shorter prompt
        fresh = await self.llm.open([], [])
        try:
            alone = usage_of(await collect(fresh, user(texts[-1])))
        finally:
            await fresh.close()
        assert alone.prompt_tokens + needed - await self.tokens(texts[-1]) <= last.prompt_tokens

    async def assert_released(self) -> None:
        assert self.litert.closed
        assert self.litert.engine is None
        assert not self.litert._conversations


@pytest.fixture(params=["openai", "litert"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "openai":
        async with open_scripted_openai() as server:
            h: Harness = OpenAiHarness(server)
            try:
                yield h
            finally:
                await h.llm.aclose()
        return
    reason = litert_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    h = LiteRtHarness()
    try:
        yield h
    finally:
        await h.llm.aclose()


HISTORY: list[WorkingItem] = [
    SystemItem(text="You are the contract test assistant."),
    UserItem(content=user("The secret word is aubergine.")),
    AssistantItem(content=user("Noted: aubergine.")),
]


async def test_stream_yields_text_then_one_finish(harness: Harness) -> None:
    conv = await harness.llm.open(HISTORY[:1], [])
    try:
        deltas = await collect(conv, user("Say something."))
    finally:
        await conv.close()
    kinds = [type(d) for d in deltas]
    assert TextDelta in kinds
    assert text_of(deltas)
    assert kinds.count(FinishDelta) == 1
    finish = kinds.index(FinishDelta)
    assert all(kind is not TextDelta for kind in kinds[finish:])


async def test_history_seeds_the_conversation(harness: Harness) -> None:
    conv = await harness.llm.open(HISTORY, [])
    try:
        first = await collect(conv, user("What is the secret word?"))
        await harness.assert_saw(
            conv, [first],
            ["You are the contract test assistant.", "The secret word is aubergine.",
             "Noted: aubergine.", "What is the secret word?"],
        )
        second = await collect(conv, user("Spell it backwards."))
        await harness.assert_saw(
            conv, [first, second],
            ["You are the contract test assistant.", "The secret word is aubergine.",
             "Noted: aubergine.", "What is the secret word?", text_of(first),
             "Spell it backwards."],
        )
    finally:
        await conv.close()


async def test_close_is_idempotent_and_final(harness: Harness) -> None:
    conv = await harness.llm.open(HISTORY, [])
    await collect(conv, user("hello"))
    await conv.close()
    await conv.close()
    with pytest.raises(LlmError):
        await collect(conv, user("after close"))
    await conv.close()


async def test_cancel_mid_stream_returns_promptly_and_conversation_is_replaceable(
    harness: Harness,
) -> None:
    await harness.make_next_round_long()
    conv = await harness.llm.open(HISTORY, [])
    seen: list[LlmDelta] = []
    with trio.fail_after(10):  # the round itself would run far longer (or forever) uncancelled
        with trio.CancelScope() as scope:
            async with aclosing(conv.send_stream(user("Tell me a very long story."))) as stream:
                async for delta in stream:
                    seen.append(delta)
                    if isinstance(delta, TextDelta):
                        scope.cancel()
                        # the stream's cleanup runs at the next checkpoint, inside fail_after
    assert scope.cancelled_caught
    assert not any(isinstance(d, FinishDelta) for d in seen)
    with trio.fail_after(10):
        await conv.close()
    # the actor's recovery: a new conversation from working memory
    await harness.make_rounds_short()
    replacement = await harness.llm.open(
        [*HISTORY, UserItem(content=user("Tell me a very long story."))], []
    )
    try:
        deltas = await collect(replacement, user("Shorter, please."))
    finally:
        await replacement.close()
    assert any(isinstance(d, FinishDelta) for d in deltas)


async def test_aclose_releases_everything(harness: Harness) -> None:
    used = await harness.llm.open(HISTORY, [])
    await collect(used, user("hello"))
    await harness.llm.open(HISTORY, [])  # left open on purpose: aclose() must close it
    await harness.llm.aclose()
    await harness.assert_released()
    await harness.llm.aclose()  # idempotent
    with pytest.raises(LlmError):
        await harness.llm.open([], [])
    with pytest.raises(LlmError):
        await collect(used, user("after aclose"))
