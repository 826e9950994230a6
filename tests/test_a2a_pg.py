# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

"""A2A on a PostgreSQL cluster (docs/A2A.md, issue 29): a context whose conversation node A owns,
continued through node B, is answered as if the caller had asked A. Real node processes on real
PostgreSQL (``tests/test_pg_nodes.py``'s nodes), driven by a2a-sdk's own client: SendMessage and
SendStreamingMessage through B go on in A's conversation (forwarded to A whole, the stream
relayed), GetTask and CancelTask through B see and end A's task; with AGENTIK_TOKENS and with a
users file and no shared token (the caller's own token reaches A). A dead owner is the JSON-RPC
form of ``not_owner`` until B takes the conversation over; then B answers it itself; a frozen
owner (its connections open, no answer coming) ends a relayed request and a relayed stream with
``not_owner`` once its heartbeat is late."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx
import httpx2
import pytest
import trio
from a2a.types import a2a_pb2 as pb

from tests.scripted_openai import Echo, Hang, Reply, ScriptedOpenAI
from tests.test_a2a import STREAM_LIMIT, V1, Rpc, message, texts
from tests.test_pg_nodes import TAKEOVER_LIMIT, cluster
from tests.usersutil import TOKENS, bearer, write_users
from tests.webutil import make_config, openai, serve_app  # noqa: F401 - fixtures by name

pytestmark = pytest.mark.usefixtures("pg_url")

T = TypeVar("T")
TOKEN = "cluster-token"
#: a2a-sdk's client for a node's URL, streaming or not
Clients = Callable[[str, bool], Awaitable[Any]]


def _sdk(go: Callable[[Clients], Awaitable[T]], token: str) -> T:
    """Run ``go`` with a2a-sdk's asyncio clients (bearer ``token``), in this worker thread,
    bounded: a thread cannot be cancelled from trio."""
    from a2a.client import ClientConfig, create_client

    async def main() -> T:
        headers = {**V1, "Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(headers=headers, timeout=30) as http:
            async def client(url: str, streaming: bool) -> Any:
                return await create_client(url, ClientConfig(streaming=streaming,
                                                              httpx_client=http))
            return await go(client)

    return asyncio.run(asyncio.wait_for(main(), 2 * STREAM_LIMIT))


def request(message_id: str, text: str, context: str = "ctx", **config: Any) -> Any:
    return pb.SendMessageRequest(
        message=pb.Message(message_id=message_id, role=pb.ROLE_USER, context_id=context,
                           parts=[pb.Part(text=text)]),
        configuration=pb.SendMessageConfiguration(**config) if config else None)


async def _events(stream: AsyncIterator[Any]) -> list[Any]:
    return [event async for event in stream]


async def _conversations(url: str, token: str) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(base_url=url, timeout=10, headers=bearer(token)) as http:
        listed = (await http.get("/agentik/conversations")).json()["conversations"]
        return [(await http.get(f"/agentik/conversations/{c['id']}/messages")).json()
                for c in listed]


def _said(journal: list[dict[str, Any]]) -> list[str]:
    return [texts([{"text": c.get("body", "")} for c in m["message"].get("content", [])])
            for m in journal]


async def _continued_through_b(a: str, b: str, token: str) -> tuple[Any, ...]:
    """One message on A, one through B, one streamed through B, GetTask through B."""

    async def go(client: Clients) -> tuple[Any, ...]:
        on_a, on_b, streaming_b = (await client(a, False), await client(b, False),
                                   await client(b, True))
        (first,) = await _events(on_a.send_message(request("m1", "one")))
        (second,) = await _events(on_b.send_message(request("m2", "two")))
        streamed = await _events(streaming_b.send_message(request("m3", "three")))
        got = await on_b.get_task(pb.GetTaskRequest(id=streamed[0].task.id))
        return first.task, second.task, streamed, got

    return await trio.to_thread.run_sync(_sdk, go, token)


def _check_continued(first: Any, second: Any, streamed: list[Any], got: Any) -> None:
    for task, answer in ((first, "re one"), (second, "re two"), (got, "re three")):
        assert task.status.state == pb.TASK_STATE_COMPLETED, task
        assert task.context_id == "ctx" and task.artifacts[0].parts[0].text == answer
    assert len({first.id, second.id, got.id}) == 3
    assert streamed[0].HasField("task") and streamed[0].task.id == got.id
    chunks = [e.artifact_update.artifact.parts[0].text for e in streamed
              if e.HasField("artifact_update")]
    assert "".join(chunks) == "re three"
    assert streamed[-1].status_update.status.state == pb.TASK_STATE_COMPLETED


async def _cancel_through_b(a: str, b: str, token: str, scripted: ScriptedOpenAI) -> Any:
    """A task working on A (its model hangs) is cancelled through B, and B reads it back."""
    scripted.push(Hang(text_before="so far"))

    async def go(client: Clients) -> tuple[Any, Any]:
        on_a, on_b = await client(a, False), await client(b, False)
        (sent,) = await _events(on_a.send_message(request("m4", "hang", return_immediately=True)))
        task_id = sent.task.id
        while (await on_b.get_task(pb.GetTaskRequest(id=task_id))).artifacts == []:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # another process: ask until the answer has begun
        canceled = await on_b.cancel_task(pb.CancelTaskRequest(id=task_id))
        return canceled, await on_b.get_task(pb.GetTaskRequest(id=task_id))

    canceled, got = await trio.to_thread.run_sync(_sdk, go, token)
    assert canceled.status.state == got.status.state == pb.TASK_STATE_CANCELED
    assert got.artifacts[0].parts[0].text == "so far"
    return got


async def test_a_context_goes_on_through_the_node_that_does_not_own_it(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    scripted.default = Echo(prefix="re ")
    async with cluster(pg_url, scripted, tmp_path, env={"AGENTIK_TOKENS": TOKEN}) as (a, b):
        first, second, streamed, got = await _continued_through_b(a.url, b.url, TOKEN)
        _check_continued(first, second, streamed, got)
        await _cancel_through_b(a.url, b.url, TOKEN, scripted)
        (journal,) = await _conversations(b.url, TOKEN)  # one conversation: A's
        assert _said(journal) == ["one", "re one", "two", "re two", "three", "re three", "hang",
                                  "so far"]
    import psycopg

    with psycopg.connect(pg_url) as conn:
        owners = conn.execute("SELECT node_id, fence FROM conv_owner").fetchall()
    assert owners == [(a.name, 1)]  # B never took it over: A ran every turn


async def test_a_users_context_goes_on_through_the_other_node_with_their_own_token(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    """No AGENTIK_TOKENS: B forwards alice's request with her token, which A checks as B did;
    bob's message to the same contextId on B is his own conversation, not alice's."""
    scripted.default = Echo(prefix="re ")
    users = write_users(tmp_path / "users.toml")
    async with cluster(pg_url, scripted, tmp_path, env={"AGENTIK_USERS": str(users)}) as (a, b):
        alice = TOKENS["alice"]
        first, second, streamed, got = await _continued_through_b(a.url, b.url, alice)
        _check_continued(first, second, streamed, got)
        await _cancel_through_b(a.url, b.url, alice, scripted)

        async def bobs(client: Clients) -> Any:
            (sent,) = await _events((await client(b.url, False)).send_message(
                request("b1", "bob here")))
            return sent.task

        bob_task = await trio.to_thread.run_sync(_sdk, bobs, TOKENS["bob"])
        assert bob_task.status.state == pb.TASK_STATE_COMPLETED
        (alices,) = await _conversations(a.url, "alice")
        assert "bob here" not in _said(alices) and "two" in _said(alices)
        (bob_journal,) = await _conversations(b.url, "bob")
        assert _said(bob_journal) == ["bob here", "re bob here"]


async def test_a_dead_owner_is_not_owner_until_the_other_node_takes_the_context_over(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    scripted.default = Echo(prefix="re ")
    async with cluster(pg_url, scripted, tmp_path) as (a, b), \
            httpx2.AsyncClient(base_url=a.url, timeout=30) as on_a, \
            httpx2.AsyncClient(base_url=b.url, timeout=30) as on_b:
        rpc_a, rpc_b = Rpc(on_a), Rpc(on_b)
        with trio.fail_after(STREAM_LIMIT):
            await rpc_a.call("SendMessage", {"message": message("one", contextId="ctx")})
            await a.kill()
            error = await rpc_b.error("SendMessage", {"message": message(
                "two", message_id="m2", contextId="ctx")}, -32603)
        assert "does not answer" in error["message"], error
        assert error["data"][0]["reason"] == "NOT_OWNER", error
        with trio.fail_after(TAKEOVER_LIMIT + STREAM_LIMIT):
            while True:  # the lease runs out: B takes the conversation over and answers
                body = await rpc_b.raw("SendMessage", {"message": message(
                    "three", message_id="m3", contextId="ctx")})
                if "result" in body:
                    break
                assert body["error"]["data"][0]["reason"] == "NOT_OWNER", body
                await trio.sleep(0.2)  # another process's lease runs out by the clock
        task = body["result"]["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        assert texts(task["artifacts"][0]["parts"]) == "re three"
        (journal,) = await _conversations(b.url, "x")
        assert _said(journal) == ["one", "re one", "three", "re three"]


async def test_a_frozen_owner_ends_relayed_requests_with_not_owner(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    """A SendMessage and a SendStreamingMessage relayed through B to A, whose model hangs; A is
    frozen (SIGSTOP): both end with NOT_OWNER once A's heartbeat is late, not never."""
    scripted.default = Echo(prefix="re ")
    async with cluster(pg_url, scripted, tmp_path) as (a, b), \
            httpx2.AsyncClient(base_url=a.url, timeout=30) as on_a, \
            httpx2.AsyncClient(base_url=b.url, timeout=60) as on_b:
        rpc_a, rpc_b = Rpc(on_a), Rpc(on_b)
        with trio.fail_after(STREAM_LIMIT):
            for context in ("c1", "c2"):  # A owns both
                await rpc_a.call("SendMessage", {"message": message("one", contextId=context)})
        scripted.push(Hang(), Hang())
        answers: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def plain() -> None:
                answers.append(await rpc_b.raw("SendMessage", {"message": message(
                    "two", message_id="m2", contextId="c1")}))

            nursery.start_soon(plain)
            async with rpc_b.stream("SendStreamingMessage", {"message": message(
                    "two", message_id="m3", contextId="c2")}) as events:
                first = await events.__anext__()
                assert first["task"]["contextId"] == "c2", first
                while len(scripted.requests) < 4:  # noqa: ASYNC110 - both reached A's model
                    await trio.sleep(0.05)
                a.signal(signal.SIGSTOP)
                with trio.fail_after(TAKEOVER_LIMIT):
                    rest = [event async for event in events]
        for body in (rest[-1], answers[0]):
            assert body["error"]["data"][0]["reason"] == "NOT_OWNER", body
            assert "stopped heartbeating" in body["error"]["message"], body


