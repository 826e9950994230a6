"""Per-user limits over the real server (docs/USERS.md): sends a minute (429 + Retry-After),
turns at once, conversations kept, model tokens a UTC day (429 until midnight UTC, stored per
user), ``GET /agentik/usage``; JWT bearer tokens through the routes. Other users are unaffected."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import httpx2
import pytest
import trio

from agentik.limits import next_reset
from agentik.users import Limits
from tests.jwtutil import AUDIENCE, ISSUER, Keys, alg_none
from tests.scripted_openai import Hang, ScriptedOpenAI
from tests.usersutil import bearer, write_users
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    make_config,
    no_error_logs,
    open_sse,
    openai,
    serve_app,
)

TEXT = {"content": [{"type": "text", "body": "hi"}]}


def http(server: Server, who: str) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(base_url=server.url, timeout=10, headers=bearer(who))


async def turn(client: httpx2.AsyncClient, cid: str) -> httpx2.Response:
    """Send and, when accepted, wait for the turn's end."""
    cursor = (await client.get("/agentik/cursor")).json()["current"]
    async with open_sse(client, f"/agentik/conversations/{cid}/events", after=cursor) as stream:
        sent = await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)
        if sent.status_code == 202:
            await stream.until("assistant_message")
        return sent


async def test_over_the_send_rate_is_429_with_retry_after(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    users = write_users(tmp_path / "u.toml", extra="sends_per_minute = 2")
    async with serve_app(make_config(tmp_path, openai, users_file=str(users))) as server, \
            http(server, "alice") as alice, http(server, "bob") as bob:
        with trio.fail_after(30):
            a = (await alice.post("/agentik/conversations")).json()["id"]
            b = (await bob.post("/agentik/conversations")).json()["id"]
            assert (await turn(alice, a)).status_code == 202
            assert (await turn(alice, a)).status_code == 202
            refused = await alice.post(f"/agentik/conversations/{a}/messages", json=TEXT)
            assert refused.status_code == 429
            body = refused.json()["error"]
            assert body["code"] == "rate_limited" and "2 sends a minute" in body["message"]
            # 2 a minute: the next send fits within 30 s
            assert 1 <= int(refused.headers["Retry-After"]) <= 30
            assert 0 < body["retry_after"] <= 30
            # creating a conversation is not a send; bob is not alice
            assert (await alice.post("/agentik/conversations")).status_code == 201
            for _ in range(3):
                assert (await turn(bob, b)).status_code == 202
            # nothing of the refused send was stored
            messages = (await alice.get(f"/agentik/conversations/{a}/messages")).json()
            assert [m["message"]["type"] for m in messages] == [
                "user_message", "assistant_message", "user_message", "assistant_message"]


async def test_daily_tokens_refuse_until_midnight_utc(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    # each scripted turn reports 10 prompt + 5 completion tokens
    users = write_users(tmp_path / "u.toml", defaults="tokens_per_day = 20")
    async with serve_app(make_config(tmp_path, openai, users_file=str(users))) as server, \
            http(server, "alice") as alice, http(server, "bob") as bob, \
            http(server, "root") as root:
        with trio.fail_after(30):
            a = (await alice.post("/agentik/conversations")).json()["id"]
            b = (await bob.post("/agentik/conversations")).json()["id"]
            assert (await turn(alice, a)).status_code == 202
            assert (await turn(alice, a)).status_code == 202  # 15 < 20: still allowed
            refused = await alice.post(f"/agentik/conversations/{a}/messages", json=TEXT)
            assert refused.status_code == 429, refused.text
            now = time.time()
            wait = int(refused.headers["Retry-After"])
            assert abs(now + wait - next_reset(now)) <= 5
            assert "30 of 20 model tokens today" in refused.json()["error"]["message"]
            assert (await turn(bob, b)).status_code == 202  # bob's own count
            usage = (await alice.get("/agentik/usage")).json()
            midnight = datetime.fromtimestamp(next_reset(now), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            assert usage == {"user": "alice", "tokens_today": 30, "tokens_per_day": 20,
                             "reset_at": midnight}
            assert (await root.get("/agentik/usage", params={"user": "alice"})).json() == usage
            assert (await root.get("/agentik/usage", params={"user": "bob"})).json()[
                "tokens_today"] == 15
            other = await bob.get("/agentik/usage", params={"user": "alice"})
            assert other.status_code == 403
            # the next UTC day counts afresh (the count is stored per user and day)
            tomorrow = next_reset(now) + 1
            await server.agent.users.before_send("alice", Limits(tokens_per_day=20), tomorrow)
    # durable: a restarted server still knows today's count
    async with serve_app(make_config(tmp_path, openai, users_file=str(users))) as server, \
            http(server, "alice") as alice:
        with trio.fail_after(30):
            assert (await alice.get("/agentik/usage")).json()["tokens_today"] == 30
            refused = await alice.post(f"/agentik/conversations/{a}/messages", json=TEXT)
            assert refused.status_code == 429


async def test_turns_at_once_and_conversations_kept(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    users = write_users(tmp_path / "u.toml", extra="turns_at_once = 1\nconversations = 1")
    async with serve_app(make_config(tmp_path, openai, users_file=str(users))) as server, \
            http(server, "alice") as alice, http(server, "bob") as bob:
        with trio.fail_after(30):
            a = (await alice.post("/agentik/conversations")).json()["id"]
            refused = await alice.post("/agentik/conversations")
            assert refused.status_code == 429 and "keeps 1 conversations" in refused.text
            assert refused.headers["Retry-After"] == "60"  # nothing changes until a deletion
            assert (await bob.post("/agentik/conversations")).status_code == 201
            openai.push(Hang())
            assert (await alice.post(f"/agentik/conversations/{a}/messages",
                                     json=TEXT)).status_code == 202
            busy = await alice.post(f"/agentik/conversations/{a}/messages", json=TEXT)
            assert busy.status_code == 429 and "turns accepted and not ended" in busy.text
            assert busy.headers["Retry-After"] == "1"
            cursor = (await alice.get("/agentik/cursor")).json()["current"]
            async with open_sse(alice, f"/agentik/conversations/{a}/events",
                                after=cursor) as stream:
                await alice.post(f"/agentik/conversations/{a}/interrupt")
                await stream.until("interrupted")  # stored with the turn's end
            assert (await turn(alice, a)).status_code == 202
            assert (await alice.delete(f"/agentik/conversations/{a}")).status_code == 204
            assert (await alice.post("/agentik/conversations")).status_code == 201


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


async def test_jwt_bearer_tokens_through_the_routes(
    tmp_path: Path, openai: ScriptedOpenAI, keys: Keys
) -> None:
    jwks = keys.write_jwks(tmp_path / "jwks.json")
    users = write_users(tmp_path / "u.toml", defaults="sends_per_minute = 5")
    config = make_config(tmp_path, openai, users_file=str(users), jwt_jwks=str(jwks),
                         jwt_issuer=ISSUER, jwt_audience=AUDIENCE)
    async with serve_app(config) as server:
        carol = httpx2.AsyncClient(base_url=server.url, timeout=10,
                                   headers=bearer(keys.token("carol", alg="ES256")))
        boss = httpx2.AsyncClient(base_url=server.url, timeout=10,
                                  headers=bearer(keys.token("boss", role="admin")))
        async with carol, boss, http(server, "alice") as alice:
            with trio.fail_after(30):
                cid = (await carol.post("/agentik/conversations")).json()["id"]
                assert (await alice.get(f"/agentik/conversations/{cid}")).status_code == 404
                assert (await boss.get(f"/agentik/conversations/{cid}")).status_code == 200
                assert (await carol.get("/agentik/usage")).json()["user"] == "carol"
                assert (await carol.get("/metrics")).status_code == 403
                assert (await boss.get("/metrics")).status_code == 200
                now = int(time.time())
                for bad in (keys.token("carol", exp=now - 120), keys.token("carol", aud="x"),
                            keys.token("carol", iss="https://evil.test"), alg_none("carol"),
                            keys.hs256_with_public_key("carol"),
                            keys.token("carol", key=keys.stranger)):
                    async with httpx2.AsyncClient(base_url=server.url, timeout=10,
                                                  headers=bearer(bad)) as client:
                        answer = await client.get("/agentik/conversations")
                        assert answer.status_code == 401, answer.text
                    async with open_sse(carol, "/agentik/events",
                                        params={"access_token": bad}, headers={"Authorization": ""},
                                        expect_status=401):
                        pass
