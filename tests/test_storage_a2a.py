"""A2A task storage (docs/A2A.md) on both engines: PutA2ATask writes the task row and its
TaskUpdated event under one seq, refuses a stale ``expect_seq`` without using a seq, the queries
page newest first, a conversation's tasks go with it (deleted, or a temporary one purged) and
none is stored for a conversation that is gone, and a version-1 SQLite database migrates to the
current version with its data kept."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import msgspec
import pytest
import trio

from agentik.errors import ConflictError, NotFoundError
from agentik.storage import ops
from agentik.storage.actor import Storage, run_storage
from agentik.storage.pg.writer import PgWriter
from agentik.storage.sqlite.schema import _V1, SCHEMA_VERSION
from agentik.storage.sqlite.writer import Writer
from agentik.wire import TaskUpdated
from tests.conftest import StorageTarget


@asynccontextmanager
async def open_storage(target: StorageTarget) -> AsyncIterator[Storage]:
    """On every engine (the ``target`` fixture: SQLite and PostgreSQL)."""
    async with trio.open_nursery() as nursery:
        storage: Storage = await nursery.start(partial(run_storage, target.path, database_url=target.url))
        yield storage
        nursery.cancel_scope.cancel()


def put(
    task_id: str, state: str, expect: int | None, context: str = "ctx", text: str = "x",
    conversation: str | None = None,
) -> ops.PutA2ATask:
    return ops.PutA2ATask(
        task_id=task_id, context_id=context, conversation_id=conversation or "conv-" + context,
        state=state,
        task=msgspec.json.encode({"id": task_id, "state": state, "text": text}),
        update=msgspec.json.encode({"statusUpdate": {"taskId": task_id, "state": state}}),
        expect_seq=expect,
    )


async def conversations(st: Storage, *ids: str, temporary: bool = False) -> None:
    for cid in ids:
        await st.write(ops.CreateConversation(conversation_id=cid, title=None,
                                              is_temporal=temporary, system_prompt="sys"))


async def test_put_task_row_and_event_share_one_seq(target: StorageTarget) -> None:
    async with open_storage(target) as st:
        await conversations(st, "conv-ctx")
        before = st.hub.current_cursor()
        seq1 = await st.write(put("t1", "TASK_STATE_WORKING", None))
        seq2 = await st.write(put("t1", "TASK_STATE_COMPLETED", seq1, text="done"))
        assert seq2 == seq1 + 1
        row = await st.reader.get_a2a_task("t1")
        assert row is not None
        assert (row.first_seq, row.seq, row.state) == (seq1, seq2, "TASK_STATE_COMPLETED")
        assert row.conversation_id == "conv-ctx"
        assert msgspec.json.decode(row.payload)["text"] == "done"
        events = []
        with trio.fail_after(10):
            async for ev in st.hub.events(before, kind="a2a"):
                events.append(ev)
                if len(events) == 2:
                    break
        assert [e.cursor.offset for e in events if e.cursor] == [seq1, seq2]
        last = events[-1].event
        assert isinstance(last, TaskUpdated)
        assert (last.task_id, last.context_id, last.state) == ("t1", "ctx", "TASK_STATE_COMPLETED")
        assert msgspec.json.decode(last.update) == {
            "statusUpdate": {"taskId": "t1", "state": "TASK_STATE_COMPLETED"}}
        assert events[-1].conversation_id == "conv-ctx"


async def test_stale_expect_seq_is_refused_and_uses_no_seq(target: StorageTarget) -> None:
    async with open_storage(target) as st:
        await conversations(st, "conv-ctx")
        seq1 = await st.write(put("t1", "TASK_STATE_WORKING", None))
        seq2 = await st.write(put("t1", "TASK_STATE_CANCELED", seq1))
        with pytest.raises(ConflictError):
            await st.write(put("t1", "TASK_STATE_COMPLETED", seq1))  # lost the race
        with pytest.raises(ConflictError):
            await st.write(put("t1", "TASK_STATE_WORKING", None))  # exists already
        row = await st.reader.get_a2a_task("t1")
        assert row is not None and row.state == "TASK_STATE_CANCELED"
        assert st.hub.current_cursor().offset == seq2  # the refused ops took no seq
        seq3 = await st.write(put("t2", "TASK_STATE_WORKING", None))
        assert seq3 == seq2 + 1


async def test_list_newest_first_paged_filtered_and_counted(target: StorageTarget) -> None:
    async with open_storage(target) as st:
        await conversations(st, "conv-a", "conv-b")
        firsts = {}
        for i in range(5):
            firsts[f"t{i}"] = await st.write(
                put(f"t{i}", "TASK_STATE_COMPLETED" if i % 2 else "TASK_STATE_WORKING", None,
                    context="a" if i < 3 else "b"))
        # A later change does not move a task in the listing (ordered by creation).
        await st.write(put("t0", "TASK_STATE_FAILED", firsts["t0"], context="a"))
        rows, total = await st.reader.list_a2a_tasks(None, None, None, 2)
        assert [r.id for r in rows] == ["t4", "t3"] and total == 5
        rows, total = await st.reader.list_a2a_tasks(None, None, rows[-1].first_seq, 2)
        assert [r.id for r in rows] == ["t2", "t1"] and total == 5
        rows, _ = await st.reader.list_a2a_tasks(None, None, rows[-1].first_seq, 2)
        assert [r.id for r in rows] == ["t0"]
        rows, total = await st.reader.list_a2a_tasks("a", None, None, 10)
        assert [r.id for r in rows] == ["t2", "t1", "t0"] and total == 3
        rows, total = await st.reader.list_a2a_tasks("a", "TASK_STATE_COMPLETED", None, 10)
        assert [r.id for r in rows] == ["t1"] and total == 1
        rows, total = await st.reader.list_a2a_tasks("nope", None, None, 10)
        assert rows == [] and total == 0
        latest = await st.reader.latest_a2a_task_of_context("b")
        assert latest is not None and latest.id == "t4"
        assert await st.reader.latest_a2a_task_of_context("nope") is None
        running = await st.reader.a2a_tasks_in_states(("TASK_STATE_WORKING", "TASK_STATE_SUBMITTED"))
        assert [r.id for r in running] == ["t2", "t4"]


async def test_a_conversations_tasks_go_with_it_and_none_is_stored_for_one_gone(
    target: StorageTarget,
) -> None:
    """Deleting a conversation deletes its A2A tasks in the same transaction (GetTask: not
    found; the context no longer maps to it); a temporary conversation purged at start-up takes
    its tasks too; a change for a task of a conversation that is gone is refused and takes no
    seq, so no task row outlives its conversation."""
    async with open_storage(target) as st:
        await conversations(st, "conv-a", "conv-b")
        await conversations(st, "conv-t", temporary=True)
        a1 = await st.write(put("a1", "TASK_STATE_COMPLETED", None, context="a"))
        a2 = await st.write(put("a2", "TASK_STATE_WORKING", None, context="a"))
        await st.write(put("b1", "TASK_STATE_COMPLETED", None, context="b"))
        await st.write(put("t1", "TASK_STATE_COMPLETED", None, context="t"))
        assert a2 == a1 + 1
        assert await st.write(ops.DeleteConversation(conversation_id="conv-a")) is True
        for gone in ("a1", "a2"):
            assert await st.reader.get_a2a_task(gone) is None
        assert await st.reader.latest_a2a_task_of_context("a") is None
        rows, total = await st.reader.list_a2a_tasks(None, None, None, 10)
        assert [r.id for r in rows] == ["t1", "b1"] and total == 2
        assert await st.reader.a2a_tasks_in_states(("TASK_STATE_WORKING",)) == []  # nothing to recover
        # The running task's last change, after its conversation went: refused, no seq used.
        head = st.hub.current_cursor().offset
        with pytest.raises(NotFoundError):
            await st.write(put("a2", "TASK_STATE_FAILED", a2, context="a"))
        with pytest.raises(NotFoundError):
            await st.write(put("a3", "TASK_STATE_WORKING", None, context="a"))
        assert st.hub.current_cursor().offset == head
        assert await st.reader.get_a2a_task("a2") is None
        # A temporary conversation's cleanup (start-up) takes its tasks too.
        assert await st.write(ops.PurgeTemporary()) == 1
        assert await st.reader.get_a2a_task("t1") is None
        b1 = await st.reader.get_a2a_task("b1")
        assert b1 is not None and b1.conversation_id == "conv-b"
        # A task with no conversation (an executor without one) needs none.
        await st.write(ops.PutA2ATask(
            task_id="n1", context_id="n", conversation_id=None, state="TASK_STATE_COMPLETED",
            task=b"{}", update=b"{}", expect_seq=None))
        assert await st.reader.get_a2a_task("n1") is not None


def test_tasks_of_a_conversation_deleted_in_the_same_batch_go_with_it(
    target: StorageTarget,
) -> None:
    """One batch creates a conversation, stores a task of it, deletes it, then tries another
    change: the task is not stored (the PostgreSQL statement cannot see its own inserts, so the
    plan must drop it) and the change after the deletion is refused."""
    if target.url is None:
        w: Writer | PgWriter = Writer(target.path, synchronous="FULL", outbox_cap=1000,
                                      outbox_ttl=3600)
    else:
        w = PgWriter(target.url, outbox_cap=1000, outbox_ttl=3600)
    try:
        create = ops.CreateConversation(conversation_id="conv-x", title=None, is_temporal=False,
                                        system_prompt="s")
        result = w.commit_batch([create, put("x1", "TASK_STATE_WORKING", None, context="x"),
                                 ops.DeleteConversation(conversation_id="conv-x"),
                                 put("x2", "TASK_STATE_WORKING", None, context="x")])
        assert result.results[2] is True and isinstance(result.results[3], NotFoundError)
        assert w.conn.execute("SELECT count(*) FROM a2a_task").fetchone() == (0,)
    finally:
        w.close()


def test_version_1_database_migrates_to_the_current_version_keeping_its_rows(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "v1.db")
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in _V1.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("INSERT INTO meta VALUES ('epoch', 'e1'), ('next_seq', '8'), "
                 "('schema_version', '1')")
    conn.execute("INSERT INTO conversation VALUES ('c1', NULL, 0, 1.0, 1.0, 7)")
    conn.close()
    # v2 a2a_task, v3 idempotency_key, v4 tasks by conversation, v5 marks, v6 a conversation's
    # agent, v7 users, v8 webhooks, v9 branch points
    assert SCHEMA_VERSION == 9
    w = Writer(path, synchronous="FULL", outbox_cap=1000, outbox_ttl=3600)
    try:
        assert w.epoch == "e1" and w.next_seq == 8
        version = w.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert version[0] == str(SCHEMA_VERSION)
        assert w.conn.execute("SELECT id FROM conversation").fetchall() == [("c1",)]
        assert w.conn.execute("SELECT count(*) FROM idempotency_key").fetchone() == (0,)
        result = w.commit_batch([put("t1", "TASK_STATE_WORKING", None, conversation="c1")])
        assert result.results == [8]
    finally:
        w.close()


async def test_streamed_chunks_are_stored_as_chunks_and_read_back_whole(
    target: StorageTarget
) -> None:
    """An artifact streamed in chunks (A2A's append updates) stores each chunk as its event
    only, not the whole task again: the row stays the last whole change. A reader that holds no
    copy (another node, a restart) gets the task with the chunks folded back in, and a stream
    from it goes on after them; the last chunk stores the whole task again."""
    from agentik.a2a.store import TaskStore
    from agentik.a2a.types import (
        WORKING,
        Artifact,
        Part,
        StreamResponse,
        Task,
        TaskArtifactUpdateEvent,
        TaskStatus,
        decode_task,
    )
    from agentik.agent_handles import TaskRecords

    def add(text: str, *, append: bool = True, last: bool = False):  # type: ignore[no-untyped-def]
        def change(task: Task) -> tuple[Task, StreamResponse]:
            from agentik.a2a.store import merge_artifact

            art = Artifact(artifact_id="a", parts=[Part(text=text)])
            return (msgspec.structs.replace(task, artifacts=merge_artifact(task.artifacts, art,
                                                                           append)),
                    StreamResponse(artifact_update=TaskArtifactUpdateEvent(
                        task_id="t", context_id="x", artifact=art, append=append,
                        last_chunk=last)))
        return change

    def text(task: Task) -> str:
        return "".join(p.text or "" for a in task.artifacts for p in a.parts)

    with trio.fail_after(30):
        async with open_storage(target) as st:
            await conversations(st, "c")
            store = TaskStore(TaskRecords(st))
            await store.create(Task(id="t", context_id="x", status=TaskStatus(state=WORKING)), "c")
            whole = await store.change("t", add("a", append=False))
            assert whole is not None
            await store.change("t", add("b"))
            await store.change("t", add("c"))
            row = await st.reader.get_a2a_task("t")
            assert row is not None and row.seq == whole.seq
            assert text(decode_task(row.payload)) == "a"  # the chunks are not in the row
            fresh = await TaskStore(TaskRecords(st)).get("t")  # no copy: folded from the outbox
            assert fresh is not None and text(fresh.task) == "abc" and fresh.seq == whole.seq
            assert fresh.after == whole.seq + 2
            final = await store.change("t", add("d", last=True))
            assert final is not None
            row = await st.reader.get_a2a_task("t")
            assert row is not None and row.seq == final.seq and text(decode_task(row.payload)) == "abcd"
            async for offset, _ in store.events(fresh):  # after the folded chunks: "d" only
                assert offset == final.seq
                break
