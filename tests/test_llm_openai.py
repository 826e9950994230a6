"""OpenAiLlm (the real openai SDK) against the scripted OpenAI-compatible server."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Sequence
from contextlib import aclosing

import httpx2
import pytest
import trio

from agentik.config import Config
from agentik.errors import LlmAuthError, LlmConnectionError, LlmResponseError, LlmTimeoutError
from agentik.llm.base import (
    FinishDelta,
    LlmDelta,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageDelta,
)
from agentik.llm.openai import OpenAiConversation, OpenAiLlm, history_to_messages
from agentik.wire import (
    AssistantItem,
    Content,
    Image,
    SummaryItem,
    SystemItem,
    Text,
    ToolCallSpec,
    ToolItem,
    UserItem,
    WorkingItem,
)
from tests.scripted_openai import (
    Echo,
    Fail,
    Hang,
    Raw,
    Reply,
    ScriptedOpenAI,
    ToolCalls,
    open_scripted_openai,
    split_words,
)

ADD = ToolSpec(
    name="add",
    description="Add two numbers",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
)


def make_llm(server: ScriptedOpenAI, **kw: object) -> OpenAiLlm:
    options: dict[str, object] = {"max_retries": 0, "timeout": 10.0}
    options.update(kw)
    return OpenAiLlm(server.base_url, None, "test-model", **options)  # type: ignore[arg-type]


def user(text: str) -> list[Content]:
    return [Text(body=text)]


async def collect(conv: OpenAiConversation, content: Sequence[Content] | None) -> list[LlmDelta]:
    with trio.fail_after(10):
        async with aclosing(conv.send_stream(content)) as stream:
            return [delta async for delta in stream]


def text_of(deltas: list[LlmDelta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, TextDelta))


def assemble(deltas: list[LlmDelta]) -> dict[int, dict[str, str]]:
    calls: dict[int, dict[str, str]] = {}
    for d in deltas:
        if isinstance(d, ToolCallDelta):
            call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            if d.id is not None:
                call["id"] = d.id
            if d.name is not None:
                call["name"] = d.name
            call["arguments"] += d.arguments
    return calls


def free_port() -> int:
    """A port nothing listens on (bound, never listened, closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- streaming -----------------------------------------------------------------------------------


async def test_rounds_reuse_one_connection() -> None:
    """A round read to its [DONE] leaves the body read to its end, so its connection goes back
    to the pool: sequential rounds (and conversations) use one TCP connection (issue 13: a
    response closed unread closed its connection, and every round connected anew)."""
    async with open_scripted_openai() as server:
        server.push(Reply("one two"), Reply("three"), Reply("four"))
        llm = make_llm(server)
        try:
            conv = await llm.open([], [])
            assert text_of(await collect(conv, user("a"))) == "one two"
            assert text_of(await collect(conv, user("b"))) == "three"
            other = await llm.open([], [])
            assert text_of(await collect(other, user("c"))) == "four"
        finally:
            await llm.aclose()
    assert len(server.peers) == 3
    assert len(set(server.peers)) == 1, server.peers


async def test_plain_text_stream() -> None:
    async with open_scripted_openai() as server:
        server.push(Reply("Hello big wide world", usage=(12, 4)))
        llm = make_llm(server)
        try:
            conv = await llm.open([SystemItem(text="Be brief.")], [])
            deltas = await collect(conv, user("hi"))
        finally:
            await llm.aclose()

    texts = [d for d in deltas if isinstance(d, TextDelta)]
    assert [t.text for t in texts] == ["Hello ", "big ", "wide ", "world"]
    assert text_of(deltas) == "Hello big wide world"
    assert UsageDelta(prompt_tokens=12, completion_tokens=4) in deltas
    assert FinishDelta("stop") in deltas
    assert not any(isinstance(d, ToolCallDelta | ReasoningDelta) for d in deltas)

    body = server.requests[0]
    assert body["model"] == "test-model"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "tools" not in body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert conv.messages[-1] == {"role": "assistant", "content": "Hello big wide world"}


async def test_second_round_carries_history_and_echo_default() -> None:
    async with open_scripted_openai() as server:
        llm = make_llm(server)
        try:
            conv = await llm.open([], [])
            first = await collect(conv, user("one"))
            second = await collect(conv, user("two"))
        finally:
            await llm.aclose()
    assert text_of(first) == "echo: one"
    assert text_of(second) == "echo: two"
    assert server.requests[1]["messages"] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "echo: one"},
        {"role": "user", "content": "two"},
    ]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_deltas(field: str) -> None:
    async with open_scripted_openai() as server:
        server.push(Reply("42", reasoning="Let me think.", reasoning_field=field))
        llm = make_llm(server)
        try:
            conv = await llm.open([], [])
            deltas = await collect(conv, user("question"))
        finally:
            await llm.aclose()
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    assert reasoning == "Let me think."
    assert text_of(deltas) == "42"
    first_text = next(i for i, d in enumerate(deltas) if isinstance(d, TextDelta))
    last_reasoning = max(i for i, d in enumerate(deltas) if isinstance(d, ReasoningDelta))
    assert last_reasoning < first_text
    # reasoning is not sent back to the model
    assert conv.messages[-1] == {"role": "assistant", "content": "42"}


