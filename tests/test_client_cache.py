"""Local caches (in-memory and SQLite journal stores, the conversation-list cache) and the sync
helpers that keep them equal to the server."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from agentik.client import (
    AgentikAgent,
    BackoffPolicy,
    ConversationListCache,
    ConversationListSync,
    InMemoryJournalStore,
    JournalStore,
    JournalSync,
    SqliteJournalStore,
)
from agentik.config import Config
from agentik.wire import (
    AssistantMessage,
    Created,
    Cursor,
    Deleted,
    MessageRecord,
    Renamed,
    Text,
    UserMessage,
)
from tests.scripted_openai import ScriptedOpenAI
from tests.webutil import serve_app

TIMEOUT = 15
FAST = BackoffPolicy.fixed(0.02)


def record(i: int, conversation_id: str = "c1", text: str | None = None) -> MessageRecord:
    message: Any = UserMessage(content=[Text(body=text or f"m{i}")]) if i % 2 else AssistantMessage(
        content=[Text(body=text or f"m{i}")]
    )
    return MessageRecord(
        id=f"id{i}", seq=i, conversation_id=conversation_id, created_at=float(i), message=message
    )


StoreFactory = Callable[[], Any]


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """A factory of stores; the SQLite ones all use the same file (to test persistence)."""

    @asynccontextmanager
    async def factory() -> AsyncIterator[JournalStore]:
        if request.param == "memory":
            yield InMemoryJournalStore()
        else:
            async with SqliteJournalStore(os.fspath(tmp_path / "cache.db")) as store:
                yield store

    return factory


async def test_store_basics(make_store: StoreFactory) -> None:
    async with make_store() as store:
        c = Cursor(epoch="e", offset=5)
        await store.upsert([record(3), record(1), record(2)], key="c1", cursor=c)
        await store.upsert([record(4, "c2")])
        assert [r.seq for r in await store.list("c1")] == [1, 2, 3]
        assert [r.seq for r in await store.list()] == [1, 2, 3, 4]
        assert [r.seq for r in await store.list("c1", after_seq=1, up_to_seq=2)] == [2]
        assert [r.seq for r in await store.list(limit=2)] == [1, 2]
        assert await store.count("c1") == 3 and await store.count(after_seq=3) == 1
        assert await store.load_cursor("c1") == c and await store.load_cursor("c2") is None
        # Upsert by id: the same record twice is stored once; a new version replaces it.
        await store.upsert([record(2), record(2, text="edited")])
        assert await store.count("c1") == 3
        got = await store.get("id2")
        assert got is not None and got == record(2, text="edited")
        assert await store.get("nope") is None
        # replace = clear + apply, atomically, with the cursor.
        c2 = Cursor(epoch="e", offset=9)
        await store.replace("c1", [record(7)], c2)
        assert [r.seq for r in await store.list("c1")] == [7]
        assert await store.load_cursor("c1") == c2
        await store.clear("c1")
        assert await store.list("c1") == [] and await store.load_cursor("c1") is None
        assert await store.count() == 1
        await store.save_cursor("k", c)
        assert await store.load_cursor("k") == c
        await store.clear()
        assert await store.count() == 0 and await store.load_cursor("k") is None


async def test_sqlite_store_persists(tmp_path: Path) -> None:
    path = os.fspath(tmp_path / "cache.db")
    async with SqliteJournalStore(path) as store:
        await store.upsert([record(1), record(2)], key="c1", cursor=Cursor(epoch="e", offset=2))
    async with SqliteJournalStore(path) as store:
        assert [r.seq for r in await store.list("c1")] == [1, 2]
        assert await store.load_cursor("c1") == Cursor(epoch="e", offset=2)


def test_conversation_list_cache() -> None:
    from agentik.wire import ConversationRecord, Touched

    cache = ConversationListCache()
    a = ConversationRecord(id="a", created_at=1, updated_at=1, seq=1)
    b = ConversationRecord(id="b", created_at=2, updated_at=2, seq=2)
    assert cache.apply(Created(conversation=a), 1) is None
    cache.apply(Created(conversation=b), 2)
    cache.apply(Created(conversation=b), 2)  # idempotent
    assert [r.id for r in cache.list()] == ["b", "a"] and len(cache) == 2
    cache.apply(Renamed(conversation_id="a", title="A", updated_at=5), 3)
    assert [r.id for r in cache.list()] == ["a", "b"]
    got = cache.get("a")
    assert got is not None and got.title == "A" and got.seq == 3
    assert cache.apply(Touched(conversation_id="zz", updated_at=9), 4) == "zz"  # fetch it
    cache.apply(Deleted(conversation_id="a"), 5)
    assert [r.id for r in cache.list()] == ["b"]


# --- syncs against a real server -----------------------------------------------------------------


async def finish_turn(agent: AgentikAgent, conv_id: str, text: str) -> None:
    """Send and wait until the answer is stored (via the durable stream)."""
    from contextlib import aclosing

    from agentik.wire import AssistantMessageEvent

    cursor = await agent.outbox.current_cursor()
    await agent.send(conv_id, text)
    async with aclosing(agent.outbox.conversation_events(cursor, conv_id)) as events:
        async for ce in events:
            if isinstance(ce.event, AssistantMessageEvent):
                return


async def test_journal_sync_follows_the_server(
    config: Config, scripted: ScriptedOpenAI, make_store: StoreFactory
) -> None:
    with trio.fail_after(TIMEOUT):
        async with serve_app(config) as srv, AgentikAgent("s", srv.url) as agent:
            conv = await agent.create_conversation()
            await finish_turn(agent, conv.id, "before")
            async with make_store() as store:
                async with trio.open_nursery() as nursery:
                    sync = JournalSync(agent, conv.id, store, policy=FAST)
                    await nursery.start(sync.run)
                    assert await store.list(conv.id) == await conv.get_messages()
                    await finish_turn(agent, conv.id, "after")
                    await conv.rename("t")
                    await sync.wait_for((await agent.outbox.current_cursor()).offset)
                    assert await store.list(conv.id) == await conv.get_messages()
                    assert len(await store.list(conv.id)) == 4
                    assert sync.conversation is not None and sync.conversation.title == "t"
                    assert sync.resyncs == 1
                    nursery.cancel_scope.cancel()

                # A restarted client resumes from the stored cursor (no second snapshot).
                await finish_turn(agent, conv.id, "while away")
                async with trio.open_nursery() as nursery:
                    sync = JournalSync(agent, conv.id, store, policy=FAST)
                    await nursery.start(sync.run)
                    await sync.wait_for((await agent.outbox.current_cursor()).offset)
                    assert await store.list(conv.id) == await conv.get_messages()
                    assert sync.resyncs == 0
                    # Deleting the conversation empties the cache and ends the sync.
                    assert await agent.delete_conversation(conv.id)
                assert sync.gone and await store.list(conv.id) == []


async def test_conversation_list_sync(config: Config) -> None:
    with trio.fail_after(TIMEOUT):
        async with serve_app(config) as srv, AgentikAgent("s", srv.url) as agent:
            convs = [await agent.create_conversation(title=f"c{i}") for i in range(5)]
            cache = ConversationListCache()
            async with trio.open_nursery() as nursery:
                # A tiny page size makes the snapshot several pages.
                sync = ConversationListSync(agent, cache, policy=FAST, page=2)
                await nursery.start(sync.run)
                await agent.rename_conversation(convs[0].id, "renamed")
                await agent.delete_conversation(convs[1].id)
                await agent.create_conversation(title="new")
                await sync.wait_for((await agent.outbox.current_cursor()).offset)
                server_list = (await agent.conversations_snapshot()).conversations
                assert cache.list() == server_list
                nursery.cancel_scope.cancel()


async def test_sync_of_unknown_conversation_ends(config: Config) -> None:
    with trio.fail_after(TIMEOUT):
        async with serve_app(config) as srv, AgentikAgent("s", srv.url) as agent:
            store = InMemoryJournalStore()
            sync = JournalSync(agent, "no-such-conversation", store, policy=FAST)
            await sync.run()
            assert sync.gone
