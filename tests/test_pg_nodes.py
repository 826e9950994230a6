"""Several agentik nodes as real processes (``hypercorn -k trio agentik.web:app``) on one real
PostgreSQL schema, driven through the real client library over HTTP/SSE (docs/SCALEOUT.md, issue 17):

- senders spread messages over conversations through both nodes, a reader on each node: both
  see the identical gap-free event sequence, every acknowledged message is stored once and gets
  a terminal record (commands for a conversation owned by the other node are forwarded);
- SIGKILL of a node mid-answer: its open turn gets "interrupted: node lost" within the lease TTL
  (plus a margin), visible on the other node, which answers the conversation next; the killed
  node restarts and rejoins, and a cursor from one node resumes on the other;
- a frozen node (SIGSTOP) loses its lease, and its late write is refused by the fence.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path

import httpx2
import pytest
import trio

from agentik.client.http import AgentikAgent
from agentik.errors import (
    BusyError,
    IdempotencyKeyReusedError,
    MailboxFullError,
    RuntimeClosedError,
    StorageError,
)
from agentik.wire import AssistantMessage, CommonEvent, Cursor, Error, event_type
from benchmarks.serverproc import free_port
from tests.scripted_openai import Hang, Reply, ScriptedOpenAI

REPO = Path(__file__).resolve().parent.parent
#: short for the test, long enough for 2 cores shared with other work (a node stops its actors
#: after 0.6 TTL without a heartbeat)
TTL = 3.0
#: how long after a node's death its open turn must have its terminal record
TAKEOVER_LIMIT = TTL + 3.0


class Node:
    """One ``hypercorn -k trio agentik.web:app`` process, a cluster node."""

    def __init__(self, name: str, url: str, openai: str, log_dir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        self.env = {
            **os.environ, "PYTHONPATH": str(REPO), "AGENTIK_DATABASE_URL": url,
            "AGENTIK_NODE_ID": name, "AGENTIK_NODE_URL": self.url,
            "AGENTIK_LEASE_TTL": str(TTL), "OPENAI_BASE_URL": openai, "OPENAI_API_KEY": "k",
            "AGENTIK_LLM_MAX_RETRIES": "0", "AGENTIK_MAILBOX_SIZE": "64",
        }
        self.process: trio.Process | None = None

    async def start(self) -> None:
        with open(self.log_path, "ab") as log:  # noqa: ASYNC230 - a local file, once
            self.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "hypercorn", "-k", "trio", "--bind",
                 f"127.0.0.1:{self.port}", "--graceful-timeout", "1",
                 "--access-logfile", "-",  # every request and its status, in the node's log
                 "agentik.web:app"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO),
                start_new_session=True,  # hypercorn runs its worker in a child: signal the group
            )
        with trio.fail_after(30):
            async with httpx2.AsyncClient(base_url=self.url, timeout=2.0) as client:
                while True:  # a separate process: ask until it answers
                    assert self.process.returncode is None, self.log()
                    try:
                        if (await client.get("/healthz")).status_code == 200:
                            return
                    except httpx2.TransportError:
                        pass
                    await trio.sleep(0.05)

    def log(self, tail: int = 6000) -> str:
        """The end of the node's output (stdout and stderr of all its runs)."""
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except FileNotFoundError:
            return "(never started)"

    def signal(self, sig: int) -> None:
        """``sig`` to the node's whole process group (hypercorn's supervisor and its worker)."""
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    async def kill(self) -> None:
        if self.process is not None:
            self.signal(signal.SIGKILL)
            with trio.fail_after(10):
                await self.process.wait()

    async def stop(self) -> None:
        if self.process is None:
            return
        if self.process.returncode is not None:
            self.signal(signal.SIGKILL)  # an orphaned worker, if any
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        with trio.move_on_after(10):
            await self.process.wait()
            return
        await self.kill()


