"""Issue 11 #1: one runtime per database *file*. A second server on the same file through another
path (a symlink, a hard link, a ``..`` path) is refused at start-up with the "in use" message and a
non-zero exit, before it touches the database; the first server serves on, reading and writing,
and loses nothing (its temporary conversation and its running turn included). The second server is
a real process (``agentik serve``); the first is a real hypercorn in this test's process."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
import trio

from tests.scripted_openai import Hang, ScriptedOpenAI
from tests.test_web_lifespan import env_for, spawn
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    make_config,
    no_error_logs,
    openai,
    serve_app,
)


def _symlink(db: Path, tmp: Path) -> Path:
    link = tmp / "link.db"
    link.symlink_to(db)
    return link


def _hard_link(db: Path, tmp: Path) -> Path:
    link = tmp / "other" / "hard.db"
    link.parent.mkdir()
    os.link(db, link)
    return link


def _dotdot(db: Path, tmp: Path) -> Path:
    (tmp / "sub").mkdir()
    return tmp / "sub" / ".." / db.name


@pytest.mark.parametrize("other_path", [_symlink, _hard_link, _dotdot])
async def test_second_server_through_another_path_is_refused(
    tmp_path: Path, openai: ScriptedOpenAI, other_path: Callable[[Path, Path], Path]
) -> None:
    config = make_config(tmp_path, openai)
    db = Path(config.db_path)
    openai.push(Hang(text_before="thinking"))
    async with serve_app(config) as first:
        async with httpx2.AsyncClient(base_url=first.url, timeout=10) as http:
            temp = (await http.post("/agentik/conversations", json={"temp": True})).json()["id"]
            cid = (await http.post("/agentik/conversations")).json()["id"]
            sent = await http.post(
                f"/agentik/conversations/{cid}/messages",
                json={"content": [{"type": "text", "body": "hi"}]},
            )
            assert sent.status_code == 202
            await openai.wait_requests(1)  # the turn is running, waiting for the model
            before = (await http.get("/agentik/cursor")).json()["current"]

            path = other_path(db, tmp_path)
            assert path.samefile(db) and str(path) != str(db)
            env = env_for(tmp_path, openai, AGENTIK_DB_PATH=str(path))
            args = [sys.executable, "-m", "agentik.cli", "serve", "--port", "0"]
            async with spawn(args, env, tmp_path) as second:
                with trio.fail_after(60):
                    seen = await second.wait_for(r"in use by another agentik process|Running on")
                    assert seen.group(0) != "Running on", second.output
                    code = await second.exit_code()
            assert code != 0, second.output

            # The first server serves on: nothing of it was touched, and it still writes.
            assert (await http.get("/agentik/cursor")).json()["current"] == before
            assert (await http.get(f"/agentik/conversations/{temp}")).status_code == 200
            snapshot = (await http.get(f"/agentik/conversations/{cid}/snapshot")).json()
            kinds = [m["message"]["type"] for m in snapshot["messages"]]
            assert kinds == ["user_message"], snapshot  # the running turn was not closed
            created = []
            for i in range(50):
                reply = await http.post("/agentik/conversations", json={"title": f"c{i}"})
                assert reply.status_code == 201, reply.text
                created.append(reply.json()["id"])
            renamed = await http.patch(f"/agentik/conversations/{cid}", json={"title": "kept"})
            assert renamed.status_code == 200, renamed.text
            listed = (await http.get("/agentik/conversations", params={"limit": 200})).json()
            ids = {c["id"] for c in listed["conversations"]}
            assert set(created) | {cid, temp} <= ids
    # Everything the first server acknowledged is in the file afterwards.
    async with serve_app(config) as again:
        async with httpx2.AsyncClient(base_url=again.url, timeout=10) as http:
            listed = (await http.get("/agentik/conversations", params={"limit": 200})).json()
            ids = {c["id"] for c in listed["conversations"]}
            assert set(created) <= ids
            kept = (await http.get(f"/agentik/conversations/{cid}")).json()
            assert kept["title"] == "kept"
