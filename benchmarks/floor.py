"""``stack_floor``: what the stack under agentik costs by itself, in the same run as the rows that
are judged against it (issue 13's goals of server CPU per streamed token and per turn start).

- **write floor**: server CPU per SSE frame of a bare ASGI app under ``hypercorn -k trio``
  (``benchmarks/floor_app.py``: one ``send`` per frame, 50 ms apart, the bytes of one agentik
  ``append_text`` frame), N streams at once, the slope through two loads (50 and 200 frames a
  stream) as in the ``concurrency`` row;
- **read floor**: the CPU per frame of the process reading those N streams with ``httpx2``
  (``aiter_raw``, frames counted at byte level) — what agentik pays to read each token of a model
  stream, before any parsing;
- **request floors**: server CPU per sequential ``GET /ping`` on the bare ASGI app and on a
  quart-trio app, and the client's CPU per request with ``httpx2``.

A token through agentik is at least one read of the model's stream and one write to each
watching client; a turn start at least one request in, one request out to the model, and the
first frames. The sum of the floors is what no agentik code can go below on this stack and
machine.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import trio

from benchmarks.concurrency import UNLIMITED, cpu_seconds
from benchmarks.serverproc import REPO, free_port


@asynccontextmanager
async def _hypercorn(app: str) -> AsyncIterator[tuple[str, int]]:
    """``hypercorn -k trio -w 0`` (one process: the one whose CPU is read) serving ``app``."""
    port = free_port()
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "hypercorn", "-k", "trio", "-w", "0", "--backlog", "1024",
         "-b", f"127.0.0.1:{port}", app], cwd=str(REPO))
    url = f"http://127.0.0.1:{port}"
    try:
        with trio.fail_after(30):
            async with httpx2.AsyncClient(timeout=2.0) as client:
                while True:
                    try:
                        if (await client.get(url + "/ping")).status_code == 200:
                            break
                    except httpx2.TransportError:
                        await trio.sleep(0.05)
        yield url, process.pid
    finally:
        process.terminate()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await process.wait()
        process.kill()


async def _streams(url: str, n: int, frames: int) -> int:
    got = 0
    async with httpx2.AsyncClient(limits=UNLIMITED, timeout=120) as client:
        async def one() -> None:
            nonlocal got
            async with client.stream("GET", f"{url}/stream?n={frames}") as response:
                async for chunk in response.aiter_raw():
                    got += chunk.count(b"\n\n")

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
    assert got == n * frames, (got, n * frames)
    return got


async def _frame_floor(n: int) -> tuple[float, float]:
    """(server, reader) CPU µs per frame: slopes through loads of 50 and 200 frames a stream."""
    async with _hypercorn("benchmarks.floor_app:raw") as (url, pid):
        points: dict[int, list[tuple[float, float, int]]] = {50: [], 200: []}
        for frames in (50, 200, 50, 200):
            server0, reader0 = cpu_seconds(pid), time.process_time()
            got = await _streams(url, n, frames)
            points[frames].append((cpu_seconds(pid) - server0, time.process_time() - reader0, got))
    short = [statistics.median(p[i] for p in points[50]) for i in range(3)]
    long = [statistics.median(p[i] for p in points[200]) for i in range(3)]
    per = 1e6 / (long[2] - short[2])
    return (long[0] - short[0]) * per, (long[1] - short[1]) * per


async def _request_floor(app: str, requests: int) -> tuple[float, float]:
    """(server, client) CPU ms per sequential ``GET /ping``."""
    async with _hypercorn(app) as (url, pid), httpx2.AsyncClient(base_url=url) as client:
        for _ in range(20):  # warm up: imports, caches, the connection
            await client.get("/ping")
        server0, client0 = cpu_seconds(pid), time.process_time()
        for _ in range(requests):
            (await client.get("/ping")).raise_for_status()
        return ((cpu_seconds(pid) - server0) / requests * 1e3,
                (time.process_time() - client0) / requests * 1e3)


async def stack_floor(quick: bool) -> dict[str, Any]:
    n = 100 if quick else 200
    requests = 200 if quick else 500
    write, read = await _frame_floor(n)
    raw_ms, client_ms = await _request_floor("benchmarks.floor_app:raw", requests)
    quart_ms, _ = await _request_floor("benchmarks.floor_app:framework", requests)
    return {
        "name": "stack_floor",
        "streams": n,
        "write_us_per_frame": round(write),
        "read_us_per_frame": round(read),
        "token_floor_us": round(write + read),
        "raw_request_server_ms": round(raw_ms, 2),
        "quart_request_server_ms": round(quart_ms, 2),
        "httpx2_request_client_ms": round(client_ms, 2),
    }
