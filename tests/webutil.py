"""Test helpers for the web facade: a real hypercorn serving ``create_app(...)`` on 127.0.0.1:0 in
the test's own trio run, and a tiny SSE client over httpx2 streaming.

    async with serve_app(config) as server:
        async with httpx2.AsyncClient(base_url=server.url) as client:
            ...
            async with open_sse(client, "/agentik/events", after=c) as stream:
                ev = await stream.next_event()
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx2
import hypercorn.config
import hypercorn.trio
import msgspec
import pytest
import trio
from trio_websocket import WebSocketConnection

from agentik.agent import LocalAgent
from agentik.client.sse import parse_sse as client_parse_sse
from agentik.config import Config
from agentik.llm.base import LiteLlm
from agentik.storage.hub import EventHub
from agentik.tools.base import ToolRegistry
from agentik.web.app import AgentikApp, WebState, create_app
from agentik.wire import CommonEvent
from tests.conftest import engine_url
from tests.scripted_openai import ScriptedOpenAI, open_scripted_openai


@dataclass
class Server:
    url: str
    app: AgentikApp
    stop: trio.Event
    fatal: list[BaseException] = field(default_factory=list)

    @property
    def state(self) -> WebState:
        return self.app.agentik

    @property
    def agent(self) -> LocalAgent:
        return self.state.require_agent()

    @property
    def hub(self) -> EventHub:
        return self.agent.hub

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http") + "/agentik/ws"


@asynccontextmanager
async def serve_app(
    config: Config,
    llm: LiteLlm | None = None,
    tools: ToolRegistry | None = None,
    *,
    heartbeat: float = 15.0,
    graceful_timeout: float = 0.5,
    tune_gc: bool = False,
) -> AsyncIterator[Server]:
    """Serve ``create_app(config, llm, tools)`` on 127.0.0.1:<free port> for the body. A runtime
    death stops the server and is recorded in ``server.fatal`` instead of exiting."""
    stop = trio.Event()
    fatal: list[BaseException] = []

    def on_fatal(exc: BaseException) -> None:
        fatal.append(exc)
        stop.set()

    app = create_app(
        config, llm, tools, heartbeat=heartbeat, on_fatal=on_fatal, handle_sigterm=False,
        tune_gc=tune_gc,
    )
    hc = hypercorn.config.Config()
    hc.bind = ["127.0.0.1:0"]
    hc.accesslog = None
    hc.graceful_timeout = graceful_timeout
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            partial(hypercorn.trio.serve, app, hc, shutdown_trigger=stop.wait)
        )
        server = Server(url=binds[0].rstrip("/"), app=app, stop=stop, fatal=fatal)
        try:
            yield server
        finally:
            stop.set()
            # Bounded: open streams get graceful_timeout, the runtime a few seconds to close.
            nursery.cancel_scope.deadline = trio.current_time() + graceful_timeout + 10


def tcp_send_buffer_max() -> int:
    """The most a socket's kernel send buffer can grow to (stalled-reader tests outsize it)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 * 1024 * 1024


# --- SSE -----------------------------------------------------------------------------------------


@dataclass
class SseEvent:
    """One dispatched SSE frame, or a comment (``comment`` set, the rest empty)."""

    id: str | None = None
    event: str | None = None
    data: str = ""
    comment: str | None = None

    def common(self) -> CommonEvent:
        return msgspec.json.decode(self.data, type=CommonEvent)

    def json(self) -> Any:
        return msgspec.json.decode(self.data)


async def parse_sse(chunks: AsyncIterable[bytes]) -> AsyncIterator[SseEvent]:
    """The client library's SSE parser (one parser for the project), with test helpers on top."""
    async for frame in client_parse_sse(chunks):
        yield SseEvent(frame.id, frame.event, frame.data, frame.comment)


class SseStream:
    def __init__(self, response: httpx2.Response) -> None:
        self.response = response
        self._events = parse_sse(response.aiter_bytes())
        self.comments: list[str] = []

    async def next_frame(self) -> SseEvent:
        """The next frame or comment. Raises StopAsyncIteration at the end of the stream."""
        return await self._events.__anext__()

    async def next_event(self) -> SseEvent:
        """The next real frame (comments are collected in ``self.comments``)."""
        while True:
            frame = await self.next_frame()
            if frame.comment is None:
                return frame
            self.comments.append(frame.comment)

    async def rest(self) -> list[SseEvent]:
        """Every real frame until the server ends the stream."""
        return [frame async for frame in self._events if frame.comment is None]

    async def take(self, n: int) -> list[SseEvent]:
        return [await self.next_event() for _ in range(n)]

    async def until(self, event_type: str, limit: int = 1000) -> list[SseEvent]:
        """Frames up to and including the first one of ``event_type``."""
        out: list[SseEvent] = []
        for _ in range(limit):
            frame = await self.next_event()
            out.append(frame)
            if frame.event == event_type:
                return out
        raise AssertionError(f"no {event_type!r} in {limit} frames")


