"""Conversation ownership in a PostgreSQL cluster: one live actor per conversation, by leases with
fencing (SCALEOUT.md, "Conversation ownership").

- ``nodes(node_id, addr, heartbeat_at)``: each node heartbeats every TTL/5 by the database's clock.
  A node is live while its heartbeat is younger than the TTL.
- ``conv_owner(conversation_id, node_id, fence)``: a conversation's owner. A node claims it
  before it starts its actor (create, cold load); the claim succeeds when there is no owner, the
  owner is this node, or the owner is not live, and a takeover bumps the fence. The writer checks
  the fence inside each commit statement (``pg.writer``): a zombie's write is refused.
- A node that could not heartbeat for 0.6 TTL stops its own actors (their turns end with their
  terminal record while its fence is still good) before any other node can take its leases: the
  fence guards database writes, not model or tool side effects.
- A sweeper on every node claims the conversations of dead nodes that have open turns and stores
  the running one's terminal record (``Error("interrupted: node lost")``); tool calls are never
  re-run. Their queued turns (accepted, not started) then run on the sweeping node
  (``on_claimed``). It deletes their temporary conversations, which die with their node as they
  die with a restart.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import psycopg
import trio

from agentik import metrics
from agentik.errors import LeaseLostError, NotOwnerError, StorageError
from agentik.storage import ops
from agentik.storage.pg.connect import connect

log = logging.getLogger(__name__)

#: fraction of the TTL a node may go without a heartbeat before it stops its own actors
STOP_AFTER = 0.6
NODE_LOST = "interrupted: node lost"
#: longest a lease query may take before its connection is dropped
QUERY_LIMIT = 10.0

_CLAIM = """
WITH prev AS (SELECT node_id FROM conv_owner WHERE conversation_id = %(cid)s)
INSERT INTO conv_owner AS x (conversation_id, node_id, fence) VALUES (%(cid)s, %(me)s, 1)
ON CONFLICT (conversation_id) DO UPDATE SET node_id = EXCLUDED.node_id, fence = x.fence + 1
WHERE x.node_id <> %(me)s AND NOT EXISTS (
    SELECT 1 FROM nodes y WHERE y.node_id = x.node_id
    AND y.heartbeat_at > now() - make_interval(secs => %(ttl)s))
RETURNING fence, (SELECT node_id FROM prev)
"""

_OWNER = """
SELECT x.node_id, x.fence, y.addr,
       COALESCE(y.heartbeat_at > now() - make_interval(secs => %(ttl)s), false)
FROM conv_owner x LEFT JOIN nodes y ON y.node_id = x.node_id WHERE x.conversation_id = %(cid)s
"""

_LIVE = """
SELECT heartbeat_at > now() - make_interval(secs => %(ttl)s) FROM nodes WHERE node_id = %(node)s
"""

_ORPHANS = """
SELECT x.conversation_id, c.is_temporal FROM conv_owner x JOIN conversation c ON c.id = x.conversation_id
WHERE x.node_id <> %(me)s
  AND NOT EXISTS (SELECT 1 FROM nodes y WHERE y.node_id = x.node_id
                  AND y.heartbeat_at > now() - make_interval(secs => %(ttl)s))
  AND (c.is_temporal OR EXISTS (SELECT 1 FROM turn t WHERE t.conversation_id = x.conversation_id))
