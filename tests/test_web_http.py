"""REST routes against a real hypercorn: CRUD, messages, journal, errors of every shape."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import logging
from typing import Any

import httpx2
import pytest
import trio

from agentik.tools.base import FunctionTools
from agentik.web.app import create_app
from agentik.wire import Cursor
from tests.scripted_openai import Hang, Reply, ScriptedOpenAI, ToolCalls
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
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


async def create(client: httpx2.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post("/agentik/conversations", json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


async def send_and_wait(client: httpx2.AsyncClient, cid: str, text: str) -> str:
    """Send a message and wait (over SSE) until the turn stored its answer."""
    async with open_sse(client, f"/agentik/conversations/{cid}/events") as stream:
        response = await client.post(
            f"/agentik/conversations/{cid}/messages",
            json={"content": [{"type": "text", "body": text}]},
        )
        assert response.status_code == 202, response.text
        with trio.fail_after(10):
            frames = await stream.until("touched")
    assert [f.event for f in frames] == ["user_message", "assistant_message", "touched"]
    message_id: str = response.json()["message_id"]
    return message_id


async def test_info_cursor_health(client: httpx2.AsyncClient, server: Server) -> None:
    health = await client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}

    info = (await client.get("/agentik")).json()
    epoch = server.agent.id
    assert info["id"] == epoch
    assert info["name"] == "agentik"
    assert info["version"]
    assert info["capabilities"] == {"image_input": True, "tools": []}
    assert info["current"] == f"{epoch}:0" and info["oldest"] == f"{epoch}:0"

    await create(client)
    cursor = (await client.get("/agentik/cursor")).json()
    assert cursor == {"current": f"{epoch}:1", "oldest": f"{epoch}:0"}
    assert (await client.get("/agentik/tools")).json() == {"servers": []}


async def test_conversation_crud(client: httpx2.AsyncClient) -> None:
    empty = await client.post("/agentik/conversations")  # no body at all means {}
    assert empty.status_code == 201
    first = empty.json()
    assert first["title"] is None and first["is_temporal"] is False
    second = await create(client, title="second", temp=True)
    assert second["title"] == "second" and second["is_temporal"] is True

    got = await client.get(f"/agentik/conversations/{first['id']}")
    assert got.status_code == 200 and got.json() == first

    renamed = await client.patch(f"/agentik/conversations/{first['id']}", json={"title": "new"})
    assert renamed.status_code == 200
    assert renamed.json()["title"] == "new" and renamed.json()["seq"] > first["seq"]
    cleared = await client.patch(f"/agentik/conversations/{first['id']}", json={"title": None})
    assert cleared.json()["title"] is None

    listing = (await client.get("/agentik/conversations")).json()
    # Ordered by updated_at desc: the renamed one was touched last.
    assert [c["id"] for c in listing["conversations"]] == [first["id"], second["id"]]
    assert listing["cursor"]["offset"] == cleared.json()["seq"]
    page = (await client.get("/agentik/conversations", params={"offset": 1, "limit": 1})).json()
    assert [c["id"] for c in page["conversations"]] == [second["id"]]

    deleted = await client.delete(f"/agentik/conversations/{first['id']}")
    assert deleted.status_code == 204 and deleted.content == b""
    assert (await client.get(f"/agentik/conversations/{first['id']}")).status_code == 404
    again = await client.delete(f"/agentik/conversations/{first['id']}")
    assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"


async def test_turn_messages_snapshot_journal(
    client: httpx2.AsyncClient, openai: ScriptedOpenAI
) -> None:
    conv = await create(client, title="chat")
    cid = conv["id"]
    openai.push(Reply("first answer"), Reply("second answer"))
    first_id = await send_and_wait(client, cid, "one")
    await send_and_wait(client, cid, "two")

    messages = (await client.get(f"/agentik/conversations/{cid}/messages")).json()
    assert [m["message"]["type"] for m in messages] == [
        "user_message", "assistant_message", "user_message", "assistant_message",
    ]
    assert messages[0]["id"] == first_id
    assert messages[1]["message"]["content"] == [{"type": "text", "body": "first answer"}]
    seqs = [m["seq"] for m in messages]
    assert seqs == sorted(seqs)

    paged = await client.get(
        f"/agentik/conversations/{cid}/messages", params={"after_seq": seqs[1], "limit": 1}
    )
    assert [m["seq"] for m in paged.json()] == [seqs[2]]
    offset = await client.get(f"/agentik/conversations/{cid}/messages", params={"offset": 3})
    assert [m["seq"] for m in offset.json()] == [seqs[3]]

    snapshot = (await client.get(f"/agentik/conversations/{cid}/snapshot")).json()
    assert snapshot["conversation"]["id"] == cid
    assert [m["seq"] for m in snapshot["messages"]] == seqs
    cursor = (await client.get("/agentik/cursor")).json()["current"]
    assert str(Cursor(**snapshot["cursor"])) == cursor

    journal = (await client.get("/agentik/journal", params={"conversation_id": cid})).json()
    assert [r["seq"] for r in journal] == seqs
    window = await client.get(
        "/agentik/journal", params={"after_seq": seqs[0], "up_to_seq": seqs[2], "limit": 10}
    )
    assert [r["seq"] for r in window.json()] == seqs[1:3]
    count = await client.get("/agentik/journal/count", params={"conversation_id": cid})
    assert count.json() == {"count": 4}
    count_after = await client.get("/agentik/journal/count", params={"after_seq": seqs[1]})
    assert count_after.json() == {"count": 2}


async def test_interrupt(client: httpx2.AsyncClient, openai: ScriptedOpenAI) -> None:
    cid = (await create(client))["id"]
    idle = await client.post(f"/agentik/conversations/{cid}/interrupt")
    assert idle.status_code == 202 and idle.json() == {"interrupted": False}

    openai.push(Hang(text_before="partial "))
    async with open_sse(client, f"/agentik/conversations/{cid}/events") as stream:
        await client.post(
            f"/agentik/conversations/{cid}/messages",
            json={"content": [{"type": "text", "body": "hi"}]},
        )
        with trio.fail_after(10):
            await openai.wait_requests(1)
            # The turn is running once the model was asked; interrupt it.
            response = await client.post(f"/agentik/conversations/{cid}/interrupt")
            assert response.status_code == 202 and response.json() == {"interrupted": True}
            frames = await stream.until("interrupted")
    assert frames[0].event == "user_message"
    assert frames[-1].event == "interrupted"
    missing = await client.post("/agentik/conversations/nope/interrupt")
    assert missing.status_code == 404


async def test_an_interruption_before_any_text_is_in_the_history(
    tmp_path: Any, openai: ScriptedOpenAI
) -> None:
    """Issue 11: a turn interrupted before the model said anything (waiting for its first token,
    or during a tool call) ends in the journal too, not only on the event stream: an
    assistant_message with no text marked interrupted, so a client rejoining from the snapshot
    shows "[interrupted]" where the answer would be."""
    tools = FunctionTools()
    started = trio.Event()

    async def slow() -> str:
        started.set()
        await trio.sleep_forever()
        return ""

    tools.add(slow)
    async with serve_app(make_config(tmp_path, openai), tools=tools) as srv:
        async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
            cid = (await create(http))["id"]
            openai.push(Hang(), ToolCalls([("c1", "slow", "{}")]))
            for text, running in (("first token?", lambda: openai.wait_requests(1)),
                                  ("a tool then", started.wait)):
                async with open_sse(http, f"/agentik/conversations/{cid}/events") as stream:
                    await http.post(f"/agentik/conversations/{cid}/messages",
                                    json={"content": [{"type": "text", "body": text}]})
                    with trio.fail_after(10):
                        await running()
                        response = await http.post(f"/agentik/conversations/{cid}/interrupt")
                        assert response.json() == {"interrupted": True}
                        await stream.until("interrupted")
            snapshot = (await http.get(f"/agentik/conversations/{cid}/snapshot")).json()
    messages = [m["message"] for m in snapshot["messages"]]
    assert [m["type"] for m in messages] == [
        "user_message", "assistant_message",
        "user_message", "tool_call", "tool_result", "assistant_message"]
    for answer in (messages[1], messages[5]):
        assert answer["interrupted"] is True and answer["content"] == []
    assert messages[4]["is_error"] is True  # the cut call is closed (ToolFailed)


async def test_not_running_is_503_with_retry_after(config: Any) -> None:
    """Before the runtime runs (and after it stopped) every route answers 503 with Retry-After,
    so clients and proxies come back instead of giving up."""
    app = create_app(config, on_fatal=lambda exc: None, handle_sigterm=False)
    client = app.test_client()
    for method, path in (("GET", "/agentik"), ("POST", "/agentik/conversations"),
                         ("GET", "/agentik/events")):
        response = await client.open(path, method=method)
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "1"
        assert (await response.get_json())["error"]["code"] == "closed"


async def test_mailbox_full_is_429(tmp_path: Any, openai: ScriptedOpenAI) -> None:
    async with serve_app(make_config(tmp_path, openai, mailbox_size=1)) as srv:
        async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
            cid = (await create(http))["id"]
            openai.default = Hang()
            body = {"content": [{"type": "text", "body": "x"}]}
            url = f"/agentik/conversations/{cid}/messages"
            assert (await http.post(url, json=body)).status_code == 202
            with trio.fail_after(10):
                await openai.wait_requests(1)  # turn 1 runs: the mailbox is empty again
            assert (await http.post(url, json=body)).status_code == 202  # queued
            full = await http.post(url, json=body)
            assert full.status_code == 429
            assert full.headers["Retry-After"] == "1"
            error = full.json()["error"]
            assert error["code"] == "mailbox_full" and error["retry_after"] == 1.0


BIG = 4 * 1024 * 1024
DEPTH = 100_000
DEEP = b'{"a":' * DEPTH + b"1" + b"}" * DEPTH
DEEP_IN_CONTEXT = (
    b'{"content": [{"type": "text", "body": "x"}], "context": {"metadata": '
    + b"[" * DEPTH + b"]" * DEPTH + b"}}"
)
BAD_OFFSETS = [
    "\u00b2", "\u0661\u0662", "\uff11\uff12", "9" * 5000, "9" * 20, "9223372036854775808", "+1",
    "1 2", "0x1",
]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        # invalid JSON / shapes
        ("post", "/agentik/conversations", {"content": b"{nope"}, 400, "invalid_input"),
        ("post", "/agentik/conversations", {"content": b"\xff\xfe"}, 400, "invalid_input"),
        ("post", "/agentik/conversations", {"json": []}, 400, "invalid_input"),
        ("post", "/agentik/conversations", {"json": {"temp": "yes"}}, 400, "invalid_input"),
        ("post", "/agentik/conversations", {"json": {"title": 5}}, 400, "invalid_input"),
        ("patch", "/agentik/conversations/{cid}", {"json": {}}, 400, "invalid_input"),
        ("patch", "/agentik/conversations/{cid}", {}, 400, "invalid_input"),
        ("post", "/agentik/conversations/{cid}/messages", {"json": {}}, 400, "invalid_input"),
        ("post", "/agentik/conversations/{cid}/messages", {"json": {"content": []}}, 400,
         "invalid_input"),
        ("post", "/agentik/conversations/{cid}/messages", {"json": {"content": "hi"}}, 400,
         "invalid_input"),
        ("post", "/agentik/conversations/{cid}/messages",
         {"json": {"content": [{"type": "video", "body": "x"}]}}, 400, "invalid_input"),
        ("post", "/agentik/conversations/{cid}/messages",
         {"json": {"content": [{"type": "text"}]}}, 400, "invalid_input"),
        ("post", "/agentik/conversations/{cid}/messages",
         {"json": {"content": [{"type": "text", "body": "x"}], "context": {"origin": 1}}}, 400,
         "invalid_input"),
        # issue 11 #8: a 100,000-deep JSON document is a 400 with a message, not a RecursionError
        ("post", "/agentik/conversations", {"content": DEEP}, 400, "invalid_input"),
        ("patch", "/agentik/conversations/{cid}", {"content": DEEP}, 400, "invalid_input"),
        ("post", "/agentik/conversations/{cid}/messages", {"content": DEEP}, 400, "invalid_input"),
        ("post", "/agentik/conversations/{cid}/messages", {"content": DEEP_IN_CONTEXT}, 400,
         "invalid_input"),
        # query parameters
        ("get", "/agentik/conversations", {"params": {"limit": "abc"}}, 400, "invalid_input"),
        ("get", "/agentik/conversations", {"params": {"limit": "0"}}, 400, "invalid_input"),
        ("get", "/agentik/conversations", {"params": {"limit": "5000"}}, 400, "invalid_input"),
        ("get", "/agentik/conversations", {"params": {"offset": "-1"}}, 400, "invalid_input"),
        ("get", "/agentik/conversations", {"params": {"offset": "1.5"}}, 400, "invalid_input"),
        ("get", "/agentik/conversations", {"params": {"offset": "9" * 30}}, 400, "invalid_input"),
        ("get", "/agentik/conversations/{cid}/messages", {"params": {"after_seq": "x"}}, 400,
         "invalid_input"),
        ("get", "/agentik/journal", {"params": {"up_to_seq": "-3"}}, 400, "invalid_input"),
        ("get", "/agentik/journal", {"params": {"limit": " 1"}}, 400, "invalid_input"),
        ("get", "/agentik/journal/count", {"params": {"after_seq": "1e3"}}, 400, "invalid_input"),
        ("get", "/agentik/events", {"params": {"after": "nocolon"}}, 400, "invalid_input"),
        ("get", "/agentik/events", {"params": {"after": "e:-1"}}, 400, "invalid_input"),
        ("get", "/agentik/events", {"headers": {"Last-Event-ID": "x:y"}}, 400, "invalid_input"),
        # issue 11 #8: cursor offsets are ASCII digits of bounded length, on after= and
        # Last-Event-ID ("²" was a 500, other scripts' digits were accepted, 5,000 digits a 500)
        *[
            (method, path, {where: {name: "{epoch}:" + offset}}, 400, "invalid_input")
            for offset in BAD_OFFSETS
            for method, path, where, name in [
                ("get", "/agentik/events", "params", "after"),
                ("get", "/agentik/events", "headers", "Last-Event-ID"),
                ("get", "/agentik/conversations/{cid}/events", "params", "after"),
            ]
        ],
        # the same rule (agentik.wire.parse_offset) for the integer query parameters
        *[
            ("get", path, {"params": {name: value}}, 400, "invalid_input")
            for value in BAD_OFFSETS
            for path, name in [("/agentik/conversations", "offset"),
                               ("/agentik/journal", "after_seq")]
        ],
        ("get", "/agentik/events", {"params": {"after": "otherepoch:0"}}, 410, "gap"),
        ("get", "/agentik/events", {"params": {"after": "{epoch}:999"}}, 410, "gap"),
        ("get", "/agentik/conversations/{cid}/events", {"params": {"after": "{epoch}:999"}}, 410,
         "gap"),
        # unknown ids and routes
        ("get", "/agentik/conversations/nope", {}, 404, "not_found"),
        ("patch", "/agentik/conversations/nope", {"json": {"title": "x"}}, 404, "not_found"),
        ("delete", "/agentik/conversations/nope", {}, 404, "not_found"),
        ("post", "/agentik/conversations/nope/messages",
         {"json": {"content": [{"type": "text", "body": "x"}]}}, 404, "not_found"),
        ("get", "/agentik/conversations/nope/messages", {}, 404, "not_found"),
        ("get", "/agentik/conversations/nope/snapshot", {}, 404, "not_found"),
        ("get", "/agentik/conversations/nope/events", {}, 404, "not_found"),
        ("get", "/agentik/conversations/nope/live", {}, 404, "not_found"),
        ("get", "/agentik/nothing-here", {}, 404, "not_found"),
        ("put", "/agentik/conversations", {}, 405, "method_not_allowed"),
        # too large: by Content-Length, and chunked (no length)
        ("post", "/agentik/conversations", {"content": b"x" * (BIG + 1)}, 413, "too_large"),
        ("post", "/agentik/conversations/{cid}/messages", {"chunked": BIG + 1}, 413, "too_large"),
    ],
)
async def test_bad_input(
    client: httpx2.AsyncClient,
    server: Server,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    kwargs: dict[str, Any],
    status: int,
    code: str,
) -> None:
    caplog.set_level(logging.INFO, logger="agentik.web.access")
    cid = (await create(client))["id"]
    epoch = server.agent.id
    kwargs = dict(kwargs)
    if "chunked" in kwargs:
        size = kwargs.pop("chunked")

        async def body() -> Any:
            chunk = b"x" * 65536
            for _ in range(size // len(chunk) + 1):
                yield chunk

        kwargs["content"] = body()
    for key in ("params", "headers"):
        if key in kwargs:
            kwargs[key] = {k: v.format(epoch=epoch) for k, v in kwargs[key].items()}
    if "headers" in kwargs:  # non-ASCII values go as UTF-8, as a careless client sends them
        kwargs["headers"] = {k: v.encode() for k, v in kwargs["headers"].items()}
    target = path.format(cid=cid)
    try:
        response = await client.request(method.upper(), target, **kwargs)
    except (httpx2.WriteError, httpx2.ReadError):
        # The server answered a too-large body before the client had sent all of it, and closed
        # the connection, so the client could not read the answer: what the server answered is
        # in its access log (one line per request, written before the answer is sent).
        assert status == 413
        answered = [r.getMessage() for r in caplog.records if r.name == "agentik.web.access"]
        assert any(line.startswith(f"POST {target} 413 ") for line in answered), answered
    else:
        assert response.status_code == status, response.text
        assert response.headers["content-type"].startswith("application/json")
        error = response.json()["error"]
        assert error["code"] == code
        assert error["message"] and len(error["message"]) < 300  # a 5,000-digit value is cut
        if status == 410:
            assert error["oldest"] == f"{epoch}:0"
            assert error["current"] == f"{epoch}:1"
    # Nothing of that broke the server.
    assert (await client.get("/agentik/cursor")).status_code == 200


async def test_no_input_shape_gets_a_500(client: httpx2.AsyncClient, openai: ScriptedOpenAI) -> None:
    """A deterministic sweep of odd inputs over every route: answers are 2xx or 4xx, never 5xx."""
    cid = (await create(client))["id"]
    openai.default = Reply("ok")
    ids = [cid, "nope", "%00", "a" * 5000, "..", "é", "' OR 1=1 --"]
    bodies: list[bytes | None] = [
        None, b"", b"null", b"0", b'"x"', b"[]", b"{}", b'{"content": null}', b"\x00\x01",
        b'{"title": "' + b"t" * 100_000 + b'"}', b'{"temp": true, "title": null, "x": [1]}',
        b'{"content": [{"type": "image", "data": "!!", "mime": 5}]}',
        b'{"content": [{"type": "text", "body": "hi"}], "context": {"metadata": {"a": 1}}}',
        DEEP, DEEP_IN_CONTEXT, b"[" * DEPTH,
    ]
    queries = [{}, {"limit": ""}, {"offset": "1"}, {"after": ":"}, {"after": "a:b:1"},
               {"after_seq": "00"}, {"up_to_seq": "0"}, {"conversation_id": ""},
               *[{"after": "e:" + offset} for offset in BAD_OFFSETS]]
    routes = [
        ("GET", "/agentik"), ("GET", "/agentik/cursor"), ("GET", "/agentik/conversations"),
        ("POST", "/agentik/conversations"), ("GET", "/agentik/conversations/{id}"),
        ("PATCH", "/agentik/conversations/{id}"), ("POST", "/agentik/conversations/{id}/messages"),
        ("POST", "/agentik/conversations/{id}/interrupt"),
        ("GET", "/agentik/conversations/{id}/messages"),
        ("GET", "/agentik/conversations/{id}/snapshot"), ("GET", "/agentik/journal"),
        ("GET", "/agentik/journal/count"), ("GET", "/agentik/tools"),
        ("POST", "/agentik/cursor"), ("DELETE", "/agentik/conversations/{id}"),
    ]
    statuses: set[int] = set()
    with trio.fail_after(60):
        for i, (method, path) in enumerate(routes):
            for j, body in enumerate(bodies):
                target = path.format(id=ids[(i + j) % len(ids)])
                if method == "DELETE" and "nope" not in target:
                    continue  # keep the conversation for the other requests
                params = queries[(i * 3 + j) % len(queries)]
                response = await client.request(method, target, content=body, params=params)
                statuses.add(response.status_code)
                assert response.status_code < 500, (method, target, body, response.text)
                assert "error" in response.json() if response.status_code >= 400 else True
    assert {200, 400, 404}.issubset(statuses)


class StatusTools(FunctionTools):
    def status(self) -> list[dict[str, Any]]:
        return [{"name": "calc", "transport": "stdio", "state": "connected", "tools": ["add"]}]


async def test_tools_and_capabilities(tmp_path: Any, openai: ScriptedOpenAI) -> None:
    registry = StatusTools()
    registry.add(lambda a, b: a + b, name="add", description="Add two numbers")
    async with serve_app(make_config(tmp_path, openai), tools=registry) as srv:
        async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
            info = (await http.get("/agentik")).json()
            assert info["capabilities"]["tools"] == ["add"]
            assert (await http.get("/agentik/tools")).json() == {"servers": registry.status()}
