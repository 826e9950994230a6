"""The embedded LiteRT-LM backend: configuration, the engine's life cycle, streaming off the event
loop, cancel and rebuild, the concurrency limit, tool calls, a real completion with the 270M
model, and a full turn through ``open_runtime``.

Mechanics run on ``tiny-random.litertlm`` (random weights: garbage text, loads in ~0.05 s); the
real completion on ``gemma3-270m-int4.litertlm``. The tool-call path runs on a fake engine: the
test models' format has no function calling (``supports_function_calling()`` is False).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import agentik
from agentik.config import Config
from agentik.errors import ConfigError, LlmConnectionError, LlmContextOverflowError, LlmResponseError
from agentik.llm.base import (
    FinishDelta,
    LlmDelta,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageDelta,
)
from agentik.llm.litert import LiteRtConversation, LiteRtLlm, history_to_messages
from agentik.llm.litert import engine as litert_engine
from agentik.runtime import make_llm
from agentik.wire import (
    AssistantItem,
    AssistantMessage,
    CommonEvent,
    Content,
    Image,
    SummaryItem,
    SystemItem,
    Text,
    ToolCallSpec,
    ToolItem,
    UserItem,
    UserMessage,
    WorkingItem,
)
from tests.models import REAL, TINY

HAVE_LITERT = importlib.util.find_spec("litert_lm") is not None
needs_litert = pytest.mark.skipif(
    not HAVE_LITERT, reason="litert_lm is not installed: pip install -e '.[litert]'"
)
needs_tiny = pytest.mark.skipif(
    not (HAVE_LITERT and TINY.is_file()),
    reason=f"needs litert_lm and the test model {TINY}",
)
needs_real = pytest.mark.skipif(
    not (HAVE_LITERT and REAL.is_file()),
    reason=f"needs litert_lm and the test model {REAL}",
)

ADD = ToolSpec(
    name="add",
    description="Add two numbers",
    parameters={"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
)


def user(text: str) -> list[Content]:
    return [Text(body=text)]


def text_of(deltas: Sequence[LlmDelta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, TextDelta))


async def collect(conv: LiteRtConversation, content: Sequence[Content] | None) -> list[LlmDelta]:
    with trio.fail_after(20):
        async with aclosing(conv.send_stream(content)) as stream:
            return [delta async for delta in stream]


def tiny(**kw: Any) -> LiteRtLlm:
    options: dict[str, Any] = {"threads": 2, "max_output_tokens": 16, "temperature": 0.0, "top_k": 1}
    options.update(kw)
    return LiteRtLlm(TINY, **options)


@pytest.fixture
async def llm() -> AsyncIterator[LiteRtLlm]:
    backend = tiny()
    try:
        yield backend
    finally:
        await backend.aclose()


# --- configuration -------------------------------------------------------------------------------


@needs_litert
def test_config_without_model_path_names_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        make_llm(Config(llm_backend="litert"))
    assert info.value.variable == "AGENTIK_LITERT_MODEL_PATH"
    assert "not set" in str(info.value)


@needs_litert
def test_config_with_missing_file_or_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope.litertlm"
    with pytest.raises(ConfigError) as info:
        LiteRtLlm.from_config(Config(llm_backend="litert", litert_model_path=str(missing)))
    assert info.value.variable == "AGENTIK_LITERT_MODEL_PATH"
    assert "does not exist" in str(info.value) and str(missing) in str(info.value)
    with pytest.raises(ConfigError, match="is a directory"):
        LiteRtLlm.from_config(Config(llm_backend="litert", litert_model_path=str(tmp_path)))


def test_config_without_the_package_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def missing() -> Any:
        raise ImportError("No module named 'litert_lm'")

    monkeypatch.setattr(litert_engine, "import_litert", missing)
    model = tmp_path / "m.litertlm"
    model.write_bytes(b"x")
    with pytest.raises(ConfigError) as info:
        make_llm(Config(llm_backend="litert", litert_model_path=str(model)))
    assert "pip install -e '.[litert]'" in str(info.value)
    assert "litert-lm-api" in str(info.value)


@needs_litert
def test_config_values_reach_the_backend(tmp_path: Path) -> None:
    model = tmp_path / "m.litertlm"
    model.write_bytes(b"x")
    backend = make_llm(
        Config(llm_backend="litert", litert_model_path=str(model), litert_threads=3,
               context_window=512)
    )
    assert isinstance(backend, LiteRtLlm)
    assert backend.threads == 3
    assert backend.max_concurrency == 1  # the default until Config has litert_max_concurrency
    assert backend.context_window == 512
    assert not backend.loaded  # nothing loads before the first conversation
    with pytest.raises(ConfigError) as info:
        make_llm(Config(llm_backend="litert", litert_model_path=str(model), litert_threads=0))
    assert info.value.variable == "AGENTIK_LITERT_THREADS"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConfigWithLitertLimits(Config):
    """Config with the settings proposed for the core (read with getattr until they exist)."""

    litert_max_concurrency: int = 1
    litert_max_output_tokens: int = 0


@needs_litert
def test_proposed_concurrency_and_output_settings(tmp_path: Path) -> None:
    model = tmp_path / "m.litertlm"
    model.write_bytes(b"x")
    backend = LiteRtLlm.from_config(ConfigWithLitertLimits(
        llm_backend="litert", litert_model_path=str(model), litert_max_concurrency=3,
        litert_max_output_tokens=64,
    ))
    assert backend.max_concurrency == 3 and backend.limiter.total_tokens == 3
    assert backend.max_output_tokens == 64
    unlimited = LiteRtLlm.from_config(
        ConfigWithLitertLimits(llm_backend="litert", litert_model_path=str(model))
    )
    assert unlimited.max_output_tokens is None
    with pytest.raises(ConfigError) as info:
        LiteRtLlm.from_config(ConfigWithLitertLimits(
            llm_backend="litert", litert_model_path=str(model), litert_max_concurrency=0,
        ))
    assert info.value.variable == "AGENTIK_LITERT_MAX_CONCURRENCY"


@needs_litert
async def test_a_file_that_is_not_a_model_fails_the_open(tmp_path: Path) -> None:
    bad = tmp_path / "bad.litertlm"
    bad.write_bytes(b"not a model" * 1000)
    backend = LiteRtLlm(bad)
    try:
        with pytest.raises(LlmConnectionError, match="cannot load the LiteRT-LM model"):
            await backend.open([], [])
        assert not backend.loaded
    finally:
        await backend.aclose()


# --- engine life cycle ---------------------------------------------------------------------------


@needs_tiny
async def test_engine_loads_once_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = tiny()
    loads: list[int] = []
    real_load = backend._load_sync

    def counting_load() -> None:
        loads.append(1)
        real_load()

    monkeypatch.setattr(backend, "_load_sync", counting_load)
    try:
        assert not backend.loaded and backend.context_window is None
        convs: list[LiteRtConversation] = []
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(lambda: _open_into(backend, convs))
        assert loads == [1]
        assert backend.loaded
        assert backend.context_window == 1024  # from the model file
        assert backend.supports_tools is False  # the test models have no function calling
        assert len({id(c.engine_conv) for c in convs}) == 3  # one engine conversation each
        engine = backend.engine
        await backend.open([], [])
        assert backend.engine is engine and loads == [1]
    finally:
        await backend.aclose()
    assert backend.engine is None
    assert all(c.closed and c.engine_conv is None for c in convs)


async def _open_into(backend: LiteRtLlm, out: list[LiteRtConversation]) -> None:
    out.append(await backend.open([SystemItem(text="hi")], []))


@needs_tiny
async def test_stream_usage_and_kv_cache_reuse(llm: LiteRtLlm) -> None:
    conv = await llm.open([SystemItem(text="Be brief.")], [])
    first = await collect(conv, user("Hello there"))
    second = await collect(conv, user("And again"))
    for deltas in (first, second):
        assert isinstance(deltas[-1], FinishDelta) and deltas[-1].reason == "length"
        usage = deltas[-2]
        assert isinstance(usage, UsageDelta) and usage.completion_tokens == 16
        assert text_of(deltas)
    u1, u2 = first[-2], second[-2]
    assert isinstance(u1, UsageDelta) and isinstance(u2, UsageDelta)
    # one engine conversation across rounds: its KV cache holds round one under round two
    assert conv.engine_conversations == 1
    assert u2.prompt_tokens > u1.prompt_tokens + u1.completion_tokens
    assert conv.messages[-1] == {
        "role": "assistant", "content": [{"type": "text", "text": text_of(second)}]
    }
    assert conv.messages[-2] == {"role": "user", "content": [{"type": "text", "text": "And again"}]}
    # greedy sampling: a fresh conversation with the same history says the same thing
    again = await llm.open([SystemItem(text="Be brief.")], [])
    assert text_of(await collect(again, user("Hello there"))) == text_of(first)


@needs_tiny
async def test_cancel_stops_the_engine_thread_and_the_next_round_rebuilds() -> None:
    backend = tiny(max_output_tokens=None)  # random weights never stop: ~1000 tokens uncancelled
    try:
        conv = await backend.open([SystemItem(text="sys")], [])
        with trio.fail_after(10), trio.CancelScope() as scope:
            async with aclosing(conv.send_stream(user("A long story, please."))) as stream:
                async for delta in stream:
                    if isinstance(delta, TextDelta):
                        scope.cancel()
        assert scope.cancelled_caught
        cancelled = conv.last_round
        assert cancelled is not None
        assert cancelled.cancelled.is_set() and cancelled.done.is_set()  # the thread has ended
        assert cancelled.chunks < 200  # stopped early, not at the end of the window
        assert conv.engine_conv is None  # a cancelled engine conversation is never reused
        assert backend.limiter.borrowed_tokens == 0
        # the next round re-creates it from the history, which kept the cancelled question
        backend.max_output_tokens = 8
        deltas = await collect(conv, user("Shorter."))
        assert conv.engine_conversations == 2
        assert isinstance(deltas[-1], FinishDelta)
        usage = deltas[-2]
        assert isinstance(usage, UsageDelta)
        question = len(backend.engine.tokenize("A long story, please."))
        assert usage.prompt_tokens > question
        assert [m["role"] for m in conv.messages] == ["system", "user", "user", "assistant"]
    finally:
        await backend.aclose()


@needs_tiny
async def test_leaving_the_stream_early_and_close_during_a_round() -> None:
    backend = tiny(max_output_tokens=None)
    try:
        conv = await backend.open([], [])
        deltas: list[LlmDelta] = []
        with trio.fail_after(10):
            async with aclosing(conv.send_stream(user("Go on and on."))) as stream:
                async for delta in stream:
                    deltas.append(delta)
                    break  # aclosing closes the generator: the round is stopped
        assert len(deltas) == 1
        stopped = conv.last_round
        assert stopped is not None and stopped.cancelled.is_set() and stopped.done.is_set()
        assert conv.engine_conv is None
        assert backend.limiter.borrowed_tokens == 0
        assert conv.messages[-1]["role"] == "user"  # no half answer in the history

        # close() from elsewhere while the consumer still holds the stream
        with trio.fail_after(10):
            async with aclosing(conv.send_stream(user("More."))) as stream:
                await stream.__anext__()
                await conv.close()
                with pytest.raises(LlmResponseError, match="closed"):
                    async for _ in stream:
                        pass
        assert conv.closed and conv.engine_conv is None
        assert backend.limiter.borrowed_tokens == 0
    finally:
        await backend.aclose()


async def collect_limited(conv: LiteRtConversation, text: str, limit: int | None) -> list[LlmDelta]:
    async with aclosing(conv.send_stream(user(text), max_output_tokens=limit)) as stream:
        return [delta async for delta in stream]


@needs_tiny
async def test_default_output_budget_is_a_quarter_of_the_window_with_exact_usage() -> None:
    backend = tiny(max_output_tokens=None)
    try:
        conv = await backend.open([], [])
        assert backend.context_window == 1024 and backend.output_budget() == 256
        deltas = await collect(conv, user("Go on and on."))
        usage = [d for d in deltas if isinstance(d, UsageDelta)][-1]
        assert deltas[-1] == FinishDelta("length")  # the random model never stops by itself
        assert usage.completion_tokens == 256
        # exact: the engine's own count of what the conversation holds
        assert usage.prompt_tokens + usage.completion_tokens == conv.engine_conv.token_count
        # the counting the runtime plans with agrees with the engine's prefill (+- template)
        counted = sum(await backend.count_tokens([UserItem(content=user("Go on and on."))]))
        assert abs(counted - usage.prompt_tokens) <= 4, (counted, usage.prompt_tokens)
        deltas = await collect_limited(conv, "Less now.", 10)
        assert [d for d in deltas if isinstance(d, UsageDelta)][-1].completion_tokens == 10
        assert deltas[-1] == FinishDelta("length")
    finally:
        await backend.aclose()


@needs_tiny
async def test_full_context_window_is_an_overflow_error_not_an_empty_answer() -> None:
    backend = tiny(max_output_tokens=None)
    try:
        conv = await backend.open([], [])
        filled = await collect_limited(conv, "Fill it.", 5000)
        assert filled[-1] == FinishDelta("length")
        with pytest.raises(LlmContextOverflowError,
                           match="does not fit the model's context window \\(1024 tokens\\)"):
            await collect(conv, user("One more."))
        # a message larger than the window is refused before the engine sees it (the engine's
        # INVALID_ARGUMENT would leave its conversation unusable), with our text, not its own
        conv2 = await backend.open([], [])
        with pytest.raises(LlmContextOverflowError) as info:
            await collect(conv2, user("word " * 1500))
        assert info.value.window == 1024 and info.value.tokens is not None
        assert info.value.tokens > 1024 and "INVALID_ARGUMENT" not in str(info.value)
        await conv2.close()
    finally:
        await backend.aclose()


@needs_tiny
async def test_event_loop_stays_responsive_while_a_round_generates() -> None:
    backend = tiny(max_output_tokens=900)
    try:
        conv = await backend.open([], [])
        gaps: list[float] = []
        async with trio.open_nursery() as nursery:

            async def tick() -> None:
                last = trio.current_time()
                while True:
                    await trio.sleep(0.001)
                    now = trio.current_time()
                    gaps.append(now - last)
                    last = now

            nursery.start_soon(tick)
            await trio.testing.wait_all_tasks_blocked()
            start = trio.current_time()
            deltas = await collect(conv, user("Write until the window is full."))
            elapsed = trio.current_time() - start
            nursery.cancel_scope.cancel()
    finally:
        await backend.aclose()
    usage = deltas[-2]
    assert isinstance(usage, UsageDelta) and usage.completion_tokens > 500
    # The ticker kept running all through the round: no stall anywhere near the round's length,
    # as a blocking engine call on the loop would cause.
    assert len(gaps) >= 20
    assert max(gaps) < max(0.25, elapsed / 4), (max(gaps), elapsed)


@needs_tiny
async def test_concurrency_limit_makes_excess_rounds_wait() -> None:
    backend = tiny(max_concurrency=1, max_output_tokens=8)
    order: list[str] = []
    try:
        a = await backend.open([], [])
        b = await backend.open([], [])
        release_a = trio.Event()
        a_started = trio.Event()

        async def run_a() -> None:
            async with aclosing(a.send_stream(user("first"))) as stream:
                async for delta in stream:
                    if not order:
                        order.append("a:first")
                        a_started.set()
                        await release_a.wait()  # holds the engine slot mid-round
                    if isinstance(delta, FinishDelta):
                        order.append("a:finish")

        async def run_b() -> None:
            async with aclosing(b.send_stream(user("second"))) as stream:
                async for delta in stream:
                    if isinstance(delta, TextDelta) and "b:first" not in order:
                        order.append("b:first")

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_a)
                await a_started.wait()
                nursery.start_soon(run_b)
                await trio.testing.wait_all_tasks_blocked()
                stats = backend.limiter.statistics()
                assert stats.borrowed_tokens == 1 and stats.tasks_waiting == 1
                assert order == ["a:first"]
                release_a.set()
    finally:
        await backend.aclose()
    assert order == ["a:first", "a:finish", "b:first"]


@needs_tiny
async def test_images_are_dropped_with_a_warning(
    llm: LiteRtLlm, caplog: pytest.LogCaptureFixture
) -> None:
    assert llm.supports_images is False
    conv = await llm.open([], [])
    with caplog.at_level(logging.WARNING, logger="agentik.llm.litert"):
        deltas = await collect(conv, [Text(body="What is this?"), Image(data="aGk=", mime="image/png")])
    assert isinstance(deltas[-1], FinishDelta)
    assert "dropped 1 image(s)" in caplog.text
    assert conv.messages[-2] == {"role": "user", "content": [{"type": "text", "text": "What is this?"}]}


# --- history and tools ---------------------------------------------------------------------------


def test_history_to_messages_with_tool_calls_and_results() -> None:
    history: list[WorkingItem] = [
        SystemItem(text="sys"),
        SummaryItem(text="we met"),
        UserItem(content=[Text(body="add 1 and 2"), Image(data="aGk=")]),
        AssistantItem(
            content=[Text(body="calling")],
            tool_calls=[
                ToolCallSpec(call_id="c1", name="add", arguments='{"a": 1, "b": 2}'),
                ToolCallSpec(call_id="c2", name="echo", arguments="not json"),
            ],
        ),
        ToolItem(call_id="c1", name="add", content="3"),
        ToolItem(call_id="c2", name="echo", content="oops"),
        AssistantItem(content=[Text(body="It is 3.")]),
        UserItem(content=[Image(data="aGk=")]),
    ]
    assert history_to_messages(history) == [
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {"role": "system", "content": [{"type": "text", "text": "Summary of earlier conversation: we met"}]},
        {"role": "user", "content": [{"type": "text", "text": "add 1 and 2"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "calling"}],
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
                {"id": "c2", "type": "function",
                 "function": {"name": "echo", "arguments": {"arguments": "not json"}}},
            ],
        },
        {"role": "tool", "content": [
            {"type": "tool_response", "name": "add", "response": "3"},
            {"type": "tool_response", "name": "echo", "response": "oops"},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": "It is 3."}]},
        {"role": "user", "content": [{"type": "text", "text": ""}]},
    ]


@needs_tiny
async def test_rebuild_seeds_a_history_with_tool_calls(llm: LiteRtLlm) -> None:
    history: list[WorkingItem] = [
        SystemItem(text="You can add."),
        UserItem(content=user("add 1 and 2")),
        AssistantItem(content=[], tool_calls=[ToolCallSpec(call_id="c1", name="add",
                                                           arguments='{"a": 1, "b": 2}')]),
        ToolItem(call_id="c1", name="add", content="three"),
        AssistantItem(content=user("It is three.")),
    ]
    conv = await llm.open(history, [ADD])
    deltas = await collect(conv, user("thanks"))
    usage = deltas[-2]
    assert isinstance(usage, UsageDelta)
    seeded = sum(len(llm.engine.tokenize(t)) for t in
                 ("You can add.", "add 1 and 2", "three", "It is three.", "thanks"))
    assert usage.prompt_tokens >= seeded


class FakeEngineConv:
    """Stands in for a litert_lm Conversation: answers each message with the next script entry
    (a list of chunk dicts, or an exception)."""

    def __init__(self, script: list[Any], kwargs: dict[str, Any]) -> None:
        self.script = script
        self.kwargs = kwargs
        self.sent: list[Any] = []
        self.token_count = 0
        self.closed = False

    def send_message_async(self, message: Any) -> Iterator[dict[str, Any]]:
        self.sent.append(message)
        step = self.script.pop(0)
        self.token_count += 10
        if isinstance(step, Exception):
            raise step
        for chunk in step:
            self.token_count += 1
            yield chunk

    def cancel_process(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeEngine:
    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.conversations: list[FakeEngineConv] = []
        self.closed = False
        #: when set, create_conversation signals ``entered`` and waits for ``gate``
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def create_conversation(self, **kwargs: Any) -> FakeEngineConv:
        if self.gate is not None:
            self.entered.set()
            self.gate.wait(10)
        conv = FakeEngineConv(self.script, kwargs)
        self.conversations.append(conv)
        return conv

    def close(self) -> None:
        assert all(c.closed for c in self.conversations), "engine closed before a conversation"
        self.closed = True


def fake_backend(script: list[Any], *, supports_tools: bool = True) -> tuple[LiteRtLlm, FakeEngine]:
    backend = LiteRtLlm("unused.litertlm", temperature=0.0, top_k=1)
    engine = FakeEngine(script)
    backend._engine = engine  # "loaded": open() skips the real load
    backend.supports_tools = supports_tools
    return backend, engine


def chunk(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


@needs_litert
async def test_tool_calls_go_through_our_loop() -> None:
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    backend, engine = fake_backend([
        [chunk("Let me add."), {"role": "assistant", "tool_calls": [call]}],
        [chunk("It is 3.")],
    ])
    try:
        conv = await backend.open([SystemItem(text="sys")], [ADD])
        kwargs = engine.conversations[0].kwargs
        assert kwargs["automatic_tool_calling"] is False
        assert kwargs["messages"] == [{"role": "system", "content": [{"type": "text", "text": "sys"}]}]
        [tool] = kwargs["tools"]
        assert tool.get_tool_description() == {
            "type": "function",
            "function": {"name": "add", "description": "Add two numbers",
                         "parameters": ADD.parameters},
        }
        with pytest.raises(RuntimeError, match="agentik's tool loop"):
            tool.execute({"a": 1})
        assert kwargs["sampler_config"].top_k == 1

        first = await collect(conv, user("add 1 and 2"))
        calls = [d for d in first if isinstance(d, ToolCallDelta)]
        assert len(calls) == 1
        assert calls[0].index == 0 and calls[0].name == "add" and calls[0].id
        assert json.loads(calls[0].arguments) == {"a": 1, "b": 2}
        assert first[-1] == FinishDelta("tool_calls")
        assert text_of(first) == "Let me add."

        conv.add_tool_result(calls[0].id or "", "add", "3")
        second = await collect(conv, None)
        assert text_of(second) == "It is 3." and second[-1] == FinishDelta("stop")
        engine_conv = engine.conversations[0]
        assert engine_conv.sent[1] == {
            "role": "tool", "content": [{"type": "tool_response", "name": "add", "response": "3"}]
        }
        assert conv.messages[2] == {
            "role": "assistant",
            "content": [{"type": "text", "text": "Let me add."}],
            "tool_calls": [{"id": calls[0].id, "type": "function",
                            "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
        }
        assert len(engine.conversations) == 1
        with pytest.raises(LlmResponseError, match="nothing to send"):
            await collect(conv, None)
    finally:
        await backend.aclose()
    assert engine.closed and all(c.closed for c in engine.conversations)


@needs_litert
async def test_tools_are_not_offered_to_a_model_without_function_calling(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend, engine = fake_backend([], supports_tools=False)
    try:
        with caplog.at_level(logging.WARNING, logger="agentik.llm.litert"):
            await backend.open([], [ADD])
            await backend.open([], [ADD])
        assert "tools" not in engine.conversations[0].kwargs
        assert caplog.text.count("does not support function calling") == 1
    finally:
        await backend.aclose()


@needs_litert
async def test_engine_errors_become_llm_errors_and_the_next_round_rebuilds() -> None:
    backend, engine = fake_backend([RuntimeError("INTERNAL: boom"), [chunk("fine")]])
    try:
        conv = await backend.open([], [])
        with pytest.raises(LlmResponseError, match="INTERNAL: boom"):
            await collect(conv, user("one"))
        assert engine.conversations[0].closed
        deltas = await collect(conv, user("two"))
        assert text_of(deltas) == "fine"
        rebuilt = engine.conversations[1]
        assert rebuilt.kwargs["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "one"}]}
        ]
        assert backend.limiter.borrowed_tokens == 0
    finally:
        await backend.aclose()


@needs_litert
async def test_aclose_while_a_conversation_is_being_created() -> None:
    """The engine's close must not miss an engine conversation created meanwhile (deleting the
    engine first would crash the process later)."""
    backend, engine = fake_backend([])
    engine.gate = threading.Event()
    failures: list[BaseException] = []

    async def opener() -> None:
        try:
            await backend.open([], [])
        except (LlmConnectionError, LlmResponseError) as exc:
            failures.append(exc)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(opener)
            await trio.to_thread.run_sync(engine.entered.wait)
            nursery.start_soon(backend.aclose)
            await trio.testing.wait_all_tasks_blocked()
            assert not engine.closed
            engine.gate.set()
    assert engine.closed  # FakeEngine.close asserts its conversations were closed first
    assert [c.closed for c in engine.conversations] == [True]
    assert len(failures) == 1 and "closed" in str(failures[0])
    assert not backend._conversations


@needs_litert
async def test_a_second_round_on_a_busy_conversation_fails_at_once() -> None:
    backend, _ = fake_backend([[chunk("one"), chunk("two")]])
    try:
        conv = await backend.open([], [])
        with trio.fail_after(10):
            async with aclosing(conv.send_stream(user("first"))) as stream:
                await stream.__anext__()
                with pytest.raises(LlmResponseError, match="already running"):
                    await collect(conv, user("second"))
                rest = [d async for d in stream]
        assert text_of(rest) == "two"
    finally:
        await backend.aclose()


# --- a real model --------------------------------------------------------------------------------


@needs_real
async def test_real_model_completes_a_few_shot_prompt() -> None:
    backend = LiteRtLlm(REAL, threads=2, max_output_tokens=8, temperature=0.0, top_k=1)
    try:
        with trio.fail_after(45):
            conv = await backend.open([
                UserItem(content=user("What is the capital of Germany?")),
                AssistantItem(content=user("Berlin")),
                UserItem(content=user("What is the capital of Italy?")),
                AssistantItem(content=user("Rome")),
            ], [])
            deltas = await collect(conv, user("What is the capital of France?"))
    finally:
        await backend.aclose()
    assert text_of(deltas).strip().startswith("Paris"), text_of(deltas)


# --- through the runtime -------------------------------------------------------------------------


async def take_until(
    it: AsyncIterator[CommonEvent], stop: Callable[[CommonEvent], bool], seconds: float = 30
) -> list[CommonEvent]:
    out: list[CommonEvent] = []
    with trio.fail_after(seconds):
        async for event in it:
            out.append(event)
            if stop(event):
                break
    return out


@needs_tiny
async def test_full_turn_through_open_runtime(tmp_path: Path) -> None:
    config = Config(llm_backend="litert", litert_model_path=str(TINY),
                    db_path=str(tmp_path / "agentik.db"), system_prompt="You are tiny.")
    async with agentik.open_runtime(config) as agent:
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        await conv.send("Hello, tiny model.")
        events = await take_until(agent.outbox.conversation_events(cursor, conv.id),
                                  lambda e: e.type in ("touched", "error"))
        assert [e.type for e in events] == ["user_message", "assistant_message", "touched"]
        answer = events[1].event.record.message  # type: ignore[union-attr]
        assert isinstance(answer, AssistantMessage)
        assert answer.content and isinstance(answer.content[0], Text) and answer.content[0].body
        assert answer.tokens is not None and answer.tokens.completion > 0
        messages = await conv.get_messages()
        assert [type(m.message) for m in messages] == [UserMessage, AssistantMessage]


EXIT_WITHOUT_ACLOSE = """
import sys, trio
from contextlib import aclosing
from agentik.llm.litert import LiteRtLlm
from agentik.wire import Text

async def main():
    llm = LiteRtLlm(sys.argv[1], max_output_tokens=4)
    conv = await llm.open([], [])
    async with aclosing(conv.send_stream([Text(body="hi")])) as stream:
        async for _ in stream:
            pass
    return llm, conv  # kept alive until exit, never closed

kept = trio.run(main)
print("ok")
"""


@needs_tiny
async def test_interpreter_exit_without_aclose_is_clean() -> None:
    """PITFALLS: an engine deleted before its conversations segfaults at exit; the module's
    atexit hook deletes them in the right order."""
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, "-c", EXIT_WITHOUT_ACLOSE, str(TINY)],
            capture_stdout=True, capture_stderr=True, check=False,
        )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    assert result.stdout.decode().strip() == "ok"
