"""Bearer-token auth on and off, ?access_token= only on SSE and WebSocket, and the request log
(one line per request, client id, never a token)."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import logging
from typing import Any

import httpx2
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from agentik.web.auth import is_valid
from agentik.web.logsafe import escape, safe_query, safe_text
from tests.scripted_openai import ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    WsClient,
    client,
    config,
    make_config,
    no_error_logs,
    open_sse,
    openai,
    serve_app,
    server,
)

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

TOKENS = ("s3cret-one", "s3cret-two")


@pytest.fixture
async def secured(tmp_path: Any, openai: ScriptedOpenAI) -> Any:
    async with serve_app(make_config(tmp_path, openai, tokens=TOKENS)) as srv:
        yield srv


async def test_auth_required_everywhere_but_healthz(secured: Server) -> None:
    async with httpx2.AsyncClient(base_url=secured.url, timeout=10) as http:
        assert (await http.get("/healthz")).status_code == 200
        for path in ("/agentik", "/agentik/cursor", "/agentik/conversations", "/agentik/journal",
                     "/agentik/tools", "/agentik/openapi.json", "/agentik/events"):
            response = await http.get(path)
            assert response.status_code == 401, path
            assert response.json()["error"]["code"] == "unauthorized"
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
        bad = await http.get("/agentik", headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["error"]["message"] == "invalid token"
        basic = await http.get("/agentik", headers={"Authorization": "Basic czNjcmV0LW9uZQ=="})
        assert basic.status_code == 401
        # A body on an unauthorized request is not read (and the connection is not reused).
        posted = await http.post("/agentik/conversations", json={"title": "x"})
        assert posted.status_code == 401

        for token in TOKENS:
            ok = await http.get("/agentik", headers={"Authorization": f"Bearer {token}"})
            assert ok.status_code == 200
        # ?access_token= is for SSE and WebSocket only.
        query = await http.get("/agentik", params={"access_token": TOKENS[0]})
        assert query.status_code == 401


async def test_access_token_on_sse_and_websocket(secured: Server) -> None:
    headers = {"Authorization": f"Bearer {TOKENS[1]}"}
    async with httpx2.AsyncClient(base_url=secured.url, timeout=10, headers=headers) as http:
        cid = (await http.post("/agentik/conversations")).json()["id"]
    async with httpx2.AsyncClient(base_url=secured.url, timeout=10) as http:
        for path in ("/agentik/events", f"/agentik/conversations/{cid}/events",
                     f"/agentik/conversations/{cid}/live"):
            async with open_sse(http, path, params={"access_token": TOKENS[0]}):
                pass
            async with open_sse(http, path, headers=headers):
                pass
            async with open_sse(http, path, params={"access_token": "wrong"}, expect_status=401):
                pass

    with trio.fail_after(10):
        with pytest.raises(ConnectionRejected) as rejected:
            async with open_websocket_url(secured.ws_url):
                pass  # pragma: no cover
        assert rejected.value.status_code == 401
        with pytest.raises(ConnectionRejected):
            async with open_websocket_url(secured.ws_url + "?access_token=wrong"):
                pass  # pragma: no cover
        async with open_websocket_url(secured.ws_url + f"?access_token={TOKENS[0]}") as ws:
            assert (await WsClient(ws).call("list"))["type"] == "reply"
        async with open_websocket_url(
            secured.ws_url, extra_headers=[(b"Authorization", f"Bearer {TOKENS[1]}".encode())]
        ) as ws:
            assert (await WsClient(ws).call("list"))["type"] == "reply"


async def test_auth_off_everything_open(client: httpx2.AsyncClient, server: Server) -> None:
    assert (await client.get("/agentik")).status_code == 200
    # A stray token is ignored when auth is off.
    stray = await client.get("/agentik", headers={"Authorization": "Bearer whatever"})
    assert stray.status_code == 200
    async with open_websocket_url(server.ws_url) as ws:
        assert (await WsClient(ws).call("list"))["type"] == "reply"


async def test_request_log(secured: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agentik.web.access")
    async with httpx2.AsyncClient(base_url=secured.url, timeout=10) as http:
        await http.get(
            "/agentik/cursor",
            headers={"Authorization": f"Bearer {TOKENS[0]}", "X-Client-Id": "ui-7"},
        )
        await http.get("/agentik/cursor", headers={"X-Client-Id": "intruder"})
        async with open_sse(
            http, "/agentik/events",
            params={"access_token": TOKENS[1], "x": "1"}, headers={"X-Client-Id": "sse-1"},
        ):
            pass
    async with open_websocket_url(
        secured.ws_url + f"?access_token={TOKENS[0]}", extra_headers=[(b"X-Client-Id", b"ws-1")]
    ) as ws:
        await WsClient(ws).call("list")
    with trio.fail_after(10):
        await secured.state.wait_open_streams(0)

    lines = [r.getMessage() for r in caplog.records if r.name == "agentik.web.access"]
    assert lines[0].startswith("GET /agentik/cursor 200 client=ui-7 ")
    assert lines[1].startswith("GET /agentik/cursor 401 client=intruder ")
    assert lines[2].startswith("GET /agentik/events?access_token=***&x=1 200 client=sse-1 ")
    assert lines[3].startswith("WS /agentik/ws?access_token=*** 101 client=ws-1 ")
    assert len(lines) == 4
    everything = "\n".join(r.getMessage() for r in caplog.records)
    for token in TOKENS:
        assert token not in everything


def test_helpers() -> None:
    assert is_valid("a", ("b", "a")) and not is_valid("a", ("b",)) and not is_valid("", ("a",))
    assert safe_query("access_token=abc&x=1&ACCESS_TOKEN=d") == (
        "access_token=***&x=1&ACCESS_TOKEN=***"
    )
    assert safe_query("access%5Ftoken=abc;access_token=d&access%255Ftoken=e") == (
        "access%5Ftoken=***;access_token=***&access%255Ftoken=***"
    )
    assert safe_query("x=s%33cret&s3cret", ["s3cret"]) == "x=***&***"
    assert safe_text("/a/s3cret/b", ["s3cret"]) == "/a/***/b"
    assert safe_text("/a/s%33cret", ["s3cret"]) == "***"
    assert escape("a\nb\r\x1b\u2028\\") == "a\\nb\\r\\x1b\\u2028\\\\"
