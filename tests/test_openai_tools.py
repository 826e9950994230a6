"""Issue 31's client-side tools on /v1/chat/completions (docs/OPENAI.md), through the official
``openai`` SDK (sync and async) against the real server and the scripted model: the model's call
of a tool the request declares comes back as ``tool_calls`` (``finish_reason: "tool_calls"``),
its turn paused on it; the next request's ``tool`` messages answer it and the turn goes on, with
and without streaming, in a temporary conversation (the calls' ids name it) or one the caller
names; the agent's own (server-side) tools run as before in the same turn; the answers' errors
(results already given 409, an unknown call 404, a result missing 400); and the same pause on
the native send (``context.tools``)."""


from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest
import trio

from agentik.tools.base import FunctionTools
from tests.scripted_openai import Reply, ScriptedOpenAI, ToolCalls
from tests.test_openai_api import CID, aclient, all_deleted, conversations, sclient, scripted, user
from tests.webutil import make_config, open_sse, serve_app

pytestmark = pytest.mark.usefixtures("engine")
__all__ = ["scripted"]  # a fixture

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def tool_results(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The (tool_call_id, content) of the tool results a model request carried."""
    return [(m["tool_call_id"], m["content"]) for m in body["messages"] if m["role"] == "tool"]


async def test_a_round_trip_with_the_sync_sdk_in_a_temporary_conversation(
        tmp_path: Any, scripted: ScriptedOpenAI) -> None:
    scripted.push(ToolCalls([("call_w", "get_weather", '{"city": "Paris"}')]),
                  Reply("It is sunny in Paris."))
    async with serve_app(make_config(tmp_path, scripted)) as server:
        after = await server.agent.outbox.current_cursor()

        def round_trip() -> tuple[Any, Any]:
            client = sclient(server)
            messages: list[Any] = [user("Weather in Paris?")]
            first = client.chat.completions.create(model="default", messages=messages,
                                                   tools=[WEATHER])
            call = first.choices[0].message.tool_calls[0]
            messages += [first.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 C"}]
            second = client.chat.completions.create(model="default", messages=messages,
                                                    tools=[WEATHER])
            return first, second

        with trio.fail_after(30):
            first, second = await trio.to_thread.run_sync(round_trip)
            assert first.choices[0].finish_reason == "tool_calls"
            (call,) = first.choices[0].message.tool_calls
            assert call.function.name == "get_weather"
            assert json.loads(call.function.arguments) == {"city": "Paris"}
            assert call.id.startswith("call_w@")  # names the temporary conversation
            assert [t["function"]["name"] for t in scripted.requests[0]["tools"]] == [
                "get_weather"]  # offered to the model
            assert second.choices[0].finish_reason == "stop"
            assert second.choices[0].message.content == "It is sunny in Paris."
            assert tool_results(scripted.requests[1]) == [("call_w", "sunny, 24 C")]
            await all_deleted(server, after, 1)  # the temporary conversation, once answered


async def test_streamed_with_a_named_conversation_and_a_server_side_tool_beside(
        tmp_path: Any, scripted: ScriptedOpenAI) -> None:
    tools = FunctionTools()
    tools.add(lambda a, b: a + b, name="add", description="add two numbers")
    async with serve_app(make_config(tmp_path, scripted), tools=tools) as server:
        client = aclient(server)
        with trio.fail_after(30):
            raw = await client.chat.completions.with_raw_response.create(
                model="default", messages=[user("hello")], store=True)
            cid = raw.headers[CID]
            scripted.push(ToolCalls([("c1", "add", '{"a": 2, "b": 3}'),
                                     ("c2", "get_weather", '{"city": "Oslo"}')]),
                          Reply(["The sum is 5 ", "and Oslo is rainy."]))
            head = {CID: cid}
            stream = await client.chat.completions.create(
                model="default", messages=[user("2+3, and Oslo?")], tools=[WEATHER],
                stream=True, stream_options={"include_usage": True}, extra_headers=head)
            chunks = [c async for c in stream]
            calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
            assert [(t.id, t.function.name) for t in calls] == [("c2", "get_weather")]
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
            assert chunks[-1].usage is not None
            stream = await client.chat.completions.create(
                model="default", tools=[WEATHER], stream=True, extra_headers=head,
                messages=[user("2+3, and Oslo?"),
                          {"role": "assistant", "tool_calls": [
                              {"id": "c2", "type": "function", "function": {
                                  "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                          {"role": "tool", "tool_call_id": "c2", "content": "rainy"}])
            chunks = [c async for c in stream]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text == "The sum is 5 and Oslo is rainy."
            assert chunks[-1].choices[0].finish_reason == "stop"
            # the agent's own tool ran server-side, the caller's result went to the model
            assert tool_results(scripted.requests[-1]) == [("c1", "5"), ("c2", "rainy")]
            # the next turn of the same conversation: the history check passes over tool turns
            scripted.push(Reply("Bye."))
            done = await client.chat.completions.create(
                model="default", extra_headers=head, messages=[
                    user("hello"), {"role": "assistant", "content": raw.parse().choices[0]
                                    .message.content},
                    user("2+3, and Oslo?"),
                    {"role": "assistant", "tool_calls": [{"id": "c2", "type": "function",
                                                          "function": {"name": "get_weather",
                                                                       "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "c2", "content": "rainy"},
                    {"role": "assistant", "content": text}, user("thanks")])
            assert done.choices[0].message.content == "Bye."
            assert await conversations(server) == [cid]


async def test_answers_already_given_unknown_or_missing_are_clear_errors(
        tmp_path: Any, scripted: ScriptedOpenAI) -> None:
    scripted.push(ToolCalls([("a1", "get_weather", '{"city": "A"}'),
                             ("a2", "get_weather", '{"city": "B"}')]),
                  Reply("Both known."))
    async with serve_app(make_config(tmp_path, scripted)) as server:
        client = aclient(server)
        with trio.fail_after(30):
            first = await client.chat.completions.create(
                model="default", messages=[user("A and B?")], tools=[WEATHER])
            ids = [c.id for c in first.choices[0].message.tool_calls]
            assert [i.split("@")[0] for i in ids] == ["a1", "a2"]
            base: list[Any] = [user("A and B?"),
                               first.choices[0].message.model_dump(exclude_none=True)]
            with pytest.raises(openai.BadRequestError) as missing:
                await client.chat.completions.create(model="default", tools=[WEATHER], messages=[
                    *base, {"role": "tool", "tool_call_id": ids[0], "content": "sun"}])
            assert "a2" in missing.value.message
            cid = ids[0].split("@")[1]
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(model="default", tools=[WEATHER], messages=[
                    *base, {"role": "tool", "tool_call_id": f"zz@{cid}", "content": "x"}])
            answers = [{"role": "tool", "tool_call_id": i, "content": f"r{n}"}
                       for n, i in enumerate(ids)]
            done = await client.chat.completions.create(
                model="default", tools=[WEATHER], messages=[*base, *answers])
            assert done.choices[0].message.content == "Both known."
            assert tool_results(scripted.requests[-1]) == [("a1", "r0"), ("a2", "r1")]
            with pytest.raises(openai.APIStatusError) as again:  # 409, or 404 once deleted
                await client.chat.completions.create(
                    model="default", tools=[WEATHER], messages=[*base, *answers])
            assert again.value.status_code in (404, 409)


async def test_the_native_send_takes_client_tools_in_its_context(
        tmp_path: Any, scripted: ScriptedOpenAI) -> None:
    """The same pause on /agentik: ``context.tools`` on a send, the call an ``input_requested``
    naming its tool, its result the answer of POST .../inputs/{call_id}; a message sent
    meanwhile does not answer it."""
    scripted.push(ToolCalls([("n1", "get_weather", '{"city": "Rome"}')]), Reply("Warm."))
    async with serve_app(make_config(tmp_path, scripted)) as server, \
            httpx2.AsyncClient(base_url=server.url, timeout=10) as http:
        with trio.fail_after(30):
            cid = (await http.post("/agentik/conversations")).json()["id"]
            base = f"/agentik/conversations/{cid}"
            cursor = (await http.get("/agentik/cursor")).json()["current"]
            async with open_sse(http, f"{base}/events", after=cursor) as stream:
                await http.post(f"{base}/messages", json={
                    "content": [{"type": "text", "body": "Rome?"}],
                    "context": {"tools": [WEATHER["function"]]}})
                asked = (await stream.until("input_requested"))[-1].json()
                request = asked["event"]["record"]["message"]
                assert request["tool"] == "get_weather" and request["call_id"] == "n1"
                scripted.push(Reply("later"))
                await http.post(f"{base}/messages",
                                json={"content": [{"type": "text", "body": "not a result"}]})
                answered = await http.post(f"{base}/inputs/n1", json={"text": "31 C"})
                assert answered.status_code == 200
                await stream.until("assistant_message")
            assert tool_results(scripted.requests[1]) == [("n1", "31 C")]


async def test_an_approval_and_a_question_are_asked_and_the_next_message_answers(
        tmp_path: Any, scripted: ScriptedOpenAI) -> None:
    """In a conversation the caller keeps, a turn that waits for a person ends the answer with
    what it asks; the caller's next message answers it (yes approves) and the turn goes on."""
    runs: list[str] = []
    tools = FunctionTools()
    tools.add(lambda path: runs.append(path) or f"deleted {path}", name="delete_file",
              parameters={"type": "object", "properties": {"path": {"type": "string"}}})
    config = make_config(tmp_path, scripted, approval=("delete_*",), ask_user=True)
    scripted.push(ToolCalls([("d1", "delete_file", '{"path": "a.txt"}')]), Reply("Deleted."),
                  ToolCalls([("q1", "ask_user", '{"question": "Which file?"}')]),
                  Reply(["Using ", "b.txt."]))
    async with serve_app(config, tools=tools) as server:
        client = aclient(server)
        with trio.fail_after(30):
            raw = await client.chat.completions.with_raw_response.create(
                model="default", messages=[user("delete a.txt")], store=True)
            head = {CID: raw.headers[CID]}
            asked = raw.parse().choices[0]
            assert asked.finish_reason == "stop" and runs == []
            assert asked.message.content == ('The tool delete_file is about to run with '
                                             '{"path": "a.txt"}. Reply yes to approve it, or '
                                             'no to refuse it (a reason may follow).')
            history: list[Any] = [user("delete a.txt"),
                                  {"role": "assistant", "content": asked.message.content}]
            done = await client.chat.completions.create(
                model="default", messages=[*history, user("yes")], extra_headers=head)
            assert done.choices[0].message.content == "Deleted." and runs == ["a.txt"]
            question = await client.chat.completions.create(
                model="default", messages=[user("clean up")], extra_headers=head)
            assert question.choices[0].message.content == "Which file?"
            stream = await client.chat.completions.create(
                model="default", messages=[user("b.txt")], extra_headers=head, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream
                            if c.choices])
            assert text == "Using b.txt."
            assert tool_results(scripted.requests[-1])[-1] == ("q1", "b.txt")
