"""The webhook admin routes (docs/WEBHOOKS.md): ``/agentik/webhooks`` to subscribe, list and
delete, ``/agentik/webhooks/{id}/deliveries`` for a subscription's delivery log. Admins only
(``auth.ADMIN_ENDPOINTS``); every call is ``agent.webhooks``' and answers its types."""

from __future__ import annotations

from quart import Blueprint, Response, request

from agentik.errors import InvalidInputError
from agentik.web._state import json_response, state
from agentik.web.http import json_body
from agentik.webhook_types import CreateWebhookBody, WebhookDeliveries, WebhookList

bp = Blueprint("agentik_webhooks", __name__)


@bp.post("/agentik/webhooks")
async def create_webhook() -> Response:
    body = await json_body(CreateWebhookBody)
    made = await state().require_agent().webhooks.create(
        body.url, body.events, agent=body.agent, conversation_id=body.conversation_id)
    return json_response(made, 201)


@bp.get("/agentik/webhooks")
async def list_webhooks() -> Response:
    return json_response(WebhookList(webhooks=await state().require_agent().webhooks.all()))


@bp.get("/agentik/webhooks/<webhook_id>")
async def get_webhook(webhook_id: str) -> Response:
    return json_response(await state().require_agent().webhooks.get(webhook_id))


@bp.delete("/agentik/webhooks/<webhook_id>")
async def delete_webhook(webhook_id: str) -> Response:
    await state().require_agent().webhooks.delete(webhook_id)
    return Response(b"", status=204)


@bp.get("/agentik/webhooks/<webhook_id>/deliveries")
async def webhook_deliveries(webhook_id: str) -> Response:
    raw = request.args.get("limit", "50")
    if not raw.isdigit() or len(raw) > 4:
        raise InvalidInputError("query parameter `limit` must be an integer 1..200")
    lines = await state().require_agent().webhooks.deliveries_of(webhook_id, int(raw))
    return json_response(WebhookDeliveries(deliveries=lines))
