"""A2A tasks across a SIGKILL and a restart agree with their conversation turns (issue 26): a
task whose turn was running ends FAILED as the turn does; a task whose message was queued
(accepted, ``returnImmediately``) follows its turn, which a restart runs: COMPLETED with the
answer, or CANCELED when ``CancelTask`` interrupts or withdraws it, seen by GetTask and
SubscribeToTask; a task cancelled while queued, before or after the restart, never runs. A real
server process, killed and started again on the same database, on SQLite and PostgreSQL."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from a2a.types import a2a_pb2 as pb

from benchmarks.serverproc import ServerProcess, spawn_server
from tests.scripted_openai import Hang, Reply, ScriptedOpenAI
from tests.test_a2a import Rpc, message, texts
from tests.webutil import open_sse, openai  # noqa: F401 - a fixture by name

IMMEDIATELY = {"returnImmediately": True}


def texts_of(stored: dict[str, Any]) -> str:
    """The text of a stored message (agentik's JSON: content items with a ``body``)."""
    return "".join(c.get("body", "") for c in stored["content"])


@asynccontextmanager
async def _server(
    engine: str, tmp_path: Path, openai: ScriptedOpenAI, request: pytest.FixtureRequest
) -> AsyncIterator[ServerProcess]:
    # On PostgreSQL the restarted node keeps its id, as a restarted deployment does: it closes
    # its dead incarnation's turns at start-up (another node would after the lease's time).
    env = {"AGENTIK_DATABASE_URL": request.getfixturevalue("pg_url"),
           "AGENTIK_NODE_ID": "killed-node"} if engine == "postgres" else {}
    async with spawn_server(str(tmp_path / "a2a.db"), openai_base_url=openai.base_url,
                            env=env) as srv:
        yield srv


async def _queue_behind_a_running_turn(
    srv: ServerProcess, openai: ScriptedOpenAI, n: int, cancel_first_queued: bool = False
) -> list[str]:
    """Task ids: the first one's turn runs (its model answer hangs), ``n`` more wait behind it,
    each message stored; the first queued one cancelled if asked."""
    openai.push(Hang(text_before="first "))
    async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
        rpc = Rpc(http)
        ids = [(await rpc.call("SendMessage", {"message": message("message 0", contextId="q"),
                                               "configuration": IMMEDIATELY}))["task"]["id"]]
        (conv,) = (await http.get("/agentik/conversations")).json()["conversations"]
        epoch = (await http.get("/agentik")).json()["id"]
        async with open_sse(http, f"/agentik/conversations/{conv['id']}/events",
                            after=f"{epoch}:0") as stream:
            with trio.fail_after(20):
                await stream.until("user_message")
                await openai.wait_requests(1)  # the first turn runs
                for i in range(1, n + 1):
                    task = (await rpc.call("SendMessage", {"message": message(
                        f"message {i}", message_id=f"m{i}", contextId="q"),
                        "configuration": IMMEDIATELY}))["task"]
                    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
                    await stream.until("user_message")  # stored: accepted, queued
                    ids.append(task["id"])
        if cancel_first_queued:
            canceled = await rpc.call("CancelTask", {"id": ids[1]}, pb.Task)
            assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    srv.kill()
    await srv.wait()
    return ids


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_a_queued_task_follows_its_turn_after_a_kill(
    engine: str, tmp_path: Path, openai: ScriptedOpenAI, request: pytest.FixtureRequest
) -> None:
    async with _server(engine, tmp_path, openai, request) as srv:
        running, second, third = await _queue_behind_a_running_turn(srv, openai, 2)
        asked = len(openai.requests)
        openai.push(Hang(text_before="second "), Reply("third answer"))
        await srv.start()
        async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
            rpc = Rpc(http)
            failed = await rpc.call("GetTask", {"id": running}, pb.Task)
            assert failed["status"]["state"] == "TASK_STATE_FAILED"
            assert texts(failed["status"]["message"]["parts"]) == "interrupted by restart"
            with trio.fail_after(20):
                await openai.wait_requests(asked + 1)  # the second message's turn runs
            waiting = await rpc.call("GetTask", {"id": third}, pb.Task)
            assert waiting["status"]["state"] == "TASK_STATE_SUBMITTED"
            states: list[str] = []
            async with rpc.stream("SubscribeToTask", {"id": third}) as events:
                async for event in events:
                    if "task" in event:  # the snapshot: now cancel the running second one
                        states.append(event["task"]["status"]["state"])
                        canceled = await rpc.call("CancelTask", {"id": second}, pb.Task)
                        assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
                    elif "statusUpdate" in event:
                        states.append(event["statusUpdate"]["status"]["state"])
            assert states[0] == "TASK_STATE_SUBMITTED" and states[-1] == "TASK_STATE_COMPLETED"
            done = await rpc.call("GetTask", {"id": third}, pb.Task)
            assert done["status"]["state"] == "TASK_STATE_COMPLETED"
            assert texts(done["artifacts"][0]["parts"]) == "third answer"
            assert texts(done["status"]["message"]["parts"]) == "third answer"
            assert (await rpc.call("GetTask", {"id": second}))["status"]["state"] == \
                "TASK_STATE_CANCELED"
            asked_now = [str(r["messages"]) for r in openai.requests[asked:]]
            assert len(asked_now) == 2 and "message 1" in asked_now[0], asked_now
            assert "message 2" in asked_now[1], asked_now


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_a_queued_task_cancelled_before_or_after_the_kill_never_runs(
    engine: str, tmp_path: Path, openai: ScriptedOpenAI, request: pytest.FixtureRequest
) -> None:
    async with _server(engine, tmp_path, openai, request) as srv:
        ids = await _queue_behind_a_running_turn(srv, openai, 3, cancel_first_queued=True)
        _, before, runs, after = ids
        asked = len(openai.requests)
        openai.push(Hang(text_before="third "))
        await srv.start()
        async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
            rpc = Rpc(http)
            with trio.fail_after(20):
                await openai.wait_requests(asked + 1)  # message 2's turn runs
            canceled = await rpc.call("CancelTask", {"id": after}, pb.Task)  # still queued
            assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
            # Its turn was withdrawn: ended (an empty interrupted answer) before the cancel's
            # answer, while the turn ahead of it still runs.
            (conv,) = (await http.get("/agentik/conversations")).json()["conversations"]
            journal = (await http.get(f"/agentik/conversations/{conv['id']}/messages")).json()
            (third,) = [m["id"] for m in journal if m["message"]["type"] == "user_message"
                        and texts_of(m["message"]) == "message 3"]
            ends = [m["message"] for m in journal if m["message"]["type"] == "assistant_message"
                    and m["message"]["turn_id"] == third]
            assert [(a["interrupted"], a["content"]) for a in ends] == [(True, [])], ends
            canceled = await rpc.call("CancelTask", {"id": runs}, pb.Task)  # running
            assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
            got: dict[str, Any] = await rpc.call("GetTask", {"id": before}, pb.Task)
            assert got["status"]["state"] == "TASK_STATE_CANCELED"
            # The conversation has nothing left to run: a new message is answered next.
            openai.push(Reply("fresh"))
            fresh = await rpc.call("SendMessage", {"message": message(
                "message 4", message_id="m4", contextId="q")})
            assert fresh["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        asked_now = [str(r["messages"]) for r in openai.requests[asked:]]
        assert len(asked_now) == 2, asked_now
        assert "message 2" in asked_now[0] and "message 4" in asked_now[1], asked_now
        assert not any("message 1" in a or "message 3" in a for a in asked_now), asked_now
