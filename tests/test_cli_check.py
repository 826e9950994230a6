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


BAD_USERS = """
[users.a]
role = "owner"
token_sha256 = ["abc"]
"""


async def test_check_reads_the_users_file_and_the_jwks(tmp_path: Path) -> None:
    from tests.jwtutil import Keys
    from tests.usersutil import write_users

    users = write_users(tmp_path / "users.toml")
    jwks = Keys().write_jwks(tmp_path / "jwks.json")
    async with open_scripted_openai() as openai:
        env = env_for(tmp_path, openai, AGENTIK_USERS=str(users), AGENTIK_JWT_JWKS=str(jwks))
        code, out = await run(["check"], env, tmp_path)
        assert code == 0, out
        assert f"ok     users: {users}: 3 user(s), 1 admin(s)" in out.splitlines()
        assert f"ok     jwks: {jwks}: 3 key(s): rsa-1, ec-1, ed-1" in out.splitlines()
        (tmp_path / "bad.toml").write_text(BAD_USERS)
        (tmp_path / "bad.json").write_text("{}")
        env.update(AGENTIK_USERS=str(tmp_path / "bad.toml"),
                   AGENTIK_JWT_JWKS=str(tmp_path / "bad.json"))
        code, out = await run(["check"], env, tmp_path)
    assert code == 2, out
    failed = [line for line in out.splitlines() if line.startswith("failed")]
    assert failed[:2] == [
        "failed users: users.a.role must be \"user\" or \"admin\", got 'owner'",
        "failed users: users.a.token_sha256: 'abc' is not 64 hex digits",
    ]
    assert len(failed) == 3 and "not a usable JWKS" in failed[2], out


async def test_serve_with_a_bad_users_file_says_each_mistake_and_exits_2(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text(BAD_USERS)
    async with open_scripted_openai() as openai:
        env = env_for(tmp_path, openai, AGENTIK_USERS=str(tmp_path / "bad.toml"))
        code, out = await run(["serve", "--port", "0"], env, tmp_path)
    assert code == 2, out
    lines = [line for line in out.splitlines() if line.startswith("agentik: bad configuration")]
    assert lines == [
        "agentik: bad configuration: AGENTIK_USERS: users.a.role must be \"user\" or \"admin\", "
        "got 'owner'",
        "agentik: bad configuration: AGENTIK_USERS: users.a.token_sha256: 'abc' is not 64 hex "
        "digits",
    ], out


async def test_check_and_serve_read_the_webhooks_file(tmp_path: Path) -> None:
    """``agentik check`` counts the webhooks file's subscriptions, names its mistake (exit 2);
    ``agentik serve`` with that file stops with one line naming AGENTIK_WEBHOOKS (exit 2)."""
    good = tmp_path / "hooks.toml"
    good.write_text('[[webhook]]\nid = "ops"\nurl = "http://127.0.0.1:9/"\n'
                    'events = ["turn.failed"]\nsecret = "whsec_' + "QUJD" * 8 + '"\n')
    bad = tmp_path / "bad-hooks.toml"
    bad.write_text('[[webhook]]\nid = "ops"\nurl = "http://127.0.0.1:9/"\n'
                   'events = ["turn.nope"]\nsecret = "whsec_' + "QUJD" * 8 + '"\n')
    async with open_scripted_openai() as openai:
        env = env_for(tmp_path, openai, AGENTIK_WEBHOOKS=str(good))
        code, out = await run(["check"], env, tmp_path)
        assert code == 0, out
        assert f"ok     webhooks: {good}: 1 subscription(s)" in out.splitlines()
        env.update(AGENTIK_WEBHOOKS=str(bad))
        code, out = await run(["check"], env, tmp_path)
        assert code == 2, out
        assert any(line.startswith("failed webhooks:") and "turn.nope" in line
                   for line in out.splitlines()), out
        code, out = await run(["serve", "--port", "0"], env, tmp_path)
    assert code == 2, out
    assert any(line.startswith("agentik: bad configuration: AGENTIK_WEBHOOKS:")
               and "turn.nope" in line for line in out.splitlines()), out
