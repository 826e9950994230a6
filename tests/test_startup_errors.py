"""Issue 11 #10: a start-up failure of ``agentik serve`` is one line naming what to fix (the
variable, the line and column of a JSON error, the port), nothing after it, and exit status 2.
Real ``agentik serve`` processes."""

from __future__ import annotations

import importlib.util
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from agentik.storage.sqlite.dblock import lock_database
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


# --- plain hypercorn -------------------------------------------------------------------------------
# The same failures under `hypercorn -k trio agentik.web:app`: one line, nothing after it (no
# "Running on", no traceback, no "leaked semaphore objects" from the supervisor's resource
# tracker, whose output ends the stream: it holds the pipe until it exits), a non-zero exit.


def _bad_model(tmp_path: Path) -> tuple[dict[str, str], str]:
    if importlib.util.find_spec("litert_lm") is None:
        pytest.skip("needs litert-lm")
    return ({"AGENTIK_LLM_BACKEND": "litert",
             "AGENTIK_LITERT_MODEL_PATH": str(tmp_path / "none.litertlm")},
            "AGENTIK_LITERT_MODEL_PATH")


def _bad_mcp_json(tmp_path: Path) -> tuple[dict[str, str], str]:
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {\n  "a": {"command": "x",}\n}}\n')
    return {"AGENTIK_MCP_CONFIG": str(config)}, "line 2, column"


def _db_in_use(tmp_path: Path) -> tuple[dict[str, str], str]:
    return {}, "is in use by another agentik process"


@pytest.mark.parametrize("workers", ["1", "0"])
@pytest.mark.parametrize("case", [_bad_model, _bad_mcp_json, _db_in_use])
async def test_plain_hypercorn_startup_failure(
    tmp_path: Path, case: Callable[[Path], tuple[dict[str, str], str]], workers: str
) -> None:
    extra, expected = case(tmp_path)
    args = [sys.executable, "-m", "hypercorn", "-k", "trio", "-w", workers, "--bind",
            "127.0.0.1:0", "agentik.web:app"]
    held = lock_database(str(tmp_path / "agentik.db")) if case is _db_in_use else None
    try:
        async with spawn(args, env_for(tmp_path, **extra), tmp_path) as p:
            with trio.fail_after(60):
                code = await p.exit_code()
    finally:
        if held is not None:
            held.release()
    lines = [line for line in p.output.splitlines() if line.strip()]
    assert len(lines) == 1, p.output  # the reason, once, and nothing after it
    assert "agentik cannot start" in lines[0] and expected in lines[0], p.output
    assert "leaked semaphore" not in p.output and "Running on" not in p.output
    if workers == "0":
        # the app runs in hypercorn's process: agentik serve's status (2: a bad setting)
        assert code == (1 if case is _db_in_use else 2), p.output
    else:
        # hypercorn 0.18's supervisor reports a failed worker as success (exit 0; see
        # agentik.web.process.terminate): the worker kills it so the failure shows.
        assert code == -signal.SIGKILL, p.output


@pytest.mark.parametrize(
    ("url", "expected"),
    [("127.0.0.1:8080", "has no scheme: add http:// (e.g. http://127.0.0.1:8080)"),
     ("ftp://127.0.0.1:8080", "is not an http:// or https:// URL")],
)
async def test_chat_url_without_http_scheme(tmp_path: Path, url: str, expected: str) -> None:
    """Issue 11 #11: ``agentik chat --url 127.0.0.1:8080`` says to add ``http://`` (exit 2),
    before it tries to connect anywhere."""
    chat = [sys.executable, "-m", "agentik.cli", "chat", "--url", url]
    async with spawn(chat, env_for(tmp_path), tmp_path) as p:
        with trio.fail_after(60):
            code = await p.exit_code()
    assert code == 2, p.output
    assert p.output.strip() == f"agentik chat: --url {url!r} {expected}" + (
        " or https://" if "no scheme" in expected else ""
    ), p.output
