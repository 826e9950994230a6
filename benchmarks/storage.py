"""Storage scenarios: group commit vs one commit per event."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from agentik.ids import new_id
from agentik.storage import ops
from agentik.storage.actor import Storage, run_storage
from agentik.wire import Text, UserMessage


async def durable_events_per_s(open_storage: Callable[..., Awaitable[None]], *, writers: int,
                               per_writer: int) -> tuple[float, int]:
    """``writers`` tasks each storing ``per_writer`` user messages at once through the storage
    actor that ``open_storage`` (``run_storage`` with its engine's arguments) starts: durable
    events/s and the largest batch the actor committed. Message ids are made as agentik makes
    them (``agentik.ids.new_id``): they are index keys, and their order matters to the commit."""
    async with trio.open_nursery() as nursery:
        storage: Storage = await nursery.start(open_storage)
        await storage.write(ops.CreateConversation(conversation_id="c", title=None, is_temporal=False,
                                                   system_prompt="s"))
        message = UserMessage(content=[Text(body="x" * 200)])

        async def writer(w: int) -> None:
            for _ in range(per_writer):
                await storage.write(ops.AppendUserMessage(
                    conversation_id="c", message_id=new_id(), message=message))

        start = time.perf_counter()
        async with trio.open_nursery() as inner:
            for w in range(writers):
                inner.start_soon(writer, w)
        elapsed = time.perf_counter() - start
        largest = storage.stats.largest_batch
        nursery.cancel_scope.cancel()
    return writers * per_writer / elapsed, largest


async def _durable_events_per_s(path: str, *, max_batch: int, writers: int, per_writer: int) -> float:
    rate, _ = await durable_events_per_s(
        partial(run_storage, path, synchronous="FULL", max_batch=max_batch),
        writers=writers, per_writer=per_writer)
    return rate


async def storage_group_commit(quick: bool) -> dict[str, Any]:
    """Durable events/s through the StorageActor, 64 concurrent writers, synchronous=FULL:
    group commit (batches up to 512) vs one commit per event (max_batch=1), same run; beside
    them, plain sqlite3 on the same disk storing this benchmark's rows (an outbox row, a journal
    row and a turn row an event, the conversation's seq a commit) in batches of 64 (what 64
    writers make) vs one commit an event: what SQLite itself gives, and its own ratio."""
    writers = 64
    per_writer = 20 if quick else 80
    with tempfile.TemporaryDirectory() as tmp:
        grouped = await _durable_events_per_s(str(Path(tmp) / "g.db"), max_batch=512,
                                              writers=writers, per_writer=per_writer)
        single = await _durable_events_per_s(str(Path(tmp) / "s.db"), max_batch=1,
                                             writers=writers, per_writer=per_writer // 4)
        plain = await trio.to_thread.run_sync(
            _plain_events_per_s, str(Path(tmp) / "p.db"), writers, writers * per_writer)
        plain_single = await trio.to_thread.run_sync(
            _plain_events_per_s, str(Path(tmp) / "q.db"), 1, writers * per_writer // 4)
    return {
        "name": "storage_group_commit",
        "events_per_s": round(grouped),
        "baseline_events_per_s": round(single),
        "ratio": round(grouped / single, 1),
        "plain_batch64_events_per_s": round(plain),
        "plain_one_commit_events_per_s": round(plain_single),
        "plain_ratio": round(plain / plain_single, 1),
    }


def _plain_events_per_s(path: str, batch: int, events: int) -> float:
    """Plain sqlite3 with agentik's pragmas (WAL, synchronous=FULL) and schema: the rows of
    ``events`` user messages (payloads of the sizes agentik stores for this benchmark's
    200-character message) in commits of ``batch``, no actor, no planning."""
    from agentik.storage.sqlite.schema import migrate
    from agentik.storage.sqlite.writer import open_connection

    conn = open_connection(path, synchronous="FULL")
    try:
        migrate(conn)
        conn.execute("INSERT INTO conversation (id, title, is_temporal, created_at, updated_at,"
                     " seq) VALUES ('c', NULL, 0, 1.0, 1.0, 0)")
        outbox, journal = b"x" * 470, b"x" * 280
        seq = 1
        start = time.perf_counter()
        for _ in range(events // batch):
            offsets = range(seq, seq + batch)
            conn.execute("BEGIN")
            conn.executemany(
                'INSERT INTO outbox ("offset", conversation_id, kind, created_at, payload) '
                "VALUES (?, 'c', 'conversation', 1.0, ?)", [(o, outbox) for o in offsets])
            conn.executemany(
                "INSERT INTO message (seq, id, conversation_id, type, created_at, payload) "
                "VALUES (?, ?, 'c', 'user', 1.0, ?)", [(o, new_id(), journal) for o in offsets])
            conn.executemany(
                "INSERT INTO turn (conversation_id, id, state, seq) VALUES ('c', ?, 'queued', ?)",
                [(f"t{o}", o) for o in offsets])
            conn.execute("UPDATE conversation SET seq = ?, updated_at = 2.0 WHERE id = 'c'",
                         (seq + batch - 1,))
            conn.execute("COMMIT")
            seq += batch
        return (events // batch) * batch / (time.perf_counter() - start)
    finally:
        conn.close()


async def storage_full_outbox(quick: bool) -> dict[str, Any]:
    """The same measurement as storage_group_commit, but on a database whose outbox already holds
    100,000 events (30,000 with --quick), as it does in steady state with the default
    AGENTIK_OUTBOX_CAP: every commit also runs the outbox trim (cap and TTL)."""
    from benchmarks.web import fill_outbox

    rows = 30_000 if quick else 100_000
    writers = 64
    per_writer = 10 if quick else 20
    with tempfile.TemporaryDirectory() as tmp:
        paths = [str(Path(tmp) / "g.db"), str(Path(tmp) / "s.db")]
        for path in paths:
            await trio.to_thread.run_sync(fill_outbox, path, rows)
        # The fill writes ~160 MB with synchronous=OFF; left to the kernel's writeback, those
        # pages are flushed during the measurement and the WAL's fsyncs wait for them (ext4,
        # data=ordered): the row would measure the set-up. A server that has run for a while
        # has no such backlog.
        await trio.to_thread.run_sync(os.sync)
        grouped = await _durable_events_per_s(paths[0], max_batch=512, writers=writers,
                                              per_writer=per_writer)
        single = await _durable_events_per_s(paths[1], max_batch=1, writers=writers,
                                             per_writer=max(1, per_writer // 4))
    return {
        "name": "storage_full_outbox",
        "outbox_rows": rows,
        "events_per_s": round(grouped),
        "baseline_events_per_s": round(single),
    }
