"""Issue 11 #2: the server closes connections after a response. Idle keep-alive connections close
after ``keep_alive_timeout`` (``AGENTIK_KEEP_ALIVE_TIMEOUT`` for ``agentik serve``), a
``Connection: close`` request is closed right after its response, and long-lived SSE / WebSocket
streams (not idle) stay open. Real ``agentik serve`` process, raw TCP sockets.

The root cause (hypercorn's end-of-request bookkeeping runs inside the app's last ``send()``, which
quart-trio cancels) is described in ``agentik.web.keepalive``."""



from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
import trio_websocket

from tests.test_web_lifespan import env_for, spawn
from tests.webutil import open_sse

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

KEEP_ALIVE = 1.0
SERVE = [sys.executable, "-m", "agentik.cli", "serve", "--port", "0"]


@asynccontextmanager
async def agentik_serve(tmp_path: Path) -> AsyncIterator[str]:
    """``agentik serve`` with AGENTIK_KEEP_ALIVE_TIMEOUT=KEEP_ALIVE; yields its URL; SIGTERM after."""
    env = env_for(tmp_path, AGENTIK_KEEP_ALIVE_TIMEOUT=str(KEEP_ALIVE))
    async with spawn(SERVE, env, tmp_path) as p:
        with trio.fail_after(60):
            url = await p.base_url()
        yield url
        p.process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await p.exit_code() == 0, p.output


async def _request(stream: trio.SocketStream, head: bytes) -> bytes:
    """Send one request head; return the response bytes up to the end of its body."""
    await stream.send_all(head)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, data
        data += chunk
    header, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in header.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = await stream.receive_some(65536)
        assert chunk
        body += chunk
    return header


async def _wait_closed(stream: trio.SocketStream) -> None:
    """Until the server closes the connection (EOF or reset)."""
    try:
        while await stream.receive_some(65536):
            pass
    except trio.BrokenResourceError:
        pass


async def test_idle_keep_alive_and_connection_close_are_closed(tmp_path: Path) -> None:
    async with agentik_serve(tmp_path) as url:
        port = int(url.rsplit(":", 1)[1])

        # 40 clients: one request each on a keep-alive connection, then they sit.
        conns = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(40)]
        for stream in conns:
            header = await _request(stream, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert header.startswith(b"HTTP/1.1 200"), header
        start = trio.current_time()
        with trio.fail_after(KEEP_ALIVE + 1):
            async with trio.open_nursery() as nursery:
                for stream in conns:
                    nursery.start_soon(_wait_closed, stream)
        assert trio.current_time() - start >= KEEP_ALIVE * 0.9  # kept alive until the timeout
        for stream in conns:
            await stream.aclose()

        # Connection: close is closed right after the response, long before the timeout.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        header = await _request(
            stream, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert header.startswith(b"HTTP/1.1 200"), header
        with trio.fail_after(KEEP_ALIVE / 2):
            await _wait_closed(stream)
        await stream.aclose()

        # Refused requests too (401 without a token, an unread body): closed, not left open.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        header = await _request(
            stream,
            b"POST /agentik/nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        )
        assert header.startswith(b"HTTP/1.1 404"), header
        with trio.fail_after(KEEP_ALIVE + 1):
            await _wait_closed(stream)
        await stream.aclose()


async def test_sse_and_websocket_streams_are_not_idle(tmp_path: Path) -> None:
    async with agentik_serve(tmp_path) as url:
        async with httpx2.AsyncClient(base_url=url, timeout=30) as http:
            async with open_sse(http, "/agentik/events") as sse:
                ws_url = "ws" + url.removeprefix("http") + "/agentik/ws"
                async with trio_websocket.open_websocket_url(ws_url) as ws:
                    # Real time must pass here: well past the keep-alive timeout, both streams still
                    # carry data.
                    await trio.sleep(3 * KEEP_ALIVE)
                    created = await http.post("/agentik/conversations")
                    assert created.status_code == 201
                    with trio.fail_after(10):
                        frame = await sse.next_event()
                    assert frame.event == "created", frame
                    await ws.send_message('{"type": "ping", "id": "p1"}')
                    with trio.fail_after(10):
                        reply = await ws.get_message()
                    assert '"p1"' in reply


async def test_a_response_of_known_length_ends_with_its_last_body_message() -> None:
    """agentik.web.keepalive (issue 13): the body message that completes a response with a
    Content-Length is sent as its last one (shielded) and Quart's empty end after it is not
    passed on; a response without a length is passed on message by message."""
    from agentik.web.keepalive import shield_response_end

    sent: list[tuple[str, bytes, bool, bool]] = []

    async def send(message: Any) -> None:
        shielded = True
        try:
            await trio.lowlevel.checkpoint()  # each is sent in a cancelled scope (below)
        except trio.Cancelled:
            shielded = False
            raise
        finally:
            sent.append((message["type"], message.get("body", b""),
                         message.get("more_body", False), shielded))

    async def wrapped(message: Any) -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            await shield_response_end_send(message)

    shield_response_end_send = shield_response_end(send)
    start = {"type": "http.response.start", "status": 202,
             "headers": [(b"content-type", b"application/json"), (b"Content-Length", b"5")]}
    for message in [start,
                    {"type": "http.response.body", "body": b"he", "more_body": True},
                    {"type": "http.response.body", "body": b"llo", "more_body": True},
                    {"type": "http.response.body", "body": b"", "more_body": False}]:
        await wrapped(message)
    assert sent[1:] == [("http.response.body", b"he", True, False),
                        ("http.response.body", b"llo", False, True)]
    sent.clear()
    stream = {"type": "http.response.start", "status": 200, "headers": []}
    for message in [stream,
                    {"type": "http.response.body", "body": b"a", "more_body": True},
                    {"type": "http.response.body", "body": b"", "more_body": False}]:
        await wrapped(message)
    assert sent[1:] == [("http.response.body", b"a", True, False),
                        ("http.response.body", b"", False, True)]