async def test_tool_call_round_then_continue() -> None:
    args = '{"a": 2, "b": 3}'
    async with open_scripted_openai() as server:
        server.push(
            ToolCalls([("call_add_1", "add", args)], text_before="Let me add."),
            Reply("It is 5."),
        )
        llm = make_llm(server)
        try:
            conv = await llm.open([SystemItem(text="sys")], [ADD])
            first = await collect(conv, user("2+3?"))
            calls = assemble(first)
            assert calls == {0: {"id": "call_add_1", "name": "add", "arguments": args}}
            # the name and id arrive once; argument fragments follow with neither
            fragments = [d for d in first if isinstance(d, ToolCallDelta)]
            assert len(fragments) > 2
            assert fragments[0].id == "call_add_1" and fragments[0].name == "add"
            assert all(f.id is None and f.name is None for f in fragments[1:])
            assert text_of(first) == "Let me add."
            assert FinishDelta("tool_calls") in first

            conv.add_tool_result("call_add_1", "add", "5")
            second = await collect(conv, None)
        finally:
            await llm.aclose()

    assert text_of(second) == "It is 5."
    assert server.requests[0]["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers",
                "parameters": ADD.parameters,
            },
        }
    ]
    messages = server.requests[1]["messages"]
    assert messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [
                {
                    "id": "call_add_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": args},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_add_1", "content": "5"},
    ]
    assert server.requests[1]["tools"] == server.requests[0]["tools"]
    assert conv.messages[-1] == {"role": "assistant", "content": "It is 5."}


async def test_parallel_tool_calls_assembled_by_index() -> None:
    specs = [
        ("call_a", "add", '{"a": 1, "b": 2}'),
        ("call_b", "mul", '{"x": 3, "y": 4}'),
        ("call_c", "now", "{}"),
    ]
    async with open_scripted_openai() as server:
        server.push(ToolCalls(specs))
        llm = make_llm(server)
        try:
            conv = await llm.open([], [ADD])
            deltas = await collect(conv, user("go"))
        finally:
            await llm.aclose()
    assert assemble(deltas) == {
        i: {"id": cid, "name": name, "arguments": args} for i, (cid, name, args) in enumerate(specs)
    }
    assert text_of(deltas) == ""
    tool_calls = conv.messages[-1]["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in tool_calls] == [
        (cid, name, args) for cid, name, args in specs
    ]
    assert conv.messages[-1]["content"] == ""


