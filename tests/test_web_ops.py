"""Running it in production (issue 14): /metrics, CORS, idempotent writes, the busy policy, the
server-side kind filter, against a real hypercorn and the scripted OpenAI server."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from typing import Any

import httpx2
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from quart import Response

from agentik.web.app import create_app
from tests.scripted_openai import Fail, Hang, Reply, ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    allow_error_logs,
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

TEXT = [{"type": "text", "body": "hi"}]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a text exposition, parsed by prometheus-client's own parser."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def scrape(client: httpx2.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


async def create(client: httpx2.AsyncClient, **body: Any) -> str:
    response = await client.post("/agentik/conversations", json=body)
    assert response.status_code == 201, response.text
    cid: str = response.json()["id"]
    return cid


async def turn(client: httpx2.AsyncClient, cid: str, until: str = "touched") -> list[str]:
    async with open_sse(client, f"/agentik/conversations/{cid}/events") as stream:
        response = await client.post(f"/agentik/conversations/{cid}/messages",
                                     json={"content": TEXT})
        assert response.status_code == 202, response.text
        with trio.fail_after(10):
            return [f.event for f in await stream.until(until)]


# --- metrics -------------------------------------------------------------------------------------


async def test_metrics_count_turns_failures_commits_and_streams(
    client: httpx2.AsyncClient, server: Server, openai: ScriptedOpenAI, allow_error_logs: None
) -> None:
    before = await scrape(client)

    def delta(after: dict[Any, float], name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    cid = await create(client)
    openai.push(Reply(text="one"), Reply(text="two"), Reply(text="three"), Fail(status=400))
    for _ in range(3):
        assert "assistant_message" in await turn(client, cid)
    assert "error" in await turn(client, cid)

    after = await scrape(client)
    assert delta(after, "agentik_turns_total", outcome="completed") == 3
    assert delta(after, "agentik_turns_total", outcome="failed") == 1
    assert delta(after, "agentik_turns_total", outcome="interrupted") == 0
    assert delta(after, "agentik_turn_duration_seconds_count") == 4
    assert delta(after, "agentik_time_to_first_token_seconds_count") == 3
    assert sum(v for (n, labels), v in after.items() if n == "agentik_llm_errors_total") - sum(
        v for (n, labels), v in before.items() if n == "agentik_llm_errors_total") == 1
    # created + 4 x (user message, answer or error, touched)
    assert delta(after, "agentik_events_committed_total") == 1 + 4 * 3
    assert delta(after, "agentik_storage_commit_seconds_count") >= 1
    assert delta(after, "agentik_storage_batch_size_sum") >= 9
    assert after[("agentik_live_conversations", ())] >= 1

    base_sse = after[("agentik_sse_connections", ())]
    async with open_sse(client, "/agentik/events"):
        during = await scrape(client)
        assert during[("agentik_sse_connections", ())] == base_sse + 1
    with trio.fail_after(5):
        await server.state.wait_open_streams(0)  # the handler has left (gauge first)
    assert (await scrape(client))[("agentik_sse_connections", ())] == base_sse


async def test_metrics_need_the_token(tmp_path: Any, openai: ScriptedOpenAI) -> None:
    async with serve_app(make_config(tmp_path, openai, tokens=("s3cret",))) as served:
        async with httpx2.AsyncClient(base_url=served.url, timeout=10) as http:
            assert (await http.get("/metrics")).status_code == 401
            ok = await http.get("/metrics", headers={"Authorization": "Bearer s3cret"})
            assert ok.status_code == 200 and "agentik_turns_total" in ok.text


# --- CORS ----------------------------------------------------------------------------------------

APP = "https://app.example"
PREFLIGHT = {
    "Origin": APP,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type, idempotency-key",
}


async def test_cors_preflight_without_token_only_for_allowed_origins(
    tmp_path: Any, openai: ScriptedOpenAI
) -> None:
    config = make_config(tmp_path, openai, tokens=("s3cret",), cors_origins=(APP,))
    async with serve_app(config) as served:
        async with httpx2.AsyncClient(base_url=served.url, timeout=10) as http:
            path = "/agentik/conversations/abc/messages"
            ok = await http.options(path, headers=PREFLIGHT)
            assert ok.status_code == 204
            assert ok.headers["access-control-allow-origin"] == APP
            allowed = {h.strip().lower() for h in
                       ok.headers["access-control-allow-headers"].split(",")}
            assert {"authorization", "content-type", "last-event-id", "idempotency-key",
                    "x-client-id"} <= allowed
            assert "POST" in ok.headers["access-control-allow-methods"]

            other = await http.options(path, headers={**PREFLIGHT, "Origin": "https://evil.example"})
            assert not [h for h in other.headers if h.lower().startswith("access-control-")]

            # an actual request (a 401 here) carries the origin and the exposed headers
            denied = await http.get("/agentik", headers={"Origin": APP})
            assert denied.status_code == 401
            assert denied.headers["access-control-allow-origin"] == APP
            exposed = {h.strip().lower() for h in
                       denied.headers["access-control-expose-headers"].split(",")}
            assert {"retry-after", "x-agentik-cursor"} <= exposed
            foreign = await http.get("/agentik", headers={"Origin": "https://evil.example",
                                                          "Authorization": "Bearer s3cret"})
            assert foreign.status_code == 200
            assert "access-control-allow-origin" not in foreign.headers


async def test_cors_star_allows_any_origin_without_credentials(
    tmp_path: Any, openai: ScriptedOpenAI
) -> None:
    async with serve_app(make_config(tmp_path, openai, cors_origins=("*",))) as served:
        async with httpx2.AsyncClient(base_url=served.url, timeout=10) as http:
            ok = await http.options("/agentik/conversations", headers=PREFLIGHT)
            assert ok.status_code == 204
            assert ok.headers["access-control-allow-origin"] == "*"
            assert "access-control-allow-credentials" not in ok.headers


async def test_no_cors_setting_no_cors_headers(client: httpx2.AsyncClient) -> None:
    response = await client.options("/agentik/conversations", headers=PREFLIGHT)
    assert not [h for h in response.headers if h.lower().startswith("access-control-")]
    plain = await client.get("/agentik", headers={"Origin": APP})
    assert not [h for h in plain.headers if h.lower().startswith("access-control-")]


# --- idempotent writes ---------------------------------------------------------------------------


async def count_user_messages(client: httpx2.AsyncClient, cid: str) -> int:
    response = await client.get(f"/agentik/conversations/{cid}/messages")
    assert response.status_code == 200, response.text
    return sum(1 for m in response.json() if m["message"]["type"] == "user_message")


async def test_idempotent_create_and_send_survive_a_restart(
    tmp_path: Any, openai: ScriptedOpenAI
) -> None:
    config = make_config(tmp_path, openai)
    openai.default = Reply(text="ok")
    url = "/agentik/conversations"
    async with serve_app(config) as served:
        async with httpx2.AsyncClient(base_url=served.url, timeout=10) as http:
            made = await http.post(url, json={"title": "t"}, headers={"Idempotency-Key": "c1"})
            again = await http.post(url, json={"title": "t"}, headers={"Idempotency-Key": "c1"})
            assert made.status_code == again.status_code == 201
            cid = made.json()["id"]
            assert again.json()["id"] == cid
            listed = (await http.get(url)).json()["conversations"]
            assert [c["id"] for c in listed] == [cid]
            other = await http.post(url, json={"title": "u"}, headers={"Idempotency-Key": "c1"})
            assert other.status_code == 422
            assert other.json()["error"]["code"] == "idempotency_key_reused"

            send = f"/agentik/conversations/{cid}/messages"
            first = await http.post(send, json={"content": TEXT}, headers={"Idempotency-Key": "m1"})
            second = await http.post(send, json={"content": TEXT},
                                     headers={"Idempotency-Key": "m1"})
            assert first.status_code == second.status_code == 202
            message_id = first.json()["message_id"]
            assert second.json()["message_id"] == message_id
            changed = await http.post(send, json={"content": [{"type": "text", "body": "other"}]},
                                      headers={"Idempotency-Key": "m1"})
            assert changed.status_code == 422
            assert (await count_user_messages(http, cid)) == 1

    async with serve_app(config) as served:
        async with httpx2.AsyncClient(base_url=served.url, timeout=10) as http:
            send = f"/agentik/conversations/{cid}/messages"
            after = await http.post(send, json={"content": TEXT}, headers={"Idempotency-Key": "m1"})
            assert after.status_code == 202 and after.json()["message_id"] == message_id
            remade = await http.post(url, json={"title": "t"}, headers={"Idempotency-Key": "c1"})
            assert remade.status_code == 201 and remade.json()["id"] == cid
            assert (await count_user_messages(http, cid)) == 1
            # without a key every send is a new message
            plain = await http.post(send, json={"content": TEXT})
            assert plain.status_code == 202 and plain.json()["message_id"] != message_id
            assert (await count_user_messages(http, cid)) == 2


async def test_idempotency_keys_expire(tmp_path: Any, openai: ScriptedOpenAI) -> None:
    openai.default = Reply(text="ok")
    # a key that lives a microsecond is gone by the retry: the retry is a new write
    async with serve_app(make_config(tmp_path, openai, idempotency_ttl=1e-6)) as served:
        async with httpx2.AsyncClient(base_url=served.url, timeout=10) as http:
            url = "/agentik/conversations"
            one = await http.post(url, json={}, headers={"Idempotency-Key": "k"})
            two = await http.post(url, json={}, headers={"Idempotency-Key": "k"})
            assert one.status_code == two.status_code == 201
            assert one.json()["id"] != two.json()["id"]


# --- busy policy ---------------------------------------------------------------------------------


async def test_busy_reject_stores_nothing_and_interrupt_takes_over(
    client: httpx2.AsyncClient, openai: ScriptedOpenAI
) -> None:
    cid = await create(client)
    send = f"/agentik/conversations/{cid}/messages"
    openai.push(Hang(text_before="partial "), Reply(text="the new answer"))
    async with open_sse(client, f"/agentik/conversations/{cid}/events") as stream:
        assert (await client.post(send, json={"content": TEXT})).status_code == 202
        with trio.fail_after(10):
            await openai.wait_requests(1)  # the first turn runs
        rejected = await client.post(send, json={"content": TEXT, "on_busy": "reject"})
        assert rejected.status_code == 409, rejected.text
        assert rejected.json()["error"]["code"] == "busy"
        assert (await count_user_messages(client, cid)) == 1

        bad = await client.post(send, json={"content": TEXT, "on_busy": "later"})
        assert bad.status_code == 400

        taken = await client.post(send, json={"content": [{"type": "text", "body": "now"}],
                                              "on_busy": "interrupt"})
        assert taken.status_code == 202
        with trio.fail_after(10):
            frames = [f.event for f in await stream.until("assistant_message")]
            frames += [f.event for f in await stream.until("assistant_message")]
    # the first turn ends interrupted (its partial answer kept), the new message is answered
    assert frames.count("interrupted") == 1
    assert frames.index("interrupted") < len(frames) - 1
    messages = (await client.get(f"/agentik/conversations/{cid}/messages")).json()
    answers = [m["message"] for m in messages if m["message"]["type"] == "assistant_message"]
    assert answers[0]["interrupted"] is True and "partial" in str(answers[0])
    assert answers[-1]["interrupted"] is False and "the new answer" in str(answers[-1])


async def test_busy_policy_default_from_the_setting(tmp_path: Any, openai: ScriptedOpenAI) -> None:
    async with serve_app(make_config(tmp_path, openai, busy_policy="reject")) as served:
        async with httpx2.AsyncClient(base_url=served.url, timeout=10) as http:
            cid = await create(http)
            openai.default = Hang()
            send = f"/agentik/conversations/{cid}/messages"
            assert (await http.post(send, json={"content": TEXT})).status_code == 202
            with trio.fail_after(10):
                await openai.wait_requests(1)
            assert (await http.post(send, json={"content": TEXT})).status_code == 409
            queued = await http.post(send, json={"content": TEXT, "on_busy": "queue"})
            assert queued.status_code == 202


# --- kind filter ---------------------------------------------------------------------------------


async def test_kind_filter_on_sse_and_websocket(
    client: httpx2.AsyncClient, server: Server, openai: ScriptedOpenAI
) -> None:
    openai.default = Reply(text="ok")
    start = (await client.get("/agentik/cursor")).json()["current"]
    cid = await create(client, title="a")
    await turn(client, cid)
    assert (await client.patch(f"/agentik/conversations/{cid}", json={"title": "b"})).status_code == 200
    assert (await client.delete(f"/agentik/conversations/{cid}")).status_code == 204
    head = (await client.get("/agentik/cursor")).json()["current"]
    head_offset = int(head.split(":")[1])

    async def read(kind: str | None) -> list[str]:
        params = {} if kind is None else {"kind": kind}
        async with open_sse(client, "/agentik/events", after=start, params=params) as stream:
            out: list[str] = []
            with trio.fail_after(10):
                while True:
                    frame = await stream.next_event()
                    out.append(frame.event)
                    if int(frame.id.split(":")[1]) >= head_offset:
                        return out
                    if kind == "agent" and frame.event == "deleted":
                        return out
                    if kind == "conversation" and frame.event == "conversation_closing":
                        return out

    agent = await read("agent")
    assert agent[0] == "created" and agent[-1] == "deleted"
    assert set(agent) == {"created", "renamed", "touched", "deleted"}  # only these
    inside = await read("conversation")
    assert "user_message" in inside and "assistant_message" in inside
    assert not set(inside) & {"created", "renamed", "touched", "deleted"}
    everything = await read(None)
    assert set(agent) | set(inside) <= set(everything)
    bad = await client.get("/agentik/events", params={"kind": "nope"})
    assert bad.status_code == 400

    from trio_websocket import open_websocket_url

    from tests.webutil import WsClient

    async with open_websocket_url(server.ws_url) as ws:
        wsc = WsClient(ws)
        reply = await wsc.call("subscribe", stream="events", after=start, kind="agent")
        assert reply["type"] == "reply", reply
        with trio.fail_after(10):
            got = await wsc.events(reply["result"]["subscription"], until="deleted")
        assert {e["event"]["type"] for e in got} == {"created", "renamed", "touched", "deleted"}
        wrong = await wsc.call("subscribe", stream="live", conversation_id=cid, kind="agent")
        assert wrong["type"] == "error"


async def test_websocket_commands_take_on_busy_and_idempotency_key(
    client: httpx2.AsyncClient, server: Server, openai: ScriptedOpenAI
) -> None:
    from trio_websocket import open_websocket_url

    from tests.webutil import WsClient

    async with open_websocket_url(server.ws_url) as ws:
        wsc = WsClient(ws)
        one = await wsc.call("create", idempotency_key="ws-c")
        two = await wsc.call("create", idempotency_key="ws-c")
        assert one["type"] == two["type"] == "reply"
        cid = one["result"]["id"]
        assert two["result"]["id"] == cid
        openai.default = Hang()
        first = await wsc.call("send", conversation_id=cid, content=TEXT, idempotency_key="ws-m")
        again = await wsc.call("send", conversation_id=cid, content=TEXT, idempotency_key="ws-m")
        assert first["result"]["message_id"] == again["result"]["message_id"]
        with trio.fail_after(10):
            await openai.wait_requests(1)
        busy = await wsc.call("send", conversation_id=cid, content=TEXT, on_busy="reject")
        assert busy["type"] == "error" and busy["error"]["code"] == "busy"
        assert (await count_user_messages(client, cid)) == 1


async def test_cors_vary_origin_is_added_to_the_routes_vary(
    tmp_path: Any, openai: ScriptedOpenAI
) -> None:
    """``Vary: Origin`` joins a Vary header the route already set (caches must still key on
    both), and is not repeated."""
    app = create_app(make_config(tmp_path, openai, cors_origins=(APP,)), handle_sigterm=False)

    @app.route("/vary-test")
    async def vary_test() -> Response:
        return Response(b"{}", headers={"Vary": "Accept-Encoding"})

    client = app.test_client()
    response = await client.get("/vary-test", headers={"Origin": APP})
    assert response.headers["Access-Control-Allow-Origin"] == APP
    assert response.headers.getlist("Vary") == ["Accept-Encoding, Origin"]
    plain = await client.get("/vary-test")  # no Origin: the route's Vary alone
    assert plain.headers.getlist("Vary") == ["Accept-Encoding"]
