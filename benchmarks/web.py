"""Scenarios through the real HTTP/SSE facade, with the server in a subprocess.

The server (``agentik serve``) runs in its own process so that its CPU time and memory are its own;
the clients and the scripted OpenAI-compatible LLM run in the benchmark process.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import msgspec
import openai
import trio

from agentik.storage import ops
from agentik.storage.sqlite.writer import Writer
from agentik.wire import Error, Text, UserMessage
from benchmarks.serverproc import ServerProcess, rss_kib, spawn_server
from tests.scripted_openai import Reply, ScriptedOpenAI, Step, open_scripted_openai
from tests.webutil import SseStream, open_sse

UNLIMITED = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
TIMEOUT = httpx2.Timeout(60.0)


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    num = sum((x - mx) * (y - my) for x, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return num / den


# --- a scripted LLM that timestamps each token when it sends it -----------------------------------


@dataclass
class Stamped:
    """Stream ``tokens`` content chunks, each ``"<time.monotonic_ns()> "`` taken when sent."""

    tokens: int
    chunk_delay: float = 0.0


class StampingOpenAI(ScriptedOpenAI):
    """ScriptedOpenAI plus the :class:`Stamped` step."""

    async def _stream(  # type: ignore[override]
        self, step: Any, chunk_id: str, model: str, include_usage: bool
    ) -> AsyncGenerator[bytes, None]:
        if not isinstance(step, Stamped):
            async for data in super()._stream(step, chunk_id, model, include_usage):
                yield data
            return

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            body = {"id": chunk_id, "object": "chat.completion.chunk", "created": 0, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return b"data: " + msgspec.json.encode(body) + b"\n\n"

        yield chunk({"role": "assistant", "content": ""})
        for _ in range(step.tokens):
            if step.chunk_delay:
                await trio.sleep(step.chunk_delay)
            yield chunk({"content": f"{time.monotonic_ns()} "})
        yield chunk({}, "stop")
        if include_usage:
            yield b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m",' \
                  b'"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\n'
        yield b"data: [DONE]\n\n"


async def _stamping_server(nursery: trio.Nursery) -> StampingOpenAI:
    """Serve a StampingOpenAI like ``open_scripted_openai`` does (same helper, other class)."""
    from functools import partial

    import hypercorn.config
    import hypercorn.trio

    server = StampingOpenAI()
    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 0.2
    binds: list[str] = await nursery.start(partial(hypercorn.trio.serve, server.app, config))
    server.base_url = binds[0].rstrip("/") + "/v1"
    return server


def _text(frame_data: str) -> str:
    event = msgspec.json.decode(frame_data)["event"]
    return str(event.get("text", ""))


async def _create(client: httpx2.AsyncClient) -> str:
    response = await client.post("/agentik/conversations", json={})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def _send(client: httpx2.AsyncClient, cid: str, text: str) -> str:
    response = await client.post(
        f"/agentik/conversations/{cid}/messages", json={"content": [{"type": "text", "body": text}]}
    )
    assert response.status_code == 202, response.text
    return str(response.json()["message_id"])


async def _until(stream: SseStream, event_type: str) -> None:
    while (await stream.next_event()).event != event_type:
        pass


# --- turn_overhead_ttft ---------------------------------------------------------------------------


async def turn_overhead_ttft(quick: bool) -> dict[str, Any]:
    """Time added to the first token by agentik: for each run index, the time to first token
    through agentik (POST send -> first ``append_text`` on the live SSE stream) minus the time to
    first token of the openai SDK calling the same scripted server directly, in the same
    iteration (the two paths alternate; 10 turns per conversation). ``p50_ms`` / ``p99_ms`` are
    percentiles of those paired differences (a difference of two p99s can go negative, since the
    two tails need not come from the same runs); each path's own p50 and p99 are given too."""
    turns = 60 if quick else 300
    per_conversation = 10
    via_agentik: list[float] = []
    direct: list[float] = []
    async with open_scripted_openai() as scripted:
        scripted.callable_default = lambda body: Reply(["Hello", " world"])
        with tempfile.TemporaryDirectory() as tmp:
            async with (
                spawn_server(str(Path(tmp) / "t.db"), openai_base_url=scripted.base_url) as server,
                httpx2.AsyncClient(base_url=server.url, timeout=TIMEOUT) as client,
                openai.AsyncOpenAI(base_url=scripted.base_url, api_key="k", max_retries=0) as sdk,
            ):
                for first in range(0, turns, per_conversation):
                    cid = await _create(client)
                    async with open_sse(client, f"/agentik/conversations/{cid}/live") as live:
                        for i in range(first, min(turns, first + per_conversation)):
                            with trio.fail_after(30):
                                start = time.perf_counter()
                                await _send(client, cid, f"question {i}")
                                await _until(live, "append_text")
                                via_agentik.append((time.perf_counter() - start) * 1000)
                                await _until(live, "end")
                                start = time.perf_counter()
                                stream = await sdk.chat.completions.create(
                                    model="m", stream=True,
                                    messages=[{"role": "user", "content": f"question {i}"}],
                                    stream_options={"include_usage": True},
                                )
                                async with stream:
                                    async for chunk in stream:
                                        if chunk.choices and chunk.choices[0].delta.content:
                                            direct.append((time.perf_counter() - start) * 1000)
                                            break
                                assert len(direct) == len(via_agentik), f"run {i}: no direct token"
    # The first conversation's first turn includes connection set-up on both paths; kept.
    added = [a - d for a, d in zip(via_agentik, direct, strict=True)]
    return {
        "name": "turn_overhead_ttft",
        "turns": turns,
        "p50_ms": round(percentile(added, 50), 2),
        "p99_ms": round(percentile(added, 99), 2),
        "agentik_p50_ms": round(percentile(via_agentik, 50), 2),
        "agentik_p99_ms": round(percentile(via_agentik, 99), 2),
        "direct_p50_ms": round(percentile(direct, 50), 2),
        "direct_p99_ms": round(percentile(direct, 99), 2),
    }


