"""Commands for a conversation owned by another node (PostgreSQL cluster, SPEC §12) go to the
owner: the node that received them forwards them over HTTP to the base URL the owner advertises
(``AGENTIK_NODE_URL``), with this cluster's first bearer token. The owner answers as if the
client had called it, errors included (404, 409, 429, ... come back as the same AgentikError)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from agentik.errors import NotOwnerError

if TYPE_CHECKING:
    from agentik.client.http import AgentikAgent
    from agentik.config import Config

T = TypeVar("T")


async def forward(
    config: Config, exc: NotOwnerError, call: Callable[[AgentikAgent], Awaitable[T]]
) -> T:
    """Run ``call`` against the owner node; re-raises ``exc`` (503) when it advertises no URL."""
    if not exc.addr:
        raise exc
    from agentik.client.http import AgentikAgent

    token = config.tokens[0] if config.tokens else None
    async with AgentikAgent(f"node:{config.node_id or 'peer'}", exc.addr, token) as owner:
        return await call(owner)
