"""SSE streams against a real hypercorn: a turn watched live and durably, resume with
Last-Event-ID, 410 after eviction, a stalled subscriber next to a healthy one, release on
disconnect, heartbeats, batching."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import h11
import httpx2
import pytest
import trio

from agentik.parking import PARK, PARK_MAX, current_parking
from agentik.sse import BUSY_CHECK, WakeBody, serve_body
from agentik.sse import frame as sse_frame
from agentik.storage.hub import REPLAY_PAGE, EventHub
from agentik.storage.types import StoredEvent
from agentik.tools.base import FunctionTools
from agentik.web.app import WebState
from agentik.web.sse import HEARTBEAT, OPENED, PUMP_BUFFER, EventStream, LiveStream, ended_frame, live_frame
from agentik.wire import AppendText, CommonEvent, Cursor, Renamed, encode
from tests.scripted_openai import Reply, ScriptedOpenAI, ToolCalls
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    SseEvent,
    client,
    config,
    make_config,
    no_error_logs,
    open_sse,
    openai,
    parse_sse,
    serve_app,
    server,
    tcp_send_buffer_max,
)

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")


async def create(client: httpx2.AsyncClient, **body: Any) -> str:
    response = await client.post("/agentik/conversations", json=body)
    assert response.status_code == 201, response.text
    cid: str = response.json()["id"]
    return cid


async def send(client: httpx2.AsyncClient, cid: str, text: str) -> str:
    response = await client.post(
        f"/agentik/conversations/{cid}/messages", json={"content": [{"type": "text", "body": text}]}
    )
    assert response.status_code == 202, response.text
    message_id: str = response.json()["message_id"]
    return message_id


async def rename(client: httpx2.AsyncClient, cid: str, title: str) -> int:
    response = await client.patch(f"/agentik/conversations/{cid}", json={"title": title})
    assert response.status_code == 200, response.text
    seq: int = response.json()["seq"]
    return seq


def check_durable(frames: list[SseEvent], epoch: str) -> list[int]:
    """Every durable frame: id == its CommonEvent cursor, event == its type; returns offsets."""
    offsets = []
    for frame in frames:
        common = frame.common()
        assert common.cursor is not None
        assert frame.id == f"{epoch}:{common.cursor.offset}" == str(common.cursor)
        assert frame.event == common.type
        offsets.append(common.cursor.offset)
    return offsets


async def test_turn_over_sse(
    client: httpx2.AsyncClient, server: Server, openai: ScriptedOpenAI
) -> None:
    epoch = server.agent.id
    cid = await create(client)
    openai.push(Reply("Hello there friend"))
    async with (
        open_sse(client, "/agentik/events") as everything,
        open_sse(client, f"/agentik/conversations/{cid}/events") as durable,
        open_sse(client, f"/agentik/conversations/{cid}/live") as live,
    ):
        assert durable.response.headers["content-type"].startswith("text/event-stream")
        assert durable.response.headers["X-Agentik-Cursor"] == f"{epoch}:1"
        message_id = await send(client, cid, "hi")
        with trio.fail_after(10):
            online = await live.until("end")
            conv_frames = await durable.until("touched")
            all_frames = await everything.until("touched")

    assert [f.event for f in online] == [
        "working", "start_response", "append_text", "append_text", "append_text", "end",
    ]
    assert all(f.id is None for f in online)  # live frames carry no ids
    assert "".join(f.json()["event"]["text"] for f in online if f.event == "append_text") == (
        "Hello there friend"
    )
    assert all(f.common().cursor is None and f.common().conversation_id == cid for f in online)

    assert [f.event for f in conv_frames] == ["user_message", "assistant_message", "touched"]
    offsets = check_durable(conv_frames, epoch)
    assert offsets == [2, 3, 4]
    assert conv_frames[0].json()["event"]["record"]["id"] == message_id
    assert [f.data for f in all_frames] == [f.data for f in conv_frames]


async def test_resume_with_last_event_id(
    client: httpx2.AsyncClient, server: Server
) -> None:
    epoch = server.agent.id
    cid = await create(client)
    start = (await client.get("/agentik/cursor")).json()["current"]
    for i in range(5):
        await rename(client, cid, f"t{i}")
    async with open_sse(client, "/agentik/events", after=start) as stream:
        with trio.fail_after(10):
            first = await stream.take(2)
    # The client dropped mid-stream: everything it held is released.
    with trio.fail_after(10):
        await server.state.wait_open_streams(0)
    assert server.hub.subscriber_count == 0
    for i in range(5, 8):
        await rename(client, cid, f"t{i}")
    # Reconnect like an EventSource: the original URL plus Last-Event-ID (which wins).
    async with open_sse(
        client, "/agentik/events", after=start, headers={"Last-Event-ID": first[-1].id or ""}
    ) as stream:
        with trio.fail_after(10):
            rest = await stream.take(6)
    offsets = check_durable(first + rest, epoch)
    assert offsets == list(range(2, 10))  # no gap, no duplicate
    titles = [f.json()["event"]["title"] for f in first + rest]
    assert titles == [f"t{i}" for i in range(8)]


async def test_without_after_starts_at_the_head(
    client: httpx2.AsyncClient, server: Server
) -> None:
    cid = await create(client)
    await rename(client, cid, "old")
    async with open_sse(client, "/agentik/events") as stream:
        head = stream.response.headers["X-Agentik-Cursor"]
        assert Cursor.parse(head).offset == 2
        seq = await rename(client, cid, "new")
        with trio.fail_after(10):
            frame = await stream.next_event()
    assert frame.common().cursor == Cursor(epoch=server.agent.id, offset=seq)
    assert frame.json()["event"]["title"] == "new"


async def test_dead_cursor_is_410(tmp_path: Any, openai: ScriptedOpenAI) -> None:
    async with serve_app(make_config(tmp_path, openai, outbox_cap=3)) as srv:
        async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
            epoch = srv.agent.id
            cid = await create(http)
            for i in range(6):
                await rename(http, cid, f"t{i}")
            # Head 7, the outbox keeps 5..7, so 4 is the oldest resumable cursor.
            for path in ("/agentik/events", f"/agentik/conversations/{cid}/events"):
                gone = await http.get(path, params={"after": f"{epoch}:1"})
                assert gone.status_code == 410
                assert gone.json() == {
                    "error": {
                        "code": "gap",
                        "message": gone.json()["error"]["message"],
                        "oldest": f"{epoch}:4",
                        "current": f"{epoch}:7",
                    }
                }
                resumed = await http.get(path, headers={"Last-Event-ID": f"{epoch}:3"})
                assert resumed.status_code == 410
            # The oldest cursor still resumes.
            async with open_sse(http, "/agentik/events", after=f"{epoch}:4") as stream:
                with trio.fail_after(10):
                    frames = await stream.take(3)
            assert check_durable(frames, epoch) == [5, 6, 7]
            with trio.fail_after(10):
                await srv.state.wait_open_streams(0)
            assert srv.hub.subscriber_count == 0


async def test_conversation_stream_ends_after_delete(
    client: httpx2.AsyncClient, server: Server
) -> None:
    cid = await create(client)
    async with open_sse(client, f"/agentik/conversations/{cid}/events") as stream:
        assert (await client.delete(f"/agentik/conversations/{cid}")).status_code == 204
        with trio.fail_after(10):
            frames = await stream.rest()
    # The stream says it ended by itself, then the response ends (stream.rest() returned).
    assert [f.event for f in frames] == ["conversation_closing", "deleted", "ended"]
    assert frames[-1].id is None and frames[-1].json() == {"reason": "deleted"}


async def test_disconnect_releases_subscribers(
    client: httpx2.AsyncClient, server: Server
) -> None:
    cid = await create(client)
    async with (
        open_sse(client, "/agentik/events"),
        open_sse(client, f"/agentik/conversations/{cid}/events"),
        open_sse(client, f"/agentik/conversations/{cid}/live"),
    ):
        assert server.state.open_streams == 3
        assert server.hub.subscriber_count == 2
        assert server.hub.online_subscribers(cid) == 1
    with trio.fail_after(10):
        await server.state.wait_open_streams(0)
    assert server.hub.subscriber_count == 0
    assert server.hub.online_subscribers(cid) == 0


async def test_heartbeat(tmp_path: Any, openai: ScriptedOpenAI) -> None:
    async with serve_app(make_config(tmp_path, openai), heartbeat=0.05) as srv:
        async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
            async with open_sse(http, "/agentik/events") as stream:
                with trio.fail_after(10):
                    frames = [await stream.next_frame() for _ in range(3)]
    assert [f.comment for f in frames] == ["heartbeat"] * 3


class EmptyOutbox:
    """A reader whose outbox holds nothing after the cursor (a hub that is live only)."""

    async def outbox_page(self, last: int, *args: Any) -> tuple[int, int, list[StoredEvent]]:
        return 1, last, []


def renamed(offset: int, title: str) -> StoredEvent:
    ev = CommonEvent(
        cursor=Cursor(epoch="e", offset=offset), conversation_id="c1",
        event=Renamed(conversation_id="c1", title=title, updated_at=0.0),
    )
    return StoredEvent(offset=offset, conversation_id="c1", kind="agent", _event=ev, raw=encode(ev))


async def test_durable_stream_sends_queued_events_in_one_write_and_wakes_when_idle() -> None:
    st = WebState(config=None, llm=None, tools=None, heartbeat=60, on_fatal=lambda exc: None)
    hub = EventHub(epoch="e", head=0, oldest=1, reader=EmptyOutbox())  # type: ignore[arg-type]
    body = EventStream(st, partial(hub.stream, Cursor(epoch="e", offset=0)),
                       Cursor(epoch="e", offset=0), heartbeat=60)
    async with body:
        assert (st.open_streams, hub.subscriber_count) == (1, 1)  # before ": connected"
        assert await body.__anext__() == OPENED
        # Queued while the body was not reading: one write, every frame in order.
        hub.publish([renamed(1, "a"), renamed(2, "b")], 1, 2)
        hub.publish([renamed(3, "c")], 1, 3)
        chunk = await body.__anext__()
        assert chunk == b"".join(
            sse_frame(renamed(i, t).raw, b"renamed", f"e:{i}".encode())
            for i, t in ((1, "a"), (2, "b"), (3, "c"))
        )
        # An idle body waits in one place and the hub's publish wakes it (no pump, no channel).
        got: list[bytes] = []

        async def read() -> None:
            got.append(await body.__anext__())

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await trio.testing.wait_all_tasks_blocked()
                hub.publish([renamed(4, "d")], 1, 4)
        assert got == [sse_frame(renamed(4, "d").raw, b"renamed", b"e:4")]
    assert (st.open_streams, hub.subscriber_count) == (0, 0)


def bare_hub(buffer: int) -> EventHub:
    """A hub for online events only (they never touch the store)."""
    return EventHub(epoch="e", head=0, oldest=1, reader=None, buffer=buffer)  # type: ignore[arg-type]


async def test_live_stream_sends_queued_events_in_one_write_each_its_own_frame() -> None:
    st = WebState(config=None, llm=None, tools=None, heartbeat=60, on_fatal=lambda exc: None)
    hub = bare_hub(buffer=4)
    texts = ["Hel", "lo", " there"]
    body = LiveStream(st, hub.subscribe_online, "c1", heartbeat=60)
    async with body:
        assert (st.open_streams, hub.online_subscribers("c1")) == (1, 1)  # before ": connected"
        assert await body.__anext__() == OPENED
        for text in texts:
            hub.publish_online("c1", AppendText(text=text))
        chunk = await body.__anext__()
        # one write, the same frames in the same order: nothing merged, nothing waited for
        assert chunk == b"".join(
            live_frame(CommonEvent(cursor=None, conversation_id="c1", event=AppendText(text=t)))
            for t in texts
        )
        # a reader more than `buffer` behind is cut off: what was queued, then the end
        for i in range(5):
            hub.publish_online("c1", AppendText(text=str(i)))
        rest = [chunk async for chunk in body]
        assert len(rest) == 1 and rest[0].count(b"event: append_text\n") == 4
        assert rest[0].endswith(ended_frame("overflow"))
        assert hub.online_subscribers("c1") == 0
    assert st.open_streams == 0


async def test_live_stream_heartbeat_and_unsubscribe() -> None:
    st = WebState(config=None, llm=None, tools=None, heartbeat=60, on_fatal=lambda exc: None)
    hub = bare_hub(buffer=4)
    body = LiveStream(st, hub.subscribe_online, "c1", heartbeat=0.01)
    async with body:
        assert await body.__anext__() == OPENED
        with trio.fail_after(10):
            assert await body.__anext__() == HEARTBEAT
        hub.publish_online("c1", AppendText(text="x"))
        assert b'"text":"x"' in await body.__anext__()
    assert (st.open_streams, hub.online_subscribers("c1")) == (0, 0)


# --- a stalled subscriber next to a healthy one --------------------------------------------------


async def raw_sse_request(url: str, path: str) -> tuple[trio.SocketStream, h11.Connection]:
    """Open an SSE request on a socket with a tiny receive buffer, read the response head, and
    never read more: the server's writes to it soon block."""
    host, port = url.removeprefix("http://").split(":")
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((host, int(port)))
    stream = trio.SocketStream(sock)
    conn = h11.Connection(h11.CLIENT)
    await stream.send_all(
        conn.send(h11.Request(method="GET", target=path, headers=[("Host", host)])) or b""
    )
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(4096))
            continue
        assert isinstance(event, h11.Response) and event.status_code == 200, event
        return stream, conn


