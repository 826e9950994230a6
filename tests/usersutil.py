"""Users for tests: a users file with two users and an admin, their tokens, and clients that
carry them."""

from __future__ import annotations

import hashlib
from pathlib import Path

TOKENS = {"alice": "alice-token", "bob": "bob-token", "root": "root-token"}
SHARED = "shared-admin-token"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def write_users(path: Path, *, defaults: str = "", extra: str = "") -> Path:
    """alice and bob are users, root an admin; ``defaults`` / ``extra`` are more TOML lines
    (``extra`` goes into alice's table)."""
    path.write_text(f"""
[defaults]
{defaults}

[users.alice]
token_sha256 = ["{sha(TOKENS["alice"])}"]
{extra}

[users.bob]
role = "user"
token_sha256 = ["{sha(TOKENS["bob"])}"]

[users.root]
role = "admin"
token_sha256 = ["{sha(TOKENS["root"])}"]
""")
    return path


def bearer(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS.get(user, user)}"}
