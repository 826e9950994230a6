"""Issue 11 #10: a start-up failure of ``agentik serve`` is one line naming what to fix (the
variable, the line and column of a JSON error, the port), nothing after it, and exit status 2.
Real ``agentik serve`` processes."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

import pytest
import trio

from tests.test_web_lifespan import env_for, spawn

SERVE = [sys.executable, "-m", "agentik.cli", "serve"]


async def _fails(tmp_path: Path, args: list[str], **env: str) -> str:
    async with spawn(args, env_for(tmp_path, **env), tmp_path) as p:
        with trio.fail_after(60):
            code = await p.exit_code()
    lines = [line for line in p.output.splitlines() if line.strip()]
    assert code == 2, p.output
    assert len(lines) == 1, p.output  # one line, nothing after it (no "Running on", traceback)
    return lines[0]


@pytest.mark.skipif(importlib.util.find_spec("litert_lm") is None, reason="needs litert-lm")
async def test_missing_model_path(tmp_path: Path) -> None:
    line = await _fails(
        tmp_path, [*SERVE, "--port", "0"], AGENTIK_LLM_BACKEND="litert",
        AGENTIK_LITERT_MODEL_PATH=str(tmp_path / "none.litertlm"),
    )
    assert "AGENTIK_LITERT_MODEL_PATH" in line and "does not exist" in line, line
    assert "set it to the path of a .litertlm model file" in line, line


async def test_malformed_mcp_json_names_line_and_column(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {\n  "a": {"command": "x",}\n}}\n')
    line = await _fails(tmp_path, [*SERVE, "--port", "0"], AGENTIK_MCP_CONFIG=str(config))
    assert "AGENTIK_MCP_CONFIG" in line and "line 2, column" in line, line


async def test_port_in_use_names_the_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = await _fails(tmp_path, [*SERVE, "--port", str(port)])
    assert f"port {port}" in line and "in use" in line, line
    assert not (tmp_path / "agentik.db").exists()  # refused before the runtime started


async def test_bad_variable(tmp_path: Path) -> None:
    line = await _fails(tmp_path, [*SERVE, "--port", "0"], AGENTIK_KEEP_ALIVE_TIMEOUT="soon")
    assert "AGENTIK_KEEP_ALIVE_TIMEOUT" in line, line
