"""Principals: who a request is (docs/USERS.md). Pure: the users file's text in, a
:class:`Users` out; no I/O but :func:`load_users` reading the file.

A principal is a user id, a role (``user`` or ``admin``) and that user's limits. It comes from
one of three places, all decided in ``agentik.web.auth``:

- the users file (``AGENTIK_USERS``, TOML): each user's tokens are stored as SHA-256 hex digests,
  never as the tokens; a request's token is hashed and compared with every stored digest in
  constant time (``hmac.compare_digest``, no early exit);
- a JWT (``agentik.web.jwt``): the user id is its ``sub``, the role from a configured claim, the
  limits that user's entry in the users file, else ``[defaults]``;
- ``AGENTIK_TOKENS``: every such token is one shared admin principal (:data:`SHARED_ADMIN`), as
  before users existed; with no auth configured at all every request is that principal too.

Every mistake in the file is found in one pass and reported one line each
(:class:`UsersFileError`), so ``agentik serve`` and ``agentik check`` can say all of them at once.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import tomllib
from dataclasses import dataclass, field, fields
from typing import Literal

from agentik.errors import ConfigError

Role = Literal["user", "admin"]
ROLES: tuple[Role, ...] = ("user", "admin")

#: the limit fields a user entry and ``[defaults]`` may set (each a positive integer)
LIMIT_FIELDS = ("sends_per_minute", "turns_at_once", "conversations", "tokens_per_day")
#: a user id: what a JWT's ``sub`` may also be, so any printable text without control characters
_USER_ID = re.compile(r"[^\x00-\x1f\x7f]{1,200}")
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


def is_user_id(text: str) -> bool:
    """1-200 characters, none of them a control character (a users-file id, a JWT's ``sub``)."""
    return _USER_ID.fullmatch(text) is not None


@dataclass(frozen=True)
class Limits:
    """One user's limits; None is no limit."""

    sends_per_minute: int | None = None
    turns_at_once: int | None = None
    conversations: int | None = None
    tokens_per_day: int | None = None

    def over(self, defaults: Limits) -> Limits:
        """These limits, each unset one taken from ``defaults``."""
        return Limits(**{
            f.name: getattr(defaults, f.name) if getattr(self, f.name) is None
            else getattr(self, f.name)
            for f in fields(self)
        })


@dataclass(frozen=True)
class Principal:
    """Who a request is."""

    user: str
    role: Role
    limits: Limits = field(default_factory=Limits)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


#: every ``AGENTIK_TOKENS`` token, and every request when no auth is configured: one admin, no
#: limits (what such deployments had before users)
SHARED_ADMIN = Principal(user="admin", role="admin")


def token_sha256(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class Users:
    """The users file, read: each user's principal, and the digests of their tokens."""

    principals: dict[str, Principal] = field(default_factory=dict)
    #: (digest, user id) for every token of every user
    digests: tuple[tuple[bytes, str], ...] = ()
    defaults: Limits = field(default_factory=Limits)

    def by_token(self, token: str) -> Principal | None:
        """The user whose token this is, None for none. Every digest is compared, in constant
        time each, so the time taken does not say which (or how much of one) matched."""
        given = token_sha256(token)
        found: str | None = None
        for digest, user in self.digests:
            if hmac.compare_digest(given, digest):
                found = user
        return None if found is None else self.principals[found]

    def limits_of(self, user: str) -> Limits:
        """A user's limits: their entry's (over the defaults), else the defaults."""
        principal = self.principals.get(user)
        return self.defaults if principal is None else principal.limits


class UsersFileError(ConfigError):
    """The users file has mistakes: ``problems`` holds one line for each."""

    def __init__(self, variable: str, problems: list[str]) -> None:
        super().__init__(variable, "; ".join(problems))
        self.problems = problems


def _limits(table: dict[str, object], where: str, problems: list[str]) -> Limits:
    values: dict[str, int] = {}
    for name in LIMIT_FIELDS:
        if name not in table:
            continue
        value = table[name]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            problems.append(f"{where}.{name} must be a positive integer, got {value!r}")
        else:
            values[name] = value
    return Limits(**values)


def _user(
    user: str, table: object, defaults: Limits, problems: list[str]
) -> tuple[Principal, list[bytes]] | None:
    where = f"users.{user}"
    if not isinstance(table, dict):
        problems.append(f"{where} must be a table")
        return None
    if not is_user_id(user):
        problems.append(f"{where}: a user id is 1-200 characters without control characters")
    for key in table:
        if key not in (*LIMIT_FIELDS, "role", "token_sha256"):
            problems.append(f"{where}: unknown field {key!r}")
    role = table.get("role", "user")
    if role not in ROLES:
        problems.append(f"{where}.role must be \"user\" or \"admin\", got {role!r}")
        role = "user"
    hashes = table.get("token_sha256", [])
    if isinstance(hashes, str):
        hashes = [hashes]
    digests: list[bytes] = []
    if not isinstance(hashes, list) or not hashes:
        problems.append(f"{where}.token_sha256 must list the SHA-256 hex digest of each token")
        hashes = []
    for item in hashes:
        if isinstance(item, str) and _SHA256_HEX.fullmatch(item):
            digests.append(bytes.fromhex(item))
        else:
            problems.append(f"{where}.token_sha256: {item!r} is not 64 hex digits")
    limits = _limits(table, where, problems).over(defaults)
    return Principal(user=user, role=role, limits=limits), digests


def parse_users(text: str, variable: str = "AGENTIK_USERS") -> Users:
    """The users file's TOML text, read. Raises :class:`UsersFileError` listing every mistake
    (``variable`` names the setting in each)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsersFileError(variable, [f"not valid TOML: {exc}"]) from None
    problems: list[str] = []
    for key in data:
        if key not in ("users", "defaults"):
            problems.append(f"unknown table {key!r} (expected [users.<id>] and [defaults])")
    raw_defaults = data.get("defaults", {})
    if not isinstance(raw_defaults, dict):
        problems.append("defaults must be a table")
        raw_defaults = {}
    for key in raw_defaults:
        if key not in LIMIT_FIELDS:
            problems.append(f"defaults: unknown field {key!r}")
    defaults = _limits(raw_defaults, "defaults", problems)
    raw_users = data.get("users", {})
    if not isinstance(raw_users, dict):
        problems.append("users must be a table of [users.<id>] tables")
        raw_users = {}
    principals: dict[str, Principal] = {}
    digests: list[tuple[bytes, str]] = []
    owner_of: dict[bytes, str] = {}
    for user, table in raw_users.items():
        entry = _user(user, table, defaults, problems)
        if entry is None:
            continue
        principal, own = entry
        principals[user] = principal
        for digest in own:
            other = owner_of.setdefault(digest, user)
            if other != user:
                problems.append(f"users.{user}: a token of theirs is also {other}'s")
            digests.append((digest, user))
    if problems:
        raise UsersFileError(variable, problems)
    return Users(principals=principals, digests=tuple(digests), defaults=defaults)


def load_users(path: str, variable: str = "AGENTIK_USERS") -> Users:
    """Read and parse the users file. Raises UsersFileError (one line per mistake)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsersFileError(variable, [f"cannot read {path}: {exc}"]) from None
    return parse_users(text, variable)
