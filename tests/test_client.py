"""The HTTP client agent on its own: headers, error mapping, the SSE parser, and the whole
library under asyncio (the rest of the client tests run under trio via pytest-trio).

asyncio: the server runs in the test's trio loop; the client scenario runs with ``asyncio.run``
in a worker thread (``trio.to_thread.run_sync``), talking to it over a real socket. The scenario
bounds itself with ``asyncio.timeout`` because a thread cannot be cancelled from trio."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

import pytest
import trio

from agentik.client import (
    AgentikAgent,
    AgentikConnectionError,
    AuthError,
    BackoffPolicy,
    Connected,
    ConversationListCache,
    ConversationListSync,
    JournalSync,
    ReconnectingOutbox,
    ServerError,
    SqliteJournalStore,
)
from agentik.client.errors import error_from_response
from agentik.client.sse import SseFrame, parse_sse
from agentik.config import Config
from agentik.errors import (
    ConversationFailedError,
    InvalidInputError,
    MailboxFullError,
    NotFoundError,
    OutboxGapError,
    RuntimeClosedError,
    StorageError,
    UnauthorizedError,
)
from agentik.wire import AssistantMessageEvent, Cursor, Renamed
from tests.scripted_openai import ScriptedOpenAI
from tests.webutil import Server, serve_app

TIMEOUT = 15


@pytest.fixture
async def server(config: Config) -> AsyncIterator[Server]:
    async with serve_app(config) as served:
        yield served


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: nothing listens there


# --- transport and errors ------------------------------------------------------------------------


async def test_client_id_and_base_url_forms(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentik.web.access")
    with trio.fail_after(TIMEOUT):
        for base in (server.url, server.url + "/", server.url + "/agentik"):
            async with AgentikAgent("test-client-42", base) as agent:
                info = await agent.info()
                assert agent.id == info.id == server.hub.epoch
                assert agent.client_id == "test-client-42"
                assert agent.supports_image_input is not None
    lines = [r.getMessage() for r in caplog.records if r.name == "agentik.web.access"]
    assert lines and all("client=test-client-42" in line for line in lines)


async def test_token(tmp_path: Path, config: Config) -> None:
    with trio.fail_after(TIMEOUT):
        async with serve_app(config.replace(tokens=("good",))) as srv:
            async with AgentikAgent("t", srv.url, token="good") as agent:
                conv = await agent.create_conversation()
                events = agent.outbox.conversation_events(await agent.outbox.current_cursor(), conv.id)
                async with aclosing(events):
                    await conv.rename("x")
                    assert isinstance((await events.__anext__()).event, Renamed)
            for token in (None, "bad"):
                async with AgentikAgent("t", srv.url, token=token) as agent:
                    with pytest.raises(AuthError, match="refused"):
                        await agent.info()
                    with pytest.raises(AuthError):
                        await agent.outbox.events().__anext__()
                    with pytest.raises(AuthError):
                        await agent.online_outbox.online_events(conv.id).__anext__()


async def test_server_down_is_a_connection_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with trio.fail_after(TIMEOUT):
        async with AgentikAgent("t", url, timeout=5) as agent:
            with pytest.raises(AgentikConnectionError, match="cannot reach") as info:
                await agent.create_conversation()
            assert isinstance(info.value, ConnectionError)
            with pytest.raises(AgentikConnectionError):
                await agent.outbox.events().__anext__()


async def test_closed_client_refuses_calls(server: Server) -> None:
    agent = AgentikAgent("t", server.url)
    await agent.close()
    await agent.close()  # idempotent
    with pytest.raises(RuntimeClosedError):
        await agent.info()


def test_error_mapping() -> None:
    def body(code: str, **extra: object) -> bytes:
        import json

        return json.dumps({"error": {"code": code, "message": "m", **extra}}).encode()

    assert isinstance(error_from_response(400, body("invalid_input")), InvalidInputError)
    assert isinstance(error_from_response(401, body("unauthorized")), AuthError)
    assert isinstance(error_from_response(404, body("not_found")), NotFoundError)
    assert isinstance(error_from_response(409, body("conversation_failed")), ConversationFailedError)
    gap = error_from_response(410, body("gap", oldest="e:3", current="e:9"))
    assert isinstance(gap, OutboxGapError)
    assert gap.oldest == Cursor(epoch="e", offset=3) and gap.current == Cursor(epoch="e", offset=9)
    full = error_from_response(429, body("mailbox_full", retry_after=2.5))
    assert isinstance(full, MailboxFullError) and full.retry_after == 2.5
    full = error_from_response(429, b"busy", {"Retry-After": "3"})
    assert isinstance(full, MailboxFullError) and full.retry_after == 3.0
    assert isinstance(error_from_response(503, body("closed")), RuntimeClosedError)
    assert isinstance(error_from_response(503, body("storage")), StorageError)
    odd = error_from_response(500, b"<html>oops</html>")
    assert isinstance(odd, ServerError) and odd.status == 500 and "oops" in str(odd)
    assert isinstance(error_from_response(500, body("config")), ServerError)
    proxy = error_from_response(502, b"<html>bad gateway</html>")
    assert isinstance(proxy, ServerError) and proxy.status == 502
    assert isinstance(error_from_response(503, b"<html>down</html>"), RuntimeClosedError)
    assert isinstance(error_from_response(410, body("gap")), ServerError)  # no cursors


async def test_one_error_map_both_ways() -> None:
    """Every row of agentik.errors.HTTP_ERRORS, raised on the server, comes back to the client as
    the same class, from the answer the server really builds (status, body, headers)."""
    from agentik.errors import HTTP_ERRORS, AgentikError, http_status
    from agentik.web._state import error_response

    def sample(cls: type[AgentikError]) -> AgentikError:
        if cls is OutboxGapError:
            return cls("m", oldest=Cursor(epoch="e", offset=1), current=Cursor(epoch="e", offset=2))
        return cls("m")

    assert AuthError is UnauthorizedError  # one class, two names
    for row in HTTP_ERRORS:
        exc = sample(row.error)
        assert http_status(exc) == row.status
        response = error_response(exc)
        assert response.status_code == row.status
        if row.status in (429, 503):  # come back later: when, the header says
            assert response.headers["Retry-After"] == "1"
        if row.status == 401:
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
        back = error_from_response(row.status, await response.get_data(), response.headers)
        assert type(back) is row.error, (row, back)


# --- SSE parser ----------------------------------------------------------------------------------


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        await trio.lowlevel.checkpoint()
        yield part


async def test_sse_parser_splits_anywhere() -> None:
    raw = (
        b": connected\n\nid: e:1\nevent: a\ndata: {\"x\":1}\n\n"
        b"id: e:2\r\nevent: b\r\ndata: l1\r\ndata: l2\r\n\r\n"
    )
    expected = [
        SseFrame(comment="connected"),
        SseFrame(id="e:1", event="a", data='{"x":1}'),
        SseFrame(id="e:2", event="b", data="l1\nl2"),
    ]
    for size in (1, 2, 3, 7, len(raw)):
        parts = [raw[i : i + size] for i in range(0, len(raw), size)]
        assert [f async for f in parse_sse(_chunks(*parts))] == expected


async def test_sse_parser_drops_a_cut_frame() -> None:
    frames = [f async for f in parse_sse(_chunks(b"id: e:1\ndata: ok\n\nid: e:2\ndata: cu"))]
    assert frames == [SseFrame(id="e:1", data="ok")]


# --- asyncio -------------------------------------------------------------------------------------


async def _asyncio_scenario(url: str, db: str) -> list[str]:
    """The library end to end under asyncio; returns what it saw, for the trio side to check."""
    seen: list[str] = []
    async with asyncio.timeout(TIMEOUT), AgentikAgent("asyncio", url) as agent:
        conv = await agent.create_conversation(title="from asyncio")
        got = await agent.get_conversation(conv.id)
        assert got is not None and got.title == "from asyncio"
        cursor = await agent.outbox.current_cursor()

        # Plain SSE, a turn, the durable answer.
        await conv.send("ping")
        async with aclosing(agent.outbox.conversation_events(cursor, conv.id)) as events:
            async for ce in events:
                seen.append(ce.type)
                if isinstance(ce.event, AssistantMessageEvent):
                    break

        # ReconnectingOutbox and both syncs.
        async with ReconnectingOutbox(agent.outbox, BackoffPolicy.fixed(0.05, 5)) as recon:
            statuses = recon.connection_status()
            async with recon.events(cursor) as stream:
                first = await stream.__anext__()
                assert first.cursor is not None and first.cursor.offset == cursor.offset + 1
            status = await statuses.receive()
            while not isinstance(status, Connected):
                status = await statuses.receive()
            seen.append("connected")
        async with SqliteJournalStore(db) as store:
            sync = JournalSync(agent, conv.id, store, policy=BackoffPolicy.fixed(0.05, 5))
            cache = ConversationListCache()
            list_sync = ConversationListSync(agent, cache, policy=BackoffPolicy.fixed(0.05, 5))
            task = asyncio.create_task(sync.run())
            list_task = asyncio.create_task(list_sync.run())
            await conv.rename("renamed")
            head = await agent.outbox.current_cursor()
            await sync.wait_for(head.offset)
            await list_sync.wait_for(head.offset)
            assert await store.list(conv.id) == await conv.get_messages()
            assert sync.conversation is not None and sync.conversation.title == "renamed"
            assert [c.id for c in cache.list()] == [
                c.id for c in (await agent.conversations_snapshot()).conversations
            ]
            task.cancel()
            list_task.cancel()
            await asyncio.gather(task, list_task, return_exceptions=True)
        seen.append("synced")
    return seen


async def test_library_under_asyncio(server: Server, scripted: ScriptedOpenAI, tmp_path: Path) -> None:
    db = os.fspath(tmp_path / "cache.db")
    with trio.fail_after(TIMEOUT + 5):
        seen = await trio.to_thread.run_sync(asyncio.run, _asyncio_scenario(server.url, db))
    assert seen[0] == "user_message" and "assistant_message" in seen
    assert seen[-2:] == ["connected", "synced"]