async def read_raw_sse(stream: trio.SocketStream, conn: h11.Connection) -> AsyncIterator[bytes]:
    """The body chunks of an SSE response read over a raw socket."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
            continue
        if isinstance(event, h11.Data):
            yield bytes(event.data)
            continue
        return


async def test_stalled_subscriber_does_not_hold_back_others(
    tmp_path: Any, openai: ScriptedOpenAI
) -> None:
    config = make_config(tmp_path, openai, subscriber_buffer=4)
    async with serve_app(config) as srv:
        async with httpx2.AsyncClient(base_url=srv.url, timeout=30) as http:
            epoch = srv.agent.id
            cid = await create(http)
            start = (await http.get("/agentik/cursor")).json()["current"]
            stalled, stalled_conn = await raw_sse_request(srv.url, f"/agentik/events?after={start}")
            # Enough bytes to fill the kernel buffers of the stalled socket several times over.
            title = "x" * 200_000
            # (kernel send buffer + the pump's queue + the hub buffer, with a wide margin)
            count = (3 * tcp_send_buffer_max()) // len(title) + PUMP_BUFFER + 20
            async with open_sse(http, "/agentik/events", after=start) as healthy:
                with trio.fail_after(60):
                    received: list[SseEvent] = []
                    async with trio.open_nursery() as nursery:

                        async def read_all() -> None:
                            received.extend(await healthy.take(count))

                        nursery.start_soon(read_all)
                        for i in range(count):
                            await rename(http, cid, f"{i}:{title}")
                assert check_durable(received, epoch) == list(range(2, 2 + count))
                # The stalled stream is blocked in a socket write, its hub buffer overflowed and
                # was dropped: only the healthy subscriber is registered now.
                assert srv.hub.subscriber_count == 1

            # Now the stalled client reads: it gets every event too, in order, exactly once
            # (its stream fell back to the stored outbox and caught up).
            with trio.fail_after(60):
                frames: list[SseEvent] = []
                async for frame in parse_sse(read_raw_sse(stalled, stalled_conn)):
                    if frame.comment is None:
                        frames.append(frame)
                        if len(frames) == count:
                            break
            assert check_durable(frames, epoch) == list(range(2, 2 + count))
            assert [f.json()["event"]["title"].split(":")[0] for f in frames] == [
                str(i) for i in range(count)
            ]
            await stalled.aclose()
            with trio.fail_after(10):
                await srv.state.wait_open_streams(0)
            assert srv.hub.subscriber_count == 0


async def test_many_events_arrive_batched(client: httpx2.AsyncClient, server: Server) -> None:
    """Replay of many stored events: every one arrives once, in order (it is sent in batches)."""
    cid = await create(client)
    start = (await client.get("/agentik/cursor")).json()["current"]
    async with trio.open_nursery() as nursery:
        for i in range(60):
            nursery.start_soon(partial(rename, client, cid, f"t{i}"))
    async with open_sse(client, "/agentik/events", after=start) as stream:
        with trio.fail_after(10):
            frames = await stream.take(60)
    assert check_durable(frames, server.agent.id) == list(range(2, 62))


async def test_a_catch_up_longer_than_a_page_arrives_whole(
    client: httpx2.AsyncClient, server: Server
) -> None:
    """A replay of more stored events than two outbox pages (``REPLAY_PAGE``): the first page is
    read as the stream opens, the others by the pump (``EventStream.catch_up``) one step at a
    time; every event arrives once, in order, and the stream goes on live after them."""
    cid = await create(client)
    start = (await client.get("/agentik/cursor")).json()["current"]
    n = 2 * REPLAY_PAGE + 100
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(server.agent.rename_conversation, cid, f"t{i}")
    async with open_sse(client, "/agentik/events", after=start) as stream:
        with trio.fail_after(30):
            frames = await stream.take(n)
            await rename(client, cid, "live")
            frames.append(await stream.next_event())
    assert check_durable(frames, server.agent.id) == list(range(2, n + 3))
    assert frames[-1].json()["event"]["title"] == "live"


@pytest.mark.sqlite_only  # PostgreSQL's rows are stamped with their offset on read
async def test_replay_sends_the_stored_bytes_without_decoding_them(
    client: httpx2.AsyncClient, server: Server
) -> None:
    """A replay frames each stored event from its stored JSON as is: no page read from the outbox
    is decoded, neither to read it nor to name the frame's ``event:`` (issue 13: decoding, and
    collecting the garbage of, events nobody looks at was most of a replay's time). Both durable
    streams; the conversation stream still ends after the conversation's Deleted."""
    cid = await create(client)
    start = (await client.get("/agentik/cursor")).json()["current"]
    for i in range(5):
        await rename(client, cid, f"t{i}")
    await send(client, cid, "hello")
    head = (await client.get("/agentik/cursor")).json()["current"]
    reader = server.hub.reader
    read: list[Any] = []
    real_page = reader.outbox_page

    async def outbox_page(*args: Any) -> Any:
        page = await real_page(*args)
        read.extend(page[2])
        return page

    reader.outbox_page = outbox_page  # type: ignore[method-assign]
    try:
        async with open_sse(client, "/agentik/events", after=start) as stream:
            with trio.fail_after(10):
                frames = [await stream.next_event()]
                while frames[-1].id != head:
                    frames.append(await stream.next_event())
        # (the turn may have stored more after `head` by the time a page was read)
        upto = [ev for ev in read if ev.offset <= Cursor.parse(head).offset]
        assert len(upto) == len(frames) >= 6
        assert check_durable(frames, server.agent.id) == [ev.offset for ev in upto]
        assert [f.data.encode() for f in frames] == [ev.raw for ev in upto]
        assert all(ev._event is None for ev in read), "a replayed event was decoded"

        read.clear()
        assert (await client.delete(f"/agentik/conversations/{cid}")).status_code == 204
        async with open_sse(client, f"/agentik/conversations/{cid}/events", after=start) as stream:
            with trio.fail_after(10):
                frames = [await stream.next_event()]
                while frames[-1].event != "ended":
                    frames.append(await stream.next_event())
        assert frames[-2].event == "deleted" and frames[-1].json() == {"reason": "deleted"}
        check_durable(frames[:-1], server.agent.id)
        # Only the Deleted was decoded (to see that it is this conversation's).
        decoded = [ev.type for ev in read if ev._event is not None]
        assert decoded == ["deleted"]
    finally:
        reader.outbox_page = real_page  # type: ignore[method-assign]


