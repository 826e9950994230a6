"""Users on a second node (docs/USERS.md): two nodes on one real PostgreSQL, a users file on
each; what one user made on node A is unknown to another user on node B, B's event stream (replay
from the oldest cursor, and live) never carries it, and the tokens counted on A are the user's
on B."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from pathlib import Path

import httpx2
import trio
from trio_websocket import open_websocket_url

from agentik import metrics
from agentik.ids import new_id
from tests.scripted_openai import ScriptedOpenAI
from tests.test_users_web import answered_turn, same_answer
from tests.usersutil import SHARED, TOKENS, bearer, write_users
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    WsClient,
    make_config,
    no_error_logs,
    open_sse,
    openai,
    serve_app,
)


async def test_another_users_conversation_is_unknown_on_a_second_node(
    tmp_path: Path, pg_url: str, openai: ScriptedOpenAI
) -> None:
    users = write_users(tmp_path / "users.toml")
    configs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        configs.append(make_config(tmp_path / name, openai, database_url=pg_url,
                                   node_id=f"node-{name}", users_file=str(users),
                                   tokens=(SHARED,)))
    async with serve_app(configs[0]) as a, serve_app(configs[1]) as b:
        alice = httpx2.AsyncClient(base_url=a.url, timeout=10, headers=bearer("alice"))
        bob = httpx2.AsyncClient(base_url=b.url, timeout=10, headers=bearer("bob"))
        alice_on_b = httpx2.AsyncClient(base_url=b.url, timeout=10, headers=bearer("alice"))
        async with alice, bob, alice_on_b:
            with trio.fail_after(60):
                oldest = (await bob.get("/agentik/cursor")).json()["oldest"]
                async with open_sse(bob, "/agentik/events", after=oldest) as live:
                    cid = (await alice.post("/agentik/conversations")).json()["id"]
                    await answered_turn(alice, cid)
                    own = (await bob.post("/agentik/conversations")).json()["id"]
                    await answered_turn(bob, own)
                    await bob.patch(f"/agentik/conversations/{own}", json={"title": "end"})
                    seen = await live.until("renamed")
                async with open_sse(bob, "/agentik/events", after=oldest) as replay:
                    replayed = await replay.until("renamed")
                for frames in (seen, replayed):
                    assert {f.common().conversation_id for f in frames} == {own}
                unknown = new_id()
                for method, path, kw in (
                        ("GET", "/agentik/conversations/{}", {}),
                        ("POST", "/agentik/conversations/{}/messages",
                         {"json": {"content": [{"type": "text", "body": "x"}]}}),
                        ("GET", "/agentik/conversations/{}/snapshot", {}),
                        ("DELETE", "/agentik/conversations/{}", {})):
                    theirs = await bob.request(method, path.format(cid), **kw)
                    other = await bob.request(method, path.format(unknown), **kw)
                    assert theirs.status_code == 404, theirs.text
                    same_answer(theirs, other, cid, unknown)
                # alice reaches hers on node B, and her tokens counted on A are hers there
                assert (await alice_on_b.get(f"/agentik/conversations/{cid}")).status_code == 200
                assert (await alice_on_b.get("/agentik/usage")).json()["tokens_today"] == 15
                assert (await bob.get("/agentik/usage")).json()["tokens_today"] == 15
                listed = (await alice_on_b.get("/agentik/conversations")).json()
                assert [c["id"] for c in listed["conversations"]] == [cid]


async def test_a_cluster_with_users_and_no_shared_token_forwards_as_the_caller(
    tmp_path: Path, pg_url: str, openai: ScriptedOpenAI
) -> None:
    """No AGENTIK_TOKENS: a command for a conversation node A owns, sent to node B, reaches A
    with the caller's own token (A checks it as B did), not a 401 from A."""
    users = write_users(tmp_path / "users.toml")
    configs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        configs.append(make_config(tmp_path / name, openai, database_url=pg_url,
                                   node_id=f"node-{name}", users_file=str(users)))
    async with serve_app(configs[0]) as a, serve_app(configs[1]) as b:
        alice = httpx2.AsyncClient(base_url=a.url, timeout=10, headers=bearer("alice"))
        alice_on_b = httpx2.AsyncClient(base_url=b.url, timeout=10, headers=bearer("alice"))
        bob_on_b = httpx2.AsyncClient(base_url=b.url, timeout=10, headers=bearer("bob"))
        async with alice, alice_on_b, bob_on_b:
            with trio.fail_after(60):
                cid = (await alice.post("/agentik/conversations")).json()["id"]
                await answered_turn(alice, cid)  # node A runs it: A owns it now
                forwarded = metrics.CLUSTER_FORWARDED._value.get()
                await answered_turn(alice_on_b, cid, "through b")  # forwarded to A
                renamed = await alice_on_b.patch(f"/agentik/conversations/{cid}",
                                                 json={"title": "via b"})
                assert renamed.status_code == 200, renamed.text
                assert renamed.json()["title"] == "via b"
                stopped = await alice_on_b.post(f"/agentik/conversations/{cid}/interrupt")
                assert stopped.status_code == 202, stopped.text
                # a WebSocket on B with the token in the query, as the web chat connects
                async with open_websocket_url(
                        f"{b.ws_url}?access_token={TOKENS['alice']}") as ws:
                    reply = await WsClient(ws).call("rename", conversation_id=cid, title="ws")
                assert reply["type"] == "reply" and reply["result"]["title"] == "ws", reply
                # bob's token reaches nothing of alice's on B, forwarded or not
                theirs = await bob_on_b.post(f"/agentik/conversations/{cid}/messages",
                                             json={"content": [{"type": "text", "body": "x"}]})
                assert theirs.status_code == 404, theirs.text
                gone = await alice_on_b.delete(f"/agentik/conversations/{cid}")
                assert gone.status_code == 204, gone.text
                assert (await alice.get(f"/agentik/conversations/{cid}")).status_code == 404
                # send, rename (HTTP, WebSocket), interrupt and delete went to A (both nodes
                # share the process's metrics); bob's send did not
                assert metrics.CLUSTER_FORWARDED._value.get() - forwarded == 5
                assert (await alice.get("/agentik/usage")).json()["tokens_today"] == 30
