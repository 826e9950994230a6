"""``concurrency``: N fresh conversations, one ``slow 50`` turn each (50 tokens 50 ms apart) started
at once, each watched on its live SSE stream, next to the same N turns sent straight to the
scripted model server with the openai SDK, in the same run (issue 13).

The load generator runs in :data:`PROCESSES` worker processes (``python -m benchmarks.concurrency
WORKER-ARGS``; one Python process is itself the limit from N=200: httpcore scans every pooled
connection per request). Each worker sets up (conversations created, live streams open), says
``ready``, waits for ``go`` on stdin, starts its turns at once and prints one JSON line of
per-turn figures (``time.monotonic()`` is system-wide, so the parent puts them on one time axis).

The server's CPU comes from ``/proc/PID/stat`` of the ``agentik serve`` process (its one trio
worker): ``cpu_ms_per_turn`` from sequential one-token turns on a fresh conversation each (start,
one token, end), ``cpu_us_per_token`` from the N-turn load minus N turn starts.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import msgspec
import trio

from benchmarks.serverproc import REPO, spawn_server
from tests.scripted_openai import Reply, ScriptedOpenAI

PROCESSES = 4
TOKENS = 50
DELAY = 0.05
TICK = os.sysconf("SC_CLK_TCK")
UNLIMITED = httpx2.Limits(max_connections=None, max_keepalive_connections=None)


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads) in seconds, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no samples."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def slow_reply(body: dict[str, Any]) -> Reply:
    """``slow 50``: 50 one-word tokens 50 ms apart; ``one`` (a turn-start probe): one token."""
    last = str(body["messages"][-1].get("content", ""))
    if "one" in last:
        return Reply(["t "])
    return Reply([f"t{i} " for i in range(TOKENS)], chunk_delay=DELAY)


async def _scripted(nursery: trio.Nursery) -> ScriptedOpenAI:
    import hypercorn.config
    import hypercorn.trio

    server = ScriptedOpenAI()
    server.callable_default = slow_reply  # type: ignore[assignment]
    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 0.2
    config.backlog = 2048  # hypercorn's 100 overflows when 500 clients connect at once
    binds: list[str] = await nursery.start(partial(hypercorn.trio.serve, server.app, config))
    server.base_url = binds[0].rstrip("/") + "/v1"
    return server


# --- the worker process ---------------------------------------------------------------------------


class _Turn(msgspec.Struct):
    sent: float  # monotonic seconds when the request went out
    first: float = 0.0  # first token received
    end: float = 0.0  # turn over (``end`` event / stream done)
    tokens: int = 0
    gaps: list[float] = []  # seconds between consecutive token deliveries


def _words(text: str) -> int:
    return len(text.split())


async def _agentik_turns(url: str, count: int, go: trio.Event) -> list[_Turn]:
    turns: list[_Turn] = []
    async with httpx2.AsyncClient(base_url=url, timeout=60.0, limits=UNLIMITED) as client:
        cids = []
        for _ in range(count):
            response = await client.post("/agentik/conversations", json={})
            assert response.status_code == 201, response.text
            cids.append(str(response.json()["id"]))
        ready = trio.Semaphore(0)

        async def one(cid: str) -> None:
            async with client.stream("GET", f"/agentik/conversations/{cid}/live") as response:
                assert response.status_code == 200
                lines = response.aiter_lines()
                async for line in lines:  # wait for ": connected"
                    if line.startswith(":"):
                        break
                ready.release()
                await go.wait()
                turn = _Turn(sent=time.monotonic())
                turns.append(turn)
                reply = await client.post(f"/agentik/conversations/{cid}/messages",
                                          json={"content": [{"type": "text", "body": "slow 50"}]})
                assert reply.status_code == 202, reply.text
                event = ""
                last = 0.0
                async for line in lines:
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:") and event == "append_text":
                        now = time.monotonic()
                        n = _words(msgspec.json.decode(line[5:])["event"]["text"])
                        if n:
                            if turn.tokens == 0:
                                turn.first = now
                            else:
                                turn.gaps.append(now - last)
                            last = now
                            turn.tokens += n
                    elif line.startswith("data:") and event == "end":
                        turn.end = time.monotonic()
                        return

        async with trio.open_nursery() as nursery:
            for cid in cids:
                nursery.start_soon(one, cid)
            for _ in cids:
                await ready.acquire()
            print("ready", flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)
            go.set()
    return turns


async def _direct_turns(url: str, count: int, go: trio.Event) -> list[_Turn]:
    import openai

    turns: list[_Turn] = []
    async with (
        httpx2.AsyncClient(timeout=60.0, limits=UNLIMITED) as http,
        openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0, http_client=http) as sdk,
    ):

        async def one() -> None:
            await go.wait()
            turn = _Turn(sent=time.monotonic())
            turns.append(turn)
            stream = await sdk.chat.completions.create(
                model="m", stream=True, messages=[{"role": "user", "content": "slow 50"}],
                stream_options={"include_usage": True},
            )
            last = 0.0
            async with stream:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        now = time.monotonic()
                        if turn.tokens == 0:
                            turn.first = now
                        else:
                            turn.gaps.append(now - last)
                        last = now
                        turn.tokens += _words(chunk.choices[0].delta.content)
            turn.end = time.monotonic()

        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(one)
            print("ready", flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)
            go.set()
    return turns


async def _worker(mode: str, url: str, count: int) -> None:
    go = trio.Event()
    with trio.fail_after(120):
        run = _agentik_turns if mode == "agentik" else _direct_turns
        turns = await run(url, count, go)
    print(msgspec.json.encode(turns).decode(), flush=True)


# --- the parent -----------------------------------------------------------------------------------


def _spawn_worker(mode: str, url: str, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.concurrency", mode, url, str(count)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=str(REPO), text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


async def _load(mode: str, url: str, n: int) -> tuple[list[_Turn], float, float]:
    """Run ``n`` turns split over PROCESSES workers; (turns, go time, all-done time)."""
    counts = [n // PROCESSES + (1 if i < n % PROCESSES else 0) for i in range(PROCESSES)]
    procs = [_spawn_worker(mode, url, c) for c in counts if c]
    try:
        with trio.fail_after(120):
            for p in procs:
                assert p.stdout is not None
                line = await trio.to_thread.run_sync(p.stdout.readline)
                assert line.strip() == "ready", line
            go = time.monotonic()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            turns: list[_Turn] = []
            for p in procs:
                assert p.stdout is not None
                out = await trio.to_thread.run_sync(p.stdout.read)
                turns += msgspec.json.decode(out.strip().splitlines()[-1], type=list[_Turn])
            return turns, go, max(t.end for t in turns)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def _figures(turns: list[_Turn], go: float, done: float) -> dict[str, float]:
    tokens = sum(t.tokens for t in turns)
    ttft = [(t.first - t.sent) * 1000 for t in turns if t.tokens]
    gaps = [g * 1000 for t in turns for g in t.gaps]
    return {
        "tokens_per_s": tokens / (done - go),
        "tokens": tokens,
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "gap_p50_ms": percentile(gaps, 50),
        "gap_p99_ms": percentile(gaps, 99),
    }


def _listen_overflows() -> int:
    """TcpExtListenOverflows from /proc/net/netstat (the whole machine; a difference is used)."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=True))
            return int(table.get("ListenOverflows", 0))
    return 0


