"""``concurrency``: N fresh conversations, one ``slow 50`` turn each (50 tokens 50 ms apart) started
at once, each watched on its live SSE stream, next to the same N turns sent straight to the
scripted model server, in the same run (issue 13).

The load generator runs in :data:`PROCESSES` worker processes (``python -m benchmarks.concurrency
MODE URL COUNT TOKENS``; one Python process is itself the limit from N=200: httpcore scans every
pooled connection per request). Each worker sets up (conversations created, live streams open),
says ``ready``, waits for ``go`` on stdin, starts its turns at once and prints one JSON line of
per-turn figures (``time.monotonic()`` is system-wide, so the parent puts them on one time axis).

Both sides are read the same way: a raw ``httpx2`` streaming read (``aiter_raw``: one item per
socket read), SSE frames split at byte level, each frame's JSON decoded by one msgspec Struct
decoder. The direct side does not use the openai SDK: it builds a pydantic chunk per token and was
itself the limit, so the ratio compared agentik with the SDK, not with the model server.

Gaps are **per read**: the time between two socket reads of one stream that carried at least one
token (frames that arrive in one read share one timestamp; ``tokens_per_read`` says how many there
were). A server that coalesces queued tokens into one write shows fewer, longer gaps, honestly.

The server's CPU comes from ``/proc/PID/stat`` of the ``agentik serve`` process (its one trio
worker), from ``go`` until every worker is done (conversation creation and opening the live
streams not counted). The split into per-token and per-turn CPU is a line through two loads of the
same N: ``slow 50`` and ``slow 200`` turns; ``cpu_us_per_token`` is the slope (ΔCPU / Δtokens),
``cpu_ms_per_turn`` the intercept (CPU at zero tokens / N). Both raw figures are in the row.
``cpu_ms_per_turn_sequential`` is the older probe: sequential one-token turns (start, one token,
end) on a fresh conversation each.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
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
#: the second token count of the CPU split (same N, same pace)
LONG_TOKENS = 200
DELAY = 0.05
#: a worker's bound on its whole load (N=500 x slow 200 is 100k tokens: over a minute here)
WORKER_TIMEOUT = 600
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
    """``slow T``: T one-word tokens 50 ms apart; ``one`` (a turn-start probe): one token."""
    last = str(body["messages"][-1].get("content", ""))
    if "one" in last:
        return Reply(["t "])
    words = last.split()
    tokens = int(words[-1]) if len(words) == 2 and words[-1].isdigit() else TOKENS
    return Reply([f"t{i} " for i in range(tokens)], chunk_delay=DELAY)


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
    end: float = 0.0  # turn over (``end`` event / ``[DONE]``)
    tokens: int = 0
    reads: int = 0  # socket reads that carried at least one token
    gaps: list[float] = []  # seconds between consecutive such reads


class _Text(msgspec.Struct):
    text: str = ""


class _Live(msgspec.Struct):
    """An agentik live frame's data (``append_text``: ``event.text``)."""

    event: _Text


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta


class _Chunk(msgspec.Struct):
    """A chat.completion.chunk (only what is counted)."""

    choices: list[_Choice] = []


_LIVE = msgspec.json.Decoder(_Live)
_CHUNK = msgspec.json.Decoder(_Chunk)
_APPEND_TEXT = b"event: append_text\n"
_END = b"event: end\n"


def _words(text: str) -> int:
    return len(text.split())


def _agentik_tokens(frame: bytes) -> int | None:
    """Tokens in one live frame; None for the turn's ``end``."""
    if frame.startswith(_APPEND_TEXT):
        return _words(_LIVE.decode(frame[frame.index(b"data:") + 5:]).event.text)
    if frame.startswith(_END):
        return None
    return 0


def _direct_tokens(frame: bytes) -> int | None:
    """Tokens in one chat-completions frame; None for ``[DONE]``."""
    if not frame.startswith(b"data:"):
        return 0
    data = frame[5:].strip()
    if data == b"[DONE]":
        return None
    choices = _CHUNK.decode(data).choices
    return _words(choices[0].delta.content or "") if choices else 0


class _Frames:
    """SSE frames (``\\n\\n``-terminated) out of raw socket reads."""

    def __init__(self, reads: AsyncIterator[bytes]) -> None:
        self.reads = reads
        self.rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        *frames, self.rest = (self.rest + data).split(b"\n\n")
        return frames