async def test_head_and_options_on_a_stream(client: httpx2.AsyncClient, server: Server) -> None:
    head = await client.head("/agentik/events")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"].startswith("text/event-stream")
    assert (await client.head("/agentik/events", params={"after": "x:1"})).status_code == 410
    assert (await client.options("/agentik/events")).status_code == 200
    assert (await client.get("/agentik/cursor")).status_code == 200  # the connection still works
    assert server.state.open_streams == 0


async def test_stalled_reader_overtaken_by_eviction_gets_a_gap_frame(
    tmp_path: Any, openai: ScriptedOpenAI
) -> None:
    config = make_config(tmp_path, openai, subscriber_buffer=2, outbox_cap=5)
    async with serve_app(config) as srv:
        async with httpx2.AsyncClient(base_url=srv.url, timeout=30) as http:
            epoch = srv.agent.id
            cid = await create(http)
            start = (await http.get("/agentik/cursor")).json()["current"]
            stalled, conn = await raw_sse_request(srv.url, f"/agentik/events?after={start}")
            title = "x" * 200_000
            count = (3 * tcp_send_buffer_max()) // len(title) + PUMP_BUFFER + 20
            with trio.fail_after(60):
                for i in range(count):
                    await rename(http, cid, f"{i}:{title}")
                # Its hub buffer overflowed while it was stalled, and the outbox kept only the
                # last 5 events, so it cannot catch up: after what it already had, a gap frame.
                frames: list[SseEvent] = []
                async for frame in parse_sse(read_raw_sse(stalled, conn)):
                    if frame.comment is None:
                        frames.append(frame)
            await stalled.aclose()
            assert frames[-1].event == "gap"
            error = frames[-1].json()["error"]
            assert error["code"] == "gap"
            assert error["current"] == f"{epoch}:{count + 1}"
            offsets = check_durable(frames[:-1], epoch)
            assert offsets == list(range(2, 2 + len(offsets)))  # no hole before the gap
            assert offsets[-1] < count - 4
            # Reconnecting from where it stopped is a 410 now.
            gone = await http.get("/agentik/events", headers={"Last-Event-ID": frames[-2].id or ""})
            assert gone.status_code == 410
            with trio.fail_after(10):
                await srv.state.wait_open_streams(0)
            assert srv.hub.subscriber_count == 0