# --- fanout_tokens --------------------------------------------------------------------------------


async def fanout_tokens(quick: bool) -> dict[str, Any]:
    """100 conversations streaming at once from a scripted server that stamps each token when it
    sends it; each conversation watched by its own live SSE client. Tokens delivered per second
    (first send to last ``end``) and the per-token latency stamp -> SSE receipt."""
    conversations = 100
    tokens = 50 if quick else 200
    delay = 0.01  # 100 tokens/s per stream offered, 10k/s in all
    latencies: list[float] = []
    received = 0
    async with trio.open_nursery() as outer:
        scripted = await _stamping_server(outer)
        scripted.callable_default = lambda body: Stamped(tokens, delay)  # type: ignore[arg-type,return-value]
        with tempfile.TemporaryDirectory() as tmp:
            async with (
                spawn_server(str(Path(tmp) / "f.db"), openai_base_url=scripted.base_url) as server,
                httpx2.AsyncClient(base_url=server.url, timeout=TIMEOUT, limits=UNLIMITED) as client,
            ):
                cids = [await _create(client) for _ in range(conversations)]
                ready = trio.Event()
                go = trio.Event()
                connected = 0
                finished: list[float] = []

                async def watch(cid: str) -> None:
                    nonlocal connected, received
                    async with open_sse(client, f"/agentik/conversations/{cid}/live") as live:
                        connected += 1
                        if connected == conversations:
                            ready.set()
                        await go.wait()
                        while True:
                            frame = await live.next_event()
                            now = time.monotonic_ns()
                            if frame.event == "append_text":
                                for stamp in _text(frame.data).split():
                                    latencies.append((now - int(stamp)) / 1e6)
                                    received += 1
                            elif frame.event == "end":
                                finished.append(time.perf_counter())
                                return

                with trio.fail_after(120):
                    async with trio.open_nursery() as nursery:
                        for cid in cids:
                            nursery.start_soon(watch, cid)
                        await ready.wait()
                        go.set()
                        start = time.perf_counter()
                        async with trio.open_nursery() as senders:
                            for cid in cids:
                                senders.start_soon(_send, client, cid, "go")
        outer.cancel_scope.cancel()
    elapsed = max(finished) - start
    assert received == conversations * tokens, (received, conversations * tokens)
    return {
        "name": "fanout_tokens",
        "conversations": conversations,
        "tokens_per_s": round(received / elapsed),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
    }


# --- replay ---------------------------------------------------------------------------------------


def fill_outbox(path: str, events: int) -> None:
    """Store ``events`` durable events (user messages) straight through the Writer (synchronous
    OFF, big batches: this is set-up, not the measurement)."""
    writer = Writer(path, synchronous="OFF", outbox_cap=10 * events, outbox_ttl=1e9)
    try:
        writer.commit_batch([ops.CreateConversation(
            conversation_id="fill", title=None, is_temporal=False, system_prompt="s")])
        message = UserMessage(content=[Text(body="x" * 100)])
        done = 0
        while writer.next_seq - 1 < events:
            n = min(1000, events - writer.next_seq + 1)
            writer.commit_batch([
                ops.AppendUserMessage(conversation_id="fill", message_id=f"m{done + i}",
                                      message=message)
                for i in range(n)
            ])
            done += n
    finally:
        writer.close()


