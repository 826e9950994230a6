"""JWT bearer tokens (OIDC) as principals (docs/USERS.md), verified by joserfc, never by hand.

- The keys: ``AGENTIK_JWT_JWKS``, a JWKS file or an ``http(s)://`` URL, read once and cached. A
  token whose ``kid`` is not in the cached set makes one refresh (URLs fetched with httpx2, files
  read again), at most one every :data:`MIN_REFRESH` seconds, so unknown kids cannot make us
  hammer the issuer; a kid still unknown is a 401.
- Signatures: RS256, ES256 and EdDSA only (:data:`ALGORITHMS`). ``alg: none`` and HS256 (whose
  "secret" would be the public key anyone can read) are refused by the algorithm list itself.
- Claims: ``iss`` and ``aud`` must equal the configured ones (when configured), ``exp`` is
  required, ``exp``/``nbf``/``iat`` get :data:`LEEWAY` seconds for clock skew, ``sub`` is the
  user id, the configured role claim (``AGENTIK_JWT_ROLE_CLAIM``, a dotted path; ``role`` unless
  set) gives ``admin`` when it is ``"admin"`` or a list holding it; anything else is a user.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import trio
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from agentik.errors import ConfigError, UnauthorizedError
from agentik.users import Limits, Principal, Role, Users, is_user_id

#: the signature algorithms accepted ("Ed25519" is joserfc's newer name for EdDSA on that curve)
ALGORITHMS = ["RS256", "ES256", "EdDSA", "Ed25519"]
#: seconds of clock skew allowed on exp / nbf / iat
LEEWAY = 30
#: seconds between two refreshes of the key set for unknown kids
MIN_REFRESH = 30.0
#: seconds a JWKS URL may take to answer
FETCH_TIMEOUT = 10.0
VARIABLE = "AGENTIK_JWT_JWKS"


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def parse_key_set(raw: bytes | str, source: str) -> KeySet:
    """A JWKS document's keys. Raises ConfigError naming the setting."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
            raise ValueError('a JWKS is a JSON object with a "keys" list')
        keys = KeySet.import_key_set(cast(Any, data))
    except (ValueError, JoseError, TypeError, KeyError) as exc:
        raise ConfigError(VARIABLE, f"{source}: not a usable JWKS: {exc}") from None
    return keys


async def fetch_key_set(source: str) -> KeySet:
    """Read the key set from its file or URL. Raises ConfigError."""
    if is_url(source):
        import httpx2

        try:
            async with httpx2.AsyncClient(timeout=FETCH_TIMEOUT) as client:
                answer = await client.get(source)
                answer.raise_for_status()
                raw: bytes = answer.content
        except httpx2.HTTPError as exc:
            raise ConfigError(VARIABLE, f"{source}: cannot fetch the JWKS: {exc}") from None
    else:
        try:
            raw = await trio.Path(source).read_bytes()
        except OSError as exc:
            raise ConfigError(VARIABLE, f"cannot read {source}: {exc}") from None
    return parse_key_set(raw, source)


def _claim(claims: dict[str, Any], path: str) -> object:
    value: object = claims
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def role_of(claims: dict[str, Any], role_claim: str) -> Role:
    value = _claim(claims, role_claim)
    if value == "admin" or (isinstance(value, list) and "admin" in value):
        return "admin"
    return "user"


class JwtVerifier:
    """Verifies bearer JWTs against a cached key set; the principal of a valid one."""

    def __init__(
        self,
        source: str,
        *,
        issuer: str | None,
        audience: str | None,
        role_claim: str = "role",
        fetch: Callable[[str], Awaitable[KeySet]] = fetch_key_set,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.issuer = issuer
        self.audience = audience
        self.role_claim = role_claim
        self._fetch = fetch
        self._clock = clock
        self._keys: KeySet | None = None
        self._fetched_at: float | None = None
        self._lock = trio.Lock()

    async def load(self) -> KeySet:
        """Read the key set now (start-up, ``agentik check``). Raises ConfigError."""
        async with self._lock:
            self._keys = await self._fetch(self.source)
            self._fetched_at = self._clock()
            return self._keys

    async def _keys_for(self, kid: str | None) -> KeySet:
        keys = self._keys if self._keys is not None else await self.load()
        if kid is None or any(key.kid == kid for key in keys.keys):
            return keys
        async with self._lock:
            due = self._fetched_at is None or self._clock() - self._fetched_at >= MIN_REFRESH
            if due and self._keys is keys:
                try:
                    self._keys = await self._fetch(self.source)
                except ConfigError:
                    pass  # keep the keys we have; this token's kid stays unknown
                self._fetched_at = self._clock()
            return self._keys if self._keys is not None else keys

    def _registry(self) -> jwt.JWTClaimsRegistry:
        options: dict[str, Any] = {"exp": {"essential": True}, "sub": {"essential": True}}
        if self.issuer is not None:
            options["iss"] = {"essential": True, "value": self.issuer}
        if self.audience is not None:
            options["aud"] = {"essential": True, "value": self.audience}
        return jwt.JWTClaimsRegistry(leeway=LEEWAY, **options)

    async def principal(self, token: str, users: Users | None) -> Principal:
        """The principal of a valid token. Raises UnauthorizedError (never says which check
        failed beyond a short reason; the token is never echoed)."""
        try:
            header = jws.extract_compact(token.encode()).protected
        except (JoseError, ValueError, UnicodeError):
            raise UnauthorizedError("invalid token") from None
        kid = header.get("kid")
        if header.get("alg") not in ALGORITHMS:
            raise UnauthorizedError("invalid token: signature algorithm not accepted")
        keys = await self._keys_for(kid if isinstance(kid, str) else None)
        if isinstance(kid, str) and not any(key.kid == kid for key in keys.keys):
            raise UnauthorizedError("invalid token: unknown key id")
        try:
            decoded = jwt.decode(token, keys, algorithms=ALGORITHMS)
            self._registry().validate(decoded.claims)
        except (JoseError, ValueError, TypeError) as exc:
            raise UnauthorizedError(f"invalid token: {type(exc).__name__}") from None
        sub = decoded.claims.get("sub")
        if not isinstance(sub, str) or not is_user_id(sub):
            raise UnauthorizedError("invalid token: its subject is no user id")
        limits = users.limits_of(sub) if users is not None else Limits()
        return Principal(user=sub, role=role_of(decoded.claims, self.role_claim), limits=limits)