async def _read_turn(frames: _Frames, turn: _Turn, tokens_of: Callable[[bytes], int | None]) -> None:
    last = 0.0
    async for data in frames.reads:
        now = time.monotonic()
        n = 0
        done = False
        for frame in frames.feed(data):
            got = tokens_of(frame)
            if got is None:
                done = True
                break
            n += got
        if n:
            if turn.tokens == 0:
                turn.first = now
            else:
                turn.gaps.append(now - last)
            last = now
            turn.tokens += n
            turn.reads += 1
        if done:
            turn.end = time.monotonic()
            return
    raise RuntimeError("stream ended before the turn did")


async def _agentik_turns(url: str, count: int, tokens: int, go: trio.Event) -> list[_Turn]:
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
                frames = _Frames(response.aiter_raw())
                connected = False
                async for data in frames.reads:  # wait for ": connected"
                    if any(f.startswith(b":") for f in frames.feed(data)):
                        connected = True
                        break
                assert connected
                ready.release()
                await go.wait()
                turn = _Turn(sent=time.monotonic())
                turns.append(turn)
                reply = await client.post(
                    f"/agentik/conversations/{cid}/messages",
                    json={"content": [{"type": "text", "body": f"slow {tokens}"}]},
                )
                assert reply.status_code == 202, reply.text
                await _read_turn(frames, turn, _agentik_tokens)

        async with trio.open_nursery() as nursery:
            for cid in cids:
                nursery.start_soon(one, cid)
            for _ in cids:
                await ready.acquire()
            print("ready", flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)
            go.set()
    return turns


async def _direct_turns(url: str, count: int, tokens: int, go: trio.Event) -> list[_Turn]:
    """The same turns straight to the model server: a raw streaming POST (no SDK)."""
    turns: list[_Turn] = []
    body = {
        "model": "m", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"slow {tokens}"}],
    }
    headers = {"Authorization": "Bearer k"}
    async with httpx2.AsyncClient(base_url=url, timeout=60.0, limits=UNLIMITED) as client:

        async def one() -> None:
            await go.wait()
            turn = _Turn(sent=time.monotonic())
            turns.append(turn)
            async with client.stream("POST", "/chat/completions", json=body,
                                     headers=headers) as response:
                assert response.status_code == 200
                await _read_turn(_Frames(response.aiter_raw()), turn, _direct_tokens)

        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(one)
            print("ready", flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)
            go.set()
    return turns


async def _worker(mode: str, url: str, count: int, tokens: int) -> None:
    go = trio.Event()
    with trio.fail_after(WORKER_TIMEOUT):
        run = _agentik_turns if mode == "agentik" else _direct_turns
        turns = await run(url, count, tokens, go)
    print(msgspec.json.encode(turns).decode(), flush=True)


# --- the parent -----------------------------------------------------------------------------------