async def test_tool_turn_over_sse(tmp_path: Any, openai: ScriptedOpenAI) -> None:
    tools = FunctionTools()
    tools.add(lambda a, b: a + b, name="add", description="Add two numbers")
    openai.push(ToolCalls([("call_1", "add", '{"a": 1, "b": 2}')]), Reply("It is 3."))
    async with serve_app(make_config(tmp_path, openai), tools=tools) as srv:
        async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
            cid = await create(http)
            async with open_sse(http, f"/agentik/conversations/{cid}/events") as stream:
                await send(http, cid, "1 + 2?")
                with trio.fail_after(10):
                    frames = await stream.until("touched")
    assert [f.event for f in frames] == [
        "user_message", "tool_call", "tool_result", "assistant_message", "touched",
    ]
    result = frames[2].json()["event"]["record"]["message"]
    assert result["content"] == "3" and result["is_error"] is False
    check_durable(frames, Cursor.parse(frames[0].id or "").epoch)


async def test_resuming_a_deleted_conversations_stream_shows_its_deletion(
    client: httpx2.AsyncClient, server: Server
) -> None:
    """A client that was away while the conversation was deleted resumes its stream from its
    cursor and sees the deletion; without a cursor the id is unknown (404)."""
    cid = await create(client)
    cursor = (await client.get("/agentik/cursor")).json()["current"]
    assert (await client.delete(f"/agentik/conversations/{cid}")).status_code == 204
    path = f"/agentik/conversations/{cid}/events"
    assert (await client.get(path)).status_code == 404
    async with open_sse(client, path, after=cursor) as stream:
        with trio.fail_after(10):
            frames = await stream.rest()
    assert [f.event for f in frames] == ["conversation_closing", "deleted", "ended"]
    head = (await client.get("/agentik/cursor")).json()["current"]
    assert (await client.get(path, params={"after": head})).status_code == 404


