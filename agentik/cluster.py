"""Commands for a conversation owned by another node (PostgreSQL cluster, docs/SCALEOUT.md) go to the
owner: the node that received them forwards them over HTTP to the base URL the owner advertises
(``AGENTIK_NODE_URL``), with the caller's own bearer token (:data:`caller_token`, set by the front
door that authenticated the request), else this cluster's first ``AGENTIK_TOKENS`` token. The owner
answers as if the client had called it, errors included (404, 409, 429, ... come back as the same
AgentikError). Forwarding the caller's token is what lets a cluster whose users come from a users
file or JWTs run without a shared token: every node checks the same token the same way.

:class:`Peers` keeps one client (one connection pool) per owner address for the runtime's life,
so a forwarded command reuses a kept-alive connection instead of opening one per call; the
runtime closes them at shutdown (``Peers.aclose``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from contextvars import ContextVar
from typing import TYPE_CHECKING, TypeVar

import httpx2

from agentik import metrics
from agentik.errors import AgentikConnectionError, NotOwnerError, RuntimeClosedError

if TYPE_CHECKING:
    from agentik.client.http import AgentikAgent
    from agentik.config import Config

T = TypeVar("T")

#: the bearer token of the request this task serves (None: no token, or not a request). A task
#: the request spawns inherits it, so a WebSocket's commands carry the socket's token.
caller_token: ContextVar[str | None] = ContextVar("agentik_caller_token", default=None)


class CallerAuth(httpx2.Auth):
    """Each forwarded request's ``Authorization``: the caller's token when there is one (the owner
    then sees the same principal, limits and idempotency scope), else ``shared``."""

    def __init__(self, shared: str | None) -> None:
        self.shared = shared

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        token = caller_token.get() or self.shared
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


class Peers:
    """The clients of the other nodes this node forwarded to, by base URL."""

    def __init__(self, config: Config,
                 factory: Callable[[str, str, str | None], AgentikAgent] | None = None) -> None:
        self.config = config
        self._factory = factory
        self._clients: dict[str, AgentikAgent] = {}
        self._closed = False

    def client(self, addr: str) -> AgentikAgent:
        """The one client for the node at ``addr`` (made on first use)."""
        if self._closed:
            raise RuntimeClosedError("the runtime is closed")
        owner = self._clients.get(addr)
        if owner is None:
            token = self.config.tokens[0] if self.config.tokens else None
            name = f"node:{self.config.node_id or 'peer'}"
            if self._factory is not None:
                owner = self._factory(name, addr, token)
            else:
                from agentik.client.http import AgentikAgent

                owner = AgentikAgent(name, addr, auth=CallerAuth(token))
            self._clients[addr] = owner
        return owner

    async def forward(self, exc: NotOwnerError, call: Callable[[AgentikAgent], Awaitable[T]]) -> T:
        """Run ``call`` against the owner node; re-raises ``exc`` (503) when it advertises no
        URL, and answers 503 too when the owner does not answer."""
        if not exc.addr:
            raise exc
        owner = self.client(exc.addr)
        metrics.CLUSTER_FORWARDED.inc()
        try:
            return await call(owner)
        except AgentikConnectionError as err:
            # The owner died or is cut off: its lease runs out and a live node takes the
            # conversation over, so this is "not here, try again" (503), not a server fault (500).
            raise NotOwnerError(
                f"the node that owns this conversation does not answer ({err}); try again once "
                "another node has taken it over", node_id=exc.node_id, addr=exc.addr) from err

    async def aclose(self) -> None:
        """Close every client (idempotent); forwarding is refused afterwards."""
        self._closed = True
        clients, self._clients = list(self._clients.values()), {}
        for owner in clients:
            await owner.close()
