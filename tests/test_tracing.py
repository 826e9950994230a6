"""OpenTelemetry traces (issue 33, docs/OBSERVABILITY.md) end to end: a real OTLP/HTTP receiver
on 127.0.0.1 decodes the SDK's protobuf exports; a real server (hypercorn), the scripted model
through the openai SDK and the toolbox MCP server over stdio serve one tool-using turn.

Traces are process-wide (one tracer provider): the ``receiver`` fixture turns them off again
(``tracing.shutdown``), so the rest of a run is untraced."""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import hypercorn.config
import hypercorn.trio
import pytest
import trio

try:  # the [otel] extra: scripts/test.sh installs it; without it the traces cannot be tested
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span
except ImportError:
    if os.environ.get("CI") == "true":  # CI installs every extra: a missing one is a failure
        raise
    pytest.skip("needs the [otel] extra: pip install -e '.[otel]'", allow_module_level=True)
from quart import Response, request
from quart_trio import QuartTrio
from trio_websocket import open_websocket_url

from agentik import tracing
from agentik.config import Config
from agentik.web.logjson import JsonFormatter
from tests.scripted_openai import Echo, Fail, Reply, ScriptedOpenAI, ToolCalls
from tests.test_tools_mcp import connected, mcp_of, stdio_entry, wait_for, write_config
from tests.webutil import WsClient, open_sse, serve_app

