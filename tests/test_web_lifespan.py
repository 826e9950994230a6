"""Lifespan: the runtime starts with the app and stops with it; start-up failures and a runtime
death end the process with a message; SIGTERM is graceful; a restart on the same database keeps
the cursor. Processes are real: ``hypercorn -k trio agentik.web:app`` and ``agentik serve``."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import contextlib
import importlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from agentik.config import Config
from agentik.runtime import open_runtime
from tests.scripted_openai import Hang, ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    allow_error_logs,
    make_config,
    no_error_logs,
    open_sse,
    openai,
    serve_app,
)

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

REPO = Path(__file__).resolve().parent.parent
# The module that holds the runtime open while serving (its `open_runtime` is patched).
web_app = importlib.import_module("agentik.web.lifespan")


# --- in-process ----------------------------------------------------------------------------------


async def test_restart_on_the_same_database_keeps_the_cursor(
    tmp_path: Any, openai: ScriptedOpenAI
) -> None:
    config = make_config(tmp_path, openai)
    async with serve_app(config) as first:
        async with httpx2.AsyncClient(base_url=first.url, timeout=10) as http:
            epoch = (await http.get("/agentik")).json()["id"]
            cid = (await http.post("/agentik/conversations")).json()["id"]
            cursor = (await http.get("/agentik/cursor")).json()["current"]
            for title in ("a", "b"):
                await http.patch(f"/agentik/conversations/{cid}", json={"title": title})
    async with serve_app(config) as second:
        async with httpx2.AsyncClient(base_url=second.url, timeout=10) as http:
            assert (await http.get("/agentik")).json()["id"] == epoch
            async with open_sse(http, "/agentik/events", after=cursor) as stream:
                await http.patch(f"/agentik/conversations/{cid}", json={"title": "c"})
                with trio.fail_after(10):
                    frames = await stream.take(3)
    assert [f.id for f in frames] == [f"{epoch}:2", f"{epoch}:3", f"{epoch}:4"]
    assert [f.json()["event"]["title"] for f in frames] == ["a", "b", "c"]


async def test_runtime_death_stops_the_server(
    tmp_path: Any, openai: ScriptedOpenAI, monkeypatch: pytest.MonkeyPatch, allow_error_logs: None
) -> None:
    crash = trio.Event()
    real_open_runtime = web_app.open_runtime

    @asynccontextmanager
    async def dying_runtime(config: Config, **kwargs: Any) -> AsyncIterator[Any]:
        async with trio.open_nursery() as nursery:
            async with real_open_runtime(config, **kwargs) as agent:

                async def die() -> None:
                    await crash.wait()
                    raise RuntimeError("simulated runtime crash")

                nursery.start_soon(die)
                yield agent

    monkeypatch.setattr(web_app, "open_runtime", dying_runtime)
    with trio.fail_after(20):
        async with serve_app(make_config(tmp_path, openai)) as srv:
            async with httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
                assert (await http.get("/healthz")).status_code == 200
                crash.set()
                await srv.stop.wait()  # on_fatal asked the server to stop
            assert srv.state.agent is None
            assert "simulated runtime crash" in web_app.describe(srv.fatal[0])


# --- processes -----------------------------------------------------------------------------------


class Proc:
    """A child process whose merged stdout/stderr is collected as it arrives."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.output = ""
        self._changed = trio.Event()
        self.eof = False

    async def _collect(self) -> None:
        assert self.process.stdout is not None
        async for chunk in self.process.stdout:
            self.output += chunk.decode(errors="replace")
            self._changed.set()
            self._changed = trio.Event()
        self.eof = True
        self._changed.set()

    async def wait_for(self, pattern: str) -> re.Match[str]:
        while True:
            match = re.search(pattern, self.output)
            if match:
                return match
            if self.eof:
                raise AssertionError(f"{pattern!r} never appeared in:\n{self.output}")
            await self._changed.wait()

    async def base_url(self) -> str:
        return (await self.wait_for(r"Running on (http://127\.0\.0\.1:\d+)")).group(1)

    async def exit_code(self) -> int:
        code = await self.process.wait()
        while not self.eof:
            await self._changed.wait()
        return code


@asynccontextmanager
async def spawn(
    args: list[str], env: dict[str, str], cwd: Path, *, new_session: bool = False
) -> AsyncIterator[Proc]:
    process = await trio.lowlevel.open_process(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd,
        start_new_session=new_session,
    )
    proc = Proc(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(proc._collect)
            yield proc
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()


def env_for(
    tmp_path: Path, openai: ScriptedOpenAI | None = None, **extra: str
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
    env.update(
        AGENTIK_DB_PATH=str(tmp_path / "agentik.db"),
        OPENAI_API_KEY="x",
        AGENTIK_LLM_MAX_RETRIES="0",
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]),
    )
    if openai is not None:
        env["OPENAI_BASE_URL"] = openai.base_url
    env.update(extra)
    return env


HYPERCORN = [sys.executable, "-m", "hypercorn", "-k", "trio", "--bind", "127.0.0.1:0"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"AGENTIK_LLM_BACKEND": "bogus"}, "AGENTIK_LLM_BACKEND"),
        ({"AGENTIK_OUTBOX_CAP": "-3"}, "AGENTIK_OUTBOX_CAP"),
        ({"AGENTIK_DB_PATH": "/nonexistent-dir/sub/agentik.db"}, "agentik cannot start"),
    ],
)
async def test_startup_failure_exits_nonzero_with_the_reason(
    tmp_path: Path, extra: dict[str, str], message: str
) -> None:
    env = env_for(tmp_path, None, **extra)
    async with spawn([*HYPERCORN, "agentik.web:app"], env, tmp_path) as p:
        with trio.fail_after(60):
            code = await p.exit_code()
    assert code != 0, p.output
    assert message in p.output