async def test_a_node_starting_leaves_another_live_nodes_tasks_alone(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    """B starts while A runs a task: B's start-up, which settles the tasks a dead process left
    running, leaves A's to A (it used to follow A's turn and fail writing its ending, fenced
    out, with an error logged); the task completes on A, and B reads it so."""
    gate = trio.Event()
    scripted.push(Reply(["partial ", "answer"], gate=gate))
    async with cluster(pg_url, scripted, tmp_path) as (a, b), \
            httpx2.AsyncClient(base_url=a.url, timeout=30) as on_a, \
            httpx2.AsyncClient(base_url=b.url, timeout=30) as on_b:
        rpc_a, rpc_b = Rpc(on_a), Rpc(on_b)
        with trio.fail_after(STREAM_LIMIT + 30):
            task = (await rpc_a.call("SendMessage", {"message": message("one", contextId="ctx"),
                                                    "configuration": {"returnImmediately": True}}))
            task_id = task["task"]["id"]
            while (await rpc_b.call("GetTask", {"id": task_id}))["status"]["state"] != \
                    "TASK_STATE_WORKING":  # noqa: ASYNC110 - another process's task
                await trio.sleep(0.05)
            await b.stop()
            await b.start()  # its start-up sees A's task WORKING
            gate.set()
            while (got := await rpc_b.call("GetTask", {"id": task_id}))["status"]["state"] == \
                    "TASK_STATE_WORKING":  # noqa: ASYNC110 - another process's task
                await trio.sleep(0.05)
        assert got["status"]["state"] == "TASK_STATE_COMPLETED", got
        assert texts(got["artifacts"][0]["parts"]) == "partial answer"
        assert "[ERROR]" not in b.log(300_000), b.log(300_000)



async def test_a_client_leaving_a_relayed_stream_closes_the_owners_stream(
    pg_url: str, openai: ScriptedOpenAI, tmp_path: Path
) -> None:
    """Two nodes in this process (so A's open A2A streams can be counted): a stream relayed
    through B is closed on A once its client has left B (B notices at its next write, a
    heartbeat)."""
    openai.default = Echo(prefix="re ")
    configs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        configs.append(make_config(tmp_path / name, openai, database_url=pg_url,
                                   node_id=f"node-{name}"))
    async with serve_app(configs[0], heartbeat=0.2) as a, \
            serve_app(configs[1], heartbeat=0.2) as b, \
            httpx2.AsyncClient(base_url=a.url, timeout=30) as on_a, \
            httpx2.AsyncClient(base_url=b.url, timeout=30) as on_b:
        rpc_a, rpc_b = Rpc(on_a), Rpc(on_b)
        streams = cast(Any, a.app).agentik_a2a
        with trio.fail_after(STREAM_LIMIT):
            await rpc_a.call("SendMessage", {"message": message("one", contextId="ctx")})
            openai.push(Hang())  # the streamed answer never ends by itself
            async with rpc_b.stream("SendStreamingMessage", {"message": message(
                    "two", message_id="m2", contextId="ctx")}) as events:
                first = await events.__anext__()  # relayed from A
                assert first["task"]["status"]["state"] == "TASK_STATE_WORKING", first
                assert streams.open_streams == 1
            while streams.open_streams:  # noqa: ASYNC110 - closed by B's next heartbeat
                await trio.sleep(0.05)
