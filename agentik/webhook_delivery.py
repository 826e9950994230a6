"""Webhook deliveries (docs/WEBHOOKS.md): every subscription follows the durable outbox from its
own cursor, sends each event it wants, signed (Standard Webhooks; ``webhook-id`` is the event's
cursor), and stores its progress after each (``ops.WebhookProgress``), so a restart goes on
where it stopped: at least once, in cursor order, retried with backoff (1 s doubling up to
AGENTIK_WEBHOOK_MAX_BACKOFF) for AGENTIK_WEBHOOK_RETRY_FOR. What the event says and every rule
are in ``agentik/webhooks.py`` (pure); here the I/O: the outbox, the HTTP posts, the writes.

One task a subscription, in the node's own nursery, never in a send's path: a slow receiver
holds its own task only (its outbox subscriber falls back to reading the store when its buffer
fills, ``storage/hub.py``). In a PostgreSQL cluster one node delivers (``Storage.lead``: the
node holding the lock; another takes over when it goes).

A2A push notifications (docs/A2A.md) are subscriptions too (``source`` ``a2a``): the same loop,
a task's changes only, the A2A StreamResponse as the body and the caller's credentials.
"""

from __future__ import annotations

import logging
import time
from contextlib import aclosing
from datetime import UTC, datetime
from functools import partial

import httpx2
import msgspec
import standardwebhooks
import trio

from agentik import metrics, webhooks
from agentik.config import Config
from agentik.errors import OutboxGapError, RuntimeClosedError, StorageError
from agentik.storage import ops
from agentik.storage.actor import Storage
from agentik.storage.types import StoredEvent, WebhookRow
from agentik.wire import Created, Cursor, TaskUpdated

log = logging.getLogger(__name__)

#: seconds between two reads of the subscriptions (those made on other nodes of a cluster; this
#: node's own changes wake the loop at once)
RESCAN = 5.0
#: seconds between two stores of a cursor that moved past events nobody wanted
SAVE_SKIPPED = 5.0
#: seconds one delivery may take (connect, send, answer)
TIMEOUT = 10.0
#: seconds before a subscription's loop starts again after a storage failure
RESTART = 1.0
#: conversations whose agent is remembered (the agent filter), at most
AGENTS_KEPT = 10_000


class Deliveries:
    """The node's deliveries: :meth:`run` in the runtime's nursery; :meth:`changed` after a
    subscription is made or deleted here."""

    def __init__(self, storage: Storage, config: Config) -> None:
        self.storage = storage
        self.retry_for = config.webhook_retry_for
        self.max_backoff = config.webhook_max_backoff
        self._wake = trio.Event()
        #: subscription id -> when its current event first failed (the lag metric)
        self.failing: dict[str, float] = {}
        #: conversation id -> its agent (for the agent filter), from Created events and reads
        self._agents: dict[str, str] = {}
        #: this node delivers now (a cluster's one node: ``Storage.lead``)
        self.leading = False
        #: the subscriptions following the outbox now (not those with nothing left to send)
        self.active: set[str] = set()
        self._stopped = trio.Event()  # set (and replaced) when one stops following
        metrics.WEBHOOK_LAG.set_function(self._lag)

    def _lag(self) -> float:
        now = time.time()
        return max((now - since for since in self.failing.values()), default=0.0)

    def changed(self) -> None:
        self._wake.set()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver while this node leads (at once on SQLite), until cancelled."""
        async with httpx2.AsyncClient(timeout=TIMEOUT, follow_redirects=False,
                                      trust_env=False) as client:
            task_status.started()
            await self.storage.lead("webhooks", partial(self._lead, client))

    async def _lead(self, client: httpx2.AsyncClient) -> None:
        running: dict[str, trio.CancelScope] = {}
        self.leading = True
        try:
            await self._deliver_all(client, running)
        finally:
            self.leading = False

    async def _deliver_all(self, client: httpx2.AsyncClient,
                           running: dict[str, trio.CancelScope]) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                self._wake = trio.Event()
                try:
                    rows = await self.storage.reader.webhooks()
                except StorageError as exc:
                    log.warning("webhooks: cannot read the subscriptions: %s", exc)
                    rows = None
                if rows is not None:
                    ids = {row.spec.id for row in rows}
                    for gone in set(running) - ids:
                        running.pop(gone).cancel()
                        self.failing.pop(gone, None)
                    for row in rows:
                        if row.spec.id not in running:
                            scope = running[row.spec.id] = trio.CancelScope()
                            nursery.start_soon(self._supervise, client, row, scope)
                with trio.move_on_after(RESCAN):
                    await self._wake.wait()

    async def _supervise(self, client: httpx2.AsyncClient, row: WebhookRow,
                         scope: trio.CancelScope) -> None:
        """One subscription's loop, started again from its stored progress after a failure."""
        self.active.add(row.spec.id)
        with scope:
            try:
                await self._follow(client, row)
            finally:
                self.active.discard(row.spec.id)
                self._stopped.set()
                self._stopped = trio.Event()

    async def wait_stopped(self, webhook_id: str) -> None:
        """Until the subscription no longer follows the outbox."""
        while webhook_id in self.active:
            await self._stopped.wait()

    async def _follow(self, client: httpx2.AsyncClient, row: WebhookRow) -> None:
        while True:
            try:
                await _Subscription(self, client, row).run()
                return  # deleted, or nothing left to send
            except StorageError as exc:
                log.warning("webhook %s: storage failed, going on in %s s: %s",
                            row.spec.id, RESTART, exc)
            except RuntimeClosedError:
                return  # the runtime is stopping
            except Exception:  # a defect: this subscription stops a while, nothing else does
                log.exception("webhook %s: delivery failed; going on in %s s", row.spec.id,
                              RESTART)
            await trio.sleep(RESTART)
            found = await _read(self.storage, row.spec.id)
            if found is None:
                return
            row = found

    async def agent_of(self, common_cid: str | None) -> str | None:
        if common_cid is None:
            return None
        agent = self._agents.get(common_cid)
        if agent is None:
            record = await self.storage.reader.get_conversation(common_cid)
            if record is not None:
                agent = self._agents[common_cid] = record.agent
        return agent

    def saw(self, ev: StoredEvent) -> None:
        event = ev.event.event
        if isinstance(event, Created):
            if len(self._agents) > AGENTS_KEPT:  # a cache: what is gone is read again
                self._agents.clear()
            self._agents[event.conversation.id] = event.conversation.agent


