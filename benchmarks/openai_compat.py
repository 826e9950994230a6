"""The OpenAI-compatible front door's cost: time to first token through ``/v1/chat/completions``
vs agentik's own route, in the same run, against the same server (``agentik serve`` in a
subprocess) and the same scripted model."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import openai
import trio

from benchmarks.serverproc import spawn_server
from benchmarks.web import TIMEOUT, _create, _send, _until
from tests.scripted_openai import Reply, open_scripted_openai
from tests.webutil import open_sse


async def _first_token(stream: Any, start: float) -> float:
    async with stream:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                return (time.perf_counter() - start) * 1000
    raise AssertionError("no token")


async def openai_ttft(quick: bool) -> dict[str, Any]:
    """For each run index, three paths one after the other: agentik's own route (POST send ->
    first ``append_text`` on the conversation's live SSE stream, 10 turns a conversation), the
    openai SDK streaming ``/v1/chat/completions`` with no conversation (a temporary one created,
    seeded and deleted per request: what a stateless client such as Open WebUI does), and the
    same continuing one stored conversation by ``X-Agentik-Conversation-Id`` (one message each,
    no history). ``added_*_p50_ms`` are medians of the paired differences against the own
    route; each path's own median is given too."""
    turns = 40 if quick else 200
    own: list[float] = []
    stateless: list[float] = []
    continued: list[float] = []
    async with open_scripted_openai() as scripted:
        scripted.callable_default = lambda body: Reply(["Hello", " world"])
        with tempfile.TemporaryDirectory() as tmp:
            async with (
                spawn_server(str(Path(tmp) / "t.db"), openai_base_url=scripted.base_url) as server,
                httpx2.AsyncClient(base_url=server.url, timeout=TIMEOUT) as client,
                openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k",
                                   max_retries=0) as sdk,
            ):
                kept = await sdk.chat.completions.with_raw_response.create(
                    model="default", store=True, messages=[{"role": "user", "content": "hi"}])
                headers = {"X-Agentik-Conversation-Id": kept.headers["X-Agentik-Conversation-Id"]}
                for first in range(0, turns, 10):
                    cid = await _create(client)
                    async with open_sse(client, f"/agentik/conversations/{cid}/live") as live:
                        for i in range(first, min(turns, first + 10)):
                            with trio.fail_after(30):
                                start = time.perf_counter()
                                await _send(client, cid, f"question {i}")
                                await _until(live, "append_text")
                                own.append((time.perf_counter() - start) * 1000)
                                await _until(live, "end")
                                message = [{"role": "user", "content": f"question {i}"}]
                                start = time.perf_counter()
                                stream = await sdk.chat.completions.create(
                                    model="default", stream=True, messages=message)
                                stateless.append(await _first_token(stream, start))
                                start = time.perf_counter()
                                stream = await sdk.chat.completions.create(
                                    model="default", stream=True, messages=message,
                                    extra_headers=headers)
                                continued.append(await _first_token(stream, start))

    def added(path: list[float]) -> float:
        return round(statistics.median(p - o for p, o in zip(path, own, strict=True)), 2)

    return {
        "name": "openai_ttft",
        "turns": turns,
        "added_stateless_p50_ms": added(stateless),
        "added_continued_p50_ms": added(continued),
        "own_p50_ms": round(statistics.median(own), 2),
        "stateless_p50_ms": round(statistics.median(stateless), 2),
        "continued_p50_ms": round(statistics.median(continued), 2),
    }
