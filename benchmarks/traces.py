"""What OpenTelemetry traces cost a turn (docs/OBSERVABILITY.md, issue 33).

Two server processes on the same scripted model, one with traces off and one exporting to an
OTLP/HTTP sink on 127.0.0.1 (the SDK's batch processor at its default delay, as in production);
turns alternate between them, so both see the same noise. A turn is timed from the POST of its
message to its ``end`` on the live SSE stream; each turn is one tool call (to a tool the server
does not have: its error result is fed back) and two model rounds, so the request,
``invoke_agent``, two ``chat``, one ``execute_tool`` and the commit spans. The
off path's own cost is measured directly too: the no-op calls a turn makes, timed in a loop.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import hypercorn.config
import hypercorn.trio
import trio
from quart import Response, request
from quart_trio import QuartTrio

from agentik import tracing
from benchmarks.serverproc import spawn_server
from benchmarks.web import _create, _send, _until
from tests.scripted_openai import Reply, ToolCalls, open_scripted_openai
from tests.webutil import open_sse

TIMEOUT = 30.0


@asynccontextmanager
async def _sink() -> AsyncIterator[tuple[str, list[int]]]:
    """An OTLP/HTTP endpoint that counts the spans it is sent; (its URL, [spans])."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    app = QuartTrio("sink")
    count = [0]

    @app.post("/v1/traces")
    async def traces() -> Response:
        export = ExportTraceServiceRequest.FromString(await request.get_data())
        count[0] += sum(len(s.spans) for r in export.resource_spans for s in r.scope_spans)
        return Response(ExportTraceServiceResponse().SerializeToString(),
                        content_type="application/x-protobuf")

    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(hypercorn.trio.serve, app, config))
        yield binds[0].rstrip("/") + "/v1/traces", count
        nursery.cancel_scope.cancel()


def _off_path_ns() -> float:
    """Nanoseconds the off path adds to one tool-using turn: the calls it makes, each a no-op."""
    assert not tracing.enabled()
    rounds = 100_000
    start = time.perf_counter_ns()
    for _ in range(rounds):
        # per turn: its request's check, the message's carry, the turn's span and its end,
        # two rounds (span, header), a tool call (span, _meta), ~8 writes and 4 batches
        tracing.enabled()
        tracing.carry()
        with tracing.span("t"):
            pass
        tracing.enabled()
        for _ in range(2):
            with tracing.span("c"):
                pass
            tracing.enabled()
        with tracing.span("x"):
            pass
        tracing.child_of(None)
        for _ in range(12):
            tracing.enabled()
    return (time.perf_counter_ns() - start) / rounds


async def traces_turn_cost(quick: bool) -> dict[str, Any]:
    turns = 40 if quick else 200
    off: list[float] = []
    on: list[float] = []
    async with open_scripted_openai() as scripted, _sink() as (sink, spans):

        def answer(body: dict[str, Any]) -> Any:
            if body["messages"][-1]["role"] == "tool":
                return Reply(["It is", " 42."])
            return ToolCalls([("c1", "add", '{"a": 40, "b": 2}')])

        scripted.callable_default = answer
        with tempfile.TemporaryDirectory() as tmp:
            traced = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink}
            async with (
                spawn_server(str(Path(tmp) / "off.db"), openai_base_url=scripted.base_url) as a,
                spawn_server(str(Path(tmp) / "on.db"), openai_base_url=scripted.base_url,
                             env=traced) as b,
                httpx2.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca,
                httpx2.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb,
            ):
                ids = [await _create(ca), await _create(cb)]
                async with (open_sse(ca, f"/agentik/conversations/{ids[0]}/live") as la,
                            open_sse(cb, f"/agentik/conversations/{ids[1]}/live") as lb):
                    for i in range(turns):
                        for client, cid, live, out in ((ca, ids[0], la, off), (cb, ids[1], lb, on)):
                            with trio.fail_after(TIMEOUT):
                                start = time.perf_counter()
                                await _send(client, cid, f"question {i}")
                                await _until(live, "end")
                                out.append((time.perf_counter() - start) * 1000)
    # the first turn of each includes connection set-up: left out of both
    off, on = off[1:], on[1:]
    return {
        "name": "traces_turn_cost",
        "turns": turns,
        "off_p50_ms": round(statistics.median(off), 3),
        "on_p50_ms": round(statistics.median(on), 3),
        "added_p50_ms": round(statistics.median(on) - statistics.median(off), 3),
        "spans_per_turn": round(spans[0] / turns, 1),
        "off_path_ns_per_turn": round(_off_path_ns(), 1),
    }