LIMIT 50
"""


def is_loopback(addr: str) -> bool:
    """Whether a base URL names this host only (127.0.0.0/8, ::1, localhost)."""
    host = urlsplit(addr).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Leases:
    """This node's leases. ``fences`` (conversation id -> fence) is read by the writer thread."""

    def __init__(self, url: str, *, node_id: str, ttl: float, addr: str | None) -> None:
        self.url = url
        self.node_id = node_id or default_node_id()
        self.ttl = ttl
        #: the base URL advertised for forwarded commands (``nodes.addr``): AGENTIK_NODE_URL,
        #: else learned (:meth:`learn_addr`)
        self.addr = addr
        self.addr_configured = addr is not None
        self._addr_warned = False
        self.fences: dict[str, int] = {}
        self.healthy = False
        #: why the last heartbeat failed; None after a successful one (``not_ready``)
        self.heartbeat_error: str | None = None
        #: set by the runtime: stop the local actor of a conversation (its turn ends stored)
        self.on_stop: Callable[[str], Awaitable[None]] | None = None
        #: set by the runtime: load a conversation the sweeper took over, so its queued turns
        #: (accepted by the dead node, not started) run here
        self.on_claimed: Callable[[str], Awaitable[None]] | None = None
        #: set by run_storage: commit an op through the node's StorageActor; ``recover``: a
        #: RecoverTurns through it, the closed turns' live streams ended (``Storage.recover_turns``)
        self.write: Callable[[ops.AnyOp], Awaitable[Any]] | None = None
        self.recover: Callable[[ops.RecoverTurns], Awaitable[Any]] | None = None
        self.stats = {"heartbeats": 0, "missed": 0, "claims": 0, "takeovers": 0, "stops": 0}
        #: line -> (lock, [connection]): one connection per line, one call at a time on it
        self._lines: dict[str, tuple[trio.Lock, list[Any]]] = {
            "heartbeat": (trio.Lock(), [None]), "claims": (trio.Lock(), [None])}
        self._last_ok = -math.inf
        #: conversations whose actor ``_stop_all`` is stopping now
        self._stopping: set[str] = set()
        self._nursery: trio.Nursery | None = None

    # --- database calls (one connection, one call at a time, bounded by the TTL) ---------------

    def _sync(self, sql: str, args: dict[str, Any], conn_box: list[Any]) -> list[tuple[Any, ...]]:
        conn = conn_box[0]
        if conn is None or conn.closed or conn.broken:
            # a lease statement that takes longer than the lease itself is of no use
            conn = connect(self.url, timeout=self.ttl)
            conn_box[0] = conn
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description is not None else []

    async def _db(self, sql: str, *, line: str = "claims", **args: Any) -> list[tuple[Any, ...]]:
        """Run ``sql`` on the connection of ``line`` ("heartbeat" has its own, so a slow claim
        never delays a heartbeat); StorageError when it fails or takes over QUERY_LIMIT seconds
        (the connection is then dropped: the abandoned thread may still hold it);
        InvalidInputError for an id with a NUL character (``ops.check_looked_up``)."""
        ops.check_looked_up(*args.values())
        args.setdefault("me", self.node_id)
        args.setdefault("ttl", self.ttl)
        lock, box = self._lines[line]
        async with lock:
            with trio.move_on_after(QUERY_LIMIT):
                try:
                    return await trio.to_thread.run_sync(
                        self._sync, sql, args, box, abandon_on_cancel=True)
                except psycopg.Error as exc:
                    box[0] = None
                    raise StorageError(f"lease query failed: {exc}") from exc
            box[0] = None
            raise StorageError(f"lease query took over {QUERY_LIMIT} s")

    # --- the node ------------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        # The lease runs from the heartbeat's now() in the database, which is after this moment
        # and may be long before the answer arrives (a slow or blocked query): counting from
        # the answer would let this node stop its actors after another node may take over.
        sent, sent_at = trio.current_time(), time.time()
        await self._db(
            "INSERT INTO nodes (node_id, addr, heartbeat_at) VALUES (%(me)s, %(addr)s, now()) "
            "ON CONFLICT (node_id) DO UPDATE SET heartbeat_at = now(), addr = EXCLUDED.addr",
            line="heartbeat", addr=self.addr,
        )
        self._last_ok = sent
        metrics.CLUSTER_HEARTBEAT.set(sent_at)
        self.heartbeat_error = None
        # A heartbeat that hung past the stop bound renewed the lease only from when it was sent
        # (now() is its transaction's start), so it is as stale as the watchdog says: were the
        # node healthy again, it would take a conversation that the watchdog's next look stops
        # (an accepted turn cancelled). The next, prompt heartbeat makes it healthy.
        if trio.current_time() - sent <= STOP_AFTER * self.ttl:
            self.healthy = True
        self.stats["heartbeats"] += 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Heartbeat, watch, sweep until cancelled. Raises StorageError if the first heartbeat
        fails (start-up)."""
        await self._heartbeat()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._watchdog)
                task_status.started()
                while True:
                    await trio.sleep(self.ttl / 5)
                    if trio.current_time() - self._last_ok > STOP_AFTER * self.ttl:
                        await self._stop_all()  # e.g. frozen: stop before heartbeating again
                    try:
                        await self._heartbeat()
                    except StorageError as exc:
                        self.stats["missed"] += 1
                        metrics.CLUSTER_HEARTBEAT_FAILURES.inc()
                        self.heartbeat_error = str(exc)
                        log.warning("node %s: heartbeat failed: %s", self.node_id, exc)
                        continue
                    try:
                        await self._sweep()
                    except StorageError as exc:
                        log.warning("node %s: sweep failed: %s", self.node_id, exc)
        finally:
            for _, box in self._lines.values():
                conn, box[0] = box[0], None
                if conn is not None:
                    conn.close()

    @property
    def wants_addr(self) -> bool:
        """Whether an address learned now could be advertised (none configured, none known,
        or only a loopback one): the web front asks before it looks at a request."""
        return not self.addr_configured and (self.addr is None or is_loopback(self.addr))

    def learn_addr(self, addr: str | None) -> None:
        """An address this node is reached at (``agentik serve``'s bind, the address a request
        arrived at; None: a request that told none, e.g. over a UNIX socket). Without
        AGENTIK_NODE_URL the first one is advertised at once, and a loopback one gives way to
        another, so other nodes can forward commands here; nothing replaces a configured or
        routable one (a request through a proxy on the same host must not hide it)."""
        if addr is None:
            if self.addr is None and not self._addr_warned:
                self._addr_warned = True
                log.warning("node %s: AGENTIK_NODE_URL is not set and a request arrived without "
                            "a server address: other nodes cannot forward commands here until "
                            "it is set", self.node_id)
            return
        if not self.wants_addr or addr == self.addr or (
                self.addr is not None and is_loopback(addr)):
            return
        self.addr = addr
        log.info("node %s: advertising %s for forwarded commands (learned; AGENTIK_NODE_URL "
                 "sets it)", self.node_id, addr)
        if self._nursery is not None:
            self._nursery.start_soon(self._advertise)

    async def _advertise(self) -> None:
        """A heartbeat now, so the new address is in ``nodes`` before the next one is due."""
        try:
            await self._heartbeat()
        except StorageError as exc:  # the heartbeat loop writes it on its next round
            log.warning("node %s: advertising its address failed: %s", self.node_id, exc)

    def addr_problem(self) -> str | None:
        """Why other nodes cannot forward commands here (``/readyz``), None when they can."""
        if self.addr is not None:
            return None
        return (f"node {self.node_id} has no address for commands forwarded by other nodes: "
                "set AGENTIK_NODE_URL (its base URL as they reach it)")

    def not_ready(self) -> str | None:
        """Why this node cannot run conversations now (``/readyz``): its last heartbeat failed,
        or it stopped its actors for want of one in time (a heartbeat hanging); None while it
        heartbeats."""
        if self.heartbeat_error is not None:
            return self.heartbeat_error
        if not self.healthy:
            return (f"no heartbeat for {trio.current_time() - self._last_ok:.1f} s "
                    f"(TTL {self.ttl:g} s): its actors are stopped")
        return None

    async def _watchdog(self) -> None:
        """Independent of how long a heartbeat query hangs: past STOP_AFTER x TTL without a
        successful heartbeat, stop every local actor."""
        while True:
            await trio.sleep(self.ttl / 10)
            if trio.current_time() - self._last_ok > STOP_AFTER * self.ttl:
                await self._stop_all()

    async def _stop_all(self) -> None:
        """Stop every local actor before another node can take this node's leases."""
        if self.healthy:
            log.error("node %s: no heartbeat for %.1f s (TTL %.1f s): stopping its actors",
                      self.node_id, trio.current_time() - self._last_ok, self.ttl)
        self.healthy = False
        for cid in list(self.fences):
            # The watchdog and the heartbeat loop may both be here; the lease is dropped only
            # once the actor stopped (its last writes still carry the fence), so skip what the
            # other one is stopping.
            if cid in self._stopping:
                continue
            self._stopping.add(cid)
            try:
                self.stats["stops"] += 1
                metrics.CLUSTER_ACTOR_STOPS.labels("no_heartbeat").inc()
                if self.on_stop is not None:
                    await self.on_stop(cid)
                self._release(cid)
            finally:
                self._stopping.discard(cid)

    def _hold(self, conversation_id: str, fence: int) -> None:
        self.fences[conversation_id] = fence
        metrics.CLUSTER_LEASES.set(len(self.fences))

    def _release(self, conversation_id: str) -> None:
        self.fences.pop(conversation_id, None)
        metrics.CLUSTER_LEASES.set(len(self.fences))

    def fenced_out(self, conversation_id: str) -> None:
        """The writer refused a write of ours by its fence: stop that actor (not waiting)."""
        self._release(conversation_id)
        if self.on_stop is not None and self._nursery is not None:
            self.stats["stops"] += 1
            metrics.CLUSTER_ACTOR_STOPS.labels("fenced_out").inc()
            self._nursery.start_soon(self.on_stop, conversation_id)

    # --- conversations -------------------------------------------------------------------------

    async def claim(self, conversation_id: str) -> int:
        """Own the conversation (before its actor starts); returns the fence. A takeover from a
        dead node first stores the terminal record of its open turns. Raises NotOwnerError
        when another live node owns it, LeaseLostError when this node cannot hold leases now."""
        if not self.healthy:
            raise LeaseLostError(f"node {self.node_id} cannot heartbeat: it holds no leases now")
        self.stats["claims"] += 1
        rows = await self._db(_CLAIM, cid=conversation_id)
        if rows:
            fence, previous = int(rows[0][0]), rows[0][1]
            self._hold(conversation_id, fence)
            if previous is not None and previous != self.node_id:
                self.stats["takeovers"] += 1
                metrics.CLUSTER_TAKEOVERS.inc()
                log.info("node %s took conversation %s over from %s (fence %d)",
                         self.node_id, conversation_id, previous, fence)
                if self.recover is not None:
                    await self.recover(ops.RecoverTurns(conversation_id=conversation_id,
                                                        message=NODE_LOST, code="node_lost"))
            return fence
        owner = await self._db(_OWNER, cid=conversation_id)
        if owner and owner[0][0] == self.node_id:
            self._hold(conversation_id, int(owner[0][1]))
            return int(owner[0][1])
        node_id, addr = (owner[0][0], owner[0][2]) if owner else ("", None)
        raise NotOwnerError(f"conversation {conversation_id!r} is owned by node {node_id!r}",
                            node_id=node_id, addr=addr)

    async def node_live(self, node_id: str) -> bool:
        """Whether ``node_id`` heartbeats in time (a request relayed to it watches this: a frozen
        or cut-off node keeps its connections open and never answers). StorageError."""
        rows = await self._db(_LIVE, node=node_id)
        return bool(rows and rows[0][0])

    async def check_remote(self, conversation_id: str) -> None:
        """Raise NotOwnerError when another live node owns the conversation."""
        if conversation_id in self.fences:
            return
        owner = await self._db(_OWNER, cid=conversation_id)
        if owner and owner[0][0] != self.node_id and owner[0][3]:
            raise NotOwnerError(f"conversation {conversation_id!r} is owned by node {owner[0][0]!r}",
                                node_id=owner[0][0], addr=owner[0][2])

    async def _sweep(self) -> None:
        for cid, temporal in await self._db(_ORPHANS):
            try:
                await self.claim(cid)
                if temporal and self.write is not None:
                    await self.write(ops.DeleteConversation(conversation_id=cid))
                    self._release(cid)
                elif self.on_claimed is not None:
                    await self.on_claimed(cid)
            except (NotOwnerError, LeaseLostError):
                continue  # another node was quicker