async def test_asyncio_worker_is_refused(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "hypercorn", "--bind", "127.0.0.1:0", "agentik.web:app"]
    async with spawn(args, env_for(tmp_path), tmp_path) as p:
        with trio.fail_after(60):
            code = await p.exit_code()
    assert code != 0, p.output
    assert "-k trio" in p.output
    assert "leaked semaphore" not in p.output  # the supervisor's were released before it died


DYING_APP = '''
from contextlib import asynccontextmanager

import trio

from agentik.web import lifespan
from agentik.web.app import create_app

real_open_runtime = lifespan.open_runtime


@asynccontextmanager
async def dying_runtime(config, **kwargs):
    async with trio.open_nursery() as nursery:
        async with real_open_runtime(config, **kwargs) as agent:
            # Dies at the first conversation created after start-up (the test creates one once
            # the server is up): replayed from this cursor, so no race with the subscription.
            cursor = await agent.outbox.current_cursor()

            async def die():
                async for _ in agent.outbox.agent_events(cursor):
                    raise RuntimeError("simulated runtime crash")

            nursery.start_soon(die)
            yield agent


lifespan.open_runtime = dying_runtime
app = create_app()
'''


async def test_runtime_death_exits_the_process(tmp_path: Path) -> None:
    (tmp_path / "dying_app.py").write_text(DYING_APP)
    async with spawn([*HYPERCORN, "dying_app:app"], env_for(tmp_path), tmp_path) as p:
        with trio.fail_after(60):
            url = await p.base_url()
            async with httpx2.AsyncClient(base_url=url, timeout=10) as http:
                with contextlib.suppress(httpx2.TransportError):
                    await http.post("/agentik/conversations")  # the runtime dies on it
            code = await p.exit_code()
    # The supervisor is killed by the worker (see agentik.web.process.terminate).
    assert code == -signal.SIGKILL, p.output
    assert "the agentik runtime died" in p.output
    assert "simulated runtime crash" in p.output
    assert "leaked semaphore" not in p.output


async def _turn_then_sigterm(
    tmp_path: Path, openai: ScriptedOpenAI, args: list[str], *, group: bool
) -> str:
    """Start the server, leave a turn hanging in the model, SIGTERM, return the output."""
    openai.push(Hang(text_before="partial answer"))
    env = env_for(tmp_path, openai)
    async with spawn(args, env, tmp_path, new_session=group) as p:
        with trio.fail_after(60):
            url = await p.base_url()
            async with httpx2.AsyncClient(base_url=url, timeout=10) as http:
                cid = (await http.post("/agentik/conversations")).json()["id"]
                sent = await http.post(
                    f"/agentik/conversations/{cid}/messages",
                    json={"content": [{"type": "text", "body": "hi"}]},
                )
                assert sent.status_code == 202
                await openai.wait_requests(1)
            if group:
                os.killpg(p.process.pid, signal.SIGTERM)  # like systemd or timeout(1)
            else:
                p.process.send_signal(signal.SIGTERM)
            code = await p.exit_code()
    assert code == 0, p.output
    assert "agentik runtime stopped" in p.output
    # The database is intact ...
    db = sqlite3.connect(tmp_path / "agentik.db")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        db.close()
    # ... and the turn ended with a terminal record after the user message.
    config = Config(db_path=str(tmp_path / "agentik.db"), openai_api_key="x")
    async with open_runtime(config) as agent:
        snapshot = await agent.chat_snapshot(cid)
    kinds = [m.message.__struct_config__.tag for m in snapshot.messages]
    assert kinds[0] == "user_message" and len(kinds) >= 2, kinds
    assert kinds[-1] in ("assistant_message", "error"), kinds
    return p.output


async def test_sigterm_is_graceful(tmp_path: Path, openai: ScriptedOpenAI) -> None:
    await _turn_then_sigterm(tmp_path, openai, [*HYPERCORN, "agentik.web:app"], group=False)


async def test_sigterm_to_the_process_group_is_graceful(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    output = await _turn_then_sigterm(
        tmp_path, openai, [*HYPERCORN, "agentik.web:app"], group=True
    )
    assert "asking hypercorn" in output  # the worker passed its SIGTERM on


async def test_agentik_serve(tmp_path: Path, openai: ScriptedOpenAI) -> None:
    args = [sys.executable, "-m", "agentik.cli", "serve", "--port", "0"]
    output = await _turn_then_sigterm(tmp_path, openai, args, group=False)
    assert "SIGTERM: shutting down" in output


async def test_agentik_serve_bad_config_and_chat(tmp_path: Path) -> None:
    env = env_for(tmp_path, AGENTIK_PORT="99999")
    async with spawn([sys.executable, "-m", "agentik.cli", "serve"], env, tmp_path) as p:
        with trio.fail_after(60):
            assert await p.exit_code() == 2
    assert "AGENTIK_PORT" in p.output
    chat = [sys.executable, "-m", "agentik.cli", "chat", "--url", "http://127.0.0.1:9"]
    async with spawn(chat, env, tmp_path) as p:
        with trio.fail_after(60):
            assert await p.exit_code() == 1
    assert "cannot reach the agentik server" in p.output
