"""A cluster node without AGENTIK_NODE_URL (issue 26, point 5): it learns the address the other
nodes forward commands to when it can (``agentik serve`` from its bind, plain hypercorn from the
address its requests arrive at), so a send through another node reaches the owner instead of a
503 ``not_owner``; only when it cannot (a UNIX socket) does it warn, and ``/readyz`` names
AGENTIK_NODE_URL. Real processes on real PostgreSQL (``tests/test_pg_nodes.py``'s nodes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx2
import psycopg
import pytest
import trio

from agentik.client.http import AgentikAgent
from benchmarks.serverproc import free_port
from tests.scripted_openai import ScriptedOpenAI
from tests.test_pg_nodes import REPO, Node, Reader, cluster, terminal_turns

pytestmark = pytest.mark.usefixtures("pg_url")

#: an empty variable counts as unset
NO_URL = {"AGENTIK_NODE_URL": ""}


def advertised(pg_url: str, node_id: str) -> str | None:
    """The node's advertised address; None before it (or its schema) is there."""
    with psycopg.connect(pg_url) as conn:
        try:
            row = conn.execute("SELECT addr FROM nodes WHERE node_id = %s", (node_id,)).fetchone()
        except psycopg.errors.UndefinedTable:
            return None
    return None if row is None else row[0]


async def test_plain_hypercorn_nodes_learn_their_address_and_forward(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    async with cluster(pg_url, scripted, tmp_path, env=NO_URL) as (a, b):
        ca, cb = AgentikAgent("ca", a.url), AgentikAgent("cb", b.url)
        try:
            conv = await ca.create_conversation()  # a owns it
            reader_b = Reader(b)
            async with trio.open_nursery() as background:
                background.start_soon(reader_b.run, (await cb.outbox.current_cursor()).epoch)
                # every send through b reaches a (before: 503 not_owner, nothing stored)
                sent = [await cb.send(conv.id, f"through b {i}") for i in range(4)]
                await reader_b.wait_for(lambda: set(sent) <= terminal_turns(reader_b.events).keys())
                background.cancel_scope.cancel()
            assert all(terminal_turns(reader_b.events)[m] == ["assistant_message"] for m in sent)
            assert advertised(pg_url, a.name) == a.url  # the address its requests came to
            async with httpx2.AsyncClient(base_url=a.url) as http:
                ready = (await http.get("/readyz")).json()
            assert ready["status"] == "ready", ready
            assert "AGENTIK_NODE_URL is not set: this node advertises" in a.log()
        finally:
            await ca.close()
            await cb.close()


async def test_agentik_serve_advertises_its_bind_before_any_request(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "AGENTIK_DATABASE_URL": pg_url,
           "AGENTIK_NODE_ID": "served", "OPENAI_BASE_URL": scripted.base_url,
           "OPENAI_API_KEY": "k", **NO_URL}
    with open(tmp_path / "served.log", "wb") as log:  # noqa: ASYNC230 - a local file, once
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "agentik", "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO))
    try:
        with trio.fail_after(30):
            while advertised(pg_url, "served") is None:  # its first heartbeat; no request made
                assert proc.returncode is None, (tmp_path / "served.log").read_text()
                await trio.sleep(0.1)
        assert advertised(pg_url, "served") == f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        with trio.move_on_after(15):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert "AGENTIK_NODE_URL is not set" not in (tmp_path / "served.log").read_text()


async def test_a_node_that_cannot_learn_its_address_warns_and_readyz_says_so(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    """Bound to a UNIX socket only, its requests tell it no address."""
    node = Node("uds", pg_url, scripted.base_url, tmp_path)
    node.env.update(NO_URL)
    sock = str(tmp_path / "node.sock")
    with open(node.log_path, "wb") as log:  # noqa: ASYNC230 - a local file, once
        node.process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "hypercorn", "-k", "trio", "--bind", f"unix:{sock}",
             "--graceful-timeout", "1", "agentik.web:app"],
            env=node.env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO),
            start_new_session=True)
    try:
        transport = httpx2.AsyncHTTPTransport(uds=sock)
        async with httpx2.AsyncClient(transport=transport, base_url="http://node") as http:
            with trio.fail_after(30):
                while True:
                    assert node.process.returncode is None, node.log()
                    try:
                        if (await http.get("/healthz")).status_code == 200:
                            break
                    except httpx2.TransportError:
                        pass
                    await trio.sleep(0.05)
            ready = (await http.get("/readyz")).json()
        assert ready["status"] == "degraded", ready
        assert any("set AGENTIK_NODE_URL" in reason for reason in ready["reasons"]), ready
        assert advertised(pg_url, "uds") is None
        assert "a request arrived without a server address" in node.log()
    finally:
        await node.stop()
