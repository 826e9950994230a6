"""The server process's garbage collector (``AGENTIK_GC_THRESHOLD``, ``process.tune_gc``): tuned
once the runtime has started when the process is the server's own, left alone otherwise."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
import trio

from agentik.config import Config
from tests.scripted_openai import ScriptedOpenAI
from tests.webutil import make_config, serve_app
from tests.webutil import openai as openai  # the fixture


@pytest.fixture
def restore_gc() -> Iterator[None]:
    """This test process's own collector as it was (tests share it)."""
    saved = gc.get_threshold()
    frozen = gc.get_freeze_count()
    try:
        yield
    finally:
        gc.unfreeze()  # what the test froze (nothing else in this process freezes)
        gc.set_threshold(*saved)
        assert frozen == 0


async def test_the_servers_own_process_freezes_start_up_and_collects_less_often(
    tmp_path: Path, openai: ScriptedOpenAI, restore_gc: None,
) -> None:
    config = make_config(tmp_path, openai, gc_threshold=12_345)
    saved = gc.get_threshold()
    async with serve_app(config, tune_gc=True) as server:
        assert gc.get_threshold() == (12_345, saved[1], saved[2])
        assert gc.get_freeze_count() > 10_000  # modules, types, the app, the runtime
        async with httpx2.AsyncClient(base_url=server.url) as client:
            assert (await client.get("/healthz")).status_code == 200


@pytest.mark.parametrize("tune_gc, threshold", [(False, 50_000), (True, 0)])
async def test_an_embedding_program_or_threshold_0_leaves_the_collector_alone(
    tmp_path: Path, openai: ScriptedOpenAI, restore_gc: None, tune_gc: bool, threshold: int,
) -> None:
    config = make_config(tmp_path, openai, gc_threshold=threshold)
    saved = gc.get_threshold()
    async with serve_app(config, tune_gc=tune_gc):
        assert gc.get_threshold() == saved
        assert gc.get_freeze_count() == 0


def test_the_setting_is_read_and_checked() -> None:
    from agentik.web import app  # what ``hypercorn -k trio agentik.web:app`` serves

    assert app.agentik.tune_gc
    assert Config.from_env({"AGENTIK_GC_THRESHOLD": "0"}).gc_threshold == 0
    assert Config().gc_threshold == 50_000
    with pytest.raises(Exception, match="AGENTIK_GC_THRESHOLD"):
        Config.from_env({"AGENTIK_GC_THRESHOLD": "-1"})


async def test_agentik_serve_tunes_its_process(tmp_path: Path, openai: ScriptedOpenAI) -> None:
    """A real ``agentik serve``: its log says what it froze and the new threshold."""
    repo = str(Path(__file__).parents[1])
    env = {"AGENTIK_DB_PATH": str(tmp_path / "s.db"), "OPENAI_BASE_URL": openai.base_url,
           "OPENAI_API_KEY": "k", "AGENTIK_GC_THRESHOLD": "23456", "PATH": "/usr/bin:/bin"}
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "agentik.cli", "serve", "--port", str(port)],
            env={**env, "PYTHONPATH": repo},
            stdout=out, stderr=out)
    try:
        with trio.fail_after(30):
            while "garbage collector" not in log.read_text():
                assert proc.returncode is None, log.read_text()
                await trio.sleep(0.05)
        line = next(x for x in log.read_text().splitlines() if "garbage collector" in x)
        assert "a collection every 23456 new objects" in line
        frozen = int(line.split("garbage collector: ")[1].split()[0])
        assert frozen > 10_000
    finally:
        proc.terminate()
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
