"""EventHub on a real StorageActor and SQLite file: an event committed while a reader replays is
delivered once; a conversation's stream ends after its Deleted (the one place of that rule),
other streams do not; waiting for an online subscriber."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from functools import partial

import pytest
import trio
import trio.testing

from agentik.storage import hub as hub_module
from agentik.storage import ops
from agentik.storage.actor import Storage, run_storage
from agentik.storage.types import StoredEvent
from agentik.wire import ConversationClosing, Deleted, Text, UserMessage, Working

TIMEOUT = 10


@asynccontextmanager
async def open_storage(path: str) -> AsyncIterator[Storage]:
    async with trio.open_nursery() as nursery:
        storage: Storage = await nursery.start(partial(run_storage, path))
        yield storage
        nursery.cancel_scope.cancel()


async def create(storage: Storage, cid: str) -> None:
    await storage.write(ops.CreateConversation(
        conversation_id=cid, title=None, is_temporal=False, system_prompt="sys"))


async def append(storage: Storage, cid: str, mid: str) -> int:
    record = await storage.write(ops.AppendUserMessage(
        conversation_id=cid, message_id=mid, message=UserMessage(content=[Text(body="x")])))
    return int(record.seq)


def offsets(batch: list[StoredEvent]) -> list[int]:
    return [ev.offset for ev in batch]


async def test_an_event_committed_during_replay_is_delivered_once(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The subscriber is registered before the replay reads the store, so an event committed
    between two replay pages is both in the next page and in the live buffer: the live part must
    skip it (the "skip offsets already replayed" check)."""
    monkeypatch.setattr(hub_module, "REPLAY_PAGE", 2)
    with trio.fail_after(TIMEOUT):
        async with open_storage(db_path) as st:
            start = st.hub.current_cursor()
            await create(st, "c1")
            await append(st, "c1", "m1")
            stream = st.hub.stream(start)
            async with aclosing(stream):
                # A full first page: the replay goes on reading after it.
                assert offsets(await stream.__anext__()) == [1, 2]
                third = await append(st, "c1", "m2")  # commits while the reader replays
                assert offsets(await stream.__anext__()) == [third]  # from the store
                fourth = await append(st, "c1", "m3")
                # Live now: the buffer holds `third` (published at its commit) and `fourth`.
                assert offsets(await stream.__anext__()) == [fourth]


async def test_a_conversation_stream_ends_after_its_deleted(db_path: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_storage(db_path) as st:
            hub = st.hub
            start = hub.current_cursor()
            await create(st, "gone")
            await create(st, "stays")
            await append(st, "gone", "m1")

            # Live: the stream is open (its subscriber registered) when the deletion commits.
            live = hub.events(hub.current_cursor(), conversation_id="gone")
            everything = hub.events(hub.current_cursor())
            async with aclosing(live), aclosing(everything):
                async with trio.open_nursery() as nursery:
                    got: list[object] = []

                    async def read_to_the_end() -> None:
                        got.extend([ce.event async for ce in live])

                    nursery.start_soon(read_to_the_end)
                    await trio.testing.wait_all_tasks_blocked()
                    assert await st.write(ops.DeleteConversation(conversation_id="gone"))
                # read_to_the_end returned: the stream ended by itself.
                assert [type(e) for e in got] == [ConversationClosing, Deleted]

                # Streams without a conversation go on after a Deleted.
                seen = [type((await everything.__anext__()).event) for _ in range(2)]
                assert seen == [ConversationClosing, Deleted]
                await append(st, "stays", "m2")
                assert (await everything.__anext__()).conversation_id == "stays"

            # Replay: resuming before the deletion replays up to the Deleted, then ends.
            replayed = [ce async for ce in hub.events(start, conversation_id="gone")]
            assert isinstance(replayed[-1].event, Deleted)
            assert [ce.conversation_id for ce in replayed] == ["gone"] * len(replayed)
            assert hub.subscriber_count == 0


async def test_wait_online_subscribers(db_path: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_storage(db_path) as st:
            hub = st.hub
            events = hub.online_events("c1")
            async with aclosing(events), trio.open_nursery() as nursery:
                waited = trio.Event()

                async def wait() -> None:
                    await hub.wait_online_subscribers("c1")
                    waited.set()

                nursery.start_soon(wait)
                await trio.testing.wait_all_tasks_blocked()
                assert not waited.is_set()
                nursery.start_soon(events.__anext__)  # registers at its first step
                await waited.wait()
                assert hub.online_subscribers("c1") == 1
                hub.publish_online("c1", Working())
