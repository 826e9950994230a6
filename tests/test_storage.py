"""StorageActor + EventHub on real SQLite files: one counter, group commit, publish after commit,
replay-then-live without gap or duplicate, gap errors, slow subscribers, failed writes."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio.testing

from agentik.errors import NotFoundError, OutboxGapError, StorageError
from agentik.storage import hub as hub_module
from agentik.storage import ops
from agentik.storage.actor import Storage, run_storage
from agentik.storage.sqlite.schema import SCHEMA_VERSION
from agentik.storage.sqlite.writer import Writer
from agentik.wire import CommonEvent, Cursor, Text, UserMessage
from tests.conftest import StorageTarget


@asynccontextmanager
async def open_storage(target: StorageTarget, **kw: object) -> AsyncIterator[Storage]:
    """The contract tests run on every engine (the ``target`` fixture: SQLite and PostgreSQL)."""
    async with trio.open_nursery() as nursery:
        storage: Storage = await nursery.start(
            partial(run_storage, target.path, database_url=target.url, **kw)  # type: ignore[arg-type]
        )
        yield storage
        nursery.cancel_scope.cancel()


async def create(storage: Storage, cid: str = "c1") -> None:
    await storage.write(ops.CreateConversation(conversation_id=cid, title=None, is_temporal=False,
                                               system_prompt="sys"))


async def append(storage: Storage, cid: str, mid: str, text: str = "x") -> int:
    record = await storage.write(ops.AppendUserMessage(
        conversation_id=cid, message_id=mid, message=UserMessage(content=[Text(body=text)])))
    return int(record.seq)


async def collect(it: AsyncIterator[CommonEvent], n: int) -> list[CommonEvent]:
    out = []
    with trio.fail_after(10):
        async for ev in it:
            out.append(ev)
            if len(out) == n:
                break
    return out


async def test_one_counter_group_commit_and_contiguous_offsets(target: StorageTarget) -> None:
    async with open_storage(target) as st:
        await create(st)
        seqs: list[int] = []

        async def writer(i: int) -> None:
            seqs.append(await append(st, "c1", f"m{i}"))

        async with trio.open_nursery() as n:
            for i in range(200):
                n.start_soon(writer, i)
        assert sorted(seqs) == list(range(2, 202))
        # Concurrent requests were drained into shared transactions.
        assert st.stats.batches < st.stats.ops
        assert st.stats.largest_batch > 1
        # message.seq == outbox offset == conversation.seq of the last change
        journal = await st.reader.journal(None, 0, None, 1000)
        assert [r.seq for r in journal] == list(range(2, 202))
        conv = await st.reader.get_conversation("c1")
        assert conv is not None and conv.seq == 201
        assert st.hub.current_cursor().offset == 201


async def test_cursor_invariant_under_concurrent_writers(target: StorageTarget) -> None:
    """A reader that takes the cursor and then reads state never misses an event; resuming from
    that cursor gives every later event exactly once, in order."""
    async with open_storage(target) as st:
        await create(st)
        total = 300
        observations: list[tuple[int, set[int], list[int]]] = []

        async def writers() -> None:
            async with trio.open_nursery() as n:
                for w in range(4):
                    async def one(w: int = w) -> None:
                        for i in range(total // 4):
                            await append(st, "c1", f"m{w}-{i}")
                    n.start_soon(one)

        async def reader() -> None:
            for _ in range(6):
                cursor = await_cursor = st.hub.current_cursor()
                state = {r.seq for r in await st.reader.journal(None, 0, None, 1000)}
                head_at_end = 1 + total  # Created + every append
                remaining = head_at_end - await_cursor.offset
                events = await collect(st.hub.events(cursor), remaining) if remaining else []
                observations.append((cursor.offset, state, [e.cursor.offset for e in events]))  # type: ignore[union-attr]
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as n:
            n.start_soon(writers)
            n.start_soon(reader)
        all_seqs = {r.seq for r in await st.reader.journal(None, 0, None, 1000)}
        assert len(all_seqs) == total
        for cursor, state, offsets in observations:
            assert {s for s in all_seqs if s <= cursor} <= state  # nothing <= cursor missing
            assert offsets == list(range(cursor + 1, total + 2))  # exactly once, in order


async def test_epoch_and_cursor_survive_restart(target: StorageTarget) -> None:
    async with open_storage(target) as st:
        await create(st)
        before = st.hub.current_cursor()
        await append(st, "c1", "m1")
    async with open_storage(target) as st:
        assert st.epoch == before.epoch
        assert st.hub.current_cursor().offset == 2
        events = await collect(st.hub.events(before), 1)
        assert [e.cursor.offset for e in events] == [2]  # type: ignore[union-attr]
        assert await append(st, "c1", "m2") == 3  # the counter continues


async def test_gap_errors_for_evicted_foreign_and_future_cursors(target: StorageTarget) -> None:
    async with open_storage(target, outbox_cap=5) as st:
        await create(st)
        for i in range(10):
            await append(st, "c1", f"m{i}")
        assert st.hub.current_cursor().offset == 11
        assert st.hub.oldest_cursor().offset == 6  # offsets 7..11 retained
        bad = [Cursor(epoch=st.epoch, offset=5), Cursor(epoch="other", offset=11),
               Cursor(epoch=st.epoch, offset=12)]
        for cursor in bad:
            with pytest.raises(OutboxGapError) as info:
                await collect(st.hub.events(cursor), 1)
            assert info.value.oldest == st.hub.oldest_cursor()
            assert info.value.current == st.hub.current_cursor()
        # the oldest live cursor still replays everything retained
        events = await collect(st.hub.events(st.hub.oldest_cursor()), 5)
        assert [e.cursor.offset for e in events] == [7, 8, 9, 10, 11]  # type: ignore[union-attr]


async def test_eviction_while_replaying_is_a_gap_not_a_skip(
    target: StorageTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_module, "REPLAY_PAGE", 3)
    async with open_storage(target, outbox_cap=20) as st:
        await create(st)
        for i in range(10):
            await append(st, "c1", f"m{i}")
        it = st.hub.events(Cursor(epoch=st.epoch, offset=0))
        first = await it.__anext__()
        assert first.cursor is not None and first.cursor.offset == 1
        for i in range(30):  # evicts everything the reader has not replayed yet
            await append(st, "c1", f"n{i}")
        with pytest.raises(OutboxGapError):
            with trio.fail_after(10):
                while True:
                    await it.__anext__()
        await it.aclose()  # type: ignore[attr-defined]


async def test_ttl_trims_the_outbox(target: StorageTarget) -> None:
    """The writer's clock dates every event; the transaction at time t drops exactly the offsets
    older than t - TTL (a prefix), nothing younger."""
    now = [1000.0]
    async with open_storage(target, outbox_ttl=10.0, clock=lambda: now[0]) as st:
        await create(st)  # offset 1, t=1000
        now[0] = 1005.0
        await append(st, "c1", "m1")  # offset 2, t=1005: offset 1 is 5 s old and stays
        assert st.hub.oldest_cursor().offset == 0
        now[0] = 1012.0
        await append(st, "c1", "m2")  # offset 3, t=1012: offset 1 (12 s) goes, offset 2 (7 s) stays
        assert st.hub.oldest_cursor().offset == 1
        conv = await st.reader.get_conversation("c1")
        assert conv is not None and conv.created_at == 1000.0  # stored times are the writer's clock


async def test_stalled_subscriber_never_blocks_writer_and_catches_up(target: StorageTarget) -> None:
    async with open_storage(target, subscriber_buffer=4) as st:
        await create(st)
        start = st.hub.current_cursor()
        stalled = st.hub.events(start)
        live = st.hub.events(start)
        got_live: list[int] = []
        total = 100

        async def consume_live() -> None:
            with trio.fail_after(10):
                async for ev in live:
                    assert ev.cursor is not None
                    got_live.append(ev.cursor.offset)
                    if len(got_live) == total:
                        return

        async with trio.open_nursery() as n:
            n.start_soon(consume_live)
            # the stalled reader takes one event and then stops reading
            first_task_result: list[CommonEvent] = []

            async def take_one() -> None:
                first_task_result.append(await stalled.__anext__())

            n.start_soon(take_one)
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(10):  # the writer is never held up by the stalled buffer
                for i in range(total):
                    await append(st, "c1", f"m{i}")
        assert got_live == list(range(2, 2 + total))
        # the stalled subscriber overflowed and was dropped from the hub...
        assert st.hub.subscriber_count == 1
        # ...and when it reads again it catches up from the stored outbox, exactly once, in order
        rest = await collect(stalled, total - 1)
        offsets = [first_task_result[0].cursor.offset] + [e.cursor.offset for e in rest]  # type: ignore[union-attr]
        assert offsets == list(range(2, 2 + total))
        await stalled.aclose()  # type: ignore[attr-defined]
        await live.aclose()  # type: ignore[attr-defined]


def test_refused_op_hands_its_seqs_back(tmp_path: Path) -> None:
    """A send to a missing conversation takes its seq before it is refused (existence is checked by
    the row count of the conversation update); its SAVEPOINT rollback must hand that seq back, so
    the ops after it in the same batch continue without a hole and nothing of it is stored."""
    w = Writer(str(tmp_path / "r.db"), synchronous="FULL", outbox_cap=1000, outbox_ttl=3600)
    w.commit_batch([ops.CreateConversation(conversation_id="c1", title=None, is_temporal=False,
                                           system_prompt="s")])

    def send(cid: str, mid: str) -> ops.AppendUserMessage:
        return ops.AppendUserMessage(conversation_id=cid, message_id=mid,
                                     message=UserMessage(content=[Text(body=mid)]))

    batch = [send("c1", "m1"), send("missing", "x1"), send("c1", "m2"), send("missing", "x2"),
             send("c1", "m3")]
    result = w.commit_batch(batch)
    assert [type(r) for r in result.results][1::2] == [NotFoundError, NotFoundError]
    assert [r.seq for r in result.results[0::2]] == [2, 3, 4]
    assert [e.offset for e in result.events] == [2, 3, 4]  # contiguous: no hole per refusal
    assert (result.oldest, result.head, w.next_seq) == (1, 4, 5)
    rows = w.conn.execute('SELECT "offset" FROM outbox ORDER BY "offset"').fetchall()
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    assert w.conn.execute("SELECT COUNT(*) FROM message WHERE conversation_id='missing'").fetchone()[0] == 0
    assert w.conn.execute("SELECT COUNT(*) FROM turn WHERE conversation_id='missing'").fetchone()[0] == 0
    w.close()


async def test_refused_op_through_the_actor(target: StorageTarget) -> None:
    async with open_storage(target) as st:
        await create(st)

        async def bad() -> None:
            with pytest.raises(NotFoundError):
                await append(st, "missing", "x1")

        async with trio.open_nursery() as n:
            n.start_soon(bad)
            for i in range(5):
                n.start_soon(lambda i=i: append(st, "c1", f"m{i}"))
        journal = await st.reader.journal(None, 0, None, 100)
        assert sorted(r.seq for r in journal) == [2, 3, 4, 5, 6]  # no hole where the refusal was
        assert st.hub.current_cursor().offset == 6


def test_failed_write_is_not_acknowledged_and_service_recovers(tmp_path: Path) -> None:
    """Disk full (SQLite's max_page_count): the batch fails whole, nothing of it is stored, the
    counter does not move; once space is back, writes succeed with contiguous seqs."""
    path = str(tmp_path / "full.db")
    w = Writer(path, synchronous="FULL", outbox_cap=1000, outbox_ttl=3600)
    create_op = ops.CreateConversation(conversation_id="c1", title=None, is_temporal=False, system_prompt="s")
    w.commit_batch([create_op])
    pages = w.conn.execute("PRAGMA page_count").fetchone()[0]
    w.conn.execute(f"PRAGMA max_page_count = {pages}")
    big = [ops.AppendUserMessage(conversation_id="c1", message_id=f"m{i}",
                                 message=UserMessage(content=[Text(body="x" * 5000)])) for i in range(20)]
    with pytest.raises(StorageError, match="full"):
        w.commit_batch(big)
    assert w.next_seq == 2
    assert w.conn.execute("SELECT COUNT(*) FROM message").fetchone()[0] == 0
    w.conn.execute("PRAGMA max_page_count = 1000000")
    result = w.commit_batch(big[:3])
    assert [e.offset for e in result.events] == [2, 3, 4]
    w.close()


async def test_unopenable_database_is_a_storage_error(tmp_path: Path) -> None:
    from agentik import Config, open_runtime
    from agentik.tools.base import NoTools

    cfg = Config(db_path=str(tmp_path / "missing-dir" / "x.db"), openai_base_url="http://127.0.0.1:9")
    with pytest.raises(StorageError, match="cannot open database"):
        async with open_runtime(cfg, tools=NoTools()):
            pass


def test_schema_version_recorded_and_newer_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "v.db")
    Writer(path, synchronous="FULL", outbox_cap=10, outbox_ttl=10).close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(
        SCHEMA_VERSION)
    conn.execute("UPDATE meta SET value='999' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StorageError, match="newer"):
        Writer(path, synchronous="FULL", outbox_cap=10, outbox_ttl=10)


def test_one_writer_per_database(tmp_path: Path) -> None:
    """A second runtime on the same file (e.g. two hypercorn workers) is refused, not allowed to
    run a second counter."""
    path = str(tmp_path / "lock.db")
    first = Writer(path, synchronous="FULL", outbox_cap=10, outbox_ttl=10)
    with pytest.raises(StorageError, match="in use by another agentik process"):
        Writer(path, synchronous="FULL", outbox_cap=10, outbox_ttl=10)
    first.close()
    Writer(path, synchronous="FULL", outbox_cap=10, outbox_ttl=10).close()  # free again


async def test_clean_shutdown_checkpoints_the_wal(db_path: str) -> None:
    async with open_storage(StorageTarget("sqlite", db_path, None)) as st:
        await create(st)
    assert not await trio.Path(db_path + "-wal").exists()


async def test_idempotency_keys_replay_refuse_and_survive_restart(target: StorageTarget) -> None:
    """Both engines: a stored key replays the first id and stores nothing, another body with
    it is refused, two ops with one key in one batch store once, and keys survive a restart."""
    from agentik.errors import IdempotencyKeyReusedError

    def send(mid: str, key: str, fp: str = "fp-a") -> ops.AppendUserMessage:
        return ops.AppendUserMessage(
            conversation_id="c1", message_id=mid, message=UserMessage(content=[Text("x")]),
            idempotency=ops.Idempotency(key=key, fingerprint=fp, ttl=3600.0))

    async with open_storage(target) as st:
        await create(st)
        first = await st.write(send("m1", "k1"))
        assert first.id == "m1"
        again = await st.write(send("m2", "k1"))
        assert isinstance(again, ops.Replayed) and again.result_id == "m1"
        with pytest.raises(IdempotencyKeyReusedError):
            await st.write(send("m3", "k1", fp="fp-b"))
        results: list[object] = []

        async def one(mid: str) -> None:
            results.append(await st.write(send(mid, "k2")))

        async with trio.open_nursery() as n:  # likely one batch: the second replays the first
            n.start_soon(one, "m4")
            n.start_soon(one, "m5")
        stored = [r for r in results if not isinstance(r, ops.Replayed)]
        assert len(stored) == 1
        journal = await st.reader.journal(None, 0, None, 1000)
        ids = [r.id for r in journal]
        assert ids == ["m1", stored[0].id]  # type: ignore[attr-defined]
    async with open_storage(target) as st:
        replay = await st.write(send("m6", "k1"))
        assert isinstance(replay, ops.Replayed) and replay.result_id == "m1"