def _spawn_worker(mode: str, url: str, count: int, tokens: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.concurrency", mode, url, str(count), str(tokens)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=str(REPO), text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


class _Load(msgspec.Struct):
    turns: list[_Turn]
    go: float
    done: float
    cpu: float  # server CPU seconds from go until every worker was done (0 without a pid)


async def _load(mode: str, url: str, n: int, tokens: int, pid: int | None = None) -> _Load:
    """Run ``n`` turns of ``tokens`` tokens split over PROCESSES workers."""
    counts = [n // PROCESSES + (1 if i < n % PROCESSES else 0) for i in range(PROCESSES)]
    procs = [_spawn_worker(mode, url, c, tokens) for c in counts if c]
    try:
        with trio.fail_after(WORKER_TIMEOUT + 60):
            for p in procs:
                assert p.stdout is not None
                line = await trio.to_thread.run_sync(p.stdout.readline)
                assert line.strip() == "ready", line
            cpu = cpu_seconds(pid) if pid else 0.0
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
            cpu = cpu_seconds(pid) - cpu if pid else 0.0
            return _Load(turns, go, max(t.end for t in turns), cpu)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def _figures(load: _Load) -> dict[str, float]:
    turns = load.turns
    tokens = sum(t.tokens for t in turns)
    ttft = [(t.first - t.sent) * 1000 for t in turns if t.tokens]
    gaps = [g * 1000 for t in turns for g in t.gaps]
    return {
        "tokens_per_s": tokens / (load.done - load.go),
        "tokens": tokens,
        "tokens_per_read": tokens / max(1, sum(t.reads for t in turns)),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "gap_p50_ms": percentile(gaps, 50),
        "gap_p99_ms": percentile(gaps, 99),
    }


def cpu_split(n: int, short: tuple[float, int], long: tuple[float, int]) -> tuple[float, float]:
    """(µs per token, ms per turn) from two loads of ``n`` turns, each (CPU seconds, tokens): the
    slope and the intercept of the line through them."""
    (cpu_a, tokens_a), (cpu_b, tokens_b) = short, long
    per_token = (cpu_b - cpu_a) / max(1, tokens_b - tokens_a)
    per_turn = (cpu_a - per_token * tokens_a) / n
    return per_token * 1e6, per_turn * 1e3


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
    server's CPU per token and per turn start (the slope and intercept over two token counts)."""
    loads = [20, 200] if quick else [20, 100, 200, 500]
    row: dict[str, Any] = {"name": "concurrency"}
    async with trio.open_nursery() as nursery:
        scripted = await _scripted(nursery)
        with tempfile.TemporaryDirectory() as tmp:
            async with (
                spawn_server(str(Path(tmp) / "c.db"), openai_base_url=scripted.base_url) as server,
                httpx2.AsyncClient(base_url=server.url, timeout=60.0) as client,
            ):
                sequential = await _turn_start_cpu(client, server.pid, 10 if quick else 30)
                per_token: list[float] = []
                per_turn: list[float] = []
                for n in loads:
                    overflows = _listen_overflows()
                    direct = await _load("direct", scripted.base_url, n, TOKENS)
                    d = _figures(direct)
                    via = await _load("agentik", server.url, n, TOKENS, server.pid)
                    a = _figures(via)
                    long = await _load("agentik", server.url, n, LONG_TOKENS, server.pid)
                    long_tokens = sum(t.tokens for t in long.turns)
                    us_token, ms_turn = cpu_split(n, (via.cpu, int(a["tokens"])),
                                                  (long.cpu, long_tokens))
                    per_token.append(us_token)
                    per_turn.append(ms_turn)
                    row[f"n{n}"] = {
                        "tokens_per_s": round(a["tokens_per_s"]),
                        "direct_tokens_per_s": round(d["tokens_per_s"]),
                        "ratio": round(a["tokens_per_s"] / d["tokens_per_s"], 3),
                        "ttft_p50_ms": round(a["ttft_p50_ms"], 1),
                        "ttft_p99_ms": round(a["ttft_p99_ms"], 1),
                        "direct_ttft_p50_ms": round(d["ttft_p50_ms"], 1),
                        "direct_ttft_p99_ms": round(d["ttft_p99_ms"], 1),
                        "gap_per_read_p50_ms": round(a["gap_p50_ms"], 1),
                        "gap_per_read_p99_ms": round(a["gap_p99_ms"], 1),
                        "direct_gap_per_read_p50_ms": round(d["gap_p50_ms"], 1),
                        "direct_gap_per_read_p99_ms": round(d["gap_p99_ms"], 1),
                        "tokens_per_read": round(a["tokens_per_read"], 2),
                        "direct_tokens_per_read": round(d["tokens_per_read"], 2),
                        "cpu_us_per_token": round(us_token),
                        "cpu_ms_per_turn": round(ms_turn, 2),
                        f"cpu_s_{TOKENS}": round(via.cpu, 2),
                        f"tokens_{TOKENS}": int(a["tokens"]),
                        f"cpu_s_{LONG_TOKENS}": round(long.cpu, 2),
                        f"tokens_{LONG_TOKENS}": long_tokens,
                        "lost_tokens": n * (TOKENS + LONG_TOKENS) - int(a["tokens"]) - long_tokens,
                        "direct_lost_tokens": n * TOKENS - int(d["tokens"]),
                        "listen_overflows": _listen_overflows() - overflows,
                    }
                row["cpu_us_per_token"] = round(statistics.median(per_token))
                row["cpu_ms_per_turn"] = round(statistics.median(per_turn), 2)
                row["cpu_ms_per_turn_sequential"] = round(sequential, 2)
        nursery.cancel_scope.cancel()
    return row


if __name__ == "__main__":
    trio.run(_worker, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
