"""Online events (token deltas, ``working``, ``end``) across the nodes of a PostgreSQL cluster.

They are never stored: the node that runs a turn publishes them to its hub, and this relay also
sends them to the other nodes as NOTIFY payloads on the schema's online channel (batched: one
NOTIFY carries every event queued since the previous one, up to 7,000 bytes; the first line is
the sender's node id, then one CommonEvent JSON per line). Every node LISTENs and hands the other
nodes' events to its local live subscribers. Lossy by definition, as online events are anyway:
a full relay queue drops, and a notification sent while a listener reconnects is lost; the
durable answer always arrives through the outbox.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import trio

from agentik.storage.hub import EventHub
from agentik.storage.pg.connect import DEFAULT_TIMEOUT, connect
from agentik.storage.pg.listen import listen
from agentik.wire import CommonEvent, OnlineEvent, decode_common_event, encode

log = logging.getLogger(__name__)

#: most bytes of one NOTIFY payload (PostgreSQL's limit is 8,000)
PAYLOAD = 7000
QUEUE = 10_000


class OnlineRelay:
    def __init__(self, url: str, channel: str, node_id: str, hub: EventHub,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = url
        #: AGENTIK_DB_TIMEOUT (``pg.connect``)
        self.timeout = timeout
        self.channel = channel
        self.node_id = node_id
        self.hub = hub
        self._send, self._recv = trio.open_memory_channel[bytes](QUEUE)
        self.stats = {"sent": 0, "notifies": 0, "dropped": 0, "received": 0}

    def tap(self, conversation_id: str, event: OnlineEvent) -> None:
        """The hub's ``online_tap``: queue the event for the other nodes (never blocks)."""
        raw = encode(CommonEvent(cursor=None, conversation_id=conversation_id, event=event))
        try:
            self._send.send_nowait(raw)
        except trio.WouldBlock:
            self.stats["dropped"] += 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self._listen)
            nursery.start_soon(self._sender)
            task_status.started()

    async def _sender(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        head = self.node_id.encode()
        pending: bytes | None = None
        try:
            while True:
                first = pending if pending is not None else await self._recv.receive()
                pending = None
                lines = [head, first]
                size = len(head) + len(first) + 1
                while True:
                    try:
                        raw = self._recv.receive_nowait()
                    except trio.WouldBlock:
                        break
                    if size + len(raw) + 1 > PAYLOAD:
                        pending = raw
                        break
                    lines.append(raw)
                    size += len(raw) + 1
                if size > PAYLOAD:  # one event too large for a notification: not relayed
                    self.stats["dropped"] += 1
                    continue
                payload = b"\n".join(lines).decode()
                try:
                    conn = await trio.to_thread.run_sync(self._notify, conn, payload)
                    self.stats["notifies"] += 1
                    self.stats["sent"] += len(lines) - 1
                except psycopg.Error as exc:
                    self.stats["dropped"] += len(lines) - 1
                    log.warning("online relay: %s", exc)
                    conn = None
                    await trio.sleep(0.5)
        finally:
            if conn is not None:
                conn.close()

    def _notify(self, conn: psycopg.Connection[Any] | None, payload: str) -> psycopg.Connection[Any]:
        if conn is None or conn.closed or conn.broken:
            conn = connect(self.url, timeout=self.timeout)
        conn.execute("SELECT pg_notify(%s, %s)", (self.channel, payload))
        return conn

    async def _listen(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await listen(self.url, self.channel, self._received, name="online listener",
                     db_timeout=self.timeout, task_status=task_status)

    def _received(self, notes: list[Any]) -> None:
        for note in notes:
            self._deliver(note.extra)

    def _deliver(self, payload: bytes) -> None:
        sender, _, body = payload.partition(b"\n")
        if sender.decode() == self.node_id:
            return  # our own: already delivered locally
        for line in body.split(b"\n"):
            try:
                common = decode_common_event(line)
            except Exception:  # a malformed payload is dropped, never fatal
                log.warning("online listener: a malformed event was dropped")
                continue
            if common.conversation_id is not None:
                self.stats["received"] += 1
                self.hub.deliver_online(common.conversation_id, common.event)  # type: ignore[arg-type]