def fill_closed_turns(path: str, turns: int) -> None:
    """Store ``turns`` closed turns straight through the Writer (set-up, as :func:`fill_outbox`),
    3 durable events each: the user message, an ``error`` "interrupted by restart" and
    ``touched``. Closed here because a message left queued is answered by the server after its
    start-up (issue 26) and a replay would race those answers; before issue 26 the start-up
    itself closed them with the same two events."""
    writer = Writer(path, synchronous="OFF", outbox_cap=10 * turns, outbox_ttl=1e9)
    try:
        writer.commit_batch([ops.CreateConversation(
            conversation_id="fill", title=None, is_temporal=False, system_prompt="s")])
        message = UserMessage(content=[Text(body="x" * 100)])
        for first in range(0, turns, 500):
            batch: list[ops.AnyOp] = []
            for i in range(first, min(first + 500, turns)):
                error = Error(message="interrupted by restart", code="restart", turn_id=f"m{i}")
                batch += [ops.AppendUserMessage(conversation_id="fill", message_id=f"m{i}",
                                                message=message),
                          ops.FinishTurn(conversation_id="fill", turn_id=f"m{i}",
                                         error=(f"e{i}", error))]
            writer.commit_batch(batch)
    finally:
        writer.close()


async def count_sse_events(response: httpx2.Response, last_id: bytes) -> int:
    """Count ``id:`` lines until the frame whose id is ``last_id`` (bytes-level, cheap)."""
    count = 0
    tail = b"\n"  # the stream starts at a line start
    needle = b"\nid: " + last_id + b"\n"
    async for data in response.aiter_bytes():
        # The 4-byte tail is shorter than b"\nid: ", so every match counted ends in `data`.
        count += (tail[-4:] + data).count(b"\nid: ")
        if needle in tail + data:
            return count
        tail = (tail + data)[-(len(needle) - 1):]
    raise AssertionError("stream ended early")


