"""The webhook admin routes' bodies (docs/WEBHOOKS.md, ``/agentik/webhooks``): msgspec wire types,
importable without the server (a leaf, like :mod:`agentik.protocol`)."""

from __future__ import annotations

from agentik.wire import Wire


class CreateWebhookBody(Wire, frozen=True, kw_only=True):
    """``POST /agentik/webhooks``: where to, which event types, and optionally only one agent's
    or one conversation's events."""

    url: str
    events: list[str]
    agent: str | None = None
    conversation_id: str | None = None


class Webhook(Wire, frozen=True, kw_only=True):
    """A subscription and where its deliveries stand: every event up to ``delivered_through``
    (an outbox offset) is done; the next one failed ``attempts`` times, since ``failing_since``,
    and is tried again at ``next_attempt_at`` (ISO 8601). ``source``: ``api`` (these routes)
    or ``file`` (AGENTIK_WEBHOOKS)."""

    id: str
    url: str
    events: list[str]
    agent: str | None = None
    conversation_id: str | None = None
    source: str
    created_at: str
    delivered_through: int
    attempts: int = 0
    failing_since: str | None = None
    next_attempt_at: str | None = None


class WebhookCreated(Webhook, frozen=True, kw_only=True):
    """``POST /agentik/webhooks``'s answer (201): the subscription with its signing secret, the
    only answer that shows it."""

    secret: str


class WebhookList(Wire, frozen=True, kw_only=True):
    webhooks: list[Webhook]


class WebhookDelivery(Wire, frozen=True, kw_only=True):
    """One line of a delivery log: the event (``offset``, its ``webhook-id`` being
    ``EPOCH:OFFSET``; ``type``), the attempt and its ``outcome`` (delivered, failed: retried,
    gave_up, lost: trimmed from the outbox before it was sent), the receiver's ``status``."""

    offset: int
    type: str
    attempt: int
    outcome: str
    status: int | None = None
    error: str | None = None
    at: str


class WebhookDeliveries(Wire, frozen=True, kw_only=True):
    """``GET /agentik/webhooks/{id}/deliveries``: the newest lines first."""

    deliveries: list[WebhookDelivery]
