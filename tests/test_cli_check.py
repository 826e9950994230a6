"""``agentik check`` and ``agentik --version`` (issue 14), as a real process: against the
scripted OpenAI server, an unreachable OPENAI_BASE_URL, a real stdio MCP server and one that
cannot start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import trio

import agentik
from tests.scripted_openai import open_scripted_openai
from tests.test_web_lifespan import env_for

TOOLBOX = str(Path(__file__).parent / "mcp_servers" / "toolbox.py")
AGENTIK = [sys.executable, "-m", "agentik.cli"]


async def run(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    with trio.fail_after(120):
        done = await trio.run_process(
            [*AGENTIK, *args], env=env, cwd=cwd, capture_stdout=True,
            stderr=subprocess.STDOUT, check=False,
        )
    return done.returncode, done.stdout.decode()


async def test_version(tmp_path: Path) -> None:
    code, out = await run(["--version"], env_for(tmp_path), tmp_path)
    assert code == 0 and out.strip() == f"agentik {agentik.__version__}"


async def test_check_ok_against_a_reachable_model_and_mcp_server(tmp_path: Path) -> None:
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {
        "toolbox": {"command": sys.executable, "args": [TOOLBOX]}}}))
    async with open_scripted_openai() as openai:
        env = env_for(tmp_path, openai, AGENTIK_MCP_CONFIG=str(mcp))
        code, out = await run(["check"], env, tmp_path)
    lines = out.strip().splitlines()
    assert code == 0, out
    assert [line.split()[0] for line in lines] == ["ok"] * 4, out
    assert lines[1].startswith("ok     database:") and "writable" in lines[1]
    assert lines[2].startswith("ok     model:") and "1 model(s)" in lines[2]
    assert lines[3].startswith("ok     mcp toolbox:") and "tool(s)" in lines[3]


async def test_check_names_an_unreachable_model_and_a_broken_mcp_server(tmp_path: Path) -> None:
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {
        "broken": {"command": str(tmp_path / "no-such-program")}}}))
    url = "http://127.0.0.1:9/v1"
    env = env_for(tmp_path, AGENTIK_MCP_CONFIG=str(mcp), OPENAI_BASE_URL=url)
    code, out = await run(["check"], env, tmp_path)
    assert code != 0, out
    model = next(line for line in out.splitlines() if " model:" in line)
    assert model.startswith("failed") and "127.0.0.1:9" in model, out
    broken = next(line for line in out.splitlines() if "mcp broken" in line)
    assert broken.startswith("failed"), out


async def test_check_a_database_that_cannot_be_written(tmp_path: Path) -> None:
    async with open_scripted_openai() as openai:
        env = env_for(tmp_path, openai, AGENTIK_DB_PATH=str(tmp_path / "missing" / "a.db"))
        code, out = await run(["check"], env, tmp_path)
    assert code == 1, out
    assert any(line.startswith("failed database:") and "does not exist" in line
               for line in out.splitlines()), out


async def test_check_a_bad_setting_exits_2(tmp_path: Path) -> None:
    code, out = await run(["check"], env_for(tmp_path, AGENTIK_PORT="x"), tmp_path)
    assert code == 2 and "AGENTIK_PORT" in out


async def test_check_a_malformed_mcp_json_is_one_line_and_exits_2(tmp_path: Path) -> None:
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {"calc": {"command": "python", "args": "calc.py"}}}))
    async with open_scripted_openai() as openai:
        env = env_for(tmp_path, openai, AGENTIK_MCP_CONFIG=str(mcp))
        code, out = await run(["check"], env, tmp_path)
    assert code == 2, out
    assert "Traceback" not in out, out
    assert out.splitlines()[-1] == ('failed mcp: AGENTIK_MCP_CONFIG: server "calc": field "args": '
                                    "Expected `array`, got `str`"), out


async def test_check_without_a_model_says_what_to_set(tmp_path: Path) -> None:
    """No OPENAI_BASE_URL, no key: nothing is asked (OpenAI's API needs a key); the model's line
    names what to set, and it is a missing setting (exit 2)."""
    env = env_for(tmp_path)
    del env["OPENAI_API_KEY"]
    code, out = await run(["check"], env, tmp_path)
    assert code == 2, out
    model = next(line for line in out.splitlines() if " model:" in line)
    assert model.startswith("failed model: OPENAI_BASE_URL: no model configured"), out
    assert "agentik check" in model and "api.openai.com" not in out, out
