"""Test key pairs and tokens for JWT auth: real RSA / EC / Ed25519 keys (joserfc makes them), a
JWKS file of their public halves, tokens signed with their private halves."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

from joserfc import jwt
from joserfc.jwk import ECKey, KeySet, OKPKey, RSAKey

ISSUER = "https://issuer.test"
AUDIENCE = "agentik-test"


class Keys:
    def __init__(self) -> None:
        self.rsa = RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})
        self.ec = ECKey.generate_key("P-256", parameters={"kid": "ec-1"})
        self.ed = OKPKey.generate_key("Ed25519", parameters={"kid": "ed-1"})
        #: signs well but is in no JWKS
        self.stranger = RSAKey.generate_key(2048, parameters={"kid": "rsa-unknown"})

    def jwks(self, *, with_stranger: bool = False) -> dict[str, Any]:
        keys = [self.rsa, self.ec, self.ed] + ([self.stranger] if with_stranger else [])
        return KeySet(keys).as_dict(private=False)  # type: ignore[arg-type]

    def write_jwks(self, path: Path, *, with_stranger: bool = False) -> Path:
        path.write_text(json.dumps(self.jwks(with_stranger=with_stranger)))
        return path

    def token(
        self, sub: str = "alice", *, alg: str = "RS256", key: Any = None, lifetime: float = 300,
        **claims: Any,
    ) -> str:
        now = int(time.time())
        body: dict[str, Any] = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now,
                                "exp": now + int(lifetime)}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}  # exp=None: no exp at all
        key = key or {"RS256": self.rsa, "ES256": self.ec, "EdDSA": self.ed, "Ed25519": self.ed}[alg]
        return jwt.encode({"alg": alg, "kid": key.kid}, body, key, algorithms=[alg])

    def hs256_with_public_key(self, sub: str = "mallory") -> str:
        """The classic confusion: HS256 whose secret is the RSA public key anyone can read.
        Signed with the standard library's HMAC: joserfc 1.8 refuses a public key as an oct key
        (rightly), so it can no longer make the attacker's token."""
        public_pem = self.rsa.as_pem(private=False)
        now = int(time.time())
        signing_input = _b64({"alg": "HS256", "kid": "rsa-1"}) + "." + _b64(
            {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": now + 300, "role": "admin"})
        mac = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
        return signing_input + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def _b64(obj: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def alg_none(sub: str = "mallory") -> str:
    now = int(time.time())
    return _b64({"alg": "none", "typ": "JWT"}) + "." + _b64(
        {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": now + 300, "role": "admin"}) + "."
