"""/v1/responses and /v1/conversations (docs/OPENAI.md) through the official ``openai`` SDK against
the real server and the scripted model: create, chain, retrieve, input items, background streams
resumed with ``starting_after`` (live, and after a server restart), cancel, delete, and the
conversations over agentik's own."""



from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
import pytest
import trio

from agentik.config import Config
from agentik.wire import Deleted
from tests.scripted_openai import Hang, Reply, ScriptedOpenAI, open_scripted_openai
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    make_config,
    no_error_logs,
    serve_app,
)

pytestmark = pytest.mark.usefixtures("engine")


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedOpenAI]:
    async with open_scripted_openai() as model:
        yield model


@pytest.fixture
def config(tmp_path: Any, scripted: ScriptedOpenAI) -> Config:
    return make_config(tmp_path, scripted)


@pytest.fixture
async def server(config: Config) -> AsyncIterator[Server]:
    async with serve_app(config) as served:
        yield served


def client(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                              timeout=20)


def check_sequence(events: list[Any]) -> None:
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers)), numbers  # strictly increasing, so unique


def text_of(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


async def test_create_chain_retrieve_and_input_items(server: Server,
                                                     scripted: ScriptedOpenAI) -> None:
    with trio.fail_after(30):
        sdk = client(server)
        first = await sdk.responses.create(model="default", input="hello")
        assert first.status == "completed" and first.output_text == "echo: hello"
        second = await sdk.responses.create(model="default", input="again",
                                            previous_response_id=first.id)
        assert second.output_text == "echo: again"
        assert second.conversation is not None and first.conversation is not None
        assert second.conversation.id == first.conversation.id
        got = await sdk.responses.retrieve(second.id)
        assert got.status == "completed" and got.output_text == "echo: again"
        assert got.previous_response_id == first.id
        items = await sdk.responses.input_items.list(second.id)
        assert [i.content[0].text for i in items.data] == ["again"]  # type: ignore[union-attr]
        # the same conversation over agentik's own API
        stored = await server.agent.chat_snapshot(first.conversation.id)
        assert len(stored.messages) == 4
        # instructions reach the model with this turn's input, and are kept with the response
        told = await sdk.responses.create(model="default", input="bonjour",
                                          instructions="Answer in French.",
                                          previous_response_id=second.id,
                                          metadata={"ticket": "42"})
        sent = str(scripted.requests[-1]["messages"][-1]["content"])
        assert "Answer in French." in sent and "bonjour" in sent
        kept = await sdk.responses.retrieve(told.id)
        assert kept.instructions == "Answer in French." and kept.metadata == {"ticket": "42"}
        sync = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        answer = await trio.to_thread.run_sync(
            lambda: sync.responses.create(model="default", input=[
                {"role": "user", "content": [{"type": "input_text", "text": "in parts"}]}]))
        assert answer.output_text == "echo: in parts"


async def test_background_stream_resumed_after_a_restart(
        config: Config, scripted: ScriptedOpenAI) -> None:
    words = [f"w{i} " for i in range(12)]
    scripted.push(Reply(words, chunk_delay=0.02))
    async with serve_app(config) as server:
        with trio.fail_after(30):
            stream = await client(server).responses.create(
                model="default", input="go", background=True, stream=True)
            before: list[Any] = []
            async for event in stream:
                before.append(event)
                if event.type == "response.output_text.delta" and len(text_of(before)) > 5:
                    break
            await stream.close()
            rid = before[0].response.id
            # the turn goes on without a reader: background
            live = server.app.agentik_openai.require().live.get(rid)  # type: ignore[attr-defined]
            if live is not None:
                await live.ended()
            assert (await client(server).responses.retrieve(rid)).status == "completed"
    async with serve_app(config) as server:
        with trio.fail_after(30):
            last = before[-1].sequence_number
            resumed = await client(server).responses.retrieve(rid, stream=True,
                                                              starting_after=last)
            after = [event async for event in resumed]
    events = before + after
    check_sequence(events)
    assert text_of(events) == "".join(words)
    assert [e.type for e in after][-4:] == [
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [e.type for e in after].count("response.output_text.delta") == 1  # the rest, once
    assert after[-1].response.output_text == "".join(words)
    # resumed from the start: every event, the text whole
    async with serve_app(config) as server:
        with trio.fail_after(30):
            whole = [e async for e in await client(server).responses.retrieve(rid, stream=True)]
    check_sequence(whole)
    assert [e.sequence_number for e in whole][:4] == [0, 1, 2, 3]
    assert text_of(whole) == "".join(words)


async def test_resumed_while_it_runs(server: Server, scripted: ScriptedOpenAI) -> None:
    gate = trio.Event()
    scripted.push(Reply(["first ", "second ", "third"], gate=gate))
    with trio.fail_after(30):
        stream = await client(server).responses.create(
            model="default", input="go", background=True, stream=True)
        before: list[Any] = []
        async for event in stream:
            before.append(event)
            if event.type == "response.output_text.delta":
                break
        await stream.close()
        resumed = await client(server).responses.retrieve(
            before[0].response.id, stream=True, starting_after=before[-1].sequence_number)
        gate.set()
        after = [event async for event in resumed]
        events = before + after
        check_sequence(events)
        assert text_of(events) == "first second third"
        assert events[-1].type == "response.completed"


async def test_cancel_a_background_response(server: Server, scripted: ScriptedOpenAI) -> None:
    scripted.push(Hang(text_before="partial"))
    with trio.fail_after(30):
        sdk = client(server)
        stream = await sdk.responses.create(model="default", input="go", background=True,
                                            stream=True)
        events: list[Any] = []
        shown = trio.Event()
        async with trio.open_nursery() as nursery:
            async def read() -> None:
                async for event in stream:
                    events.append(event)
                    if text_of(events) == "partial":
                        shown.set()

            nursery.start_soon(read)
            await shown.wait()
            cancelled = await sdk.responses.cancel(events[0].response.id)
        assert cancelled.status == "cancelled"
        assert events[-1].type == "response.cancelled"
        check_sequence(events)
        with pytest.raises(openai.BadRequestError):  # only background ones
            done = await sdk.responses.create(model="default", input="x")
            await sdk.responses.cancel(done.id)


async def test_delete(server: Server) -> None:
    with trio.fail_after(30):
        sdk = client(server)
        alone = await sdk.responses.create(model="default", input="one")
        chained = await sdk.responses.create(model="default", input="two",
                                             previous_response_id=alone.id)
        with pytest.raises(openai.ConflictError):
            await sdk.responses.delete(chained.id)
        single = await sdk.responses.create(model="default", input="solo")
        await sdk.responses.delete(single.id)
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(single.id)


async def test_conversations_are_agentik_conversations(server: Server) -> None:
    with trio.fail_after(30):
        sdk = client(server)
        conv = await sdk.conversations.create(metadata={"title": "trip"})
        record = (await server.agent.get_conversation(conv.id)).record  # type: ignore[union-attr]
        assert record.title == "trip"
        for text in ("a", "b", "c"):
            await sdk.responses.create(model="default", input=text, conversation=conv.id)
        items = await sdk.conversations.items.list(conv.id, order="asc")
        assert [(i.role, i.content[0].text) for i in items.data] == [  # type: ignore[union-attr]
            ("user", "a"), ("assistant", "echo: a"), ("user", "b"), ("assistant", "echo: b"),
            ("user", "c"), ("assistant", "echo: c")]
        page = await sdk.conversations.items.list(conv.id, limit=2)
        assert page.has_more and [i.role for i in page.data] == ["assistant", "user"]
        updated = await sdk.conversations.update(conv.id, metadata={"title": "holiday"})
        assert updated.metadata == {"title": "holiday"}
        assert (await sdk.conversations.retrieve(conv.id)).metadata == {"title": "holiday"}
        assert (await sdk.conversations.delete(conv.id)).deleted
        with pytest.raises(openai.NotFoundError):
            await sdk.conversations.retrieve(conv.id)


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("post", "/v1/responses", {"model": "ghost", "input": "x"}, 404),
    ("post", "/v1/responses", {"model": "default"}, 400),
    ("post", "/v1/responses", {"model": "default", "input": "x", "tools": [{"type": "x"}]}, 400),
    ("post", "/v1/responses", {"model": "default", "input": "x", "background": True,
                               "store": False}, 400),
    ("post", "/v1/responses", {"model": "default", "input": "x", "conversation": "c",
                               "previous_response_id": "resp_a_b"}, 400),
    ("post", "/v1/responses", {"model": "default", "input": "x", "conversation": "nope"}, 404),
    ("post", "/v1/responses", {"model": "default", "input": [
        {"type": "function_call_output", "call_id": "c", "output": "1"}]}, 400),
    ("get", "/v1/responses/resp_nope_nope", None, 404),
    ("get", "/v1/responses/garbage", None, 404),
    ("post", "/v1/conversations", {"items": [{"type": "message"}]}, 400),
    ("post", "/v1/conversations", {"metadata": {"colour": "red"}}, 400),
    ("get", "/v1/conversations/nope", None, 404),
    ("get", "/v1/conversations/nope/items", None, 404),
])
async def test_bad_requests(server: Server, method: str, path: str, body: Any,
                            status: int) -> None:
    with trio.fail_after(20):
        async with httpx2.AsyncClient(base_url=server.url, timeout=10) as http:
            response = await http.request(method, path, json=body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["message"] and error["type"] and "code" in error


async def test_each_agent_is_a_model_for_responses(tmp_path: Any) -> None:
    from tests.test_agents import two_agents

    async with open_scripted_openai() as a, open_scripted_openai() as b:
        async with serve_app(two_agents(tmp_path, a, b)) as server:
            with trio.fail_after(30):
                sdk = client(server)
                a.push(Reply("from A"))
                answer = await sdk.responses.create(model="support", input="hi")
                assert answer.output_text == "from A" and not b.requests
                assert answer.conversation is not None
                with pytest.raises(openai.ConflictError) as info:
                    await sdk.responses.create(model="coder", input="hi",
                                               conversation=answer.conversation.id)
                assert "belongs to the model (agent) 'support'" in info.value.message
                with pytest.raises(openai.NotFoundError):
                    await sdk.responses.create(model="default", input="hi")


async def test_unstored_response_and_a_reader_gone(server: Server,
                                                   scripted: ScriptedOpenAI) -> None:
    with trio.fail_after(30):
        sdk = client(server)
        cursor = await server.agent.outbox.current_cursor()
        answer = await sdk.responses.create(model="default", input="forget me", store=False)
        assert answer.output_text == "echo: forget me" and answer.conversation is None
        async for event in server.agent.outbox.agent_events(cursor):
            if isinstance(event.event, Deleted):
                break  # its temporary conversation, once the turn was over
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(answer.id)
        # a reader that goes away mid-stream releases its stream; the response goes on
        gate = trio.Event()
        scripted.push(Reply(["one ", "two"], gate=gate))
        mount = server.app.agentik_openai  # type: ignore[attr-defined]
        stream = await sdk.responses.create(model="default", input="go", stream=True)
        first = [e async for e in _until_delta(stream)]
        await stream.close()
        await mount.wait_open_streams(0)
        live = mount.require().live[first[0].response.id]  # held by the gate until now
        gate.set()
        await live.ended()
        done = await sdk.responses.retrieve(first[0].response.id)
        assert done.status == "completed" and done.output_text == "one two"


async def _until_delta(stream: Any) -> AsyncIterator[Any]:
    async for event in stream:
        yield event
        if event.type == "response.output_text.delta":
            return


async def test_resumed_on_another_node(tmp_path: Any, pg_url: str,
                                       scripted: ScriptedOpenAI) -> None:
    """Two nodes on one PostgreSQL: a response streaming on node A, cut, resumed on node B
    while it still runs there: B follows it in storage and gives the rest as one delta."""
    gate = trio.Event()
    scripted.push(Reply(["alpha ", "beta ", "gamma"], gate=gate))
    node_a = make_config(tmp_path / "a", scripted, database_url=pg_url, node_id="node-a")
    node_b = make_config(tmp_path / "b", scripted, database_url=pg_url, node_id="node-b")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with serve_app(node_a) as a, serve_app(node_b) as b:
        with trio.fail_after(30):
            stream = await client(a).responses.create(
                model="default", input="go", background=True, stream=True)
            before = [e async for e in _until_delta(stream)]
            await stream.close()
            resumed = await client(b).responses.retrieve(
                before[0].response.id, stream=True, starting_after=before[-1].sequence_number)
            gate.set()
            after = [e async for e in resumed]
    events = before + after
    check_sequence(events)
    assert text_of(before) == "alpha "
    assert text_of(events) == "alpha beta gamma"
    assert [e.type for e in after].count("response.output_text.delta") == 1
    assert after[-1].type == "response.completed"
