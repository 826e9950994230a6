"""The webhook admin routes (docs/WEBHOOKS.md): ``/agentik/webhooks`` to subscribe, list and
delete, ``/agentik/webhooks/{id}/deliveries`` for a subscription's delivery log. Admins only
(``auth.ADMIN_ENDPOINTS``); every call goes through ``agent.webhooks``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import Blueprint, Response, request

from agentik.errors import InvalidInputError
from agentik.web._state import json_response, state
from agentik.web.http import json_body
from agentik.webhook_types import (
    CreateWebhookBody,
    Webhook,
    WebhookCreated,
    WebhookDeliveries,
    WebhookDelivery,
    WebhookList,
)
from agentik.webhooks import timestamp

if TYPE_CHECKING:  # rows as agent.webhooks hands them over (the web reads no storage)
    from agentik.storage.types import DeliveryRow, WebhookRow

bp = Blueprint("agentik_webhooks", __name__)


def _webhook(row: WebhookRow) -> Webhook:
    spec = row.spec
    return Webhook(
        id=spec.id, url=spec.url, events=list(spec.events), agent=spec.agent,
        conversation_id=spec.conversation_id, source=spec.source,
        created_at=timestamp(row.created_at), delivered_through=row.after,
        attempts=row.attempts,
        failing_since=None if row.failing_since is None else timestamp(row.failing_since),
        next_attempt_at=timestamp(row.next_at) if row.attempts else None)


def _delivery(row: DeliveryRow) -> WebhookDelivery:
    a = row.attempt
    return WebhookDelivery(offset=a.offset, type=a.type, attempt=a.attempt, outcome=a.outcome,
                           status=a.status, error=a.error, at=timestamp(row.at))


@bp.post("/agentik/webhooks")
async def create_webhook() -> Response:
    body = await json_body(CreateWebhookBody)
    row = await state().require_agent().webhooks.create(
        body.url, body.events, agent=body.agent, conversation_id=body.conversation_id)
    shown = _webhook(row)
    return json_response(WebhookCreated(**{f: getattr(shown, f) for f in shown.__struct_fields__},
                                        secret=row.spec.secret), 201)


@bp.get("/agentik/webhooks")
async def list_webhooks() -> Response:
    rows = await state().require_agent().webhooks.all()
    return json_response(WebhookList(webhooks=[_webhook(r) for r in rows]))


@bp.get("/agentik/webhooks/<webhook_id>")
async def get_webhook(webhook_id: str) -> Response:
    return json_response(_webhook(await state().require_agent().webhooks.get(webhook_id)))


@bp.delete("/agentik/webhooks/<webhook_id>")
async def delete_webhook(webhook_id: str) -> Response:
    await state().require_agent().webhooks.delete(webhook_id)
    return Response(b"", status=204)


@bp.get("/agentik/webhooks/<webhook_id>/deliveries")
async def webhook_deliveries(webhook_id: str) -> Response:
    raw = request.args.get("limit", "50")
    if not raw.isdigit() or not 1 <= int(raw) <= 200:
        raise InvalidInputError("query parameter `limit` must be an integer 1..200")
    rows = await state().require_agent().webhooks.deliveries_of(webhook_id, int(raw))
    return json_response(WebhookDeliveries(deliveries=[_delivery(r) for r in rows]))
