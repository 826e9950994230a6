"""WebSocket /agentik/ws against a real hypercorn with trio-websocket: commands and replies, a turn
watched on durable and live subscriptions, resume by cursor, gaps, unsubscribe, size limit,
ping/pong, release on disconnect."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url, wrap_client_stream

from agentik.web.types import decode_server_frame
from agentik.web.ws import OUT_BUFFER, events_frames
from tests.scripted_openai import Reply, ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    WsClient,
    config,
    make_config,
    no_error_logs,
    openai,
    serve_app,
    server,
    tcp_send_buffer_max,
)

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")


@asynccontextmanager
async def connect(server: Server, query: str = "") -> AsyncIterator[WsClient]:
    async with open_websocket_url(server.ws_url + query) as ws:
        yield WsClient(ws)


TEXT = [{"type": "text", "body": "hi"}]


async def test_commands(server: Server) -> None:
    async with connect(server) as ws:
        with trio.fail_after(10):
            created = await ws.call("create", title="first")
            assert created["type"] == "reply"
            record = created["result"]
            cid = record["id"]
            assert record["title"] == "first"
            temp = (await ws.call("create", temp=True))["result"]
            assert temp["is_temporal"] is True

            assert (await ws.call("get", conversation_id=cid))["result"] == record
            listing = (await ws.call("list", limit=10))["result"]
            assert {c["id"] for c in listing["conversations"]} == {cid, temp["id"]}
            assert listing["cursor"]["offset"] == 2

            renamed = (await ws.call("rename", conversation_id=cid, title="new"))["result"]
            assert renamed["title"] == "new"
            snapshot = (await ws.call("snapshot", conversation_id=cid))["result"]
            assert snapshot["conversation"] == renamed and snapshot["messages"] == []
            interrupted = await ws.call("interrupt", conversation_id=cid)
            assert interrupted["result"] == {"interrupted": False}

            deleted = await ws.call("delete", conversation_id=temp["id"])
            assert deleted == {"type": "reply", "id": deleted["id"], "result": None}
            missing = await ws.call("get", conversation_id=temp["id"])
            assert missing["type"] == "error" and missing["error"]["code"] == "not_found"
            assert (await ws.call("delete", conversation_id="nope"))["error"]["code"] == (
                "not_found"
            )
            assert (await ws.call("send", conversation_id="nope", content=TEXT))["error"][
                "code"
            ] == "not_found"
            assert ws.backlog == []
            # Every server frame decodes as a ServerFrame.
            decode_server_frame(b'{"type":"reply","id":"x","result":null}')


@pytest.mark.parametrize(
    ("raw", "answer_id", "fragment"),
    [
        ("{not json", None, "invalid JSON"),
        ('{"type": "fly", "id": "q1"}', "q1", "Invalid value 'fly'"),
        ('{"type": "get", "id": "q2"}', "q2", "conversation_id"),
        ('{"type": "create", "id": "q3", "temp": "no"}', "q3", "$.temp"),
        ('{"type": "send", "id": "q4", "conversation_id": "x", "content": []}', "q4",
         "must not be empty"),
        ('{"type": "list", "id": "q5", "limit": 0}', "q5", "limit"),
        ('{"type": "subscribe", "id": "q6", "stream": "conversation"}', "q6", "conversation_id"),
        ('{"type": "subscribe", "id": "q7", "stream": "events", "after": "bad"}', "q7", "cursor"),
        ('{"type": "subscribe", "id": "q8", "stream": "river"}', "q8", "$.stream"),
        ('{"type": "unsubscribe", "id": "q9", "subscription": "none"}', "q9", "none"),
        ('[1, 2]', None, "Expected `object`"),
    ],
)
async def test_bad_frames_get_error_frames(
    server: Server, raw: str, answer_id: str | None, fragment: str
) -> None:
    async with connect(server) as ws:
        with trio.fail_after(10):
            await ws.ws.send_message(raw)
            frame = await ws.next()
            assert frame["type"] == "error"
            assert frame.get("id") == answer_id
            assert fragment in frame["error"]["message"]
            # The socket still works.
            assert (await ws.call("list"))["type"] == "reply"


async def test_turn_over_websocket(server: Server, openai: ScriptedOpenAI) -> None:
    epoch = server.agent.id
    openai.push(Reply("Hello over ws"))
    async with connect(server) as ws:
        with trio.fail_after(10):
            cid = (await ws.call("create"))["result"]["id"]
            subscribed = await ws.call(
                "subscribe", id="conv", stream="conversation", conversation_id=cid
            )
            assert subscribed["result"] == {"subscription": "conv", "after": f"{epoch}:1"}
            live = await ws.call("subscribe", id="live", stream="live", conversation_id=cid)
            assert live["result"] == {"subscription": "live", "after": None}
            everything = await ws.call("subscribe", id="all", stream="events")
            assert everything["type"] == "reply"
            agent_only = await ws.call("subscribe", id="agent", stream="agent")
            assert agent_only["type"] == "reply"

            sent = await ws.call("send", conversation_id=cid, content=TEXT)
            message_id = sent["result"]["message_id"]
            online = await ws.events("live", until="end")
            durable = await ws.events("conv", until="touched")
            alls = await ws.events("all", until="touched")
            agent = await ws.events("agent", until="touched")

    assert [e["event"]["type"] for e in online] == [
        "working", "start_response", "append_text", "append_text", "append_text", "end",
    ]
    assert all(e["cursor"] is None for e in online)
    assert [e["event"]["type"] for e in durable] == [
        "user_message", "assistant_message", "touched",
    ]
    assert durable[0]["event"]["record"]["id"] == message_id
    assert [e["cursor"]["offset"] for e in durable] == [2, 3, 4]
    assert alls == durable
    assert [e["event"]["type"] for e in agent] == ["touched"]


async def test_resume_gap_and_unsubscribe(tmp_path: Any, openai: ScriptedOpenAI) -> None:
    async with serve_app(make_config(tmp_path, openai, outbox_cap=4)) as srv:
        epoch = srv.agent.id
        async with connect(srv) as ws:
            with trio.fail_after(10):
                cid = (await ws.call("create"))["result"]["id"]
                for i in range(3):
                    await ws.call("rename", conversation_id=cid, title=f"t{i}")
                # Resume from a cursor: replay 2..4, then live.
                await ws.call("subscribe", id="s", stream="events", after=f"{epoch}:1")
                batches = [await ws.events("s", until="renamed") for _ in range(3)]
                replayed = [ev for evs in batches for ev in evs]
                assert [e["cursor"]["offset"] for e in replayed] == [2, 3, 4]
                await ws.call("rename", conversation_id=cid, title="live")
                assert [e["event"]["title"] for e in await ws.events("s", until="renamed")] == [
                    "live"
                ]
                assert srv.hub.subscriber_count == 1

                # Unsubscribe: once answered, the subscription is gone.
                done = await ws.call("unsubscribe", subscription="s")
                assert done["type"] == "reply" and done["result"] is None
                assert srv.hub.subscriber_count == 0
                again = await ws.call("unsubscribe", subscription="s")
                assert again["error"]["code"] == "not_found"

                # Head is 5 with 4 kept (2..5): cursor 1 is still alive, 0 is dead.
                gap = await ws.call("subscribe", id="g", stream="events", after=f"{epoch}:0")
                assert gap["type"] == "error"
                assert gap["error"] == {
                    "code": "gap", "message": gap["error"]["message"],
                    "oldest": f"{epoch}:1", "current": f"{epoch}:5",
                }
                other = await ws.call("subscribe", id="o", stream="agent", after="other:0")
                assert other["error"]["code"] == "gap"
                dup = await ws.call("subscribe", id="d", stream="events")
                assert dup["type"] == "reply"
                dup2 = await ws.call("subscribe", id="d", stream="events")
                assert dup2["error"]["code"] == "invalid_input"


async def test_conversation_subscription_ends_after_delete(server: Server) -> None:
    async with connect(server) as ws:
        with trio.fail_after(10):
            cid = (await ws.call("create"))["result"]["id"]
            await ws.call("subscribe", id="c", stream="conversation", conversation_id=cid)
            await ws.call("delete", conversation_id=cid)
            events = await ws.events("c", until="deleted")
            assert [e["event"]["type"] for e in events] == ["conversation_closing", "deleted"]
            assert await ws.next() == {"type": "ended", "subscription": "c", "reason": "deleted"}
            assert server.hub.subscriber_count == 0


async def test_ping_pong(tmp_path: Any, openai: ScriptedOpenAI) -> None:
    async with serve_app(make_config(tmp_path, openai), heartbeat=0.05) as srv:
        async with connect(srv) as ws:
            with trio.fail_after(10):
                await ws.send({"type": "ping", "id": "p1"})
                pongs: list[dict[str, Any]] = []
                pings = 0
                while not pongs or pings < 2:
                    frame = await ws.next(skip_pings=False)
                    if frame["type"] == "ping":
                        pings += 1
                        await ws.send({"type": "pong"})
                    else:
                        pongs.append(frame)
                assert pongs == [{"type": "pong", "id": "p1"}]


async def test_message_too_big_closes_1009(tmp_path: Any, openai: ScriptedOpenAI) -> None:
    async with serve_app(make_config(tmp_path, openai, max_body_bytes=1000)) as srv:
        async with connect(srv) as ws:
            with trio.fail_after(10):
                assert (await ws.call("list"))["type"] == "reply"
                await ws.send({"type": "create", "id": "big", "title": "x" * 2000})
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await ws.next()
        assert closed.value.reason is not None and closed.value.reason.code == 1009
        with trio.fail_after(10):
            await srv.state.wait_open_streams(0)


async def test_disconnect_releases_everything(server: Server) -> None:
    async with connect(server) as ws:
        with trio.fail_after(10):
            cid = (await ws.call("create"))["result"]["id"]
            await ws.call("subscribe", id="a", stream="events")
            await ws.call("subscribe", id="b", stream="conversation", conversation_id=cid)
            await ws.call("subscribe", id="c", stream="live", conversation_id=cid)
            assert server.state.open_streams == 1
            assert server.hub.subscriber_count == 2
            assert server.hub.online_subscribers(cid) == 1
    with trio.fail_after(10):
        await server.state.wait_open_streams(0)
    assert server.hub.subscriber_count == 0
    assert server.hub.online_subscribers(cid) == 0


def test_events_frames_are_split_by_size() -> None:
    raws = [b'{"n":%d}' % i + b" " * 90 for i in range(10)]  # 100 bytes each
    frames = events_frames(b'"s"', raws, limit=350)
    decoded = [msgspec.json.decode(f) for f in frames]
    assert [len(f["events"]) for f in decoded] == [3, 3, 3, 1]
    assert [e["n"] for f in decoded for e in f["events"]] == list(range(10))
    assert events_frames(b'"s"', [b"x" * 1000], limit=10) == [
        b'{"type":"events","subscription":"s","events":[' + b"x" * 1000 + b"]}"
    ]


async def test_stalled_socket_overtaken_by_eviction_gets_a_gap_error(
    tmp_path: Any, openai: ScriptedOpenAI
) -> None:
    """A client that stops reading holds back nobody; when its subscription can no longer catch
    up (the outbox moved past it), it gets a gap error frame for that subscription."""
    config = make_config(tmp_path, openai, subscriber_buffer=2, outbox_cap=5)
    async with serve_app(config) as srv, trio.open_nursery() as nursery:
        epoch = srv.agent.id
        async with connect(srv) as writer:
            cid = (await writer.call("create"))["result"]["id"]
            # The stalled client: a tiny receive buffer, and it stops reading after subscribing.
            host, port = srv.url.removeprefix("http://").split(":")
            sock = trio.socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await sock.connect((host, int(port)))
            ws = await wrap_client_stream(
                nursery, trio.SocketStream(sock), host, "/agentik/ws", max_message_size=2**24
            )
            stalled = WsClient(ws)
            with trio.fail_after(60):
                subscribed = await stalled.call("subscribe", id="s", stream="events")
                assert subscribed["type"] == "reply"
                title = "x" * 200_000
                count = (3 * tcp_send_buffer_max()) // len(title) + OUT_BUFFER + 20
                for i in range(count):
                    renamed = await writer.call("rename", conversation_id=cid, title=f"{i}{title}")
                    assert renamed["type"] == "reply"
                # Now it reads: what it had, then the gap.
                events: list[Any] = []
                while True:
                    frame = await stalled.next()
                    if frame["type"] == "events":
                        events += frame["events"]
                        continue
                    break
            assert frame["type"] == "error" and frame["subscription"] == "s"
            assert frame["error"]["code"] == "gap"
            assert frame["error"]["current"] == f"{epoch}:{count + 1}"
            offsets = [e["cursor"]["offset"] for e in events]
            assert offsets == list(range(2, 2 + len(offsets)))  # no hole before the gap
            assert offsets[-1] < count - 4
            # The socket itself is fine.
            assert (await stalled.call("list"))["type"] == "reply"
            await ws.aclose()
