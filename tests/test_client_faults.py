"""Fault tests of the client: the server restarted mid-stream, connections cut at random points
(seeded), the outbox evicted while the client is offline. Every stream is checked for
exactly-once, in-order delivery against the server's own numbering (every offset from the start
cursor to the head, each once)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path

import pytest
import trio

from agentik.agent import LocalAgent
from agentik.client import (
    AgentikAgent,
    BackoffPolicy,
    ConversationListCache,
    ConversationListSync,
    Disconnected,
    JournalSync,
    ReconnectingOutbox,
    SqliteJournalStore,
)
from agentik.config import Config
from agentik.wire import AssistantMessageEvent, CommonEvent, Cursor
from tests.tcp_proxy import Faults, TcpProxy, open_tcp_proxy
from tests.webutil import Server, serve_app

TIMEOUT = 40
FAST = BackoffPolicy.fixed(0.02)


@pytest.fixture
def cfg(config: Config) -> Config:
    return config.replace(sqlite_synchronous="NORMAL")


def port_of(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


async def renames(agent: LocalAgent, conversation_id: str, n: int, tag: str) -> None:
    """``n`` durable events, written in-process on the server, a few at a time (group commit)."""
    async with trio.open_nursery() as nursery:
        for worker in range(8):

            async def write(worker: int = worker) -> None:
                for i in range(worker, n, 8):
                    await agent.rename_conversation(conversation_id, f"{tag}-{i}")

            nursery.start_soon(write)


class Collector:
    """Consumes a reconnecting stream into ``events``; ``wait_for(offset)`` waits for it."""

    def __init__(self) -> None:
        self.events: list[CommonEvent] = []
        self._changed = trio.Event()

    @property
    def offset(self) -> int:
        cursor = self.events[-1].cursor if self.events else None
        return -1 if cursor is None else cursor.offset

    async def run(self, stream: AsyncIterator[CommonEvent]) -> None:
        async for ce in stream:
            self.events.append(ce)
            self._changed.set()
            self._changed = trio.Event()

    async def wait_for(self, offset: int) -> None:
        while self.offset < offset:
            await self._changed.wait()

    def assert_exactly_once(self, start: Cursor, head: Cursor) -> None:
        offsets = [ce.cursor.offset for ce in self.events if ce.cursor is not None]
        assert len(offsets) == len(self.events)
        expected = list(range(start.offset + 1, head.offset + 1))
        assert offsets == expected, (len(offsets), len(expected))


async def finish_turn(agent: AgentikAgent, conversation_id: str, text: str) -> None:
    """Send and wait until the answer is stored."""
    cursor = await agent.outbox.current_cursor()
    await agent.send(conversation_id, text)
    async with aclosing(agent.outbox.conversation_events(cursor, conversation_id)) as events:
        async for ce in events:
            if isinstance(ce.event, AssistantMessageEvent):
                return


@asynccontextmanager
async def proxied(server: Server, faults: Faults | None = None) -> AsyncIterator[TcpProxy]:
    async with open_tcp_proxy("127.0.0.1", port_of(server), faults=faults) as proxy:
        yield proxy


async def test_server_restart_mid_stream(cfg: Config) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_tcp_proxy("127.0.0.1", 9) as proxy, AgentikAgent("f", proxy.url) as agent:
            collector = Collector()
            async with ReconnectingOutbox(agent.outbox, FAST) as recon, trio.open_nursery() as nursery:
                statuses = recon.connection_status()
                async with serve_app(cfg) as first:
                    proxy.retarget("127.0.0.1", port_of(first))
                    conv = await first.agent.create_conversation()
                    start = first.hub.current_cursor()
                    nursery.start_soon(collector.run, recon.events(start))
                    await renames(first.agent, conv.id, 300, "a")
                    await collector.wait_for(start.offset + 100)  # mid-stream: then stop it
                disconnects = 0
                async with serve_app(cfg) as second:  # same database file
                    proxy.retarget("127.0.0.1", port_of(second))
                    await renames(second.agent, conv.id, 300, "b")
                    head = second.hub.current_cursor()
                    await collector.wait_for(head.offset)
                    collector.assert_exactly_once(start, head)
                    await recon.close()
                    async for status in statuses:
                        disconnects += isinstance(status, Disconnected)
                    assert disconnects >= 1
                nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", [11, 2026])
async def test_random_cuts_exactly_once(cfg: Config, seed: int) -> None:
    """1,200 events through a proxy that cuts connections at random points (mid-frame too)."""
    faults = Faults(seed=seed, cut_probability=0.03, max_cuts=30, chunk_size=700, truncate=True)
    with trio.fail_after(TIMEOUT):
        async with serve_app(cfg) as srv, proxied(srv) as proxy, AgentikAgent("f", proxy.url) as agent:
            conv = await srv.agent.create_conversation()
            start = srv.hub.current_cursor()
            collector = Collector()
            async with ReconnectingOutbox(agent.outbox, FAST) as recon, trio.open_nursery() as nursery:
                nursery.start_soon(collector.run, recon.events(start))
                await collector.wait_for(-1)
                proxy.faults = faults
                for batch in range(4):
                    await renames(srv.agent, conv.id, 300, f"r{batch}")
                head = srv.hub.current_cursor()
                await collector.wait_for(head.offset)
                collector.assert_exactly_once(start, head)
                assert head.offset - start.offset >= 1200
                assert proxy.cuts >= 5, proxy.cuts  # the faults really happened
                nursery.cancel_scope.cancel()


async def test_outbox_evicted_while_offline(cfg: Config, tmp_path: Path) -> None:
    """A client goes away, the outbox forgets what it missed (cap 20), it comes back: Gap,
    resync, and its caches equal the server's state."""
    with trio.fail_after(TIMEOUT):
        async with serve_app(cfg.replace(outbox_cap=20)) as srv, AgentikAgent("f", srv.url) as agent:
            conv = await agent.create_conversation()
            other = await agent.create_conversation(title="other")
            await finish_turn(agent, conv.id, "first")
            path = os.fspath(tmp_path / "cache.db")
            listing = ConversationListCache()
            async with SqliteJournalStore(path) as store, trio.open_nursery() as nursery:
                sync = JournalSync(agent, conv.id, store, policy=FAST)
                list_sync = ConversationListSync(agent, listing, policy=FAST)
                await nursery.start(sync.run)
                await nursery.start(list_sync.run)
                nursery.cancel_scope.cancel()  # offline
            stale = await agent.outbox.current_cursor()

            # While offline: a turn, renames, a deletion, a creation, far more than the cap.
            await finish_turn(agent, conv.id, "second")
            await renames(srv.agent, conv.id, 40, "x")
            await agent.delete_conversation(other.id)
            await agent.create_conversation(title="new")
            assert (await agent.outbox.oldest_cursor()).offset > stale.offset

            async with SqliteJournalStore(path) as store, trio.open_nursery() as nursery:
                assert await store.load_cursor(conv.id) is not None  # it will try to resume
                sync = JournalSync(agent, conv.id, store, policy=FAST)
                list_sync = ConversationListSync(agent, listing, policy=FAST)
                await nursery.start(sync.run)
                await nursery.start(list_sync.run)
                head = await agent.outbox.current_cursor()
                await sync.wait_for(head.offset)
                await list_sync.wait_for(head.offset)
                assert sync.gaps == 1 and list_sync.gaps == 1
                server_state = await agent.chat_snapshot(conv.id)
                assert await store.list(conv.id) == server_state.messages
                assert len(server_state.messages) == 4
                assert sync.conversation == server_state.conversation
                assert listing.list() == (await agent.conversations_snapshot()).conversations
                nursery.cancel_scope.cancel()