async def test_unanswered_calls_are_not_sent_on_the_next_round() -> None:
    async with open_scripted_openai() as server:
        server.push(ToolCalls([("c1", "add", "{}"), ("c2", "add", "{}")]), Reply("ok"))
        llm = make_llm(server)
        try:
            conv = await llm.open([], [ADD])
            await collect(conv, user("go"))
            conv.add_tool_result("c1", "add", "1")  # c2 never answered
            conv.add_tool_result("zzz", "add", "stray")  # answers nothing
            await collect(conv, None)
        finally:
            await llm.aclose()
    messages = server.requests[1]["messages"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1"]
    assert messages[2:] == [{"role": "tool", "tool_call_id": "c1", "content": "1"}]


def _chunk(delta: dict[str, object], finish: str | None = None) -> str:
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


async def test_llama_cpp_style_repeated_ids_and_missing_ids() -> None:
    """Servers that repeat id/name in every delta (assigned, never appended), or send none."""

    def call(index: int, call_id: str | None, name: str, arguments: str) -> str:
        fragment: dict[str, object] = {
            "index": index,
            "function": {"name": name, "arguments": arguments},
        }
        if call_id is not None:
            fragment["id"] = call_id
        return _chunk({"tool_calls": [fragment]})

    async with open_scripted_openai() as server:
        server.push(
            Raw(
                [
                    _chunk({"role": "assistant", "content": None}),
                    call(0, "c1", "add", '{"a"'),
                    call(0, "c1", "add", ": 1}"),
                    call(1, None, "now", "{}"),
                    _chunk({}, "tool_calls"),
                    "[DONE]",
                ]
            )
        )
        llm = make_llm(server)
        try:
            conv = await llm.open([], [ADD])
            deltas = await collect(conv, user("go"))
        finally:
            await llm.aclose()
    assert assemble(deltas) == {
        0: {"id": "c1", "name": "add", "arguments": '{"a": 1}'},
        1: {"id": "call_1", "name": "now", "arguments": "{}"},
    }
    assert deltas[-1] == FinishDelta("tool_calls")
    assert [c["id"] for c in conv.messages[-1]["tool_calls"]] == ["c1", "call_1"]
    assert not any(isinstance(d, UsageDelta) for d in deltas)


async def test_stream_without_finish_reason_ends_with_none() -> None:
    async with open_scripted_openai() as server:
        server.push(Raw([_chunk({"content": "cut"}), "[DONE]"]))
        llm = make_llm(server)
        try:
            conv = await llm.open([], [])
            deltas = await collect(conv, user("go"))
        finally:
            await llm.aclose()
    assert deltas == [TextDelta("cut"), FinishDelta(None)]


# --- errors --------------------------------------------------------------------------------------


async def test_http_500_is_response_error() -> None:
    async with open_scripted_openai() as server:
        server.push(Fail(500, "the model fell over"))
        llm = make_llm(server, max_retries=0)
        try:
            conv = await llm.open([], [])
            with pytest.raises(LlmResponseError) as info:
                await collect(conv, user("hi"))
        finally:
            await llm.aclose()
    assert "500" in str(info.value)
    assert "the model fell over" in str(info.value)
    assert len(server.requests) == 1


async def test_http_500_is_retried() -> None:
    async with open_scripted_openai() as server:
        server.push(Fail(503, "busy"), Reply("fine"))
        llm = make_llm(server, max_retries=1)
        try:
            conv = await llm.open([], [])
            deltas = await collect(conv, user("hi"))
        finally:
            await llm.aclose()
    assert text_of(deltas) == "fine"
    assert len(server.requests) == 2


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_errors(status: int) -> None:
    async with open_scripted_openai() as server:
        server.push(Fail(status, "Incorrect API key provided"))
        llm = make_llm(server, max_retries=2)
        try:
            conv = await llm.open([], [])
            with pytest.raises(LlmAuthError) as info:
                await collect(conv, user("hi"))
        finally:
            await llm.aclose()
    assert str(status) in str(info.value)
    assert "Incorrect API key provided" in str(info.value)
    assert len(server.requests) == 1  # not retried


async def test_http_400_is_response_error() -> None:
    async with open_scripted_openai() as server:
        server.push(Fail(400, "messages: bad shape"))
        llm = make_llm(server)
        try:
            conv = await llm.open([], [])
            with pytest.raises(LlmResponseError, match=r"400.*messages: bad shape"):
                await collect(conv, user("hi"))
        finally:
            await llm.aclose()


async def test_connection_refused() -> None:
    llm = OpenAiLlm(f"http://127.0.0.1:{free_port()}/v1", None, "m", max_retries=0)
    try:
        conv = await llm.open([], [])
        with pytest.raises(LlmConnectionError) as info:
            await collect(conv, user("hi"))
    finally:
        await llm.aclose()
    assert "127.0.0.1" in str(info.value)


async def test_error_event_in_stream_is_response_error() -> None:
    async with open_scripted_openai() as server:
        server.push(Raw([json.dumps({"error": {"message": "overloaded", "type": "server"}})]))
        llm = make_llm(server)
        try:
            conv = await llm.open([], [])
            with pytest.raises(LlmResponseError, match="overloaded"):
                await collect(conv, user("hi"))
        finally:
            await llm.aclose()


async def test_malformed_stream_is_response_error() -> None:
    async with open_scripted_openai() as server:
        server.push(Raw(["{this is not json", "[DONE]"]))
        llm = make_llm(server)
        try:
            conv = await llm.open([], [])
            with pytest.raises(LlmResponseError, match="malformed"):
                await collect(conv, user("hi"))
        finally:
            await llm.aclose()


# --- hangs, cancellation, timeouts ---------------------------------------------------------------


async def test_hang_cancelled_by_trio_scope_returns_promptly() -> None:
    async with open_scripted_openai() as server:
        server.push(Hang(text_before="partial"), Reply("after"))
        llm = make_llm(server, timeout=60.0)
        try:
            conv = await llm.open([], [])
            seen: list[LlmDelta] = []
            with trio.fail_after(5):
                with trio.CancelScope() as scope:
                    async with aclosing(conv.send_stream(user("hi"))) as stream:
                        async for delta in stream:
                            seen.append(delta)
                            if isinstance(delta, TextDelta):
                                scope.cancel()
                assert scope.cancelled_caught
                # the server sees the disconnect and ends its stream
                await server.wait_idle()
            assert text_of(seen) == "partial"
            # the failed round is not recorded
            assert conv.messages[-1] == {"role": "user", "content": "hi"}
            await conv.close()
            await conv.close()

            # the client (and its pool) is still usable
            conv2 = await llm.open([], [])
            assert text_of(await collect(conv2, user("again"))) == "after"
        finally:
            await llm.aclose()


async def test_gate_holds_the_stream_until_set() -> None:
    async with open_scripted_openai() as server:
        gate = trio.Event()
        server.push(Reply(["first", " second", " third"], gate=gate))
        llm = make_llm(server)
        try:
            conv = await llm.open([], [])
            texts: list[str] = []
            with trio.fail_after(5):
                async with aclosing(conv.send_stream(user("hi"))) as stream:
                    async for delta in stream:
                        if isinstance(delta, TextDelta):
                            texts.append(delta.text)
                            if len(texts) == 1:
                                assert server.active_streams == 1
                                gate.set()
        finally:
            await llm.aclose()
    assert texts == ["first", " second", " third"]


async def test_early_exit_closes_the_stream() -> None:
    async with open_scripted_openai() as server:
        server.push(Reply(["a", "b"], gate=trio.Event()))
        llm = make_llm(server)
        try:
            conv = await llm.open([], [])
            with trio.fail_after(5):
                async with aclosing(conv.send_stream(user("hi"))) as stream:
                    async for delta in stream:
                        if isinstance(delta, TextDelta):
                            break
                await server.wait_idle()
        finally:
            await llm.aclose()


@pytest.mark.parametrize("text_before", ["", "some text"])
async def test_read_timeout_mid_stream(text_before: str) -> None:
    async with open_scripted_openai() as server:
        server.push(Hang(text_before=text_before))
        llm = make_llm(server, timeout=0.5, max_retries=0)
        try:
            conv = await llm.open([], [])
            start = trio.current_time()
            with pytest.raises(LlmTimeoutError):
                await collect(conv, user("hi"))
            assert trio.current_time() - start < 5
        finally:
            await llm.aclose()


async def test_server_exit_releases_a_hanging_stream() -> None:
    with trio.fail_after(10):
        async with open_scripted_openai() as server:
            server.push(Hang(text_before="x"))
            llm = make_llm(server, timeout=60.0)
            conv = await llm.open([], [])
            got_text = trio.Event()
            result: list[LlmDelta] = []

            async def consume() -> None:
                async with aclosing(conv.send_stream(user("hi"))) as stream:
                    async for delta in stream:
                        result.append(delta)
                        got_text.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume)
                await got_text.wait()
                nursery.cancel_scope.cancel()
            await llm.aclose()
    assert text_of(result) == "x"


