"""One suite, two agents: the in-process agent (``agentik.open_runtime``) and the HTTP client
agent (``agentik.client.AgentikAgent`` against a real hypercorn server). Whatever holds for one
must hold for the other: same names, same results, same errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio

import agentik
from agentik.client import AgentikAgent, BackoffPolicy, Connected, ReconnectingOutbox
from agentik.config import Config
from agentik.errors import InvalidInputError, MailboxFullError, NotFoundError, OutboxGapError
from agentik.storage.hub import EventHub
from agentik.wire import (
    AppendText,
    AssistantMessage,
    AssistantMessageEvent,
    CommonEvent,
    Created,
    Cursor,
    Deleted,
    End,
    Renamed,
    Text,
    UserMessage,
    UserMessageEvent,
    Working,
)
from tests.scripted_openai import Hang, Reply, ScriptedOpenAI
from tests.webutil import serve_app

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

TIMEOUT = 15


@dataclass
class Harness:
    agent: Any  # LocalAgent | AgentikAgent: the point is that the test cannot tell
    hub: EventHub  # the server-side hub, to wait for live subscriptions

    async def online_subscribed(self, conversation_id: str) -> None:
        """Wait until a live subscription of the conversation is in place."""
        await self.hub.wait_online_subscribers(conversation_id)


Opener = Callable[..., Any]


@pytest.fixture(params=["local", "http"])
def open_agent(request: pytest.FixtureRequest, config: Config) -> Opener:
    """``async with open_agent(**config_changes) as h``: a Harness of the parametrised kind."""

    @asynccontextmanager
    async def opener(**changes: Any) -> AsyncIterator[Harness]:
        cfg = config.replace(**changes)
        if request.param == "local":
            async with agentik.open_runtime(cfg) as agent:
                yield Harness(agent, agent.hub)
        else:
            async with serve_app(cfg) as server, AgentikAgent("conformance", server.url) as agent:
                yield Harness(agent, server.hub)

    return opener


async def collect_until(
    events: Any, stop: Callable[[CommonEvent], bool], limit: int = 1000
) -> list[CommonEvent]:
    out: list[CommonEvent] = []
    async with aclosing(events):
        async for ce in events:
            out.append(ce)
            if stop(ce) or len(out) >= limit:
                break
    return out


async def test_crud(open_agent: Opener) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_agent() as h:
            agent = h.agent
            conv = await agent.create_conversation(title="first")
            assert conv.title == "first" and not conv.is_temporal and conv.id
            temp = await agent.create_conversation(temp=True)
            assert temp.is_temporal and temp.title is None

            got = await agent.get_conversation(conv.id)
            assert got is not None and got.record == conv.record
            assert await agent.get_conversation("no-such-id") is None

            record = await conv.rename("second")
            assert record.title == "second" == conv.title
            record = await agent.rename_conversation(conv.id, None)
            assert record.title is None and record.seq > conv.record.seq
            with pytest.raises(NotFoundError):
                await agent.rename_conversation("no-such-id", "x")

            assert await agent.delete_conversation(conv.id) is True
            assert await agent.delete_conversation(conv.id) is False
            assert await agent.get_conversation(conv.id) is None
            await conv.close()
            await conv.close()  # idempotent


async def test_send_and_watch_a_turn(open_agent: Opener, scripted: ScriptedOpenAI) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_agent() as h:
            agent = h.agent
            conv = await agent.create_conversation()
            cursor = await agent.outbox.current_cursor()
            durable: list[CommonEvent] = []
            online: list[CommonEvent] = []
            scripted.push(Reply(["Hel", "lo ", "there"]))

            async with trio.open_nursery() as nursery:

                async def watch_durable() -> None:
                    durable.extend(await collect_until(
                        agent.outbox.conversation_events(cursor, conv.id),
                        lambda ce: isinstance(ce.event, AssistantMessageEvent),
                    ))

                async def watch_online() -> None:
                    online.extend(await collect_until(
                        agent.online_outbox.online_events(conv.id),
                        lambda ce: isinstance(ce.event, End),
                    ))

                nursery.start_soon(watch_durable)
                nursery.start_soon(watch_online)
                await h.online_subscribed(conv.id)
                message_id = await conv.send("Hi!")

            user = [ce for ce in durable if isinstance(ce.event, UserMessageEvent)]
            assert len(user) == 1 and user[0].event.record.id == message_id
            assert isinstance(user[0].event.record.message, UserMessage)
            assert user[0].event.record.message.content == [Text(body="Hi!")]
            final = durable[-1].event
            assert isinstance(final, AssistantMessageEvent)
            assert isinstance(final.record.message, AssistantMessage)
            assert final.record.message.content == [Text(body="Hello there")]
            offsets = [ce.cursor.offset for ce in durable if ce.cursor]
            assert offsets == sorted(offsets) and offsets[0] > cursor.offset
            assert all(ce.conversation_id == conv.id for ce in durable)

            assert isinstance(online[0].event, Working) and online[0].cursor is None
            text = "".join(ce.event.text for ce in online if isinstance(ce.event, AppendText))
            assert text == "Hello there"


async def test_journal_and_messages(open_agent: Opener) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_agent() as h:
            agent = h.agent
            conv = await agent.create_conversation()
            cursor = await agent.outbox.current_cursor()
            await conv.send("one")
            await collect_until(
                agent.outbox.conversation_events(cursor, conv.id),
                lambda ce: isinstance(ce.event, AssistantMessageEvent),
            )
            records = await agent.journal.list(conversation_id=conv.id)
            assert [type(r.message) for r in records] == [UserMessage, AssistantMessage]
            assert await agent.journal.count(conversation_id=conv.id) == 2
            assert await agent.journal.count(conversation_id=conv.id, after_seq=records[0].seq) == 1
            later = await agent.journal.list(conversation_id=conv.id, after_seq=records[0].seq)
            assert later == records[1:]
            upto = await agent.journal.list(conversation_id=conv.id, up_to_seq=records[0].seq)
            assert upto == records[:1]
            assert await agent.journal.list(conversation_id=conv.id, limit=1) == records[:1]
            assert await conv.get_messages() == records
            assert await conv.get_messages(after_seq=records[0].seq) == records[1:]
            assert await conv.get_messages(offset=1) == records[1:]
            everything = await agent.journal.list()
            assert all(r in everything for r in records)
            with pytest.raises(InvalidInputError):
                await conv.get_messages(limit=0)
            with pytest.raises(InvalidInputError):
                await agent.journal.list(limit=100_000)
            with pytest.raises(InvalidInputError):
                await conv.send([])


async def test_snapshots(open_agent: Opener) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_agent() as h:
            agent = h.agent
            a = await agent.create_conversation(title="a")
            b = await agent.create_conversation(title="b")
            await b.rename("b2")
            snap = await agent.conversations_snapshot()
            ids = [c.id for c in snap.conversations]
            assert ids[:2] == [b.id, a.id]  # newest change first
            assert snap.cursor.offset >= b.record.seq
            assert snap.cursor == await agent.outbox.current_cursor()
            assert (await agent.conversations_snapshot(offset=1, limit=1)).conversations[0].id == a.id

            cursor = await agent.outbox.current_cursor()
            await a.send("hello")
            await collect_until(
                agent.outbox.conversation_events(cursor, a.id),
                lambda ce: isinstance(ce.event, AssistantMessageEvent),
            )
            chat = await agent.chat_snapshot(a.id)
            assert chat.conversation.id == a.id
            assert chat.messages == await a.get_messages()
            assert chat.cursor.offset >= chat.messages[-1].seq

            # Agent events: everything about the list, from a cursor.
            seen = await collect_until(
                agent.outbox.agent_events(Cursor(epoch=snap.cursor.epoch, offset=a.record.seq - 1)),
                lambda ce: isinstance(ce.event, Renamed),
            )
            kinds = [type(ce.event) for ce in seen]
            assert kinds[:2] == [Created, Created] and kinds[-1] is Renamed


async def test_gap_error(open_agent: Opener) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_agent(outbox_cap=3) as h:
            agent = h.agent
            start = await agent.outbox.current_cursor()
            for i in range(6):
                await agent.create_conversation(title=f"c{i}")
            head = await agent.outbox.current_cursor()
            oldest = await agent.outbox.oldest_cursor()
            assert oldest.offset > start.offset
            for events in (
                agent.outbox.events(start),
                agent.outbox.agent_events(start),
                agent.outbox.events(Cursor(epoch="another-epoch", offset=head.offset)),
                agent.outbox.events(Cursor(epoch=head.epoch, offset=head.offset + 100)),
            ):
                with pytest.raises(OutboxGapError) as info:
                    async with aclosing(events):
                        await events.__anext__()
                assert info.value.current == head and info.value.oldest == oldest
            # The oldest cursor itself is alive.
            conv = await agent.create_conversation()
            oldest = await agent.outbox.oldest_cursor()
            got = await collect_until(agent.outbox.events(oldest), lambda ce: ce.conversation_id == conv.id)
            assert got[0].cursor is not None and got[0].cursor.offset == oldest.offset + 1


async def test_not_found(open_agent: Opener) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_agent() as h:
            agent = h.agent
            conv = await agent.create_conversation()
            cursor = await agent.outbox.current_cursor()
            events = agent.outbox.conversation_events(cursor, conv.id)
            async with aclosing(events):
                await conv.rename("bye")
                assert isinstance((await events.__anext__()).event, Renamed)  # the stream is open
                assert await agent.delete_conversation(conv.id)
                # The conversation's own stream shows its deletion, and then it ENDS: read to
                # its end (fail_after bounds a stream that would stay open).
                rest = [ce async for ce in events]
                assert isinstance(rest[-1].event, Deleted)
                assert not any(isinstance(ce.event, Deleted) for ce in rest[:-1])
            for call in (
                lambda: conv.send("hi"),
                lambda: conv.interrupt(),
                lambda: conv.rename("x"),
                lambda: agent.chat_snapshot(conv.id),
                lambda: agent.send("nope", "hi"),
                lambda: agent.interrupt("nope"),
            ):
                with pytest.raises(NotFoundError):
                    await call()


async def test_reconnecting_stream_ends_after_deleted(open_agent: Opener) -> None:
    """ReconnectingOutbox over either outbox: a conversation's stream ends after its Deleted
    because the stream it reads ends (no reconnect, no status change), read to its end."""
    with trio.fail_after(TIMEOUT):
        async with open_agent() as h:
            agent = h.agent
            conv = await agent.create_conversation()
            cursor = await agent.outbox.current_cursor()
            async with ReconnectingOutbox(agent.outbox, policy=BackoffPolicy.fixed(0.01)) as recon:
                async with recon.conversation_events(cursor, conv.id) as events:
                    assert await agent.delete_conversation(conv.id)
                    got = [ce async for ce in events]
                assert isinstance(recon.status, Connected), recon.status
            assert isinstance(got[-1].event, Deleted) and len(got) == 2


async def test_mailbox_full(open_agent: Opener, scripted: ScriptedOpenAI) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_agent(mailbox_size=1) as h:
            agent = h.agent
            conv = await agent.create_conversation()
            scripted.push(Hang())
            await conv.send("hang")
            await scripted.wait_requests(1)  # the first turn runs (and hangs)
            with pytest.raises(MailboxFullError) as info:
                for _ in range(10):
                    await conv.send("more")
            assert info.value.retry_after > 0
            assert await conv.interrupt() is True


async def test_get_messages_of_unknown_conversation(open_agent: Opener) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_agent() as h:
            conv = await h.agent.create_conversation()
            assert await h.agent.delete_conversation(conv.id)
            with pytest.raises(NotFoundError):
                await conv.get_messages()
