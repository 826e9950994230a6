"""ReconnectingOutbox: success, cut + reconnect, exhausted attempts -> Failed, dead cursor -> Gap
(never retried), close -> both streams end. Plus the backoff arithmetic. The connection runs
through tests/tcp_proxy.py so the tests can cut it."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from agentik.client import (
    AgentikAgent,
    AuthError,
    BackoffPolicy,
    Connected,
    Connecting,
    ConnectionStatus,
    Disconnected,
    Failed,
    Gap,
    ReconnectingOutbox,
)
from agentik.client.errors import AgentikConnectionError
from agentik.config import Config
from agentik.wire import CommonEvent, Cursor
from tests.tcp_proxy import Faults, TcpProxy, open_tcp_proxy
from tests.webutil import Server, serve_app

TIMEOUT = 15
FAST = BackoffPolicy.fixed(0.02)


@pytest.fixture
async def server(config: Config) -> AsyncIterator[Server]:
    async with serve_app(config.replace(outbox_cap=50)) as served:
        yield served


@pytest.fixture
async def proxy(server: Server) -> AsyncIterator[TcpProxy]:
    port = int(server.url.rsplit(":", 1)[1])
    async with open_tcp_proxy("127.0.0.1", port) as p:
        yield p


async def make_events(server: Server, n: int) -> None:
    """``n`` durable events (conversation creations), written in-process on the server."""
    for i in range(n):
        await server.agent.create_conversation(title=f"c{i}")


async def statuses_until(
    receive: trio.abc.ReceiveChannel[ConnectionStatus] | object, kind: type, limit: int = 100
) -> list[ConnectionStatus]:
    out: list[ConnectionStatus] = []
    for _ in range(limit):
        status = await receive.receive()  # type: ignore[attr-defined]
        out.append(status)
        if isinstance(status, kind):
            return out
    raise AssertionError(f"no {kind.__name__} in {out}")


def test_backoff_policy() -> None:
    rng = random.Random(1)
    policy = BackoffPolicy(initial=1, max=10, multiplier=2, jitter=0)
    assert [policy.delay(n, rng) for n in (1, 2, 3, 4, 5, 6)] == [1, 2, 4, 8, 10, 10]
    jittery = BackoffPolicy(initial=1, max=10, multiplier=2, jitter=0.2)
    for n in range(1, 8):
        base = min(10, 2 ** (n - 1))
        assert base * 0.8 <= jittery.delay(n, rng) <= base * 1.2
    fixed = BackoffPolicy.fixed(0.5, attempts=3)
    assert fixed.delay(9, rng) == 0.5 and fixed.max_attempts == 3


async def test_success(server: Server, proxy: TcpProxy) -> None:
    proxy.faults = Faults(seed=3, delay=(0.0, 0.002), chunk_size=64)  # slow and fragmented
    with trio.fail_after(TIMEOUT):
        async with AgentikAgent("r", proxy.url) as agent:
            start = await agent.outbox.current_cursor()
            async with ReconnectingOutbox(agent.outbox, FAST) as recon:
                statuses = recon.connection_status()
                stream = recon.events(start)
                await make_events(server, 5)
                got = [await stream.__anext__() for _ in range(5)]
                assert [ce.cursor.offset for ce in got if ce.cursor] == list(
                    range(start.offset + 1, start.offset + 6)
                )
                seen = await statuses_until(statuses, Connected)
                assert isinstance(seen[0], Connecting) and seen[-1] == Connected(start)
                assert recon.last_cursor == got[-1].cursor


async def test_cut_and_reconnect(server: Server, proxy: TcpProxy) -> None:
    with trio.fail_after(TIMEOUT):
        async with AgentikAgent("r", proxy.url) as agent:
            start = await agent.outbox.current_cursor()
            async with ReconnectingOutbox(agent.outbox, FAST) as recon:
                statuses = recon.connection_status()
                stream = recon.events(start)
                got: list[CommonEvent] = []
                for _round in range(3):
                    await make_events(server, 4)
                    got += [await stream.__anext__() for _ in range(4)]
                    assert await proxy.cut_all() >= 1
                    await statuses_until(statuses, Disconnected)
                    await statuses_until(statuses, Connected)
                offsets = [ce.cursor.offset for ce in got if ce.cursor]
                assert offsets == list(range(start.offset + 1, start.offset + 13))
                assert proxy.connections >= 4


async def test_exhausted_attempts_fail(server: Server, proxy: TcpProxy) -> None:
    proxy.refuse = True  # the server looks down: every connection is closed at once
    with trio.fail_after(TIMEOUT):
        async with AgentikAgent("r", proxy.url) as agent:
            cursor = server.hub.current_cursor()
            async with ReconnectingOutbox(agent.outbox, BackoffPolicy.fixed(0.01, 3)) as recon:
                statuses = recon.connection_status()
                stream = recon.events(cursor)
                assert [ce async for ce in stream] == []  # ends, no events
                seen = await statuses_until(statuses, Failed)
                assert [type(s) for s in seen] == [
                    Connecting, Disconnected, Connecting, Disconnected, Connecting, Failed
                ]
                assert isinstance(seen[1], Disconnected) and seen[1].will_retry_in == 0.01
                failed = seen[-1]
                assert isinstance(failed, Failed) and isinstance(failed.cause, AgentikConnectionError)
                assert proxy.connections == 3


async def test_dead_cursor_is_a_gap_and_never_retried(server: Server, proxy: TcpProxy) -> None:
    with trio.fail_after(TIMEOUT):
        async with AgentikAgent("r", proxy.url) as agent:
            dead = Cursor(epoch="some-other-database", offset=1)
            async with ReconnectingOutbox(agent.outbox, FAST) as recon:
                statuses = recon.connection_status()
                assert [ce async for ce in recon.events(dead)] == []
                seen = await statuses_until(statuses, Gap)
                assert [type(s) for s in seen] == [Connecting, Gap]
                gap = seen[-1]
                assert isinstance(gap, Gap) and gap.cause.current == server.hub.current_cursor()
                assert proxy.connections == 1


async def test_auth_failure_is_not_retried(config: Config) -> None:
    with trio.fail_after(TIMEOUT):
        async with serve_app(config.replace(tokens=("good",))) as srv, AgentikAgent(
            "r", srv.url, token="bad"
        ) as agent:
            async with ReconnectingOutbox(agent.outbox, FAST) as recon:
                statuses = recon.connection_status()
                assert [ce async for ce in recon.events()] == []
                seen = await statuses_until(statuses, Failed)
                failed = seen[-1]
                assert isinstance(failed, Failed) and isinstance(failed.cause, AuthError)


async def test_close_ends_both_streams(server: Server, proxy: TcpProxy) -> None:
    with trio.fail_after(TIMEOUT):
        async with AgentikAgent("r", proxy.url) as agent:
            recon = ReconnectingOutbox(agent.outbox, FAST)
            async with recon:
                statuses = recon.connection_status()
                stream = recon.events()
                await statuses_until(statuses, Connected)
                async with trio.open_nursery() as nursery:
                    ended: list[str] = []

                    async def drain_events() -> None:
                        assert [ce async for ce in stream] == []
                        ended.append("events")

                    async def drain_statuses() -> None:
                        async for _ in statuses:
                            pass
                        ended.append("statuses")

                    nursery.start_soon(drain_events)
                    nursery.start_soon(drain_statuses)
                    await trio.testing.wait_all_tasks_blocked()
                    await recon.close()
                assert sorted(ended) == ["events", "statuses"]
            await proxy.wait_idle()  # after close, the connection is released


async def test_works_over_the_in_process_outbox(config: Config) -> None:
    import agentik

    with trio.fail_after(TIMEOUT):
        async with agentik.open_runtime(config.replace(outbox_cap=3)) as agent:
            start = await agent.outbox.current_cursor()
            async with ReconnectingOutbox(agent.outbox, FAST) as recon:
                stream = recon.events(start)
                convs = [await agent.create_conversation() for _ in range(2)]
                got = [await stream.__anext__() for _ in range(2)]
                assert [ce.conversation_id for ce in got] == [c.id for c in convs]
            for _ in range(5):
                await agent.create_conversation()
            async with ReconnectingOutbox(agent.outbox, FAST) as recon:
                statuses = recon.connection_status()
                assert [ce async for ce in recon.events(start)] == []
                seen = await statuses_until(statuses, Gap)
                assert isinstance(seen[-1], Gap)