async def test_server_exit_while_client_still_hangs() -> None:
    """Exiting the server context with a Hang in progress returns; the client stream ends."""
    llm: OpenAiLlm | None = None
    result: list[LlmDelta] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async with open_scripted_openai() as server:
                server.push(Hang(text_before="x"))
                llm = make_llm(server, timeout=60.0)
                conv = await llm.open([], [])
                got_text = trio.Event()

                async def consume() -> None:
                    try:
                        async with aclosing(conv.send_stream(user("hi"))) as stream:
                            async for delta in stream:
                                result.append(delta)
                                got_text.set()
                    except LlmConnectionError:
                        pass

                nursery.start_soon(consume)
                await got_text.wait()
            # server gone; the consumer finishes on its own
        assert llm is not None
        await llm.aclose()
    assert text_of(result) == "x"


# --- history conversion --------------------------------------------------------------------------


PNG = "iVBORw0KGgo="


def rich_history() -> list[WorkingItem]:
    return [
        SystemItem(text="sys"),
        SummaryItem(text="we talked about cats"),
        UserItem(content=[Text(body="look"), Image(data=PNG, mime="image/png")]),
        AssistantItem(
            content=[], tool_calls=[ToolCallSpec(call_id="t1", name="add", arguments="{}")]
        ),
        ToolItem(call_id="t1", name="add", content="2"),
        AssistantItem(
            content=[Text(body="calling")],
            tool_calls=[
                ToolCallSpec(call_id="t2", name="add", arguments='{"a":1}'),
                ToolCallSpec(call_id="t3", name="add", arguments='{"a":2}'),
            ],
        ),
        ToolItem(call_id="t2", name="add", content="3"),
        ToolItem(call_id="nope", name="add", content="stray"),
        AssistantItem(content=[Text(body="done")]),
        AssistantItem(
            content=[], tool_calls=[ToolCallSpec(call_id="t9", name="x", arguments="{}")]
        ),
    ]