async def replay(quick: bool) -> dict[str, Any]:
    """SSE catch-up from the stored outbox: ``GET /agentik/events?after=<oldest>`` on a server that
    holds N stored events (100k; 20k with --quick; user messages, errors and touched events),
    until the last one arrives. Median of 3 reads."""
    events = 20_000 if quick else 100_000
    samples: list[float] = []
    async with open_scripted_openai() as scripted:
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "r.db")
            await trio.to_thread.run_sync(fill_closed_turns, path, events // 3)
            async with (
                spawn_server(path, openai_base_url=scripted.base_url,
                             env={"AGENTIK_OUTBOX_CAP": str(10 * events)}) as server,
                httpx2.AsyncClient(base_url=server.url, timeout=TIMEOUT) as client,
            ):
                cursor = (await client.get("/agentik/cursor")).json()
                oldest, current = cursor["oldest"], cursor["current"]
                events = int(current.split(":")[1]) - int(oldest.split(":")[1])
                for _ in range(3):
                    with trio.fail_after(300):
                        start = time.perf_counter()
                        async with client.stream("GET", "/agentik/events",
                                                 params={"after": oldest}) as response:
                            got = await count_sse_events(response, current.encode())
                        samples.append(got / (time.perf_counter() - start))
                    assert got == events, (got, events)
    return {"name": "replay", "events": events, "events_per_s": round(statistics.median(samples))}


# --- memory ---------------------------------------------------------------------------------------


async def _rss_points(
    server: ServerProcess, n: int, step: int, grow: Callable[[int], Any]
) -> list[tuple[float, float]]:
    points = [(0.0, float(rss_kib(server.pid)))]
    for count in range(step, n + 1, step):
        await grow(step)
        await trio.sleep(0.3)
        points.append((float(count), float(rss_kib(server.pid))))
    return points


async def memory(quick: bool) -> dict[str, Any]:
    """RSS of the server process per idle SSE connection and per live conversation actor: the
    least-squares slope over N of each (N = 2,000; 500 with --quick), read from /proc/PID/statm
    of the server subprocess so that client memory does not count. A fresh server for each
    (memory freed by one would be reused by the other and hide it)."""
    n = 500 if quick else 2_000
    step = n // 4
    with trio.fail_after(600):
        sse = await _memory_slope("sse", n, step)
        actors = await _memory_slope("actors", n, step)
    return {"name": "memory", "connections": n, "kib_per_sse": round(sse, 2),
            "kib_per_actor": round(actors, 2)}


async def _memory_slope(what: str, n: int, step: int) -> float:
    async with open_scripted_openai() as scripted:
        with tempfile.TemporaryDirectory() as tmp:
            async with (
                spawn_server(str(Path(tmp) / "m.db"), openai_base_url=scripted.base_url) as server,
                httpx2.AsyncClient(base_url=server.url, timeout=TIMEOUT, limits=UNLIMITED) as client,
                trio.open_nursery() as holders,
            ):
                release = trio.Event()

                async def hold(task_status: trio.TaskStatus[None]) -> None:
                    async with open_sse(client, "/agentik/events"):
                        task_status.started()
                        await release.wait()

                async def open_streams(k: int) -> None:
                    for _ in range(k):
                        await holders.start(hold)

                async def create_actors(k: int) -> None:
                    async with trio.open_nursery() as nursery:
                        for _ in range(20):
                            nursery.start_soon(_create_many, client, k // 20)

                grow = open_streams if what == "sse" else create_actors
                # Warm up code paths so the first step does not pay for imports and caches.
                await create_actors(20)
                await open_streams(10)
                points = await _rss_points(server, n, step, grow)
                release.set()
    return slope(points)


async def _create_many(client: httpx2.AsyncClient, k: int) -> None:
    for _ in range(k):
        await _create(client)


# --- stalled_subscriber ---------------------------------------------------------------------------


async def stalled_subscriber(quick: bool) -> dict[str, Any]:
    """Throughput of one SSE subscriber of ``/agentik/events`` while 32 writers rename a
    conversation as fast as the server takes it: alone, next to a second subscriber that
    connects and then never reads, and next to a second subscriber that reads everything.
    Phases alternate; ratios of medians. ``throughput_ratio`` is stalled vs alone;
    ``second_reader_ratio`` (a healthy second reader vs alone) tells what any second subscriber
    costs the server, stalled or not."""
    duration = 2.0 if quick else 3.0
    rounds = 2 if quick else 5
    rates: dict[str, list[float]] = {"none": [], "stalled": [], "reading": []}
    async with open_scripted_openai() as scripted:
        with tempfile.TemporaryDirectory() as tmp:
            async with (
                spawn_server(str(Path(tmp) / "s.db"), openai_base_url=scripted.base_url) as server,
                httpx2.AsyncClient(base_url=server.url, timeout=TIMEOUT, limits=UNLIMITED) as client,
            ):
                cid = await _create(client)
                for _ in range(rounds):
                    for second in rates:
                        rates[second].append(
                            await _subscriber_rate(client, cid, duration, second=second)
                        )
    alone = statistics.median(rates["none"])
    stalled = statistics.median(rates["stalled"])
    reading = statistics.median(rates["reading"])
    return {
        "name": "stalled_subscriber",
        "events_per_s": round(alone),
        "stalled_events_per_s": round(stalled),
        "throughput_ratio": round(stalled / alone, 3),
        "second_reader_ratio": round(reading / alone, 3),
    }


WRITERS = 32


async def _subscriber_rate(client: httpx2.AsyncClient, cid: str, duration: float, *,
                           second: str) -> float:
    received = 0
    with trio.fail_after(duration + 60):
        async with trio.open_nursery() as nursery:
            stop = trio.Event()
            ready = trio.Event()

            async def reader() -> None:
                nonlocal received
                async with client.stream("GET", "/agentik/events") as response:
                    ready.set()
                    async for data in response.aiter_bytes():
                        if stop.is_set():
                            return
                        received += data.count(b"\nid: ") + data.startswith(b"id: ")

            async def stalled_reader() -> None:
                async with client.stream("GET", "/agentik/events"):
                    await stop.wait()  # never reads the body

            async def other_reader() -> None:
                async with client.stream("GET", "/agentik/events") as response:
                    async for _ in response.aiter_bytes():
                        if stop.is_set():
                            return

            async def writer(w: int) -> None:
                i = 0
                while not stop.is_set():
                    await client.patch(f"/agentik/conversations/{cid}", json={"title": f"{w}-{i}"})
                    i += 1

            nursery.start_soon(reader)
            if second == "stalled":
                nursery.start_soon(stalled_reader)
            elif second == "reading":
                nursery.start_soon(other_reader)
            await ready.wait()
            await trio.sleep(0.2)
            for w in range(WRITERS):
                nursery.start_soon(writer, w)
            await trio.sleep(duration)
            stop.set()
            nursery.cancel_scope.cancel()
    return received / duration


__all__ = [
    "Step",
    "fanout_tokens",
    "memory",
    "replay",
    "stalled_subscriber",
    "turn_overhead_ttft",
]
