"""``agent.webhooks`` over HTTP (docs/WEBHOOKS.md, docs/CLIENT.md): the webhook admin routes
with the in-process agent's names and answers. Admins only: a user's token gets ForbiddenError."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

from agentik.client.streams import decode_answer
from agentik.webhook_types import (
    CreateWebhookBody,
    Webhook,
    WebhookCreated,
    WebhookDeliveries,
    WebhookDelivery,
    WebhookList,
)
from agentik.wire import encode

if TYPE_CHECKING:
    from agentik.client.http import AgentikAgent


def _path(webhook_id: str) -> str:
    return "/agentik/webhooks/" + urllib.parse.quote(webhook_id, safe="")


class HttpWebhooks:
    """``POST/GET/DELETE /agentik/webhooks…``."""

    def __init__(self, agent: AgentikAgent) -> None:
        self._agent = agent

    async def create(self, url: str, events: list[str], *, agent: str | None = None,
                     conversation_id: str | None = None) -> WebhookCreated:
        """A new subscription with its secret (no other answer shows it). Raises
        InvalidInputError (an unknown event type or agent, a URL that is not http(s))."""
        body = encode(CreateWebhookBody(url=url, events=events, agent=agent,
                                        conversation_id=conversation_id))
        raw = await self._agent._request("POST", "/agentik/webhooks", content=body)
        return decode_answer(raw, WebhookCreated)

    async def all(self) -> list[Webhook]:
        raw = await self._agent._request("GET", "/agentik/webhooks")
        return decode_answer(raw, WebhookList).webhooks

    async def get(self, webhook_id: str) -> Webhook:
        """Raises NotFoundError."""
        return decode_answer(await self._agent._request("GET", _path(webhook_id)), Webhook)

    async def delete(self, webhook_id: str) -> None:
        """Raises NotFoundError, ConflictError (a subscription of the settings file)."""
        await self._agent._request("DELETE", _path(webhook_id))

    async def deliveries_of(self, webhook_id: str, limit: int = 50) -> list[WebhookDelivery]:
        """Its newest delivery log lines, newest first. Raises NotFoundError."""
        raw = await self._agent._request("GET", _path(webhook_id) + "/deliveries",
                                         params={"limit": limit})
        return decode_answer(raw, WebhookDeliveries).deliveries
