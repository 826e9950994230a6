"""JWT bearer tokens verified against a JWKS (agentik.web.jwt_auth): real key pairs, a real
JWKS file, tokens signed by joserfc."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio

from agentik.errors import ConfigError, UnauthorizedError
from agentik.users import Limits, parse_users
from agentik.web.jwt_auth import MIN_REFRESH, JwtVerifier, fetch_key_set
from tests.jwtutil import AUDIENCE, ISSUER, Keys, alg_none


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


def verifier(path: Path, clock: list[float] | None = None, **kw: object) -> JwtVerifier:
    now = clock if clock is not None else [0.0]
    return JwtVerifier(str(path), issuer=ISSUER, audience=AUDIENCE,
                       clock=lambda: now[0], **kw)  # type: ignore[arg-type]


async def test_tokens_of_each_algorithm_are_accepted(keys: Keys, tmp_path: Path) -> None:
    v = verifier(keys.write_jwks(tmp_path / "jwks.json"))
    users = parse_users("[defaults]\ntokens_per_day = 5\n")
    with trio.fail_after(10):
        for alg in ("RS256", "ES256", "EdDSA", "Ed25519"):
            p = await v.principal(keys.token("alice", alg=alg), users)
            assert (p.user, p.role, p.limits) == ("alice", "user", Limits(tokens_per_day=5))
        admin = await v.principal(keys.token("boss", role="admin"), None)
        assert (admin.user, admin.role) == ("boss", "admin")
        nested = verifier(tmp_path / "jwks.json", role_claim="realm.roles")
        p = await nested.principal(keys.token("boss", realm={"roles": ["x", "admin"]}), None)
        assert p.role == "admin"
        assert (await v.principal(keys.token("eve", role="superuser"), None)).role == "user"
        # an audience list holding ours is ours; one without it is not
        assert (await v.principal(keys.token("al", aud=["x", AUDIENCE]), None)).user == "al"
        with pytest.raises(UnauthorizedError):
            await v.principal(keys.token("al", aud=["x"]), None)


@pytest.mark.parametrize("case", [
    "expired", "not_yet", "wrong_aud", "wrong_iss", "alg_none", "hs256_public_key",
    "unknown_kid", "no_exp", "garbage", "bad_signature",
])
async def test_bad_tokens_are_refused(keys: Keys, tmp_path: Path, case: str) -> None:
    v = verifier(keys.write_jwks(tmp_path / "jwks.json"))
    now = int(time.time())
    token = {
        "expired": lambda: keys.token(exp=now - 120),
        "not_yet": lambda: keys.token(nbf=now + 120),
        "wrong_aud": lambda: keys.token(aud="someone-else"),
        "wrong_iss": lambda: keys.token(iss="https://evil.test"),
        "alg_none": lambda: alg_none(),
        "hs256_public_key": keys.hs256_with_public_key,
        "unknown_kid": lambda: keys.token(key=keys.stranger),
        "no_exp": lambda: keys.token(exp=None),
        "garbage": lambda: "not.a.jwt",
        "bad_signature": lambda: keys.token()[:-6] + "AAAAAA",
    }[case]()
    with trio.fail_after(10), pytest.raises(UnauthorizedError):
        await v.principal(token, None)


async def test_a_small_clock_skew_is_allowed(keys: Keys, tmp_path: Path) -> None:
    v = verifier(keys.write_jwks(tmp_path / "jwks.json"))
    now = int(time.time())
    with trio.fail_after(10):
        assert (await v.principal(keys.token(exp=now - 5), None)).user == "alice"
        assert (await v.principal(keys.token(nbf=now + 5), None)).user == "alice"


async def test_an_unknown_kid_refreshes_the_key_set_once_per_interval(
    keys: Keys, tmp_path: Path
) -> None:
    path = keys.write_jwks(tmp_path / "jwks.json")
    fetches: list[str] = []

    async def counting_fetch(source: str):  # type: ignore[no-untyped-def]
        fetches.append(source)
        return await fetch_key_set(source)

    clock = [1000.0]
    v = verifier(path, clock, fetch=counting_fetch)
    with trio.fail_after(10):
        await v.load()
        # the issuer rotates in a new key: the first token signed with it makes one refresh
        keys.write_jwks(path, with_stranger=True)
        clock[0] += MIN_REFRESH
        assert (await v.principal(keys.token("new", key=keys.stranger), None)).user == "new"
        assert len(fetches) == 2
        # an unknown kid again within the interval reads nothing more
        keys.write_jwks(path)
        v2 = verifier(path, clock, fetch=counting_fetch)
        await v2.load()
        keys.write_jwks(path, with_stranger=True)
        with pytest.raises(UnauthorizedError, match="unknown key id"):
            await v2.principal(keys.token(key=keys.stranger), None)
        clock[0] += 1
        with pytest.raises(UnauthorizedError, match="unknown key id"):
            await v2.principal(keys.token(key=keys.stranger), None)
        assert len(fetches) == 3  # v2 loaded within the interval: no refresh yet
        clock[0] += MIN_REFRESH
        assert (await v2.principal(keys.token("late", key=keys.stranger), None)).user == "late"
        assert len(fetches) == 4


async def test_a_bad_jwks_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text(json.dumps({"nokeys": []}))
    (tmp_path / "empty.json").write_text(json.dumps({"keys": []}))
    with trio.fail_after(10):
        for name, match in (("bad.json", "not a usable JWKS"), ("empty.json", "No keys"),
                            ("missing.json", "cannot read")):
            with pytest.raises(ConfigError, match=match) as info:
                await fetch_key_set(str(tmp_path / name))
            assert info.value.variable == "AGENTIK_JWT_JWKS"


async def test_a_refused_algorithm_never_makes_the_key_set_be_read_again(
    keys: Keys, tmp_path: Path
) -> None:
    path = keys.write_jwks(tmp_path / "jwks.json")
    fetches: list[str] = []

    async def counting_fetch(source: str):  # type: ignore[no-untyped-def]
        fetches.append(source)
        return await fetch_key_set(source)

    clock = [1000.0]
    v = verifier(path, clock, fetch=counting_fetch)
    with trio.fail_after(10):
        await v.load()
        clock[0] += MIN_REFRESH
        none_with_unknown_kid = (_b64({"alg": "none", "kid": "who-knows"}) + "."
                                 + alg_none().split(".")[1] + ".")
        with pytest.raises(UnauthorizedError, match="algorithm"):
            await v.principal(none_with_unknown_kid, None)
    assert len(fetches) == 1  # only the load


def _b64(obj: dict[str, str]) -> str:
    import base64

    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


async def test_a_jwks_url_is_fetched_and_fetched_again_for_a_new_kid(keys: Keys) -> None:
    """A real HTTP server on 127.0.0.1 serves the JWKS; the issuer rotates in a key."""
    from functools import partial

    import hypercorn.config
    import hypercorn.trio
    from quart import Response
    from quart_trio import QuartTrio

    app = QuartTrio("jwks")
    served = {"doc": keys.jwks(), "status": 200}
    fetched: list[int] = []

    @app.get("/jwks.json")
    async def jwks() -> Response:
        fetched.append(1)
        return Response(json.dumps(served["doc"]), status=served["status"],
                        content_type="application/json")

    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    stop = trio.Event()
    clock = [1000.0]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(hypercorn.trio.serve, app, config,
                                                shutdown_trigger=stop.wait))
            url = binds[0].rstrip("/") + "/jwks.json"
            v = JwtVerifier(url, issuer=ISSUER, audience=AUDIENCE, clock=lambda: clock[0])
            assert (await v.principal(keys.token("alice"), None)).user == "alice"
            served["doc"] = keys.jwks(with_stranger=True)
            clock[0] += MIN_REFRESH
            assert (await v.principal(keys.token("new", key=keys.stranger), None)).user == "new"
            assert len(fetched) == 2
            served["status"] = 500
            with pytest.raises(ConfigError, match="cannot fetch the JWKS"):
                await fetch_key_set(url)
            stop.set()
