"""Issue 11 #6 and #7: no token in any log line, in any encoding, and no forged log line.
A real hypercorn with auth on; requests are written byte for byte on raw sockets (an HTTP client
would re-encode them); every record the server logs is checked."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote_plus

import pytest
import trio
from trio_websocket import open_websocket_url

from tests.scripted_openai import ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    WsClient,
    make_config,
    no_error_logs,
    openai,
    serve_app,
)

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

TOKEN = "s3cretTok3n"
#: the token with one character percent-encoded, as an attacker (or a careless client) may send it
TOKEN_ENCODED = "s%33cretTok3n"


@pytest.fixture
async def secured(tmp_path: Any, openai: ScriptedOpenAI) -> AsyncIterator[Server]:
    async with serve_app(make_config(tmp_path, openai, tokens=(TOKEN,))) as served:
        yield served


async def raw_request(server: Server, head: str) -> bytes:
    """Send ``head`` (request line + headers, no body), return the status line."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(head.encode("latin-1"))
        data = b""
        with trio.fail_after(10):
            while b"\r\n" not in data:
                chunk = await stream.receive_some(4096)
                assert chunk, data
                data += chunk
    return data.split(b"\r\n", 1)[0]


def _decoded(text: str) -> str:
    for _ in range(5):
        text = unquote_plus(text)
    return text


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "agentik.web.access"]


async def test_no_token_in_any_log_line(
    secured: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="agentik")
    sse_queries = [
        f"access%5Ftoken={TOKEN}",  # the name percent-encoded: the server decodes and accepts it
        f"x=1;access_token={TOKEN}",
        f"access_token={TOKEN}&access_token={TOKEN}",
        f"ACCESS_TOKEN={TOKEN}",
        f"access_token={TOKEN_ENCODED}",
        f"access%255Ftoken={TOKEN}",
        f"x={TOKEN}",
        f"{TOKEN}",
    ]
    for query in sse_queries:
        status = await raw_request(
            secured, f"GET /agentik/events?{query} HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        assert status.startswith(b"HTTP/1.1 "), status
    accepted = await raw_request(
        secured, f"GET /agentik/events?access%5Ftoken={TOKEN} HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert accepted.startswith(b"HTTP/1.1 200"), accepted
    for head in [
        f"GET /agentik/cursor HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n",
        f"GET /agentik/{TOKEN} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n",
        f"GET /agentik/{TOKEN_ENCODED} HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET /agentik/cursor HTTP/1.1\r\nHost: x\r\nX-Client-Id: {TOKEN}\r\n\r\n",
    ]:
        await raw_request(secured, head)
    async with open_websocket_url(secured.ws_url + f"?access%5Ftoken={TOKEN}") as ws:
        assert (await WsClient(ws).call("list"))["type"] == "reply"
    with trio.fail_after(10):
        await secured.state.wait_open_streams(0)
    lines = access_lines(caplog)
    assert len(lines) >= len(sse_queries) + 6, lines
    assert any(line.startswith("WS /agentik/ws?access%5Ftoken=*** 101") for line in lines), lines
    for record in caplog.records:
        message = record.getMessage()
        assert TOKEN not in _decoded(message), message
        assert TOKEN_ENCODED not in message, message


async def test_no_forged_log_line(secured: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="agentik")
    forged = "DELETE%20/agentik/conversations/all%20204%20client=admin"
    for newline in ("%0a", "%0d%0a", "%0d", "%e2%80%a8", "%1b[2K", "%00"):
        status = await raw_request(
            secured, f"GET /x{newline}{forged} HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        assert status.startswith(b"HTTP/1.1 401"), status
    # A control character in X-Client-Id (h11 passes tabs and obs-text through).
    await raw_request(secured, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Client-Id: a\tb\x85c\r\n\r\n")
    lines = access_lines(caplog)
    assert len(lines) == 7, lines
    for line in lines:
        assert line.isprintable(), repr(line)
        assert not line.startswith("DELETE")
    assert lines[0].startswith("GET /x\\nDELETE /agentik/conversations/all 204 client=admin 401 ")
    assert lines[1].startswith("GET /x\\r\\nDELETE")
    assert "client=a\\tb\\x85c" in lines[6], lines[6]
