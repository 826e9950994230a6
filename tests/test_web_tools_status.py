"""Issue 11 #11: an MCP command that does not exist keeps being retried, and ``/agentik/tools``
shows that server failed and why (real server, real mcp.json, a command that is not there)."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest
import trio

from tests.scripted_openai import ScriptedOpenAI
from tests.webutil import make_config, no_error_logs, openai, serve_app  # noqa: F401

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")


async def test_missing_mcp_command_shows_failed_with_the_reason(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    mcp = tmp_path / "mcp.json"
    missing = str(tmp_path / "no-such-mcp-server")
    mcp.write_text(json.dumps({"mcpServers": {"ghost": {"command": missing, "args": []}}}))
    config = make_config(tmp_path, openai, mcp_config=str(mcp))
    async with serve_app(config) as srv, httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
        with trio.fail_after(20):
            while True:
                servers = (await http.get("/agentik/tools")).json()["servers"]
                if servers and servers[0]["state"] == "failed":
                    break
                await trio.sleep(0.05)  # polling a route: its state has no event a client sees
        ghost = servers[0]
        assert ghost["name"] == "ghost" and ghost["tools"] == []
        assert "no-such-mcp-server" in ghost["error"], ghost
        assert (await http.get("/healthz")).status_code == 200  # liveness is not readiness