async def test_history_conversion_end_to_end() -> None:
    async with open_scripted_openai() as server:
        llm = make_llm(server)
        try:
            conv = await llm.open(rich_history(), [])
            await collect(conv, [Text(body="and this"), Image(data="QUJD", mime="image/jpeg")])
        finally:
            await llm.aclose()
    assert server.requests[0]["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "system", "content": "Summary of earlier conversation: we talked about cats"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "2"},
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [
                {
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a":1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t2", "content": "3"},
        {"role": "assistant", "content": "done"},
        # the trailing unanswered call (and its then-empty assistant message) is gone
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and this"},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}},
            ],
        },
    ]


async def test_images_dropped_without_support(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="agentik.llm.openai")
    async with open_scripted_openai() as server:
        llm = make_llm(server, supports_images=False)
        assert llm.supports_images is False
        try:
            conv = await llm.open(rich_history()[:3], [])
            await collect(conv, [Image(data="QUJD"), Text(body="what is it?")])
        finally:
            await llm.aclose()
    messages = server.requests[0]["messages"]
    assert messages[2] == {"role": "user", "content": "look"}
    assert messages[-1] == {"role": "user", "content": "what is it?"}
    assert "image" in caplog.text


def test_history_to_messages_pure() -> None:
    history: list[WorkingItem] = [
        UserItem(content=[Text(body="a"), Text(body="b")]),
        ToolItem(call_id="orphan", name="x", content="?"),
        AssistantItem(content=[Text(body="hi")]),
    ]
    assert history_to_messages(history) == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        },
        {"role": "assistant", "content": "hi"},
    ]
    assert history_to_messages([UserItem(content=[])]) == [{"role": "user", "content": ""}]


# --- lifecycle -----------------------------------------------------------------------------------


async def test_aclose_closes_the_client() -> None:
    async with open_scripted_openai() as server:
        llm = make_llm(server)
        conv = await llm.open([], [])
        await collect(conv, user("hi"))
        assert not llm.client.is_closed()
        await llm.aclose()
        assert llm.client.is_closed()
        await llm.aclose()  # idempotent
        with pytest.raises(LlmConnectionError):
            await llm.open([], [])
        with pytest.raises(LlmConnectionError):
            await collect(conv, user("again"))


async def test_from_config() -> None:
    cfg = Config(
        openai_base_url="http://example.invalid/v1",
        openai_api_key=None,
        openai_model="m1",
        llm_timeout=7.0,
        llm_max_retries=1,
        context_window=0,
    )
    llm = OpenAiLlm.from_config(cfg)
    sized = OpenAiLlm.from_config(cfg.replace(context_window=8192, openai_api_key="sk-x"))
    try:
        assert llm.model == "m1"
        assert llm.context_window is None
        assert llm.max_retries == 1 and llm.client.max_retries == 0  # the retries are ours
        assert llm.client.api_key == "none"
        assert str(llm.client.base_url).startswith("http://example.invalid/v1")
        assert sized.context_window == 8192
        assert sized.client.api_key == "sk-x"
    finally:
        await llm.aclose()
        await sized.aclose()


# --- the scripted server itself ------------------------------------------------------------------


def test_split_words() -> None:
    assert split_words("Hello big  world ") == ["Hello ", "big  ", "world "]
    assert split_words("") == []


async def test_scripted_non_stream_and_callable_default() -> None:
    async with open_scripted_openai() as server:
        server.callable_default = lambda body: Reply(f"n={len(body['messages'])}")
        server.push(Echo(prefix="> "))
        async with httpx2.AsyncClient(timeout=5) as client:
            url = server.base_url + "/chat/completions"
            body = {"model": "m", "messages": [{"role": "user", "content": "yo"}]}
            first = (await client.post(url, json=body)).json()
            second = (await client.post(url, json=body)).json()
            failed = None
            server.push(Fail(429, "slow down"))
            failed = await client.post(url, json=body)
    assert first["object"] == "chat.completion"
    assert first["choices"][0]["message"]["content"] == "> yo"
    assert second["choices"][0]["message"]["content"] == "n=1"
    assert failed.status_code == 429
    assert failed.json()["error"]["message"] == "slow down"
    assert len(server.requests) == 3