@asynccontextmanager
async def open_sse(
    client: httpx2.AsyncClient,
    path: str,
    *,
    after: str | None = None,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    expect_status: int = 200,
) -> AsyncIterator[SseStream]:
    """Open an SSE stream; on 200 wait for the server's ``: connected`` comment, sent once the
    subscription is in place (so whatever happens after this returns is in the stream)."""
    query = dict(params or {})
    if after is not None:
        query["after"] = after
    async with client.stream(
        "GET", path, params=query, headers=headers, timeout=httpx2.Timeout(30.0)
    ) as response:
        assert response.status_code == expect_status, (response.status_code, await response.aread())
        stream = SseStream(response)
        if expect_status == 200:
            first = await stream.next_frame()
            assert first.comment == "connected", first
        yield stream


# --- fixtures (import them into a test module to use them) ---------------------------------------


@pytest.fixture
async def openai() -> AsyncIterator[ScriptedOpenAI]:
    async with open_scripted_openai() as scripted:
        yield scripted


def make_config(tmp_path: Any, openai: ScriptedOpenAI, **changes: Any) -> Config:
    """A config for a test server, on the suite's engine (``conftest.engine_url``: a test calling
    this asks for the ``engine`` fixture) unless ``changes`` name a database."""
    changes.setdefault("database_url", engine_url())
    return Config(
        db_path=str(tmp_path / "agentik.db"),
        openai_base_url=openai.base_url,
        openai_api_key="x",
        llm_max_retries=0,
        sqlite_synchronous="NORMAL",
        **changes,
    )


@pytest.fixture
def config(tmp_path: Any, openai: ScriptedOpenAI, engine: str | None) -> Config:
    return make_config(tmp_path, openai)


@pytest.fixture
async def server(config: Config) -> AsyncIterator[Server]:
    async with serve_app(config) as served:
        yield served


@pytest.fixture
async def client(server: Server) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(base_url=server.url, timeout=10) as http:
        yield http


@pytest.fixture(autouse=True)
def no_error_logs(request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture) -> Any:
    """Fail a test whose server logged an error (a disconnect that leaked an exception, a 500...)
    unless it uses the ``allow_error_logs`` fixture. Import both into a test module."""
    yield
    if "allow_error_logs" in request.fixturenames:
        return
    records = [*caplog.get_records("setup"), *caplog.get_records("call"), *caplog.records]
    errors = [r for r in records if r.levelno >= logging.ERROR]
    assert not errors, [f"{r.name}: {r.getMessage()}" for r in errors]


@pytest.fixture
def allow_error_logs() -> None:
    """Request it in a test that makes the server log errors on purpose."""


# --- WebSocket -----------------------------------------------------------------------------------


class WsClient:
    """JSON frames over a trio-websocket connection. ``call`` sends a command and returns its
    reply (or error) frame; frames that arrive meanwhile wait in ``backlog`` for ``next``."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.backlog: list[dict[str, Any]] = []
        self._pending: dict[str, list[Any]] = {}
        self._ids = 0

    def new_id(self) -> str:
        self._ids += 1
        return f"r{self._ids}"

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send_message(msgspec.json.encode(frame).decode())

    async def _receive(self) -> dict[str, Any]:
        frame: dict[str, Any] = msgspec.json.decode(await self.ws.get_message())
        return frame

    async def call(self, type_: str, **fields: Any) -> dict[str, Any]:
        request_id = fields.pop("id", None) or self.new_id()
        await self.send({"type": type_, "id": request_id, **fields})
        while True:
            frame = await self._receive()
            if frame["type"] in ("reply", "error") and frame.get("id") == request_id:
                return frame
            self.backlog.append(frame)

    async def next(self, *, skip_pings: bool = True) -> dict[str, Any]:
        while True:
            frame = self.backlog.pop(0) if self.backlog else await self._receive()
            if skip_pings and frame["type"] == "ping":
                continue
            return frame

    async def events(self, subscription: str, until: str, limit: int = 1000) -> list[Any]:
        """Events of ``subscription`` up to and including the first of type ``until``; events
        after it in the same frame are kept for the next call."""
        out: list[Any] = []
        others: list[dict[str, Any]] = []
        pending = self._pending.setdefault(subscription, [])
        try:
            for _ in range(limit):
                while pending:
                    ev = pending.pop(0)
                    out.append(ev)
                    if ev["event"]["type"] == until:
                        return out
                frame = await self.next()
                if frame["type"] != "events" or frame["subscription"] != subscription:
                    others.append(frame)  # someone else's: keep it for later
                    continue
                pending.extend(frame["events"])
            raise AssertionError(f"no {until!r} in {limit} frames")
        finally:
            self.backlog[:0] = others