WAIT = 20


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver: every span of every export, decoded."""

    url: str = ""
    spans: list[Span] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    async def until(self, done: Callable[[list[Span]], bool]) -> list[Span]:
        with trio.fail_after(WAIT):
            while not done(self.spans):
                self.changed = trio.Event()
                await trio.to_thread.run_sync(tracing.flush)  # do not wait for the timer
                if not done(self.spans):
                    await self.changed.wait()
        return self.spans


@asynccontextmanager
async def open_receiver() -> AsyncIterator[Receiver]:
    app = QuartTrio("otlp")
    receiver = Receiver()

    @app.post("/v1/traces")
    async def traces() -> Response:
        assert request.headers["Content-Type"] == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(await request.get_data())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                receiver.spans.extend(scope.spans)
        receiver.changed.set()
        return Response(ExportTraceServiceResponse().SerializeToString(),
                        content_type="application/x-protobuf")

    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(hypercorn.trio.serve, app, config))
        receiver.url = binds[0].rstrip("/") + "/v1/traces"
        yield receiver
        nursery.cancel_scope.cancel()


@pytest.fixture
async def receiver(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Receiver]:
    assert not tracing.enabled()
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    async with open_receiver() as found:
        try:
            yield found
        finally:
            await trio.to_thread.run_sync(tracing.shutdown)


def attrs(span: Span) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [v.string_value for v in value.array_value.values]
        else:
            out[kv.key] = getattr(value, kind)
    return out


def named(spans: list[Span], prefix: str) -> list[Span]:
    return [s for s in spans if s.name.startswith(prefix)]


async def test_a_tool_using_turn_is_one_trace_under_the_callers_traceparent(
    config: Config, scripted: ScriptedOpenAI, tmp_path: Path, receiver: Receiver
) -> None:
    scripted.push(ToolCalls([("c1", "box__meta", "{}")]), Reply("Done."))
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    path = write_config(tmp_path, {"box": stdio_entry()})
    config = config.replace(mcp_config=path, tool_timeout=10, trace_endpoint=receiver.url)
    async with serve_app(config) as server:
        await wait_for(mcp_of(server.agent), connected(mcp_of(server.agent), "box"))
        async with httpx2.AsyncClient(base_url=server.url, timeout=WAIT) as client:
            cid = (await client.post("/agentik/conversations", json={})).json()["id"]
            async with open_sse(client, f"/agentik/conversations/{cid}/events") as stream:
                sent = await client.post(
                    f"/agentik/conversations/{cid}/messages",
                    json={"content": [{"type": "text", "body": "what is in _meta?"}]},
                    headers={"traceparent": f"00-{trace_id}-{caller}-01"})
                assert sent.status_code == 202, sent.text
                with trio.fail_after(WAIT):
                    frames = await stream.until("touched")

        def complete(spans: list[Span]) -> bool:
            return bool(named(spans, "invoke_agent")) and len(named(spans, "chat ")) == 2

        spans = await receiver.until(complete)

    mine = [s for s in spans if s.trace_id.hex() == trace_id]
    [post] = [s for s in mine if s.name == "POST /agentik/conversations/<conversation_id>/messages"]
    assert post.kind == Span.SPAN_KIND_SERVER and post.parent_span_id.hex() == caller
    assert attrs(post)["http.response.status_code"] == 202
    [turn] = named(mine, "invoke_agent")
    assert turn.parent_span_id == post.span_id
    assert attrs(turn)["gen_ai.operation.name"] == "invoke_agent"
    assert attrs(turn)["gen_ai.conversation.id"] == cid
    first, second = sorted(named(mine, "chat "), key=lambda s: s.start_time_unix_nano)
    [tool] = named(mine, "execute_tool")
    for child in (first, second, tool):
        assert child.parent_span_id == turn.span_id, child.name
    model = config.openai_model
    assert first.name == f"chat {model}" and first.kind == Span.SPAN_KIND_CLIENT
    a = attrs(first)
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == model
    assert a["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert attrs(second)["gen_ai.response.finish_reasons"] == ["stop"]
    assert tool.name == "execute_tool box__meta"
    assert attrs(tool)["gen_ai.tool.name"] == "box__meta"
    assert attrs(tool)["gen_ai.tool.call.id"] == "c1"
    # no content unless AGENTIK_TRACE_CONTENT=1
    for span in mine:
        assert not {"gen_ai.input.messages", "gen_ai.output.messages",
                    "gen_ai.tool.call.result"} & set(attrs(span)), span.name
    # the model request carries the round's span; the MCP request's _meta the tool call's
    assert scripted.headers[0]["traceparent"] == f"00-{trace_id}-{first.span_id.hex()}-01"
    assert scripted.headers[1]["traceparent"] == f"00-{trace_id}-{second.span_id.hex()}-01"
    [result] = [f.json()["event"]["record"]["message"] for f in frames if f.event == "tool_result"]
    meta = json.loads(result["content"])
    assert meta["traceparent"] == f"00-{trace_id}-{tool.span_id.hex()}-01"
    # the commits of the turn's writes are linked to the turn
    commits = named(spans, "storage commit")
    linked = {link.span_id for span in commits for link in span.links}
    assert turn.span_id in linked and tool.span_id not in {s.span_id for s in commits}


async def test_a_websocket_send_joins_the_trace_its_traceparent_names(
    config: Config, scripted: ScriptedOpenAI, receiver: Receiver
) -> None:
    scripted.push(Reply("Hi."))
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    async with serve_app(config.replace(trace_endpoint=receiver.url)) as server:
        async with open_websocket_url(server.ws_url) as ws:
            client = WsClient(ws)
            created = await client.call("create")
            cid = created["result"]["id"]
            sent = await client.call("send", conversation_id=cid,
                                     content=[{"type": "text", "body": "hello"}],
                                     traceparent=f"00-{trace_id}-{caller}-01")
            assert sent["type"] == "reply", sent
            await receiver.until(lambda spans: bool(named(spans, "invoke_agent")))
        spans = await receiver.until(lambda spans: bool(named(spans, "GET /agentik/ws")))
    [command] = named(spans, "ws SendMessage")
    assert command.trace_id.hex() == trace_id and command.parent_span_id.hex() == caller
    [turn] = named(spans, "invoke_agent")
    assert turn.parent_span_id == command.span_id
    # a command without one starts a trace of its own (a socket may stay open for hours), each
    # linked to the socket's span
    [socket] = [s for s in spans if s.name == "GET /agentik/ws"]
    [create] = named(spans, "ws CreateConversation")
    assert create.parent_span_id == b"" and create.trace_id != socket.trace_id
    for span in (create, command):
        assert [link.span_id for link in span.links] == [socket.span_id]


async def test_an_a2a_call_is_the_parent_of_its_turn(
    config: Config, scripted: ScriptedOpenAI, receiver: Receiver
) -> None:
    """A2A runs the turn's execution in a task of its own: the call's context goes with it."""
    scripted.push(Reply("Paris."))
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    async with serve_app(config.replace(trace_endpoint=receiver.url)) as server:
        async with httpx2.AsyncClient(base_url=server.url, timeout=WAIT) as client:
            answer = await client.post("/a2a", json={
                "jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
                    "role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "Capital?"}]}}},
                headers={"A2A-Version": "1.0", "traceparent": f"00-{trace_id}-{caller}-01"})
            assert answer.status_code == 200 and "result" in answer.json(), answer.text
        spans = await receiver.until(lambda spans: bool(named(spans, "invoke_agent")))
    [call] = [s for s in spans if s.name == "POST /a2a"]
    assert call.trace_id.hex() == trace_id and call.parent_span_id.hex() == caller
    [turn] = named(spans, "invoke_agent")
    assert turn.trace_id == call.trace_id and turn.parent_span_id == call.span_id


async def test_a_failed_turn_is_a_failed_span(
    config: Config, scripted: ScriptedOpenAI, receiver: Receiver
) -> None:
    scripted.push(Fail(500, "the model broke"))
    async with serve_app(config.replace(trace_endpoint=receiver.url)) as server:
        conv = await server.agent.create_conversation()
        await conv.send("hello")
        spans = await receiver.until(lambda spans: bool(named(spans, "invoke_agent")))
    [turn] = named(spans, "invoke_agent")
    [chat] = named(spans, "chat ")
    assert turn.status.code == turn.status.STATUS_CODE_ERROR, turn.status
    assert attrs(turn)["agentik.turn.outcome"] == "failed" and attrs(turn)["error.type"]
    assert chat.status.code == chat.status.STATUS_CODE_ERROR  # the round raised


async def test_a_compaction_is_a_span_of_its_turn(
    config: Config, scripted: ScriptedOpenAI, receiver: Receiver
) -> None:
    from agentik import open_runtime
    from tests.test_context_openai import is_summary_request, sentence
    from tests.test_runtime import run_turn

    scripted.callable_default = lambda body: (
        Reply("They talked.") if is_summary_request(body) else Echo(prefix="You asked: "))
    async with open_runtime(config.replace(context_window=600,
                                           trace_endpoint=receiver.url)) as agent:
        conv = await agent.create_conversation()
        for i in range(8):
            await run_turn(agent, conv, sentence(i))
        spans = await receiver.until(lambda spans: bool(named(spans, "compaction")))
    compaction = named(spans, "compaction")[0]
    [turn] = [s for s in named(spans, "invoke_agent") if s.span_id == compaction.parent_span_id]
    assert attrs(compaction)["agentik.compaction.items"] > 0
    assert attrs(compaction)["gen_ai.conversation.id"] == attrs(turn)["gen_ai.conversation.id"]
    # its summary is a model round of its own, the compaction's child
    [summary] = [s for s in named(spans, "chat ") if s.parent_span_id == compaction.span_id]
    assert attrs(summary)["agentik.chat.purpose"] == "summary"


async def test_content_is_recorded_only_when_allowed(
    config: Config, scripted: ScriptedOpenAI, receiver: Receiver
) -> None:
    scripted.push(Reply("The answer."))
    config = config.replace(trace_endpoint=receiver.url, trace_content=True)
    async with serve_app(config) as server:
        conv = await server.agent.create_conversation()
        await conv.send("the question")
        spans = await receiver.until(lambda spans: bool(named(spans, "invoke_agent")))
    [turn] = named(spans, "invoke_agent")
    [chat] = named(spans, "chat ")
    # the GenAI conventions' shape: a JSON list of messages of typed parts
    assert json.loads(attrs(turn)["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "the question"}]}]
    assert json.loads(attrs(chat)["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "The answer."}],
         "finish_reason": "stop"}]


async def test_json_log_lines_carry_the_trace_ids(receiver: Receiver) -> None:
    tracing.setup(endpoint=receiver.url)
    record = logging.LogRecord("agentik.x", logging.INFO, __file__, 1, "inside", None, None)
    with tracing.span("outer"):
        inside = json.loads(JsonFormatter().format(record))
        span = tracing.current()
    outside = json.loads(JsonFormatter().format(record))
    spans = await receiver.until(lambda spans: bool(named(spans, "outer")))
    [outer] = named(spans, "outer")
    assert (inside["trace_id"], inside["span_id"]) == (outer.trace_id.hex(), outer.span_id.hex())
    assert "trace_id" not in outside and span is not None


def test_off_imports_nothing_of_the_sdk(tmp_path: Path) -> None:
    """No endpoint: a turn runs with no SDK loaded and every call is the shared no-op."""
    program = """