async def _read(storage: Storage, webhook_id: str) -> WebhookRow | None:
    while True:
        try:
            return await storage.reader.get_webhook(webhook_id)
        except StorageError:
            await trio.sleep(RESTART)


class _Subscription:
    """One subscription's delivery: its cursor, the current event's attempts."""

    def __init__(self, owner: Deliveries, client: httpx2.AsyncClient, row: WebhookRow) -> None:
        self.owner, self.client, self.spec = owner, client, row.spec
        self.after, self.saved = row.after, row.after
        self.attempts, self.since = row.attempts, row.failing_since
        self.next_at = row.next_at
        self.signer = standardwebhooks.Webhook(row.spec.secret)
        self.push = (webhooks.split_push(row.spec.config)[0] if row.spec.source == "a2a"
                     else None)
        self.saved_at = trio.current_time()

    async def run(self) -> None:
        """Until the subscription is deleted or has nothing left to send (returns: an A2A push
        config whose task ended and was sent), or storage fails (StorageError)."""
        if self.spec.task_id is not None and await self._task_sent():
            return
        if self.attempts:
            await trio.sleep(max(0.0, self.next_at - time.time()))
        storage = self.owner.storage
        kind = "a2a" if self.spec.task_id is not None else None
        while True:
            try:
                cursor = Cursor(epoch=storage.epoch, offset=self.after)
                async with aclosing(storage.hub.stream(cursor, kind=kind)) as stream:
                    async for batch in stream:
                        for ev in batch:
                            if not await self._one(ev):
                                return
                        if not await self._save_skipped():
                            return
            except OutboxGapError as gap:
                if not await self._lost(gap.oldest.offset):
                    return

    async def _task_sent(self) -> bool:
        """Whether the push config's task has ended and its last change is sent (a config does
        not follow the outbox for ever: one a task, and tasks end)."""
        row = await self.owner.storage.reader.get_a2a_task(self.spec.task_id or "")
        return row is not None and row.state in webhooks.TASK_ENDED and row.seq <= self.after

    async def _one(self, ev: StoredEvent) -> bool:
        """``ev`` sent if the subscription wants it (until delivered or given up); False: the
        subscription is gone, or (a push config) its task's last change is sent."""
        self.owner.saw(ev)
        made = await self._body(ev)
        if made is None:
            self.after = ev.offset
            return True
        kind, body = made
        while True:
            outcome, status, error = await self._post(ev, body)
            self.attempts += 1
            now = time.time()
            line = ops.WebhookAttempt(offset=ev.offset, type=kind, attempt=self.attempts,
                                      outcome=outcome, status=status, error=error)
            if outcome == "delivered" or webhooks.give_up(self.since or now, now,
                                                         self.owner.retry_for):
                if outcome != "delivered":
                    line = msgspec.structs.replace(line, outcome="gave_up")
                    log.warning("webhook %s: gave up event %d after %d attempts",
                                self.spec.id, ev.offset, self.attempts)
                metrics.WEBHOOK_DELIVERIES.labels(line.outcome).inc()
                self.after, self.attempts, self.since = ev.offset, 0, None
                self.owner.failing.pop(self.spec.id, None)
                ended = isinstance(event := ev.event.event, TaskUpdated) and (
                    event.state in webhooks.TASK_ENDED)
                return await self._store(line) and not ended
            metrics.WEBHOOK_DELIVERIES.labels("failed").inc()
            self.since = self.since or now
            self.owner.failing[self.spec.id] = self.since
            delay = webhooks.backoff(self.attempts, self.owner.max_backoff)
            if not await self._store(line, retry_in=delay):
                return False
            await trio.sleep(delay)

    async def _body(self, ev: StoredEvent) -> tuple[str, bytes] | None:
        """(the event's type, the body to send) when the subscription wants ``ev``."""
        common = ev.event
        if self.spec.task_id is not None:  # an A2A push config: its task's changes
            event = common.event
            if isinstance(event, TaskUpdated) and event.task_id == self.spec.task_id:
                return "task.updated", bytes(event.update)
            return None
        found = webhooks.webhook_event(common)
        if found is None:
            return None
        kind, data = found
        agent = data.get("agent")  # the events that carry it (created, deleted), else looked up
        if self.spec.agent is not None and agent is None:
            agent = await self.owner.agent_of(data.get("conversation_id"))
        if not webhooks.wants(self.spec, kind, data.get("conversation_id"), agent):
            return None
        at = webhooks.event_time(common) or time.time()
        return kind, webhooks.body(kind, at, data)

    async def _post(self, ev: StoredEvent, body: bytes) -> tuple[str, int | None, str | None]:
        """One attempt: (outcome, the receiver's status, what went wrong)."""
        msg_id = str(Cursor(epoch=self.owner.storage.epoch, offset=ev.offset))
        now = datetime.now(UTC)
        headers = {"content-type": "application/json", "webhook-id": msg_id,
                   "webhook-timestamp": str(int(now.timestamp())),
                   "webhook-signature": self.signer.sign(msg_id, now, body)}
        push = self.push
        if push is not None:
            if push.token is not None:
                headers["x-a2a-notification-token"] = push.token
            if push.scheme is not None:
                headers["authorization"] = f"{push.scheme} {push.credentials or ''}".strip()
        try:
            response = await self.client.post(self.spec.url, content=body, headers=headers)
        except (httpx2.HTTPError, httpx2.InvalidURL, httpx2.StreamError, ValueError) as exc:
            # (a URL httpx2 will not take is a failed attempt too, logged, never a crash)
            return "failed", None, f"{type(exc).__name__}: {exc}"[:500]
        if webhooks.delivered(response.status_code):
            return "delivered", response.status_code, None
        return "failed", response.status_code, f"HTTP {response.status_code}"

    async def _store(self, line: ops.WebhookAttempt, retry_in: float = 0.0) -> bool:
        done = self.after
        stored = await self.owner.storage.write(ops.WebhookProgress(
            webhook_id=self.spec.id, after=done, attempts=self.attempts, retry_in=retry_in,
            log=(line,)))
        self.saved, self.saved_at = done, trio.current_time()
        return stored

    async def _save_skipped(self) -> bool:
        """The cursor stored now and then when it moved past events nobody wanted (so a restart
        need not read them again); True unless the subscription is gone."""
        if self.after == self.saved or trio.current_time() - self.saved_at < SAVE_SKIPPED:
            return True
        done = self.after
        stored = await self.owner.storage.write(ops.WebhookProgress(webhook_id=self.spec.id,
                                                                    after=done))
        self.saved, self.saved_at = done, trio.current_time()
        return stored

    async def _lost(self, oldest_cursor: int) -> bool:
        """The outbox trimmed events after the cursor before they were sent: the loss is a line
        of the delivery log and a metric, and delivery goes on from what is left."""
        first, last = self.after + 1, oldest_cursor
        log.warning("webhook %s: events %d..%d were trimmed from the outbox before delivery",
                    self.spec.id, first, last)
        metrics.WEBHOOK_DELIVERIES.labels("lost").inc(last - first + 1)
        self.after, self.attempts, self.since = last, 0, None
        self.owner.failing.pop(self.spec.id, None)
        return await self._store(ops.WebhookAttempt(
            offset=first, type="lost", attempt=0, outcome="lost",
            error=f"events {first}..{last} were trimmed from the outbox before delivery"))
