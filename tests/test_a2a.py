"""The A2A v1.0 facade (docs/A2A.md) against the real server (hypercorn, trio worker) with the
scripted model: card, JSON-RPC methods and errors, streaming, cancel, failure, durable tasks
across a restart, auth, the TCK's system under test, and a2a-sdk as an interop peer. Every body
the facade sends is parsed by a2a-sdk's protobuf classes (unknown fields and bad enums fail) and
checked for camelCase names."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import msgspec
import pytest
import trio
from a2a.types import a2a_pb2 as pb
from google.protobuf import json_format
from google.rpc import error_details_pb2

from agentik.config import Config
from benchmarks.serverproc import spawn_server
from tests.a2a_sut import open_sut
from tests.scripted_openai import Fail, Hang, Reply, ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    allow_error_logs,
    make_config,
    no_error_logs,
    openai,
    parse_sse,
    serve_app,
)

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

V1 = {"A2A-Version": "1.0"}
A2A_DOC = Path(__file__).resolve().parent.parent / "docs" / "A2A.md"


# --- helpers -------------------------------------------------------------------------------------


def assert_camel(value: Any, path: str = "$") -> None:
    """Every field name is camelCase (metadata and data parts hold free-form keys)."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert "_" not in key or key == "@type", f"snake_case name {key!r} at {path}"
            if key not in ("metadata", "data"):
                assert_camel(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert_camel(item, f"{path}[{i}]")


def pb_check(body: Any, message: type[Any]) -> Any:
    """Parse ``body`` strictly into the a2a-sdk protobuf ``message`` (unknown fields, bad enums
    and wrong types raise) and check its names are camelCase."""
    assert_camel(body)
    return json_format.ParseDict(body, message())


#: seconds a streaming exchange may take before the test fails
STREAM_LIMIT = 30


class Rpc:
    """A JSON-RPC client over httpx2 that validates every answer."""

    def __init__(self, http: httpx2.AsyncClient, path: str = "/a2a") -> None:
        self.http = http
        self.path = path
        self.ids = 0

    def envelope(self, method: str, params: Any) -> dict[str, Any]:
        self.ids += 1
        return {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}

    async def raw(self, method: str, params: Any, headers: dict[str, str] | None = None) -> Any:
        envelope = self.envelope(method, params)
        response = await self.http.post(self.path, json=envelope,
                                        headers={**V1, **(headers or {})})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/json")
        body = response.json()
        assert body["jsonrpc"] == "2.0" and body["id"] == envelope["id"]
        if "error" in body:
            check_error(body)
        return body

    async def call(self, method: str, params: Any, result_type: type[Any] | None = None) -> Any:
        body = await self.raw(method, params)
        assert "result" in body, body
        if result_type is not None:
            pb_check(body["result"], result_type)
        return body["result"]

    async def error(self, method: str, params: Any, code: int, **kw: Any) -> dict[str, Any]:
        body = await self.raw(method, params, **kw)
        assert body.get("error", {}).get("code") == code, body
        return body["error"]  # type: ignore[no-any-return]

    @asynccontextmanager
    async def stream(self, method: str, params: Any) -> AsyncIterator[AsyncIterator[Any]]:
        """A streaming call's events; the whole stream is bounded in time (a stream that never
        ends, its heartbeats keeping the read timeout at bay, fails the test in 30 s)."""
        envelope = self.envelope(method, params)
        request_id = envelope["id"]
        with trio.fail_after(STREAM_LIMIT):
            async with self._stream(envelope, request_id) as events:
                yield events

    @asynccontextmanager
    async def _stream(self, envelope: dict[str, Any], request_id: Any,
                      ) -> AsyncIterator[AsyncIterator[Any]]:
        async with self.http.stream(
            "POST", self.path, json=envelope,
            headers={**V1, "Accept": "text/event-stream"}, timeout=httpx2.Timeout(30.0),
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream"), \
                await response.aread()

            async def events() -> AsyncIterator[Any]:
                async for frame in parse_sse(response.aiter_bytes()):
                    if frame.comment is not None:
                        continue
                    body = msgspec.json.decode(frame.data)
                    assert body["jsonrpc"] == "2.0" and body["id"] == request_id
                    if "error" in body:  # an error ending the stream: yielded as is
                        check_error(body)
                        yield body
                        continue
                    pb_check(body["result"], pb.StreamResponse)
                    yield body["result"]

            yield events()


def check_error(body: dict[str, Any]) -> None:
    error = body["error"]
    assert set(error) <= {"code", "message", "data"} and isinstance(error["message"], str)
    if -32099 <= error["code"] <= -32001:
        (info,) = error["data"]
        assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
        assert info["domain"] == "a2a-protocol.org" and info["reason"].isupper()
        # The ProtoJSON of a google.rpc.ErrorInfo packed in an Any.
        json_format.ParseDict({k: v for k, v in info.items() if k != "@type"},
                              error_details_pb2.ErrorInfo())


def message(text: str, *, message_id: str = "m1", **fields: Any) -> dict[str, Any]:
    return {"role": "ROLE_USER", "messageId": message_id, "parts": [{"text": text}], **fields}


def texts(parts: list[dict[str, Any]]) -> str:
    return "".join(p.get("text", "") for p in parts)


@asynccontextmanager
async def a2a_server(config: Config) -> AsyncIterator[tuple[Server, Rpc]]:
    async with serve_app(config) as server:
        async with httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
            yield server, Rpc(http)


@pytest.fixture
def config(tmp_path: Path, openai: ScriptedOpenAI) -> Config:
    return make_config(tmp_path, openai, agent_name="Tester", agent_description="A test agent")


# --- card and auth -------------------------------------------------------------------------------


async def test_card_is_public_and_cached_and_calls_need_the_token(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    config = make_config(tmp_path, openai, tokens=("sekret",), agent_name="Tester")
    async with a2a_server(config) as (server, rpc):
        response = await rpc.http.get("/.well-known/agent-card.json")
        assert response.status_code == 200
        card = response.json()
        pb_check(card, pb.AgentCard)
        assert card["name"] == "Tester"
        assert card["capabilities"] == {"streaming": True, "pushNotifications": True,
                                        "extendedAgentCard": False}
        (interface,) = card["supportedInterfaces"]
        assert interface == {"url": server.url + "/a2a", "protocolBinding": "JSONRPC",
                             "protocolVersion": "1.0"}
        assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
        assert card["securityRequirements"] == [{"schemes": {"bearer": {}}}]
        assert "max-age=" in response.headers["cache-control"]
        etag = response.headers["etag"]
        again = await rpc.http.get("/.well-known/agent-card.json",
                                   headers={"If-None-Match": etag})
        assert again.status_code == 304
        # Every JSON-RPC call needs the token.
        denied = await rpc.http.post("/a2a", json=rpc.envelope("GetTask", {"id": "x"}),
                                     headers=V1)
        assert denied.status_code == 401
        rpc.http.headers["Authorization"] = "Bearer sekret"
        await rpc.error("GetTask", {"id": "x"}, -32001)


async def test_card_without_tokens_has_no_security_schemes(config: Config) -> None:
    async with a2a_server(config) as (_, rpc):
        card = (await rpc.http.get("/.well-known/agent-card.json")).json()
        assert "securitySchemes" not in card and card["description"] == "A test agent"
        assert card["skills"][0]["id"] == "chat"


# --- SendMessage ---------------------------------------------------------------------------------


async def test_send_message_completes_with_the_answer_and_the_context_continues(
    config: Config, openai: ScriptedOpenAI
) -> None:
    openai.push(Reply("Paris is the capital."), Reply("About two million people."))
    async with a2a_server(config) as (_, rpc):
        first = await rpc.call("SendMessage", {"message": message(
            "Capital of France?", contextId="client-ctx-1")}, pb.SendMessageResponse)
        task = first["task"]
        assert task["contextId"] == "client-ctx-1"
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        assert task["status"]["timestamp"].endswith("Z")
        assert texts(task["status"]["message"]["parts"]) == "Paris is the capital."
        assert task["status"]["message"]["role"] == "ROLE_AGENT"
        (artifact,) = task["artifacts"]
        assert texts(artifact["parts"]) == "Paris is the capital."
        assert task["history"][0]["parts"] == [{"text": "Capital of France?"}]
        # Same contextId: the same conversation, the model sees the first exchange.
        second = await rpc.call("SendMessage", {"message": message(
            "How many people live there?", message_id="m1", contextId="client-ctx-1")},
            pb.SendMessageResponse)
        assert second["task"]["id"] != task["id"]
        assert second["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        sent = [m.get("content") for m in openai.requests[1]["messages"]]
        assert "Capital of France?" in str(sent) and "Paris is the capital." in str(sent)
        # The exchange is an ordinary conversation over /agentik.
        conversations = (await rpc.http.get("/agentik/conversations")).json()["conversations"]
        (conv,) = conversations
        assert conv["title"] == "A2A client-ctx-1"
        snapshot = (await rpc.http.get(f"/agentik/conversations/{conv['id']}/snapshot")).json()
        kinds = [m["message"]["type"] for m in snapshot["messages"]]
        assert kinds == ["user_message", "assistant_message"] * 2
        origin = snapshot["messages"][0]["message"]["context"]
        assert origin["metadata"]["a2a_task_id"] == task["id"]


async def test_streaming_gives_working_chunks_that_add_up_and_completed(
    config: Config, openai: ScriptedOpenAI
) -> None:
    gate = trio.Event()
    openai.push(Reply(["The ", "answer ", "is ", "42."], gate=gate))
    async with a2a_server(config) as (_, rpc):
        async with rpc.stream("SendStreamingMessage", {"message": message("q?")}) as events:
            seen: list[dict[str, Any]] = []
            async for event in events:
                seen.append(event)
                if "artifactUpdate" in event:
                    gate.set()  # the rest of the answer only after the first chunk arrived
        first = seen[0]["task"]
        assert first["status"]["state"] == "TASK_STATE_WORKING"
        chunks = [e["artifactUpdate"] for e in seen if "artifactUpdate" in e]
        assert len(chunks) >= 2
        assert "".join(texts(c["artifact"]["parts"]) for c in chunks) == "The answer is 42."
        assert all(c["artifact"]["artifactId"] == chunks[0]["artifact"]["artifactId"]
                   for c in chunks)
        assert [c.get("append", False) for c in chunks[1:]] == [True] * (len(chunks) - 1)
        assert chunks[-1]["lastChunk"] is True
        last = seen[-1]["statusUpdate"]
        assert last["status"]["state"] == "TASK_STATE_COMPLETED"
        assert texts(last["status"]["message"]["parts"]) == "The answer is 42."
        # GetTask holds the whole answer as one text part of the one artifact.
        task = await rpc.call("GetTask", {"id": first["id"]}, pb.Task)
        assert task["artifacts"][0]["parts"] == [{"text": "The answer is 42."}]


async def test_tool_call_is_a_working_update_naming_the_tool(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    from agentik.tools.base import FunctionTools
    from tests.scripted_openai import ToolCalls

    tools = FunctionTools()

    async def add(a: int, b: int) -> str:
        return str(a + b)

    tools.add(add, name="add", description="adds",
              parameters={"type": "object", "properties": {"a": {}, "b": {}}})
    openai.push(ToolCalls([("c1", "add", '{"a": 1, "b": 2}')]), Reply("3"))
    async with serve_app(make_config(tmp_path, openai), tools=tools) as server:
        async with httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
            rpc = Rpc(http)
            card = (await http.get("/.well-known/agent-card.json")).json()
            assert [s["name"] for s in card["skills"]] == ["Conversation", "add"]
            async with rpc.stream("SendStreamingMessage", {"message": message("1+2?")}) as events:
                seen = [e async for e in events]
    updates = [e["statusUpdate"]["status"] for e in seen if "statusUpdate" in e]
    tool = [u for u in updates if u.get("message") and "tool" in texts(u["message"]["parts"])]
    assert tool and tool[0]["state"] == "TASK_STATE_WORKING"
    assert tool[0]["message"]["metadata"]["agentik"]["toolCall"]["name"] == "add"
    assert updates[-1]["state"] == "TASK_STATE_COMPLETED"


async def test_cancel_during_a_slow_answer_is_canceled_and_a_done_task_is_not_cancelable(
    config: Config, openai: ScriptedOpenAI
) -> None:
    openai.push(Hang(text_before="partial "), Reply("done"))
    async with a2a_server(config) as (_, rpc):
        async with rpc.stream("SendStreamingMessage", {"message": message("slow")}) as events:
            task_id = None
            states = []
            async for event in events:
                if "task" in event:
                    task_id = event["task"]["id"]
                if "artifactUpdate" in event and not states:
                    states.append("canceling")
                    canceled = await rpc.call("CancelTask", {"id": task_id}, pb.Task)
                    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
                if "statusUpdate" in event:
                    states.append(event["statusUpdate"]["status"]["state"])
        assert states[-1] == "TASK_STATE_CANCELED"
        task = await rpc.call("GetTask", {"id": task_id}, pb.Task)
        assert task["status"]["state"] == "TASK_STATE_CANCELED"
        assert texts(task["artifacts"][0]["parts"]) == "partial "
        await rpc.error("CancelTask", {"id": task_id}, -32002)
        done = await rpc.call("SendMessage", {"message": message("quick")})
        assert done["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        await rpc.error("CancelTask", {"id": done["task"]["id"]}, -32002)
        await rpc.error("CancelTask", {"id": "no-such-task"}, -32001)


async def test_model_failure_is_failed(
    config: Config, openai: ScriptedOpenAI, allow_error_logs: None
) -> None:
    openai.push(Fail(status=500, message="model exploded"), Reply("fine again"))
    async with a2a_server(config) as (_, rpc):
        failed = await rpc.call("SendMessage", {"message": message("x", contextId="c")},
                                pb.SendMessageResponse)
        status = failed["task"]["status"]
        assert status["state"] == "TASK_STATE_FAILED"
        assert "exploded" in texts(status["message"]["parts"])
        ok = await rpc.call("SendMessage", {"message": message("y", contextId="c")})
        assert ok["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_get_and_list_tasks_also_after_a_restart_and_a_running_task_fails_then(
    config: Config, openai: ScriptedOpenAI, allow_error_logs: None
) -> None:
    openai.push(Reply("one"), Reply("two"), Hang(text_before="never "))
    async with a2a_server(config) as (_, rpc):
        t1 = (await rpc.call("SendMessage", {"message": message("a", contextId="k")}))["task"]
        t2 = (await rpc.call("SendMessage", {"message": message("b", contextId="k")}))["task"]
        page = await rpc.call("ListTasks", {"contextId": "k", "pageSize": 1},
                              pb.ListTasksResponse)
        assert [t["id"] for t in page["tasks"]] == [t2["id"]]
        assert page["totalSize"] == 2 and page["pageSize"] == 1 and page["nextPageToken"]
        assert "artifacts" not in page["tasks"][0]
        rest = await rpc.call("ListTasks", {"contextId": "k", "pageSize": 1,
                                            "pageToken": page["nextPageToken"],
                                            "includeArtifacts": True}, pb.ListTasksResponse)
        assert [t["id"] for t in rest["tasks"]] == [t1["id"]] and rest["nextPageToken"] == ""
        assert texts(rest["tasks"][0]["artifacts"][0]["parts"]) == "one"
        empty = await rpc.call("ListTasks", {"contextId": "nobody"}, pb.ListTasksResponse)
        assert empty == {"tasks": [], "nextPageToken": "", "pageSize": 50, "totalSize": 0}
        no_history = await rpc.call("GetTask", {"id": t1["id"], "historyLength": 0}, pb.Task)
        assert "history" not in no_history
        # A task still running when the server stops.
        async with rpc.stream("SendStreamingMessage",
                              {"message": message("c", contextId="k")}) as events:
            async for event in events:
                if "artifactUpdate" in event:
                    break
        running = (await rpc.call("ListTasks", {"contextId": "k"}))["tasks"][0]
        assert running["status"]["state"] == "TASK_STATE_WORKING"
    async with a2a_server(config) as (_, rpc):
        assert (await rpc.call("GetTask", {"id": t1["id"]}, pb.Task))["status"]["state"] == \
            "TASK_STATE_COMPLETED"
        listed = await rpc.call("ListTasks", {"contextId": "k"}, pb.ListTasksResponse)
        assert [t["id"] for t in listed["tasks"]][1:] == [t2["id"], t1["id"]]
        after = listed["tasks"][0]
        assert after["id"] == running["id"]
        assert after["status"]["state"] == "TASK_STATE_FAILED"
        assert "restart" in texts(after["status"]["message"]["parts"])


async def test_a_task_running_when_the_server_is_killed_ends_failed_on_restart(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    """SIGKILL mid-answer (no shutdown code runs): after the restart the task is FAILED and keeps
    what had been streamed; the conversation's turn got its terminal record too."""
    openai.push(Hang(text_before="half an answer "))
    async with spawn_server(str(tmp_path / "kill.db"), openai_base_url=openai.base_url) as srv:
        async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
            rpc = Rpc(http)
            with trio.fail_after(30):
                async with rpc.stream("SendStreamingMessage",
                                      {"message": message("x", contextId="kill")}) as events:
                    async for event in events:
                        if "task" in event:
                            task_id = event["task"]["id"]
                        if "artifactUpdate" in event:
                            break
        srv.kill()
        await srv.wait()
        await srv.start()
        async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
            rpc = Rpc(http)
            task = await rpc.call("GetTask", {"id": task_id}, pb.Task)
            assert task["status"]["state"] == "TASK_STATE_FAILED"
            assert "restart" in texts(task["status"]["message"]["parts"])
            assert texts(task["artifacts"][0]["parts"]) == "half an answer "
            conversation = (await http.get("/agentik/conversations")).json()["conversations"][0]
            snapshot = (await http.get(
                f"/agentik/conversations/{conversation['id']}/snapshot")).json()
            assert snapshot["messages"][-1]["message"]["type"] == "error"


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_deleting_the_conversation_deletes_its_tasks_and_frees_the_context(
    engine: str, tmp_path: Path, openai: ScriptedOpenAI, request: pytest.FixtureRequest
) -> None:
    """The tasks of a deleted conversation go with it: GetTask is TaskNotFound for a finished one
    and for the one running (its stream ends with TaskNotFound), ListTasks no longer lists them,
    and the next message to the contextId starts a new conversation with only its own task."""
    database_url = request.getfixturevalue("pg_url") if engine == "postgres" else None
    config = make_config(tmp_path, openai, database_url=database_url)
    openai.push(Reply("one"), Hang(text_before="half "), Reply("fresh"))
    async with a2a_server(config) as (_, rpc):
        done = (await rpc.call("SendMessage", {"message": message("a", contextId="gone")}))["task"]
        (conv,) = (await rpc.http.get("/agentik/conversations")).json()["conversations"]
        with trio.fail_after(20):
            async with rpc.stream("SendStreamingMessage",
                                  {"message": message("b", contextId="gone")}) as events:
                seen: list[dict[str, Any]] = []
                async for event in events:
                    seen.append(event)
                    if "artifactUpdate" in event and len(seen) == 2:  # the turn is running
                        deleted = await rpc.http.delete(f"/agentik/conversations/{conv['id']}")
                        assert deleted.status_code == 204
        running = seen[0]["task"]["id"]
        assert seen[-1]["error"]["code"] == -32001  # the stream ends: the task is gone
        for task_id in (done["id"], running):
            await rpc.error("GetTask", {"id": task_id}, -32001)
        empty = await rpc.call("ListTasks", {"contextId": "gone"}, pb.ListTasksResponse)
        assert empty["tasks"] == [] and empty["totalSize"] == 0
        again = (await rpc.call("SendMessage", {"message": message("c", contextId="gone")},
                                pb.SendMessageResponse))["task"]
        assert again["status"]["state"] == "TASK_STATE_COMPLETED"
        (fresh,) = (await rpc.http.get("/agentik/conversations")).json()["conversations"]
        assert fresh["id"] != conv["id"] and fresh["title"] == "A2A gone"
        assert "one" not in str(openai.requests[-1]["messages"])  # a new conversation
        listed = await rpc.call("ListTasks", {"contextId": "gone"}, pb.ListTasksResponse)
        assert [t["id"] for t in listed["tasks"]] == [again["id"]]


#: where the conversation is deleted: right after the facade looked the context's conversation up,
#: right after the executor took its handle (before the message is sent to it), or right before
#: the task's first store (the message reached the conversation)
RACES = [("send", "lookup"), ("send", "handle"), ("send", "store"), ("stream", "lookup"),
         ("stream", "store"), ("immediate", "store")]


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_a_conversation_deleted_before_the_tasks_first_store_is_a_clear_error(
    engine: str, tmp_path: Path, openai: ScriptedOpenAI, request: pytest.FixtureRequest
) -> None:
    """A message whose context's conversation is deleted between the facade's lookup of it and
    the task's first store: storage refuses the task (its conversation is gone), the client gets
    one clear JSON-RPC error naming the context (before any stream opens), nothing of the task is
    stored, nothing is logged as a failure, and the message sent again starts a new
    conversation. The deletion is made at each step through the in-process handles."""
    database_url = request.getfixturevalue("pg_url") if engine == "postgres" else None
    config = make_config(tmp_path, openai, database_url=database_url)
    async with a2a_server(config) as (server, rpc):
        service = server.app.agentik_a2a.service  # type: ignore[attr-defined]
        executor, store = service.executor, service.store
        agent = executor.agent
        attempted: list[str] = []  # ids of the tasks whose first store was refused

        async def delete(cid: str) -> None:
            assert (await rpc.http.delete(f"/agentik/conversations/{cid}")).status_code == 204

        async def looked_up(context_id: str, previous: str | None,
                            for_agent: str | None = None) -> str | None:
            del executor.conversation  # once
            cid = await executor.conversation(context_id, previous, for_agent)
            assert cid is not None and cid == previous
            await delete(cid)
            return cid

        async def first_store(task: Any, cid: str | None) -> Any:
            del store.create  # once
            assert cid is not None
            attempted.append(task.id)
            await delete(cid)
            return await store.create(task, cid)

        async def handle(cid: str) -> Any:
            del agent.get_conversation  # once
            conversation = await agent.get_conversation(cid)
            assert conversation is not None
            await delete(cid)
            return conversation

        async def lookup_then_handle(context_id: str, previous: str | None,
                                     for_agent: str | None = None) -> str | None:
            del executor.conversation  # the lookup reads the handle too: the next read
            cid = await executor.conversation(context_id, previous, for_agent)
            agent.get_conversation = handle
            return cid

        for mode, where in RACES:
            ctx = f"ctx-{mode}-{where}"
            first = await rpc.call("SendMessage", {"message": message("a", contextId=ctx)})
            if where == "lookup":
                executor.conversation = looked_up
            elif where == "handle":
                executor.conversation = lookup_then_handle
            else:
                store.create = first_store
            params: dict[str, Any] = {"message": message("b", contextId=ctx)}
            if mode == "immediate":
                params["configuration"] = {"returnImmediately": True}
            with trio.fail_after(20):
                # raw(): an HTTP 200 JSON answer, also for the stream (it never opened)
                body = await rpc.raw("SendStreamingMessage" if mode == "stream" else "SendMessage",
                                     params)
            assert "error" in body, (mode, where, body)
            assert body["error"]["code"] == -32603, (mode, where, body)
            assert f"context {ctx!r} was deleted" in body["error"]["message"], (mode, where, body)
            assert not {"conversation", "create", "get_conversation"} & {*vars(executor),
                                                                         *vars(store), *vars(agent)}
            for task_id in (first["task"]["id"], *attempted):
                await rpc.error("GetTask", {"id": task_id}, -32001)
            listed = await rpc.call("ListTasks", {"contextId": ctx}, pb.ListTasksResponse)
            assert listed["tasks"] == [] and listed["totalSize"] == 0, (mode, where)
            again = (await rpc.call("SendMessage", {"message": message("c", contextId=ctx)},
                                    pb.SendMessageResponse))["task"]
            assert again["status"]["state"] == "TASK_STATE_COMPLETED", (mode, where)
            listed = await rpc.call("ListTasks", {"contextId": ctx}, pb.ListTasksResponse)
            assert [t["id"] for t in listed["tasks"]] == [again["id"]], (mode, where)
        total = await rpc.call("ListTasks", {}, pb.ListTasksResponse)
        assert total["totalSize"] == len(RACES)  # only the messages sent again


async def test_a_busy_conversation_with_the_reject_policy_is_a_clear_error(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    """AGENTIK_BUSY_POLICY=reject: a second message while the context's turn runs is refused with
    a JSON-RPC error saying the conversation is busy (raised inside the executor's nursery: not
    an unexpected failure), nothing stored for it; the running task goes on."""
    config = make_config(tmp_path, openai, busy_policy="reject")
    openai.push(Hang(text_before="slow "))
    async with a2a_server(config) as (_, rpc):
        with trio.fail_after(20):
            async with rpc.stream("SendStreamingMessage",
                                  {"message": message("a", contextId="busy")}) as events:
                async for event in events:
                    if "artifactUpdate" in event:  # the turn is running
                        break
                busy = await rpc.error("SendMessage", {"message": message(
                    "b", message_id="m2", contextId="busy")}, -32603)
                assert "busy" in busy["message"], busy
                listed = await rpc.call("ListTasks", {"contextId": "busy"}, pb.ListTasksResponse)
                (running,) = listed["tasks"]
                assert running["status"]["state"] == "TASK_STATE_WORKING"
                await rpc.call("CancelTask", {"id": running["id"]}, pb.Task)


# --- JSON-RPC errors -----------------------------------------------------------------------------


async def test_jsonrpc_errors_carry_their_codes(config: Config, openai: ScriptedOpenAI) -> None:
    async with a2a_server(config) as (_, rpc):
        http = rpc.http

        async def post(content: bytes, content_type: str = "application/json",
                       headers: dict[str, str] | None = None) -> Any:
            response = await http.post("/a2a", content=content, headers={
                "Content-Type": content_type, **V1, **(headers or {})})
            assert response.status_code == 200
            body = response.json()
            check_error(body)
            return body

        assert (await post(b'{"jsonrpc": "2.0", "id": 1, "method"'))["error"]["code"] == -32700
        assert (await post(b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{}}',
                           "text/plain"))["error"]["code"] == -32005
        assert (await post(b'[{"jsonrpc":"2.0","id":1,"method":"GetTask"}]'))["error"]["code"] \
            == -32600
        body = await post(b'{"jsonrpc":"1.0","id":7,"method":"GetTask","params":{"id":"x"}}')
        assert body["error"]["code"] == -32600 and body["id"] == 7
        await rpc.error("NoSuchMethod", {}, -32601)
        await rpc.error("SendMessage", {}, -32602)
        await rpc.error("SendMessage", {"message": {"role": "ROLE_USER", "messageId": "m",
                                                    "parts": [{}]}}, -32602)
        await rpc.error("GetTask", {"id": "x", "historyLength": -1}, -32602)
        await rpc.error("ListTasks", {"pageSize": 1000}, -32602)
        await rpc.error("GetTask", {"id": "x"}, -32009, headers={"A2A-Version": "99.0"})
        await rpc.error("GetTask", {"id": "x"}, -32009, headers={"A2A-Version": ""})
        await rpc.error("GetTask", {"id": "nope"}, -32001)
        await rpc.error("SubscribeToTask", {"id": "nope"}, -32001)
        await rpc.error("CreateTaskPushNotificationConfig",
                        {"taskId": "nope", "url": "http://127.0.0.1/x"}, -32001)
        await rpc.error("GetExtendedAgentCard", {}, -32007)
        # Follow-ups: a terminal task -32004, an unknown one -32001, another context -32602.
        done = (await rpc.call("SendMessage", {"message": message("hi")}))["task"]
        await rpc.error("SendMessage", {"message": message("more", taskId=done["id"])}, -32004)
        await rpc.error("SendMessage", {"message": message("more", taskId="nope")}, -32001)
        await rpc.error("SubscribeToTask", {"id": done["id"]}, -32004)
        # snake_case params are accepted as ProtoJSON parsers do.
        assert (await rpc.call("GetTask", {"id": done["id"], "history_length": 0}))["id"] == \
            done["id"]


async def test_jsonrpc_url_is_served_with_and_without_the_trailing_slash(config: Config) -> None:
    async with a2a_server(config) as (_, rpc):
        for path in ("/a2a", "/a2a/"):
            response = await rpc.http.post(path, json=rpc.envelope("GetTask", {"id": "x"}),
                                           headers=V1, follow_redirects=False)
            assert response.status_code == 200, path
            assert response.json()["error"]["code"] == -32001


# --- docs/A2A.md ---------------------------------------------------------------------------------


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl, jq")
async def test_the_docs_curl_examples_run_as_written(config: Config) -> None:
    doc = A2A_DOC.read_text()
    (block,) = re.findall(r"```sh\n(.*?)```", doc, flags=re.S)
    async with a2a_server(config) as (server, _):
        with trio.fail_after(60):
            result = await trio.run_process(
                ["bash", "-c", "set -euo pipefail\n" + block],
                env={"BASE": server.url, "PATH": "/usr/bin:/bin:/usr/local/bin"},
                capture_stdout=True, capture_stderr=True, check=False,
            )
    out = result.stdout.decode()
    assert result.returncode == 0, (out, result.stderr.decode())
    assert '"protocolBinding": "JSONRPC"' in out and '"TASK_STATE_COMPLETED"' in out
    # The stream ended with COMPLETED, then ListTasks counted the context's three tasks.
    assert '"statusUpdate"' in out and out.rstrip().endswith("\n3"), out


# --- the TCK's system under test -----------------------------------------------------------------


async def test_sut_prefix_table_subscribers_and_follow_ups(tmp_path: Path) -> None:
    async with open_sut(str(tmp_path / "sut.db")) as sut:
        async with httpx2.AsyncClient(base_url=sut.url.rstrip("/"), timeout=30) as http:
            rpc = Rpc(http)
            reply = await rpc.call("SendMessage", {"message": message(
                "x", message_id="tck-message-response-1")}, pb.SendMessageResponse)
            assert texts(reply["message"]["parts"]) == "Direct message response"
            data = (await rpc.call("SendMessage", {"message": message(
                "x", message_id="tck-artifact-data-1")}, pb.SendMessageResponse))["task"]
            assert data["artifacts"][0]["parts"] == [{"data": {"key": "value", "count": 42}}]
            rejected = await rpc.call("SendMessage", {"message": message(
                "x", message_id="tck-reject-task-1")})
            assert rejected["task"]["status"]["state"] == "TASK_STATE_REJECTED"
            # The same messageId twice is two tasks (never deduplicated).
            waiting = [(await rpc.call("SendMessage", {"message": message(
                "x", message_id="tck-input-required-1")}))["task"] for _ in range(2)]
            assert waiting[0]["id"] != waiting[1]["id"]
            task = waiting[0]
            assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
            # Two subscribers, then a follow-up completes the task: identical sequences.
            results: list[list[Any]] = [[], []]

            async def subscribe(i: int, ready: trio.Event) -> None:
                async with rpc.stream("SubscribeToTask", {"id": task["id"]}) as events:
                    async for event in events:
                        results[i].append(event)
                        ready.set()

            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    readies = [trio.Event(), trio.Event()]
                    for i in range(2):
                        nursery.start_soon(subscribe, i, readies[i])
                    for ready in readies:
                        await ready.wait()
                    done = await rpc.call("SendMessage", {"message": message(
                        "go", message_id="tck-complete-task-1", taskId=task["id"])})
                    assert done["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
                    assert done["task"]["contextId"] == task["contextId"]
            assert results[0] == results[1]
            assert "task" in results[0][0]
            assert results[0][-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
            # The follow-up joined the history; a different contextId is refused.
            again = await rpc.call("SendMessage", {"message": message(
                "x", message_id="tck-input-required-2")})
            await rpc.error("SendMessage", {"message": message(
                "x", taskId=again["task"]["id"], contextId="other")}, -32602)
            canceled = await rpc.call("CancelTask", {"id": again["task"]["id"]}, pb.Task)
            assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
            history = (await rpc.call("GetTask", {"id": task["id"]}))["history"]
            assert [texts(m["parts"]) for m in history if m["role"] == "ROLE_USER"] == ["x", "go"]


# --- a2a-sdk as an interop peer ------------------------------------------------------------------


def _sdk_conversation(base_url: str) -> tuple[list[Any], Any, Any]:
    """a2a-sdk's asyncio client, in this worker thread: a streaming exchange, a second message in
    the same context (non-streaming), GetTask."""
    from a2a.client import ClientConfig, create_client

    async def go() -> tuple[list[Any], Any, Any]:
        async with httpx.AsyncClient(headers=V1, timeout=30) as http:
            client = await create_client(base_url, ClientConfig(streaming=True, httpx_client=http))
            request = pb.SendMessageRequest(message=pb.Message(
                message_id="sdk-1", role=pb.ROLE_USER, context_id="sdk-ctx",
                parts=[pb.Part(text="hello from the sdk")]))
            events = [event async for event in client.send_message(request)]
            task_id = events[0].task.id
            task = await client.get_task(pb.GetTaskRequest(id=task_id))
            plain = await create_client(base_url, ClientConfig(streaming=False, httpx_client=http))
            second = [event async for event in plain.send_message(pb.SendMessageRequest(
                message=pb.Message(message_id="sdk-2", role=pb.ROLE_USER, context_id="sdk-ctx",
                                   parts=[pb.Part(text="again")])))]
            return events, task, second

    # bounded: this thread cannot be cancelled from trio, and heartbeats keep a stream alive
    return asyncio.run(asyncio.wait_for(go(), STREAM_LIMIT))


async def test_a2a_sdk_client_talks_to_agentik(config: Config, openai: ScriptedOpenAI) -> None:
    openai.push(Reply(["Hi ", "there, ", "sdk."]), Reply("Second answer."))
    async with a2a_server(config) as (server, _):
        events, task, second = await trio.to_thread.run_sync(_sdk_conversation, server.url)
    assert events[0].HasField("task")
    final = [e for e in events if e.HasField("status_update")][-1]
    assert final.status_update.status.state == pb.TASK_STATE_COMPLETED
    assert task.status.state == pb.TASK_STATE_COMPLETED
    assert task.artifacts[0].parts[0].text == "Hi there, sdk."
    assert task.context_id == "sdk-ctx"
    (reply,) = second
    assert reply.task.status.state == pb.TASK_STATE_COMPLETED
    assert reply.task.status.message.parts[0].text == "Second answer."
    assert reply.task.context_id == "sdk-ctx"
