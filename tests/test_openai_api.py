"""The OpenAI-compatible front door (docs/OPENAI.md) through the official ``openai`` SDK, sync and
async, against the real server (hypercorn, trio worker) and the scripted model: models, chat
completions with and without streaming, a tool-using agent, a conversation continued by id,
temporary and stored conversations, and bad requests answered in OpenAI's error shape."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
import pytest
import trio

from agentik.tools.base import FunctionTools
from agentik.wire import Cursor, Deleted
from tests.scripted_openai import Fail, Hang, Reply, ScriptedOpenAI, ToolCalls, open_scripted_openai
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    allow_error_logs,
    make_config,
    no_error_logs,
    serve_app,
)

pytestmark = pytest.mark.usefixtures("engine")


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedOpenAI]:
    async with open_scripted_openai() as model:
        yield model

CID = "X-Agentik-Conversation-Id"


@pytest.fixture
async def server(tmp_path: Any, scripted: ScriptedOpenAI) -> AsyncIterator[Server]:
    async with serve_app(make_config(tmp_path, scripted)) as served:
        yield served


def aclient(server: Server, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=kw.pop("api_key", "unused"),
                              max_retries=0, timeout=20, **kw)


def sclient(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=20)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


async def all_deleted(server: Server, after: Cursor, n: int) -> None:
    """Once ``n`` conversations were deleted after ``after`` (a temporary one is deleted by its
    follower once its turn is over, which may be a moment after the answer went out)."""
    async for event in server.agent.outbox.agent_events(after):
        if isinstance(event.event, Deleted):
            n -= 1
            if n == 0:
                break
    assert await conversations(server) == []


async def conversations(server: Server) -> list[str]:
    snapshot = await server.agent.conversations_snapshot()
    return [c.id for c in snapshot.conversations]


# --- models --------------------------------------------------------------------------------------


async def test_models_list_async_and_sync(server: Server) -> None:
    with trio.fail_after(20):
        models = await aclient(server).models.list()
        assert [m.id for m in models.data] == ["default"]
        assert models.data[0].object == "model"
        assert (await aclient(server).models.retrieve("default")).id == "default"
        listed = await trio.to_thread.run_sync(lambda: sclient(server).models.list())
        assert [m.id for m in listed.data] == ["default"]
        with pytest.raises(openai.NotFoundError) as info:
            await aclient(server).models.retrieve("nobody")
        assert info.value.code == "model_not_found"


# --- chat completions ----------------------------------------------------------------------------


async def test_create_without_streaming_async_and_sync(server: Server,
                                                        scripted: ScriptedOpenAI) -> None:
    with trio.fail_after(20):
        cursor = await server.agent.outbox.current_cursor()
        scripted.push(Reply("Hello there"))
        answer = await aclient(server).chat.completions.create(
            model="default", messages=[user("hi")])
        assert answer.object == "chat.completion"
        assert answer.choices[0].message.content == "Hello there"
        assert answer.choices[0].finish_reason == "stop"
        assert answer.usage is not None and answer.usage.total_tokens == 15
        scripted.push(Reply("From a thread"))
        sync = await trio.to_thread.run_sync(lambda: sclient(server).chat.completions.create(
            model="default", messages=[user("hi")]))
        assert sync.choices[0].message.content == "From a thread"
        # no store: the temporary conversations are gone once answered
        await all_deleted(server, cursor, 2)


async def test_streaming_deltas_add_up_with_usage(server: Server,
                                                 scripted: ScriptedOpenAI) -> None:
    with trio.fail_after(20):
        scripted.push(Reply(["One ", "two ", "three."]))
        stream = await aclient(server).chat.completions.create(
            model="default", messages=[user("count")], stream=True,
            stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "One two three."
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == "stop" and finishes.count("stop") == 1
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.prompt_tokens == 10
        assert len({c.id for c in chunks}) == 1

        scripted.push(Reply("sync stream"))

        def sync_stream() -> str:
            out = sclient(server).chat.completions.create(
                model="default", messages=[user("x")], stream=True)
            return "".join(c.choices[0].delta.content or "" for c in out if c.choices)

        assert await trio.to_thread.run_sync(sync_stream) == "sync stream"


async def test_a_tool_using_agent_answers(tmp_path: Any, scripted: ScriptedOpenAI) -> None:
    tools = FunctionTools()
    tools.add(lambda a, b: a + b, name="add", description="add two numbers")
    async with serve_app(make_config(tmp_path, scripted), tools=tools) as server:
        with trio.fail_after(20):
            scripted.push(ToolCalls([("call_1", "add", '{"a": 2, "b": 3}')], text_before="Let me add. "),
                          Reply("It is 5."))
            answer = await aclient(server).chat.completions.create(
                model="default", messages=[user("2+3?")])
            assert answer.choices[0].message.content == "Let me add. It is 5."
            assert answer.choices[0].finish_reason == "stop"
            # the tool ran server-side: its result went to the model
            assert scripted.requests[-1]["messages"][-1]["content"] == "5"
            scripted.push(ToolCalls([("call_2", "add", '{"a": 1, "b": 1}')]), Reply("Two."))
            stream = await aclient(server).chat.completions.create(
                model="default", messages=[user("1+1?")], stream=True)
            chunks = [c async for c in stream]
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Two."
            assert all(not c.choices[0].delta.tool_calls for c in chunks)


async def test_a_conversation_continued_by_id_over_five_turns(server: Server) -> None:
    with trio.fail_after(30):
        client = aclient(server)
        raw = await client.chat.completions.with_raw_response.create(
            model="default", messages=[user("turn 1")], store=True)
        cid = raw.headers[CID]
        first = raw.parse().choices[0].message.content or ""
        history: list[dict[str, str]] = [user("turn 1"), assistant(first)]
        for n in range(2, 6):
            messages = [*history, user(f"turn {n}")]
            stream = n % 2 == 0
            if stream:
                chunks = await client.chat.completions.create(
                    model="default", messages=messages, stream=True,
                    extra_headers={CID: cid})
                text = "".join([c.choices[0].delta.content or "" async for c in chunks
                                if c.choices])
            else:
                answer = await client.chat.completions.create(
                    model="default", messages=messages, extra_headers={CID: cid})
                text = answer.choices[0].message.content or ""
            assert text == f"echo: turn {n}"
            history += [user(f"turn {n}"), assistant(text)]
        stored = await (await server.agent.get_conversation(cid)).get_messages()  # type: ignore[union-attr]
        assert [type(r.message).__name__ for r in stored] == ["UserMessage", "AssistantMessage"] * 5
        # only the new message, via metadata: the history need not be repeated
        answer = await client.chat.completions.create(
            model="default", messages=[user("turn 6")],
            metadata={"agentik_conversation_id": cid})
        assert answer.choices[0].message.content == "echo: turn 6"
        # system messages are not history: with only them before it, the message continues
        answer = await client.chat.completions.create(
            model="default", messages=[{"role": "system", "content": "Be kind."}, user("turn 7")],
            extra_headers={CID: cid})
        assert answer.choices[0].message.content == "echo: turn 7"
        # an edited history is a conflict, and nothing is stored
        with pytest.raises(openai.ConflictError) as info:
            await client.chat.completions.create(
                model="default", messages=[user("turn 1"), assistant("edited"), user("again")],
                extra_headers={CID: cid})
        assert info.value.status_code == 409
        assert len(await (await server.agent.get_conversation(cid)).get_messages()) == 14  # type: ignore[union-attr]
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="default", messages=[user("x")], extra_headers={CID: "nope"})


async def test_history_seeds_a_conversation_the_next_request_continues(
        server: Server, scripted: ScriptedOpenAI) -> None:
    with trio.fail_after(20):
        client = aclient(server)
        messages = [{"role": "system", "content": "Be brief."}, user("a"), assistant("b"),
                    user("c")]
        raw = await client.chat.completions.with_raw_response.create(
            model="default", messages=messages, store=True)
        cid = raw.headers[CID]
        sent = scripted.requests[-1]["messages"][-1]["content"]
        text = sent if isinstance(sent, str) else "".join(p["text"] for p in sent)
        assert "Be brief." in text and text.endswith("c")
        answer = raw.parse().choices[0].message.content or ""
        again = await client.chat.completions.create(
            model="default", messages=[*messages, assistant(answer), user("d")],
            extra_headers={CID: cid})
        assert again.choices[0].message.content == "echo: d"


# --- failures and bad requests -------------------------------------------------------------------


async def post(server: Server, body: Any, **kw: Any) -> httpx2.Response:
    async with httpx2.AsyncClient(base_url=server.url, timeout=10) as http:
        if isinstance(body, bytes):
            return await http.post("/v1/chat/completions", content=body,
                                   headers={"Content-Type": "application/json"}, **kw)
        return await http.post("/v1/chat/completions", json=body, **kw)


def assert_openai_error(response: httpx2.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error  # type: ignore[no-any-return]


@pytest.mark.parametrize(("body", "status", "code", "param"), [
    ({"model": "ghost", "messages": [{"role": "user", "content": "x"}]}, 404,
     "model_not_found", None),
    ({"model": "default", "messages": [{"role": "robot", "content": "x"}]}, 400,
     "invalid_input", None),
    ({"model": "default", "messages": [{"role": "assistant", "content": "x"}]}, 400,
     "invalid_input", None),
    ({"model": "default", "messages": []}, 400, "invalid_input", None),
    ({"model": "default", "messages": "hi"}, 400, "invalid_input", None),
    ({"model": "default"}, 400, "invalid_input", None),
    ({"model": "default", "messages": [{"role": "user", "content": [{"type": "audio"}]}]},
     400, "invalid_input", None),
    ({"model": "default", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]},
     400, "invalid_input", None),
    ({"model": "default", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/bmp;base64,AAAA"}}]}]},
     400, "invalid_input", None),
    ({"model": "default", "n": 2, "messages": [{"role": "user", "content": "x"}]}, 400,
     "unsupported_parameter", "n"),
    ({"model": "default", "tools": [{"type": "retrieval"}],
      "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_input", None),
    ({"model": "default", "tools": [{"type": "function", "function": {"name": "a b"}}],
      "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_input", None),
    ({"model": "default", "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": "required", "messages": [{"role": "user", "content": "x"}]}, 400,
     "unsupported_parameter", "tool_choice"),
    ({"model": "default", "functions": [{"name": "f"}],
      "messages": [{"role": "user", "content": "x"}]}, 400, "unsupported_parameter", "functions"),
    ({"model": "default", "logprobs": True, "messages": [{"role": "user", "content": "x"}]},
     400, "unsupported_parameter", "logprobs"),
    ({"model": "default", "messages": [{"role": "user", "content": "x"},
                                       {"role": "tool", "content": "r", "tool_call_id": "c"}]},
     400, "invalid_input", None),  # results naming no conversation
    ({"model": "default", "messages": [{"role": "user", "content": "x"},
                                       {"role": "tool", "content": "r"}]},
     400, "invalid_input", None),
    (b"{not json", 400, "invalid_input", None),
    (b"", 400, "invalid_input", None),
])
async def test_bad_requests_get_openai_shaped_4xx(
        server: Server, body: Any, status: int, code: str, param: str | None) -> None:
    with trio.fail_after(20):
        error = assert_openai_error(await post(server, body), status, code)
        assert error["param"] == param
        assert error["type"] == "invalid_request_error"
        assert await conversations(server) == []  # nothing stored


async def test_sdk_raises_the_right_errors(server: Server) -> None:
    with trio.fail_after(20):
        client = aclient(server)
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model="default", messages=[user("x")], n=3)
        assert bad.value.code == "unsupported_parameter" and bad.value.param == "n"
        with pytest.raises(openai.BadRequestError) as tools:
            await client.chat.completions.create(
                model="default", messages=[user("x")],
                tools=[{"type": "function", "function": {"name": "f g", "parameters": {}}}])
        assert "tools[0].function.name" in tools.value.message
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=[user("x")])


async def test_unknown_v1_path_and_auth_are_openai_shaped(
        tmp_path: Any, scripted: ScriptedOpenAI) -> None:
    async with serve_app(make_config(tmp_path, scripted, tokens=("secret-token",))) as server:
        with trio.fail_after(20):
            with pytest.raises(openai.AuthenticationError) as info:
                await aclient(server, api_key="wrong").models.list()
            assert info.value.status_code == 401
            assert_openai_error(await post(server, {"model": "default"}), 401, "unauthorized")
            models = await aclient(server, api_key="secret-token").models.list()
            assert [m.id for m in models.data] == ["default"]
            async with httpx2.AsyncClient(base_url=server.url) as http:
                missing = await http.get("/v1/nothing",
                                         headers={"Authorization": "Bearer secret-token"})
            assert_openai_error(missing, 404)


async def test_a_failed_turn_is_an_openai_error(server: Server, scripted: ScriptedOpenAI,
                                                allow_error_logs: None) -> None:
    with trio.fail_after(20):
        cursor = await server.agent.outbox.current_cursor()
        scripted.push(Fail(status=401, message="bad key"))
        with pytest.raises(openai.APIStatusError) as info:
            await aclient(server).chat.completions.create(model="default", messages=[user("x")])
        assert info.value.status_code == 502
        assert "bad key" in info.value.message
        scripted.push(Fail(status=401, message="bad key again"))
        stream = await aclient(server).chat.completions.create(
            model="default", messages=[user("x")], stream=True)
        with pytest.raises(openai.APIError) as streamed:
            async for _ in stream:
                pass
        assert "bad key again" in streamed.value.message
        await all_deleted(server, cursor, 2)


async def test_a_client_gone_mid_stream_releases_the_turn(
        server: Server, scripted: ScriptedOpenAI) -> None:
    with trio.fail_after(20):
        scripted.push(Hang(text_before="partial "))
        mount = server.app.agentik_openai  # type: ignore[attr-defined]
        cursor = await server.agent.outbox.current_cursor()
        stream = await aclient(server).chat.completions.create(
            model="default", messages=[user("x")], stream=True)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        await stream.close()
        await mount.wait_open_streams(0)
        # the temporary conversation is deleted, which ends its turn
        await all_deleted(server, cursor, 1)


async def test_open_webui_chat_id_keys_one_conversation(server: Server,
                                                        scripted: ScriptedOpenAI) -> None:
    with trio.fail_after(30):
        client = aclient(server)
        chat = {"X-OpenWebUI-Chat-Id": "chat-42"}
        system = {"role": "system", "content": "You are terse."}
        first = await client.chat.completions.create(
            model="default", messages=[system, user("hello")], extra_headers=chat)
        sent = scripted.requests[-1]["messages"][-1]["content"]
        assert "You are terse." in (sent if isinstance(sent, str) else str(sent))
        text = first.choices[0].message.content or ""
        second = await client.chat.completions.create(
            model="default", messages=[system, user("hello"), assistant(text), user("more")],
            extra_headers=chat)
        assert second.choices[0].message.content == "echo: more"
        [cid] = await conversations(server)
        record = (await server.agent.get_conversation(cid)).record  # type: ignore[union-attr]
        assert record.title == "Open WebUI chat chat-42"
        # a regenerated answer (the history stops before it): a new version of it (issue 32),
        # the current branch ends there
        await client.chat.completions.create(
            model="default", messages=[system, user("hello")], extra_headers=chat)
        listing = await (await server.agent.get_conversation(cid)).get_messages()  # type: ignore[union-attr]
        assert len(listing) == 2 and (listing[1].siblings, listing[1].sibling_index) == (2, 1)