async def _turn_start_cpu(client: httpx2.AsyncClient, pid: int, turns: int) -> float:
    """Server CPU ms per sequential one-token turn on a fresh conversation (create not counted)."""
    cpu = 0.0
    for _ in range(turns):
        response = await client.post("/agentik/conversations", json={})
        cid = str(response.json()["id"])
        async with client.stream("GET", f"/agentik/conversations/{cid}/live") as live:
            lines = live.aiter_lines()
            async for line in lines:
                if line.startswith(":"):
                    break
            before = cpu_seconds(pid)
            reply = await client.post(f"/agentik/conversations/{cid}/messages",
                                      json={"content": [{"type": "text", "body": "one"}]})
            assert reply.status_code == 202, reply.text
            async for line in lines:
                if line.startswith("event: end"):
                    break
            cpu += cpu_seconds(pid) - before
    return cpu / turns * 1000


async def concurrency(quick: bool) -> dict[str, Any]:
    """The ``concurrency`` row: per N, agentik vs direct tokens/s, ratio, TTFT and gaps, and the
    server's CPU per token and per turn start."""
    loads = [20, 200] if quick else [20, 100, 200, 500]
    row: dict[str, Any] = {"name": "concurrency"}
    async with trio.open_nursery() as nursery:
        scripted = await _scripted(nursery)
        with tempfile.TemporaryDirectory() as tmp:
            async with (
                spawn_server(str(Path(tmp) / "c.db"), openai_base_url=scripted.base_url) as server,
                httpx2.AsyncClient(base_url=server.url, timeout=60.0) as client,
            ):
                per_turn = await _turn_start_cpu(client, server.pid, 10 if quick else 30)
                row["cpu_ms_per_turn"] = round(per_turn, 2)
                per_token: list[float] = []
                for n in loads:
                    overflows = _listen_overflows()
                    direct, go, done = await _load("direct", scripted.base_url, n)
                    d = _figures(direct, go, done)
                    before = cpu_seconds(server.pid)
                    via, go, done = await _load("agentik", server.url, n)
                    cpu = cpu_seconds(server.pid) - before
                    a = _figures(via, go, done)
                    tokens = int(a["tokens"])
                    per_token.append((cpu * 1000 - n * per_turn) / max(1, tokens - n) * 1000)
                    row[f"n{n}"] = {
                        "tokens_per_s": round(a["tokens_per_s"]),
                        "direct_tokens_per_s": round(d["tokens_per_s"]),
                        "ratio": round(a["tokens_per_s"] / d["tokens_per_s"], 3),
                        "ttft_p50_ms": round(a["ttft_p50_ms"], 1),
                        "ttft_p99_ms": round(a["ttft_p99_ms"], 1),
                        "direct_ttft_p50_ms": round(d["ttft_p50_ms"], 1),
                        "direct_ttft_p99_ms": round(d["ttft_p99_ms"], 1),
                        "gap_p50_ms": round(a["gap_p50_ms"], 1),
                        "gap_p99_ms": round(a["gap_p99_ms"], 1),
                        "direct_gap_p99_ms": round(d["gap_p99_ms"], 1),
                        "cpu_us_per_token": round(per_token[-1]),
                        "lost_tokens": n * TOKENS - tokens,
                        "listen_overflows": _listen_overflows() - overflows,
                    }
                row["cpu_us_per_token"] = round(statistics.median(per_token))
        nursery.cancel_scope.cancel()
    return row


if __name__ == "__main__":
    trio.run(_worker, sys.argv[1], sys.argv[2], int(sys.argv[3]))
