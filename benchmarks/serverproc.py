"""Run a real agentik server (``python -m agentik.cli serve``) in a subprocess.

Benchmarks use it so that the server's CPU and memory are its own (the clients and the scripted
LLM run in the calling process); the reliability tests use it to ``kill -9`` the server.

    async with spawn_server(db_path, openai_base_url=scripted.base_url) as server:
        async with httpx2.AsyncClient(base_url=server.url) as client:
            ...
        server.kill()            # SIGKILL, like a power cut for the process
        await server.restart()   # same database, same port
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO

import httpx2
import trio

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rss_kib(pid: int) -> int:
    """Resident set size of process ``pid`` in KiB, from /proc/PID/statm."""
    with open(f"/proc/{pid}/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() // 1024


class ServerProcess:
    """One ``agentik serve`` child. ``url`` stays the same across restarts (same port)."""

    def __init__(self, db_path: str, env: Mapping[str, str], log_path: str) -> None:
        self.db_path = db_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.env = {
            **os.environ,
            "AGENTIK_DB_PATH": db_path,
            "PYTHONPATH": str(REPO),
            **env,
        }
        self.process: trio.Process | None = None
        self.starts = 0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def _open_log(self) -> IO[bytes]:
        log = open(self.log_path, "ab")
        log.write(f"\n=== start {self.starts} ===\n".encode())
        log.flush()
        return log

    async def start(self, start_timeout: float = 30.0) -> None:
        """Start the child and wait until ``/healthz`` answers 200."""
        assert self.process is None or self.process.returncode is not None
        self.starts += 1
        with self._open_log() as log:
            self.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "agentik.cli", "serve", "--port", str(self.port),
                 "--graceful-timeout", "0.5"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO),
            )
        with trio.fail_after(start_timeout):
            async with httpx2.AsyncClient(base_url=self.url, timeout=2.0) as client:
                while True:
                    if self.process.returncode is not None:
                        raise RuntimeError(
                            f"server exited with {self.process.returncode}: {self.log_tail()}"
                        )
                    try:
                        response = await client.get("/healthz")
                        if response.status_code == 200:
                            return
                    except httpx2.TransportError:
                        pass
                    await trio.sleep(0.05)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs; the OS releases the database lock."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)

    async def wait(self) -> int:
        assert self.process is not None
        with trio.fail_after(30):
            return await self.process.wait()

    async def restart(self) -> None:
        self.kill()
        await self.wait()
        await self.start()

    async def stop(self) -> int:
        """SIGTERM and wait (graceful); SIGKILL if it takes more than 15 s."""
        if self.process is None or self.process.returncode is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(15):
            return await self.process.wait()
        self.kill()
        return await self.wait()


@asynccontextmanager
async def spawn_server(
    db_path: str,
    *,
    openai_base_url: str,
    env: Mapping[str, str] | None = None,
    log_path: str | None = None,
) -> AsyncIterator[ServerProcess]:
    """A started :class:`ServerProcess` for the body; stopped (or killed) on exit."""
    base = {
        "OPENAI_BASE_URL": openai_base_url,
        "OPENAI_API_KEY": "k",
        "AGENTIK_LLM_MAX_RETRIES": "0",
    }
    server = ServerProcess(db_path, {**base, **(env or {})}, log_path or db_path + ".log")
    await server.start()
    try:
        yield server
    finally:
        with trio.CancelScope(shield=True):
            await server.stop()
