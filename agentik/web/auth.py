"""Bearer-token auth (docs/PROTOCOL.md §2): ``Authorization: Bearer <token>`` against ``config.tokens``;
``?access_token=`` only where browsers cannot set headers (SSE and WebSocket). With no tokens
configured every route is open. Tokens are compared with ``hmac.compare_digest`` and never logged
(``agentik.web.logsafe``).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from agentik.cluster import caller_token
from agentik.config import Config
from agentik.errors import ForbiddenError, UnauthorizedError
from agentik.users import SHARED_ADMIN, Principal, Users, load_users
from agentik.web.jwt_auth import JwtVerifier


def token_from(
    authorization: str | None, access_token: str | None, *, allow_query: bool
) -> str | None:
    """The bearer token of a request: the Authorization header, else (where allowed) the
    ``access_token`` query parameter."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    if allow_query:
        return access_token or None
    return None


def is_valid(token: str, tokens: Sequence[str]) -> bool:
    """Constant-time per candidate, and every candidate is compared (no early exit that would
    tell which token prefix matched)."""
    given = token.encode()
    ok = False
    for candidate in tokens:
        ok |= hmac.compare_digest(given, candidate.encode())
    return ok


@dataclass(frozen=True)
class Authenticator:
    """Who a token is: built once at start-up from the settings (:meth:`start`)."""

    tokens: Sequence[str] = ()
    users: Users | None = None
    jwt: JwtVerifier | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.tokens) or self.users is not None or self.jwt is not None

    @classmethod
    async def start(cls, config: Config) -> Authenticator:
        """Read the users file and the JWKS. Raises ConfigError (UsersFileError: one line per
        mistake in the file)."""
        users = load_users(config.users_file) if config.users_file else None
        verifier = None
        if config.jwt_jwks:
            verifier = JwtVerifier(
                config.jwt_jwks, issuer=config.jwt_issuer, audience=config.jwt_audience,
                role_claim=config.jwt_role_claim)
            await verifier.load()
        return cls(tokens=config.tokens, users=users, jwt=verifier)

    async def caller(
        self, authorization: str | None, access_token: str | None, *, allow_query: bool
    ) -> Principal:
        """:meth:`principal` for a request that may reach the Agent API: its token is also
        remembered for this task (and those it starts), so a command forwarded to another
        cluster node goes as this caller (``agentik.cluster.caller_token``)."""
        who = await self.principal(authorization, access_token, allow_query=allow_query)
        caller_token.set(token_from(authorization, access_token, allow_query=allow_query))
        return who

    async def principal(
        self, authorization: str | None, access_token: str | None, *, allow_query: bool
    ) -> Principal:
        """The request's principal. Raises UnauthorizedError."""
        if not self.enabled:
            return SHARED_ADMIN
        token = token_from(authorization, access_token, allow_query=allow_query)
        if token is None:
            where = "an Authorization: Bearer header" + (
                " or ?access_token=" if allow_query else "")
            raise UnauthorizedError(f"authentication required: send {where}")
        if self.users is not None:
            user = self.users.by_token(token)
            if user is not None:
                return user
        if is_valid(token, self.tokens):
            return SHARED_ADMIN
        if self.jwt is not None and token.count(".") == 2:
            return await self.jwt.principal(token, self.users)
        raise UnauthorizedError("invalid token")


def require_admin(principal: Principal, what: str) -> None:
    """Raises ForbiddenError unless ``principal`` is an admin."""
    if not principal.is_admin:
        raise ForbiddenError(f"{what} is for admins only")


#: endpoints only admins reach (a user gets 403): the process's metrics, the API description,
#: the tool servers' states (their errors name hosts and paths) and the webhooks (they see every
#: user's events)
ADMIN_ENDPOINTS = frozenset({
    "agentik_http.prometheus_metrics",
    "agentik_http.openapi",
    "agentik_http.tools",
    "agentik_webhooks.create_webhook",
    "agentik_webhooks.list_webhooks",
    "agentik_webhooks.get_webhook",
    "agentik_webhooks.delete_webhook",
    "agentik_webhooks.webhook_deliveries",
})

#: endpoints where browsers cannot set headers, so ``?access_token=`` is accepted (SSE, WebSocket)
QUERY_TOKEN_ENDPOINTS = frozenset({
    "agentik_sse.events",
    "agentik_sse.conversation_events",
    "agentik_sse.live",
    "agentik_ws.ws",
})

#: endpoints open to everyone even with auth on (besides /healthz): /readyz, the A2A agent card
#: (docs/A2A.md) and the web chat's files (they hold no secrets; the page asks for a token when the
#: API answers 401)
PUBLIC_ENDPOINTS = frozenset({
    "agentik_http.readyz",  # readiness, like /healthz: for load balancers and orchestrators
    "agentik_a2a.agent_card",
    "agentik_a2a.one_agent_card",  # each agent's card (docs/AGENTS.md)
    "agentik_ui.index",
    "agentik_ui.ui",
    "agentik_ui.static_file",
})
