"""The users file (agentik.users) and the per-user limits' pure logic (agentik.limits)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from agentik.limits import SendBucket, SendRates, next_reset, tokens_retry_after, utc_day
from agentik.users import SHARED_ADMIN, Limits, UsersFileError, load_users, parse_users


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


GOOD = f"""
[defaults]
sends_per_minute = 10
tokens_per_day = 1000

[users.alice]
role = "user"
token_sha256 = ["{sha("alice-1")}", "{sha("alice-2")}"]
sends_per_minute = 30
turns_at_once = 2

[users.root]
role = "admin"
token_sha256 = "{sha("root-token")}"
"""


def test_users_file_gives_each_token_its_user_and_limits_over_defaults() -> None:
    users = parse_users(GOOD)
    alice = users.by_token("alice-2")
    assert alice is not None and alice.user == "alice" and not alice.is_admin
    assert alice.limits == Limits(sends_per_minute=30, turns_at_once=2, tokens_per_day=1000)
    root = users.by_token("root-token")
    assert root is not None and root.is_admin
    assert root.limits == Limits(sends_per_minute=10, tokens_per_day=1000)
    assert users.by_token("alice-3") is None
    assert users.by_token(sha("alice-1")) is None  # the digest itself is no token
    # a user only a JWT names: the defaults
    assert users.limits_of("bob") == Limits(sends_per_minute=10, tokens_per_day=1000)
    assert SHARED_ADMIN.is_admin and SHARED_ADMIN.limits == Limits()


def test_every_mistake_is_one_line() -> None:
    bad = f"""
[defaults]
sends_per_minute = 0
colour = "red"

[users.a]
role = "owner"
token_sha256 = ["abc", "{sha("x")}"]
turns_at_once = "two"

[users.b]
token_sha256 = ["{sha("x")}"]

[users.c]

[extra]
"""
    with pytest.raises(UsersFileError) as info:
        parse_users(bad)
    problems = info.value.problems
    assert problems == [
        "unknown table 'extra' (expected [users.<id>] and [defaults])",
        "defaults: unknown field 'colour'",
        "defaults.sends_per_minute must be a positive integer, got 0",
        "users.a.role must be \"user\" or \"admin\", got 'owner'",
        "users.a.token_sha256: 'abc' is not 64 hex digits",
        "users.a.turns_at_once must be a positive integer, got 'two'",
        "users.b: a token of theirs is also a's",
        "users.c.token_sha256 must list the SHA-256 hex digest of each token",
    ]
    assert info.value.variable == "AGENTIK_USERS"


def test_unreadable_or_not_toml(tmp_path: object) -> None:
    with pytest.raises(UsersFileError, match="not valid TOML"):
        parse_users("[users.a\n")
    with pytest.raises(UsersFileError, match="cannot read"):
        load_users("/nonexistent/users.toml")


def test_send_bucket_holds_a_minute_of_sends_and_refills_evenly() -> None:
    bucket = SendBucket.full(3, now=1000.0)
    assert [bucket.take(1000.0) for _ in range(3)] == [None, None, None]
    wait = bucket.take(1000.0)
    assert wait == pytest.approx(20.0)  # 3 a minute: one every 20 s
    assert bucket.take(1010.0) == pytest.approx(10.0)
    assert bucket.take(1020.0) is None
    assert bucket.take(1020.0) == pytest.approx(20.0)
    # refill never goes over the capacity
    assert [bucket.take(5000.0) for _ in range(4)][-1] is not None


def test_send_rates_are_per_user_and_unlimited_without_a_limit() -> None:
    rates = SendRates()
    assert rates.take("a", 1, 0.0) is None
    assert rates.take("a", 1, 0.0) is not None
    assert rates.take("b", 1, 0.0) is None  # another user's bucket
    assert all(rates.take("c", None, 0.0) is None for _ in range(100))


def test_daily_tokens_reset_at_utc_midnight() -> None:
    now = datetime(2026, 12, 4, 23, 59, 30, tzinfo=UTC).timestamp()
    assert utc_day(now) == "2026-12-04"
    assert next_reset(now) == datetime(2026, 12, 5, tzinfo=UTC).timestamp()
    assert tokens_retry_after(999, 1000, now) is None
    assert tokens_retry_after(1000, 1000, now) == 30
    assert tokens_retry_after(10**9, None, now) is None
    midnight = datetime(2026, 12, 5, tzinfo=UTC).timestamp()
    assert utc_day(midnight) == "2026-12-05" and next_reset(midnight) == midnight + 86400
