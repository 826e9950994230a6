"""Users over the real server (docs/USERS.md): two users with their own tokens never reach each
other's conversations (HTTP, SSE, WebSocket, A2A), their event streams carry only their own
conversations' events on the one global cursor, admins see everything, admin-only routes."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from trio_websocket import open_websocket_url

from agentik.ids import new_id
from tests.scripted_openai import ScriptedOpenAI
from tests.usersutil import SHARED, bearer, write_users
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    WsClient,
    make_config,
    no_error_logs,
    open_sse,
    openai,
    serve_app,
)

V1 = {"A2A-Version": "1.0"}


@pytest.fixture
async def served(tmp_path: Path, openai: ScriptedOpenAI) -> AsyncIterator[Server]:
    users = write_users(tmp_path / "users.toml")
    config = make_config(tmp_path, openai, users_file=str(users), tokens=(SHARED,))
    async with serve_app(config) as server:
        yield server


def http(server: Server, user: str) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(base_url=server.url, timeout=10, headers=bearer(user))


async def answered_turn(client: httpx2.AsyncClient, cid: str, text: str = "hi") -> None:
    """Send ``text`` and wait for the turn's answer on the conversation's stream."""
    cursor = (await client.get("/agentik/cursor")).json()["current"]
    async with open_sse(client, f"/agentik/conversations/{cid}/events", after=cursor) as stream:
        sent = await client.post(f"/agentik/conversations/{cid}/messages",
                                 json={"content": [{"type": "text", "body": text}]})
        assert sent.status_code == 202, sent.text
        await stream.until("assistant_message")


def same_answer(theirs: httpx2.Response, unknown: httpx2.Response, cid: str, other: str) -> None:
    """``theirs`` (for another user's ``cid``) is what ``unknown`` (for id ``other``) is."""
    assert theirs.status_code == unknown.status_code, (theirs.text, unknown.text)
    assert theirs.text.replace(cid, "ID") == unknown.text.replace(other, "ID")


async def test_every_http_route_answers_another_users_conversation_as_unknown(
    served: Server,
) -> None:
    async with http(served, "alice") as alice, http(served, "bob") as bob, \
            http(served, "root") as root:
        with trio.fail_after(30):
            cid = (await alice.post("/agentik/conversations", json={"title": "A"})).json()["id"]
            await answered_turn(alice, cid)
            own = (await bob.post("/agentik/conversations", json={"title": "B"})).json()["id"]
            unknown = new_id()
            calls: list[tuple[str, str, dict[str, Any]]] = [
                ("GET", "/agentik/conversations/{}", {}),
                ("PATCH", "/agentik/conversations/{}", {"json": {"title": "mine now"}}),
                ("POST", "/agentik/conversations/{}/messages",
                 {"json": {"content": [{"type": "text", "body": "x"}]}}),
                ("POST", "/agentik/conversations/{}/interrupt", {}),
                ("POST", "/agentik/conversations/{}/interrupt", {"json": {"turn_id": "t1"}}),
                ("POST", "/agentik/conversations/{}/approvals/c1", {"json": {"approve": True}}),
                ("POST", "/agentik/conversations/{}/inputs/c1", {"json": {"text": "yes"}}),
                ("GET", "/agentik/conversations/{}/messages", {}),
                ("GET", "/agentik/conversations/{}/snapshot", {}),
                ("GET", "/agentik/conversations/{}/events", {}),
                ("GET", "/agentik/conversations/{}/live", {}),
                ("GET", "/agentik/journal?conversation_id={}", {}),
                ("GET", "/agentik/journal/count?conversation_id={}", {}),
                ("DELETE", "/agentik/conversations/{}", {}),
            ]
            for method, path, kw in calls:
                theirs = await bob.request(method, path.format(cid), **kw)
                other = await bob.request(method, path.format(unknown), **kw)
                same_answer(theirs, other, cid, unknown)
                assert theirs.status_code in (404, 200), (method, path)
            # the lists leave it out; bob's own is there
            listed = (await bob.get("/agentik/conversations")).json()["conversations"]
            assert [c["id"] for c in listed] == [own]
            journal = (await bob.get("/agentik/journal")).json()
            assert journal == [] and (await bob.get("/agentik/journal/count")).json() == {
                "count": 0}
            # alice's is untouched (bob's rename and delete did nothing), and hers to see
            mine = (await alice.get(f"/agentik/conversations/{cid}")).json()
            assert mine["title"] == "A"
            assert len((await alice.get("/agentik/journal")).json()) == 2
            assert [c["id"] for c in (await alice.get("/agentik/conversations")).json()[
                "conversations"]] == [cid]
            # admins see everything: the users file's and AGENTIK_TOKENS'
            for admin in (root, http(served, SHARED)):
                listed = (await admin.get("/agentik/conversations")).json()["conversations"]
                assert {c["id"] for c in listed} == {cid, own}
                assert (await admin.get(f"/agentik/conversations/{cid}/snapshot")).status_code == 200


async def test_websocket_answers_another_users_conversation_as_unknown(served: Server) -> None:
    async with http(served, "alice") as alice:
        cid = (await alice.post("/agentik/conversations")).json()["id"]
    unknown = new_id()
    with trio.fail_after(30):
        async with open_websocket_url(served.ws_url, extra_headers=[
                ("Authorization", bearer("bob")["Authorization"])]) as ws:
            bob = WsClient(ws)
            commands: list[tuple[str, dict[str, Any]]] = [
                ("get", {}), ("rename", {"title": "t"}),
                ("send", {"content": [{"type": "text", "body": "x"}]}), ("interrupt", {}),
                ("snapshot", {}), ("approve", {"call_id": "c1", "approve": True}),
                ("answer", {"call_id": "c1", "text": "yes"}), ("delete", {}),
            ]
            for command, fields in commands:
                theirs = await bob.call(command, id="x", conversation_id=cid, **fields)
                other = await bob.call(command, id="x", conversation_id=unknown, **fields)
                assert theirs["type"] == "error" and theirs["error"]["code"] == "not_found"
                assert str(theirs).replace(cid, "ID") == str(other).replace(unknown, "ID")
            for stream in ("conversation", "live"):
                theirs = await bob.call("subscribe", id="s", stream=stream, conversation_id=cid)
                other = await bob.call("subscribe", id="s", stream=stream,
                                       conversation_id=unknown)
                assert theirs["error"]["code"] == "not_found"
                assert str(theirs).replace(cid, "ID") == str(other).replace(unknown, "ID")
            listed = await bob.call("list")
            assert listed["result"]["conversations"] == []
    async with http(served, "alice") as alice:
        assert (await alice.get(f"/agentik/conversations/{cid}")).json()["title"] is None


async def test_event_streams_carry_only_the_users_own_conversations(served: Server) -> None:
    async with http(served, "alice") as alice, http(served, "bob") as bob:
        with trio.fail_after(60):
            oldest = (await bob.get("/agentik/cursor")).json()["oldest"]
            async with open_sse(bob, "/agentik/events", after=oldest) as live_bob, \
                    open_websocket_url(served.ws_url, extra_headers=[
                        ("Authorization", bearer("bob")["Authorization"])]) as ws:
                bob_ws = WsClient(ws)
                assert (await bob_ws.call("subscribe", id="all", stream="events",
                                          after=oldest))["type"] == "reply"
                a1 = (await alice.post("/agentik/conversations")).json()["id"]
                await answered_turn(alice, a1)
                b1 = (await bob.post("/agentik/conversations")).json()["id"]
                await answered_turn(bob, b1)
                await alice.patch(f"/agentik/conversations/{a1}", json={"title": "x"})
                assert (await alice.delete(f"/agentik/conversations/{a1}")).status_code == 204
                await bob.patch(f"/agentik/conversations/{b1}", json={"title": "last"})
                seen = await live_bob.until("renamed")
                over_ws = await bob_ws.events("all", until="renamed")
            # replayed from the oldest cursor, after everything happened
            async with open_sse(bob, "/agentik/events", after=oldest) as replay:
                replayed = await replay.until("renamed")
            for frames in (seen, replayed):
                assert {f.common().conversation_id for f in frames} == {b1}
                assert frames[0].event == "created"
            assert {e["conversation_id"] for e in over_ws} == {b1}
            # the same events, with the global cursor's ids (others' offsets skipped)
            assert [f.id for f in seen] == [f.id for f in replayed]
            offsets = [int(f.id.split(":")[1]) for f in seen]
            assert offsets == sorted(offsets) and offsets[-1] - offsets[0] >= len(offsets)
            # resuming from one of bob's ids goes on from there
            async with open_sse(bob, "/agentik/events", after=seen[1].id) as resumed:
                assert [f.id for f in await resumed.take(len(seen) - 2)] == [
                    f.id for f in seen[2:]]
            # alice's own stream still has her deleted conversation's end
            async with open_sse(alice, "/agentik/events", after=oldest) as hers:
                frames = await hers.until("deleted")
                assert {f.common().conversation_id for f in frames} == {a1}
            # a user's kind=agent and conversation kinds are filtered the same way
            async with open_sse(bob, "/agentik/events", after=oldest,
                                params={"kind": "agent"}) as agent_kind:
                frames = await agent_kind.until("renamed")
                assert {f.common().conversation_id for f in frames} == {b1}


async def test_a2a_tasks_and_contexts_of_another_user_are_unknown(served: Server) -> None:
    async def rpc(client: httpx2.AsyncClient, method: str, params: Any) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        answer = await client.post("/a2a", json=body, headers=V1)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def message(text: str, context: str | None = None) -> dict[str, Any]:
        m: dict[str, Any] = {"role": "ROLE_USER", "messageId": new_id(),
                             "parts": [{"text": text}]}
        if context:
            m["contextId"] = context
        return {"message": m}

    async with http(served, "alice") as alice, http(served, "bob") as bob, \
            http(served, "root") as root:
        with trio.fail_after(60):
            sent = await rpc(alice, "SendMessage", message("hello", "ctx-1"))
            task = sent["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED", sent
            tid = task["id"]
            unknown = new_id()
            for method, params in (("GetTask", {"id": tid}), ("CancelTask", {"id": tid}),
                                   ("SubscribeToTask", {"id": tid})):
                theirs = await rpc(bob, method, params)
                other = await rpc(bob, method, {"id": unknown})
                assert theirs["error"]["code"] == -32001, theirs
                assert str(theirs).replace(tid, "ID") == str(other).replace(unknown, "ID")
            listed = await rpc(bob, "ListTasks", {})
            assert listed["result"]["tasks"] == [] and listed["result"]["totalSize"] == 0
            assert len((await rpc(alice, "ListTasks", {}))["result"]["tasks"]) == 1
            assert len((await rpc(root, "ListTasks", {}))["result"]["tasks"]) == 1
            # bob using alice's context id gets a conversation of his own, not hers
            mine = await rpc(bob, "SendMessage", message("me too", "ctx-1"))
            assert mine["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
            listed = (await bob.get("/agentik/conversations")).json()["conversations"]
            hers = (await alice.get("/agentik/conversations")).json()["conversations"]
            assert len(listed) == 1 and len(hers) == 1 and listed[0]["id"] != hers[0]["id"]
            assert len((await alice.get(
                f"/agentik/conversations/{hers[0]['id']}/messages")).json()) == 2


async def test_admin_only_routes(served: Server) -> None:
    async with http(served, "alice") as alice, http(served, "root") as root, \
            http(served, SHARED) as shared:
        with trio.fail_after(30):
            for path in ("/metrics", "/agentik/openapi.json", "/agentik/tools"):
                refused = await alice.get(path)
                assert refused.status_code == 403, path
                assert refused.json()["error"]["code"] == "forbidden"
                assert (await root.get(path)).status_code == 200
                assert (await shared.get(path)).status_code == 200
            async with httpx2.AsyncClient(base_url=served.url, timeout=10) as anonymous:
                assert (await anonymous.get("/healthz")).status_code == 200
                assert (await anonymous.get("/metrics")).status_code == 401


async def test_openai_route_continues_only_the_users_own_conversations(served: Server) -> None:
    def chat(text: str, **extra: Any) -> dict[str, Any]:
        return {"model": "default", "messages": [{"role": "user", "content": text}], **extra}

    async with http(served, "alice") as alice, http(served, "bob") as bob:
        with trio.fail_after(30):
            made = await alice.post("/v1/chat/completions", json=chat("hi", store=True))
            assert made.status_code == 200, made.text
            cid = made.headers["X-Agentik-Conversation-Id"]
            unknown = new_id()
            theirs = await bob.post("/v1/chat/completions", json=chat("mine?"),
                                    headers={"X-Agentik-Conversation-Id": cid})
            other = await bob.post("/v1/chat/completions", json=chat("mine?"),
                                   headers={"X-Agentik-Conversation-Id": unknown})
            assert theirs.status_code == 404
            same_answer(theirs, other, cid, unknown)
            kept = await bob.post("/v1/chat/completions", json=chat("my own", store=True))
            own = kept.headers["X-Agentik-Conversation-Id"]
            assert [c["id"] for c in (await bob.get("/agentik/conversations")).json()[
                "conversations"]] == [own]
            assert len((await alice.get(f"/agentik/conversations/{cid}/messages")).json()) == 2


async def test_openai_responses_and_conversations_are_the_users_own(served: Server) -> None:
    from agentik.openai_api.responses import parse_response_id, response_id

    async with http(served, "alice") as alice, http(served, "bob") as bob:
        with trio.fail_after(30):
            made = await alice.post("/v1/responses", json={
                "model": "default", "input": "hi", "store": True})
            assert made.status_code == 200, made.text
            rid = made.json()["id"]
            conv = (await alice.post("/v1/conversations", json={})).json()["id"]
            unknown_rid, unknown = response_id(new_id(), new_id()), new_id()
            for method, path, body in (
                    ("GET", "/v1/responses/{}", None), ("POST", "/v1/responses/{}/cancel", None),
                    ("DELETE", "/v1/responses/{}", None),
                    ("GET", "/v1/responses/{}/input_items", None)):
                theirs = await bob.request(method, path.format(rid), json=body)
                other = await bob.request(method, path.format(unknown_rid), json=body)
                assert theirs.status_code == 404, theirs.text
                same_answer(theirs, other, rid, unknown_rid)
            follow = {"model": "default", "input": "again"}
            theirs = await bob.post("/v1/responses", json={**follow, "previous_response_id": rid})
            other = await bob.post("/v1/responses",
                                   json={**follow, "previous_response_id": unknown_rid})
            same_answer(theirs, other, parse_response_id(rid)[0],
                        parse_response_id(unknown_rid)[0])
            assert theirs.status_code == 404
            for method, path, body in (
                    ("GET", "/v1/conversations/{}", None),
                    ("POST", "/v1/conversations/{}", {"metadata": {"title": "x"}}),
                    ("GET", "/v1/conversations/{}/items", None),
                    ("DELETE", "/v1/conversations/{}", None)):
                theirs = await bob.request(method, path.format(conv), json=body)
                other = await bob.request(method, path.format(unknown), json=body)
                assert theirs.status_code == 404, theirs.text
                same_answer(theirs, other, conv, unknown)
            theirs = await bob.post("/v1/responses", json={**follow, "conversation": conv})
            other = await bob.post("/v1/responses", json={**follow, "conversation": unknown})
            same_answer(theirs, other, conv, unknown)
            assert (await alice.get(f"/v1/responses/{rid}")).status_code == 200
            assert (await alice.get(f"/v1/conversations/{conv}")).status_code == 200


async def test_idempotency_keys_of_users_never_meet(served: Server) -> None:
    async with http(served, "alice") as alice, http(served, "bob") as bob:
        with trio.fail_after(30):
            key = {"Idempotency-Key": "same-key"}
            hers = await alice.post("/agentik/conversations", json={"title": "t"}, headers=key)
            his = await bob.post("/agentik/conversations", json={"title": "t"}, headers=key)
            assert hers.status_code == his.status_code == 201
            assert hers.json()["id"] != his.json()["id"]
            again = await alice.post("/agentik/conversations", json={"title": "t"}, headers=key)
            assert again.json()["id"] == hers.json()["id"]  # still a replay for her