async def test_an_idle_stream_holds_no_task_of_its_own(tmp_path: Any, openai: ScriptedOpenAI) -> None:
    """Quart answers, then hands the stream off (agentik.web.sse): an idle stream is hypercorn's
    two tasks for the connection (its reader and the app), nothing of Quart's or ours (issue 13:
    memory per idle connection). It still ends, and unsubscribes, on the client's disconnect."""
    async with serve_app(make_config(tmp_path, openai)) as srv:
        async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
            cid = await create(http)
        await trio.testing.wait_all_tasks_blocked()
        before = trio.lowlevel.current_statistics().tasks_living
        paths = ["/agentik/events", f"/agentik/conversations/{cid}/events",
                 f"/agentik/conversations/{cid}/live"]
        streams = [await raw_sse_request(srv.url, path) for path in paths]
        with trio.fail_after(10):
            await srv.state.wait_open_streams(3)
            await trio.testing.wait_all_tasks_blocked()
        assert trio.lowlevel.current_statistics().tasks_living - before == 2 * len(paths)
        assert (srv.hub.subscriber_count, srv.hub.online_subscribers(cid)) == (2, 1)
        for stream, _ in streams:
            await stream.aclose()
        with trio.fail_after(10):
            await srv.state.wait_open_streams(0)
        assert (srv.hub.subscriber_count, srv.hub.online_subscribers(cid)) == (0, 0)


