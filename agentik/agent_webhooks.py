"""``agent.webhooks`` (docs/WEBHOOKS.md): webhook subscriptions and A2A push configs made,
listed and deleted through the Agent API, the settings file's subscriptions put in place at
start-up, and the deliveries (``webhook_delivery.Deliveries``) told of each change. Every front
door reaches them here: the admin routes (``web/webhooks.py``) and the A2A push methods."""

from __future__ import annotations

import logging
import socket
import urllib.parse

import msgspec
import trio

from agentik import webhooks
from agentik.config import Config
from agentik.errors import ConfigError, ConflictError, InvalidInputError, NotFoundError
from agentik.ids import new_id
from agentik.storage import ops
from agentik.storage.actor import Storage
from agentik.storage.types import DeliveryRow, WebhookRow
from agentik.webhook_delivery import Deliveries
from agentik.webhook_types import Webhook, WebhookCreated, WebhookDelivery
from agentik.webhooks import Push

log = logging.getLogger(__name__)

#: most delivery log lines one read returns
MAX_DELIVERIES = 200


def push_id(task_id: str, config_id: str) -> str:
    """The subscription id of an A2A push config (its id is the task's own)."""
    return f"a2a/{task_id}/{config_id}"


class Webhooks:
    """The subscriptions of one runtime (``agent.webhooks``)."""

    def __init__(self, storage: Storage, config: Config, agents: frozenset[str]) -> None:
        self._storage = storage
        self._config = config
        self._agents = agents
        self.deliveries = Deliveries(storage, config)

    async def start(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """The settings file's subscriptions in place (new ones start at the head), those it no
        longer names removed, then the deliveries run until cancelled. Raises ConfigError."""
        specs = await self._file()
        head = self._storage.hub.head
        for spec in specs:
            await self._storage.write(ops.PutWebhook(spec=spec, after=head, replace=True))
        named = {spec.id for spec in specs}
        for row in await self._storage.reader.webhooks():
            if row.spec.source == "file" and row.spec.id not in named:
                await self._storage.write(ops.DeleteWebhook(webhook_id=row.spec.id))
        await self.deliveries.run(task_status=task_status)

    async def _file(self) -> list[ops.WebhookSpec]:
        path = self._config.webhooks_file
        if not path:
            return []
        try:
            text = await trio.Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("AGENTIK_WEBHOOKS", f"cannot read {path!r}: {exc}") from None
        try:
            return webhooks.parse_file(text, dict.fromkeys(self._agents))
        except webhooks.WebhooksFileError as exc:
            raise ConfigError("AGENTIK_WEBHOOKS", f"{path}: {exc}") from None

    # --- the admin routes' subscriptions ----------------------------------------------------------

    async def create(self, url: str, events: object, *, agent: str | None = None,
                     conversation_id: str | None = None) -> WebhookCreated:
        """A new subscription for the events stored from now on, with its secret (no other
        answer shows it). Raises InvalidInputError."""
        if agent is not None and agent not in self._agents:
            raise InvalidInputError(f"agent {agent!r} is not one of the server's agents")
        spec = ops.WebhookSpec(id=new_id(), url=webhooks.check_url(url),
                               events=webhooks.check_events(events), agent=agent,
                               conversation_id=conversation_id, secret=webhooks.new_secret())
        await self._storage.write(ops.PutWebhook(spec=spec, after=self._storage.hub.head))
        self.deliveries.changed()
        shown = webhook_of(await self._get(spec.id))
        return WebhookCreated(**msgspec.structs.asdict(shown), secret=spec.secret)

    async def all(self) -> list[Webhook]:
        """The admin routes' and the settings file's subscriptions (not A2A push configs)."""
        return [webhook_of(r) for r in await self._storage.reader.webhooks()
                if r.spec.source != "a2a"]

    async def get(self, webhook_id: str) -> Webhook:
        """Raises NotFoundError."""
        return webhook_of(await self._admin_row(webhook_id))

    async def _admin_row(self, webhook_id: str) -> WebhookRow:
        row = await self._storage.reader.get_webhook(webhook_id)
        if row is None or row.spec.source == "a2a":
            raise NotFoundError(f"webhook {webhook_id!r} not found")
        return row

    async def _get(self, webhook_id: str) -> WebhookRow:
        row = await self._storage.reader.get_webhook(webhook_id)
        if row is None:
            raise NotFoundError(f"webhook {webhook_id!r} not found")
        return row

    async def delete(self, webhook_id: str) -> None:
        """Raises NotFoundError, ConflictError for one the settings file makes."""
        row = await self._admin_row(webhook_id)
        if row.spec.source == "file":
            raise ConflictError(f"webhook {webhook_id!r} is made by the settings file "
                                "(AGENTIK_WEBHOOKS): remove it there")
        await self._storage.write(ops.DeleteWebhook(webhook_id=webhook_id))
        self.deliveries.changed()

    async def deliveries_of(self, webhook_id: str, limit: int = 50) -> list[WebhookDelivery]:
        """The subscription's newest delivery log lines (``limit``: 1..200), newest first.
        Raises NotFoundError, InvalidInputError."""
        if not 1 <= limit <= MAX_DELIVERIES:
            raise InvalidInputError(f"limit must be an integer 1..{MAX_DELIVERIES}")
        await self._admin_row(webhook_id)
        rows = await self._storage.reader.webhook_deliveries(webhook_id, limit)
        return [delivery_of(r) for r in rows]

    # --- A2A push configs (the A2A facade checked the task is the caller's) ---------------------

    async def put_push(self, task_id: str, config_id: str, url: str, push: Push,
                       config: bytes) -> WebhookRow:
        """The task's push config ``config_id`` (``config``: its JSON as it is answered), new or
        replaced; its task's changes from now on go to ``url``. Raises InvalidInputError for a
        URL it may not name."""
        await self.check_push_url(webhooks.check_url(url))
        spec = ops.WebhookSpec(
            id=push_id(task_id, config_id), url=url, events=("task.updated",), task_id=task_id,
            secret=webhooks.new_secret(), source="a2a", config=webhooks.join_push(push, config))
        await self._storage.write(ops.PutWebhook(spec=spec, after=self._storage.hub.head,
                                                 replace=True))
        self.deliveries.changed()
        return await self._get(spec.id)

    async def pushes(self, task_id: str) -> list[WebhookRow]:
        return await self._storage.reader.webhooks(task_id)

    async def get_push(self, task_id: str, config_id: str) -> WebhookRow | None:
        return await self._storage.reader.get_webhook(push_id(task_id, config_id))

    async def delete_push(self, task_id: str, config_id: str) -> bool:
        deleted: bool = await self._storage.write(
            ops.DeleteWebhook(webhook_id=push_id(task_id, config_id)))
        self.deliveries.changed()
        return deleted

    async def check_push_url(self, url: str) -> None:
        """A caller's push URL may not reach loopback, private or link-local addresses (unless
        AGENTIK_PUSH_ALLOW_PRIVATE=1); a name is resolved to tell. Raises InvalidInputError."""
        if self._config.push_allow_private:
            return
        host = webhooks.literal_host(url)
        if host is not None:
            addresses = [host]
        else:
            name = urllib.parse.urlsplit(url).hostname or ""
            try:
                found = await trio.to_thread.run_sync(
                    lambda: socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP))
            except OSError:
                raise InvalidInputError(f"push URL host {name!r} cannot be resolved") from None
            addresses = [str(info[4][0]) for info in found]
        if any(webhooks.private_address(a) for a in addresses):
            raise InvalidInputError("push URL must not name a loopback, private or link-local "
                                    "address")


def webhook_of(row: WebhookRow) -> Webhook:
    """A subscription as the API shows it (no secret)."""
    spec = row.spec
    return Webhook(
        id=spec.id, url=spec.url, events=list(spec.events), agent=spec.agent,
        conversation_id=spec.conversation_id, source=spec.source,
        created_at=webhooks.timestamp(row.created_at), delivered_through=row.after,
        attempts=row.attempts,
        failing_since=(None if row.failing_since is None
                       else webhooks.timestamp(row.failing_since)),
        next_attempt_at=webhooks.timestamp(row.next_at) if row.attempts else None)


def delivery_of(row: DeliveryRow) -> WebhookDelivery:
    a = row.attempt
    return WebhookDelivery(offset=a.offset, type=a.type, attempt=a.attempt, outcome=a.outcome,
                           status=a.status, error=a.error, at=webhooks.timestamp(row.at))