@asynccontextmanager
async def cluster(pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path,
                  n: int = 2, env: dict[str, str] | None = None) -> AsyncIterator[list[Node]]:
    nodes = [Node(f"n{i}", pg_url, scripted.base_url, tmp_path) for i in range(n)]
    for node in nodes:
        node.env.update(env or {})
    try:
        for node in nodes:
            await node.start()
        yield nodes
    except BaseException:
        # a failure explains itself: every node's log, shown by pytest with the failure
        for node in nodes:
            print(f"----- log of node {node.name} ({node.log_path}) -----\n{node.log(300_000)}")
        raise
    finally:
        with trio.CancelScope(shield=True):
            for node in nodes:
                await node.stop()


class Reader:
    """Every durable event of one node, from offset 0, in a background task."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.events: list[CommonEvent] = []
        self._changed = trio.Event()

    async def run(self, epoch: str) -> None:
        async with AgentikAgent("reader", self.node.url) as client:
            stream = client.outbox.events(Cursor(epoch=epoch, offset=0))
            async with aclosing(stream):
                async for ev in stream:
                    self.events.append(ev)
                    self._changed.set()
                    self._changed = trio.Event()

    async def wait_for(self, predicate: object, limit: float = 60.0) -> None:
        with trio.fail_after(limit):
            while not predicate():  # type: ignore[operator]
                await self._changed.wait()

    def offsets(self) -> list[int]:
        return [ev.cursor.offset for ev in self.events if ev.cursor is not None]


def terminal_turns(events: list[CommonEvent]) -> dict[str, list[str]]:
    """turn id -> the types of its terminal records (assistant answer, error)."""
    out: dict[str, list[str]] = {}
    for ev in events:
        record = getattr(ev.event, "record", None)
        message = getattr(record, "message", None)
        if isinstance(message, AssistantMessage | Error) and message.turn_id is not None:
            out.setdefault(message.turn_id, []).append(event_type(ev.event))
    return out


async def test_two_nodes_senders_and_readers_see_one_sequence(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    seconds = float(os.environ.get("AGENTIK_TEST_CLUSTER_SECONDS", "10"))
    async with cluster(pg_url, scripted, tmp_path) as nodes:
        clients = [AgentikAgent(f"c{i}", node.url) for i, node in enumerate(nodes)]
        try:
            epoch = (await clients[0].outbox.current_cursor()).epoch
            assert (await clients[1].outbox.current_cursor()).epoch == epoch
            # the start-up log names the database in use (it once named the unused SQLite file)
            assert f"agentik runtime started (database {pg_url}," in nodes[0].log()
            readers = [Reader(node) for node in nodes]
            conversations = [
                (await clients[i % 2].create_conversation()).id for i in range(8)
            ]
            acked: list[tuple[str, str]] = []  # (conversation, message id)
            full = 0
            rng = random.Random(17)
            async with trio.open_nursery() as background:
                for reader in readers:
                    background.start_soon(reader.run, epoch)

                async def sender(k: int) -> None:
                    nonlocal full
                    i = 0
                    end = trio.current_time() + seconds
                    while trio.current_time() < end:  # never cancelled mid-send
                        cid = rng.choice(conversations)
                        client = clients[rng.randrange(2)]
                        try:
                            acked.append((cid, await client.send(cid, f"s{k}-{i}")))
                        except (MailboxFullError, StorageError, RuntimeClosedError):
                            full += 1  # refused (429/503): not acknowledged
                        i += 1

                async with trio.open_nursery() as senders:
                    for k in range(4):
                        senders.start_soon(sender, k)
                ids = {mid for _, mid in acked}
                for reader in readers:  # every acknowledged message gets its terminal record
                    try:
                        await reader.wait_for(
                            lambda r=reader: ids <= terminal_turns(r.events).keys())
                    except trio.TooSlowError:
                        missing = ids - terminal_turns(reader.events).keys()
                        raise AssertionError(
                            f"{len(missing)} of {len(ids)} turns unanswered on {reader.node.name}"
                            " (the nodes' logs follow)") from None
                head = (await clients[0].outbox.current_cursor()).offset
                for reader in readers:
                    await reader.wait_for(lambda r=reader: len(r.events) >= head)
                background.cancel_scope.cancel()
            a, b = readers[0].events[:head], readers[1].events[:head]
            assert [e.cursor.offset for e in a] == list(range(1, head + 1))  # type: ignore[union-attr]
            assert [(e.cursor, event_type(e.event)) for e in a] == [
                (e.cursor, event_type(e.event)) for e in b]
            turns = terminal_turns(a)
            assert all(turns[mid] == ["assistant_message"] for mid in ids)  # once, answered
            stored: list[str] = []
            after = 0
            while page := await clients[1].journal.list(after_seq=after, limit=100):
                stored += [m.id for m in page if type(m.message).__name__ == "UserMessage"]
                after = page[-1].seq
            assert len(stored) == len(set(stored))  # nothing stored twice
            assert sorted(stored) == sorted(ids), (len(stored), len(ids), full)  # acked = stored
            assert len(ids) > 10, (len(ids), full)
        finally:
            for client in clients:
                await client.close()


async def _start_long_answer(client: AgentikAgent, scripted: ScriptedOpenAI) -> tuple[str, str]:
    """Send a question whose answer hangs after its first text, and return once that text was
    streamed. The live stream is open before the send: live events are not replayed, and a turn
    of an idle conversation starts as soon as its message is stored."""
    scripted.push(Hang(text_before="Let me think"))
    conv = await client.create_conversation()
    opened, streamed = trio.Event(), trio.Event()
    live = client.online_outbox.online_events(conv.id, on_open=lambda _: opened.set())

    async def read() -> None:
        async for ev in live:
            if event_type(ev.event) == "append_text":
                streamed.set()
                return

    async with aclosing(live), trio.open_nursery() as nursery:
        nursery.start_soon(read)
        with trio.fail_after(30):
            await opened.wait()
        mid = await client.send(conv.id, "a long question")
        with trio.fail_after(30):
            await streamed.wait()
    return conv.id, mid


async def test_sigkill_mid_answer_takeover_rejoin_and_cursor_across_nodes(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    async with cluster(pg_url, scripted, tmp_path) as (a, b):
        ca, cb = AgentikAgent("ca", a.url), AgentikAgent("cb", b.url)
        try:
            epoch = (await cb.outbox.current_cursor()).epoch
            reader_b = Reader(b)
            async with trio.open_nursery() as background:
                background.start_soon(reader_b.run, epoch)
                cid, mid = await _start_long_answer(ca, scripted)  # a owns it, mid-answer
                await a.kill()
                start = trio.current_time()
                await reader_b.wait_for(lambda: mid in terminal_turns(reader_b.events),
                                        limit=TAKEOVER_LIMIT + 5)
                took = trio.current_time() - start
                assert took < TAKEOVER_LIMIT, took
                error = next(e.event.record.message for e in reader_b.events  # type: ignore[union-attr]
                             if isinstance(getattr(getattr(e.event, "record", None), "message", None),
                                           Error))
                assert (error.message, error.turn_id) == ("interrupted: node lost", mid)
                # b serves the conversation now
                nxt = await cb.send(cid, "still there?")
                await reader_b.wait_for(lambda: nxt in terminal_turns(reader_b.events))
                assert terminal_turns(reader_b.events)[nxt] == ["assistant_message"]
                # a restarts and rejoins; a cursor from b resumes on a, nothing lost or doubled
                cursor = reader_b.events[-1].cursor
                assert cursor is not None
                await a.start()
                after = await ca.send(cid, "and now?")  # owned by b: a forwards it
                await reader_b.wait_for(lambda: after in terminal_turns(reader_b.events))
                head = reader_b.events[-1].cursor.offset  # type: ignore[union-attr]
                on_a: list[CommonEvent] = []
                with trio.fail_after(30):
                    async with aclosing(ca.outbox.events(cursor)) as stream:
                        async for ev in stream:
                            on_a.append(ev)
                            if ev.cursor is not None and ev.cursor.offset >= head:
                                break
                on_b = [e for e in reader_b.events if e.cursor.offset > cursor.offset]  # type: ignore[union-attr]
                assert [e.cursor for e in on_a] == [e.cursor for e in on_b]
                assert [e.cursor.offset for e in on_a] == list(range(cursor.offset + 1, head + 1))  # type: ignore[union-attr]
                background.cancel_scope.cancel()
            journal = await cb.journal.list(conversation_id=cid, limit=100)
            assert [m.id for m in journal].count(mid) == 1
        finally:
            await ca.close()
            await cb.close()


async def test_frozen_node_loses_its_lease_and_its_late_write_is_refused(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    async with cluster(pg_url, scripted, tmp_path) as (a, b):
        ca, cb = AgentikAgent("ca", a.url), AgentikAgent("cb", b.url)
        try:
            epoch = (await cb.outbox.current_cursor()).epoch
            reader_b = Reader(b)
            async with trio.open_nursery() as background:
                background.start_soon(reader_b.run, epoch)
                cid, mid = await _start_long_answer(ca, scripted)
                a.signal(signal.SIGSTOP)  # frozen: alive, but no heartbeat
                await reader_b.wait_for(lambda: mid in terminal_turns(reader_b.events),
                                        limit=TAKEOVER_LIMIT + 5)
                a.signal(signal.SIGCONT)
                # a wakes up past its lease: it stops its actor, whose terminal write carries the
                # old fence and is refused
                with trio.fail_after(20):
                    while "was taken" not in a.log():  # noqa: ASYNC110 - another process's log
                        await trio.sleep(0.05)
                nxt = await ca.send(cid, "who answers?")  # forwarded to b, the owner now
                await reader_b.wait_for(lambda: nxt in terminal_turns(reader_b.events))
                background.cancel_scope.cancel()
            turns = terminal_turns(reader_b.events)
            assert turns[mid] == ["error"]  # b's "node lost" only: a's late "cancelled" refused
            assert turns[nxt] == ["assistant_message"]
            messages = await cb.journal.list(conversation_id=cid, limit=100)
            kinds = [type(m.message).__name__ for m in messages]
            assert kinds == ["UserMessage", "Error", "UserMessage", "AssistantMessage"], kinds
        finally:
            await ca.close()
            await cb.close()


async def test_idempotency_key_replayed_through_the_other_node(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    """A retry that lands on another node (a load balancer does that) gets the first answer:
    the same conversation, the same message id, nothing stored twice; another body with the
    key is refused there too."""
    async with cluster(pg_url, scripted, tmp_path) as (a, b):
        ca, cb = AgentikAgent("ca", a.url), AgentikAgent("cb", b.url)
        try:
            conv = await ca.create_conversation(idempotency_key="create-1")
            assert (await cb.create_conversation(idempotency_key="create-1")).id == conv.id
            mid = await ca.send(conv.id, "hello", idempotency_key="send-1")
            assert await cb.send(conv.id, "hello", idempotency_key="send-1") == mid
            with pytest.raises(IdempotencyKeyReusedError):
                await cb.send(conv.id, "another body", idempotency_key="send-1")
            reader_b = Reader(b)
            async with trio.open_nursery() as background:
                background.start_soon(reader_b.run, (await cb.outbox.current_cursor()).epoch)
                await reader_b.wait_for(lambda: mid in terminal_turns(reader_b.events))
                background.cancel_scope.cancel()
            assert terminal_turns(reader_b.events) == {mid: ["assistant_message"]}  # one turn
            journal = await cb.journal.list(conversation_id=conv.id, limit=100)
            assert [type(m.message).__name__ for m in journal] == ["UserMessage", "AssistantMessage"]
            snapshot = await cb.conversations_snapshot()
            assert [c.id for c in snapshot.conversations] == [conv.id]
        finally:
            await ca.close()
            await cb.close()


async def test_busy_policy_holds_across_nodes(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    """A send through another node than the owner of a conversation with a running turn is
    judged by the owner: reject gets 409 busy and stores nothing; interrupt cancels the turn
    there and its message is answered next."""
    async with cluster(pg_url, scripted, tmp_path) as (a, b):
        ca, cb = AgentikAgent("ca", a.url), AgentikAgent("cb", b.url)
        try:
            reader_b = Reader(b)
            async with trio.open_nursery() as background:
                background.start_soon(reader_b.run, (await cb.outbox.current_cursor()).epoch)
                cid, mid = await _start_long_answer(ca, scripted)  # a owns it, mid-answer
                with pytest.raises(BusyError):
                    await cb.send(cid, "are you busy?", on_busy="reject")
                nxt = await cb.send(cid, "stop that", on_busy="interrupt")
                await reader_b.wait_for(lambda: nxt in terminal_turns(reader_b.events))
                background.cancel_scope.cancel()
            turns = terminal_turns(reader_b.events)
            assert turns[nxt] == ["assistant_message"]
            assert mid in turns and "interrupted" in [event_type(e.event) for e in reader_b.events]
            journal = await cb.journal.list(conversation_id=cid, limit=100)
            users = [m for m in journal if type(m.message).__name__ == "UserMessage"]
            assert [m.id for m in users] == [mid, nxt]  # the rejected send stored nothing
        finally:
            await ca.close()
            await cb.close()


async def _live_conversations(client: httpx2.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("agentik_live_conversations ")))


async def test_idle_passivation_then_a_message_on_the_other_node(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    """The owner passivates an idle conversation and keeps its lease; a message arriving at the
    other node goes to the owner, which loads it again and answers: no takeover, one actor."""
    env = {"AGENTIK_IDLE_TIMEOUT": "0.5"}
    async with cluster(pg_url, scripted, tmp_path, env=env) as (a, b):
        ca, cb = AgentikAgent("ca", a.url), AgentikAgent("cb", b.url)
        try:
            reader_b = Reader(b)
            async with trio.open_nursery() as background, \
                    httpx2.AsyncClient(base_url=a.url) as http_a, \
                    httpx2.AsyncClient(base_url=b.url) as http_b:
                background.start_soon(reader_b.run, (await cb.outbox.current_cursor()).epoch)
                conv = await ca.create_conversation()
                first = await ca.send(conv.id, "hello")
                await reader_b.wait_for(lambda: first in terminal_turns(reader_b.events))
                with trio.fail_after(20):
                    while await _live_conversations(http_a) != 0:  # noqa: ASYNC110 - passivated, another process
                        await trio.sleep(0.1)
                nxt = await cb.send(conv.id, "still there?")
                await reader_b.wait_for(lambda: nxt in terminal_turns(reader_b.events))
                assert await _live_conversations(http_b) == 0  # b ran nothing: a answered
                background.cancel_scope.cancel()
            assert terminal_turns(reader_b.events)[nxt] == ["assistant_message"]
            import psycopg

            with psycopg.connect(pg_url) as conn:
                owner = conn.execute("SELECT node_id, fence FROM conv_owner WHERE conversation_id"
                                     " = %s", (conv.id,)).fetchone()
            assert owner == (a.name, 1)  # never taken over
        finally:
            await ca.close()
            await cb.close()


async def test_a_queued_turn_cancelled_through_the_other_node_never_runs(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    """``cancel_turn`` at a node that does not own the conversation goes to its owner, which
    withdraws the queued turn (issue 26: an A2A task is cancelled at whichever node the
    CancelTask reaches): its ending is stored at once, and the model never sees it."""
    async with cluster(pg_url, scripted, tmp_path) as (a, b):
        ca, cb = AgentikAgent("ca", a.url), AgentikAgent("cb", b.url)
        try:
            reader_b = Reader(b)
            async with trio.open_nursery() as background:
                background.start_soon(reader_b.run, (await cb.outbox.current_cursor()).epoch)
                cid, first = await _start_long_answer(ca, scripted)  # a owns it, mid-answer
                second = await ca.send(cid, "second message")  # queued on a
                assert await cb.cancel_turn(cid, second)  # b forwards it to a
                answers = [(m.message.turn_id, m.message.interrupted)
                           for m in await cb.journal.list(conversation_id=cid, limit=100)
                           if isinstance(m.message, AssistantMessage)]
                assert answers == [(second, True)]
                assert await cb.cancel_turn(cid, first)  # the running one, through b too
                scripted.push(Reply("third answer"))
                third = await cb.send(cid, "third message")
                await reader_b.wait_for(lambda: third in terminal_turns(reader_b.events))
                background.cancel_scope.cancel()
            assert terminal_turns(reader_b.events)[third] == ["assistant_message"]
            assert not any("second message" in str(r["messages"]) for r in scripted.requests)
        finally:
            await ca.close()
            await cb.close()


pytestmark = pytest.mark.usefixtures("pg_url")