import sys, trio
from agentik import Config, open_runtime, tracing
from agentik.testing import ScriptedLlm

async def main():
    async with open_runtime(Config(db_path=sys.argv[1]), llm=ScriptedLlm("hi")) as agent:
        conv = await agent.create_conversation()
        await conv.send("hello")
        assert tracing.span("x") is tracing.NOOP and tracing.carry() is None
    loaded = [m for m in sys.modules
              if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))]
    assert loaded == [], loaded
    print("ok")

trio.run(main)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", program, str(tmp_path / "a.db")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.stdout.strip() == "ok", done.stderr


async def test_a_command_forwarded_to_the_owner_node_stays_in_the_trace(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path, receiver: Receiver
) -> None:
    """Two nodes (processes) on one PostgreSQL: a message sent to the node that does not own its
    conversation is forwarded to the owner, and the owner's spans join the caller's trace."""
    from agentik.client.http import AgentikAgent
    from tests.test_pg_nodes import cluster

    scripted.push(Reply("From the owner."))
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url}
    async with cluster(pg_url, scripted, tmp_path, env=env) as (a, b):
        owner = AgentikAgent("cb", b.url)
        try:
            cid = (await owner.create_conversation()).id  # b owns it
        finally:
            await owner.close()
        async with httpx2.AsyncClient(base_url=a.url, timeout=WAIT) as client:
            sent = await client.post(f"/agentik/conversations/{cid}/messages",
                                     json={"content": [{"type": "text", "body": "hi"}]},
                                     headers={"traceparent": f"00-{trace_id}-{caller}-01"})
            assert sent.status_code == 202, sent.text
        spans = await receiver.until(lambda spans: bool(named(spans, "invoke_agent")))
    mine = [s for s in spans if s.trace_id.hex() == trace_id]
    posts = [s for s in mine if s.name == "POST /agentik/conversations/<conversation_id>/messages"]
    [on_a] = [s for s in posts if s.parent_span_id.hex() == caller]
    [on_b] = [s for s in posts if s.parent_span_id == on_a.span_id]  # forwarded by a
    [turn] = named(mine, "invoke_agent")
    assert turn.parent_span_id == on_b.span_id


def test_only_the_tracing_module_imports_opentelemetry() -> None:
    """Every other module calls through agentik.tracing (type-only imports aside), so traces
    off cost nothing and the SDK stays optional."""
    import ast

    from tests.test_layers import _imports, module_names

    found = set()
    for module, path in module_names().items():
        for node in _imports(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""])
            if any(name.split(".")[0] == "opentelemetry" for name in names):
                found.add(module)
    assert found == {"agentik.tracing"}