async def test_a_stream_that_never_idles_still_ends_on_disconnect(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No task waits for the disconnect while a handed-off stream writes (agentik.sse.serve_body):
    a client gone in the middle of a long replay is noticed within BUSY_CHECK, not at its end."""
    exited = []

    class Busy(WakeBody):
        async def step(self) -> bytes:
            return b"data: x\n\n"  # always more, never idle

        async def __aenter__(self) -> Busy:
            return self

        async def __aexit__(self, *exc: object) -> None:
            exited.append(True)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}  # the client is already gone

    writes = []

    async def send(message: Any) -> None:
        writes.append(message)
        await trio.sleep(0.01)  # a write takes time

    with trio.fail_after(10 * BUSY_CHECK):
        await serve_body(Busy(heartbeat=60), receive, send)
    assert exited == [True]
    assert all(m.get("more_body") for m in writes)  # not ended as if the stream had finished


class Queued(WakeBody):
    """A body whose step() writes what the test queued (its source calls wake()); it parks."""

    parks = True

    def __init__(self, heartbeat: float) -> None:
        super().__init__(heartbeat)
        self.queued: list[bytes] = []
        self.exited = False

    async def step(self) -> bytes:
        chunk = b"".join(self.queued)
        self.queued.clear()
        return chunk

    def put(self, chunk: bytes) -> None:
        self.queued.append(chunk)
        self.wake()

    async def __aenter__(self) -> Queued:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.exited = True


async def test_a_stream_that_wrote_events_parks_until_the_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Between a model's tokens a stream waits *parked* (agentik.sse.WakeBody._park): woken by
    its source, with no cancel scope and no wait on the client (issue 13: that idle wait cost
    about as much as the token's write). A park that runs out falls back to the idle wait; a
    cancelled park leaves nothing parked."""
    body = Queued(heartbeat=60)
    idles: list[float] = []

    async def idle() -> None:
        idles.append(trio.current_time())
        await trio.sleep_forever()

    assert await body.next_chunk(idle) == OPENED
    body.put(b"a")
    assert await body.next_chunk(idle) == b"a"
    got: list[bytes] = []

    async def read() -> None:
        got.append(await body.next_chunk(idle))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.sleep(PARK / 4)
        body.put(b"b")
    assert got == [b"b"]
    assert idles == []  # parked, not in the idle wait
    # Nothing comes: the park runs out, then the idle wait (which sees a disconnect).
    parked_at = trio.current_time()
    with trio.move_on_after(10 * PARK):
        await body.next_chunk(idle)
    assert len(idles) == 1 and PARK <= idles[0] - parked_at <= PARK_MAX
    # Cancelled while parked: nothing stays parked.
    body.put(b"c")
    assert await body.next_chunk(idle) == b"c"
    with trio.move_on_after(PARK / 4):
        await body.next_chunk(idle)
    assert current_parking().parked == {} and len(idles) == 1


async def test_a_parked_stream_still_ends_on_disconnect(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A client gone while its stream is parked is noticed once the park runs out."""
    body = Queued(heartbeat=60)
    body.queued.append(b"data: x\n\n")
    disconnect = trio.Event()

    async def receive() -> dict[str, Any]:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    writes: list[Any] = []

    async def send(message: Any) -> None:
        writes.append(message)
        disconnect.set()  # the client leaves after the first write

    with trio.fail_after(2 * PARK_MAX):
        await serve_body(body, receive, send)
    assert body.exited
    assert [m["body"] for m in writes] == [OPENED, b"data: x\n\n"]
