"""Issue 11 #9: ``hypercorn -k trio -w 2`` on one database ends every agentik process, with one
clear message to run one worker and a non-zero exit; no worker is left serving as an orphan
holding the database. Real processes; the workers are found by their session id."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from agentik.storage.sqlite.dblock import lock_database
from tests.test_web_lifespan import env_for, spawn

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

HYPERCORN_2 = [sys.executable, "-m", "hypercorn", "-k", "trio", "-w", "2", "--bind",
               "127.0.0.1:0", "agentik.web:app"]


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) != sid:
                    continue
                with open(f"/proc/{entry}/stat") as stat:
                    state = stat.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue  # gone meanwhile
            if state != "Z":
                pids.append(int(entry))
    return pids


async def wait_gone(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(fd)  # readable once the process has exited
    finally:
        os.close(fd)


async def test_two_workers_end_every_process(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with spawn(HYPERCORN_2, env, tmp_path, new_session=True) as p:
        with trio.fail_after(60):
            code = await p.exit_code()
            assert code != 0, p.output
            assert "run a single hypercorn worker" in p.output, p.output
            # Every process of the server's session ends (the worker that held the database
            # shuts down cleanly once its supervisor is gone).
            while members := session_members(p.process.pid):
                for pid in members:
                    await wait_gone(pid)
    assert "SIGTERM: runtime closed, exiting" in p.output, p.output
    assert "leaked semaphore" not in p.output, p.output
    lock_database(str(tmp_path / "agentik.db")).release()  # nobody holds the database
