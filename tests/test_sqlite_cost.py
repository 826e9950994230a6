"""The SQLite writer's cheaper per-event work (issue 13, durable rate): ops dispatched by type,
payloads bound as bytearrays, rows written in one executemany per table, the outbox trim run
only when something can be trimmed. Each keeps what the slower form stored."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from agentik.errors import StorageError
from agentik.storage import apply, ops
from agentik.storage.sqlite.writer import Writer
from agentik.storage.types import KINDS
from agentik.wire import Text, UserItem, UserMessage, decode_common_event, encode
from agentik.wire_pause import ApprovalAnswer, ApprovalRequest, InputAnswer, InputRequest
from tests.test_pg_plan import TRICKY
from tests.test_pg_plan import _ops as journal_ops
from tests.test_storage_batch import _create, _send


def test_every_op_has_its_one_definition() -> None:
    """Both engines dispatch ops by exact type through the one table of definitions
    (``storage/apply.py``): an op added to ``ops.AnyOp`` and missing from it would be a
    KeyError at its first write."""
    assert set(apply.APPLY) == set(typing.get_args(ops.AnyOp))


def test_payloads_are_stored_as_blobs_of_their_json(tmp_path: Path) -> None:
    """A payload bound as a bytearray is stored as the BLOB a bytes value was: the same JSON."""
    w = Writer(str(tmp_path / "p.db"), synchronous="FULL", outbox_cap=1000, outbox_ttl=3600)
    result = w.commit_batch([_create("c"), _send("c", "m1")])
    conn = w.conn
    rows = conn.execute("SELECT typeof(payload), payload FROM message").fetchall()
    assert rows == [("blob", encode(UserMessage(content=[Text(body="m1")])))]
    types = {r[0] for r in conn.execute("SELECT typeof(payload) FROM working_memory")}
    assert types == {"blob"}
    outbox = conn.execute('SELECT typeof(payload), payload FROM outbox ORDER BY "offset"')
    assert [(t, bytes(p)) for t, p in outbox] == [("blob", ev.raw) for ev in result.events]
    assert [type(ev.raw) for ev in result.events] == [bytes, bytes]
    assert decode_common_event(result.events[1].raw) == result.events[1].event
    w.close()


def test_pending_rows_are_written_before_an_op_that_reads_them(tmp_path: Path) -> None:
    """Sends leave their journal and turn rows pending; an op of another kind later in the batch
    finds them: a turn started and finished in the batch of its message, a conversation deleted
    with the messages sent to it in the batch."""
    w = Writer(str(tmp_path / "r.db"), synchronous="FULL", outbox_cap=1000, outbox_ttl=3600)
    w.commit_batch([_create("c1"), _create("c2")])
    result = w.commit_batch([
        _send("c1", "a1"), _send("c1", "a2"),
        ops.StartTurn(conversation_id="c1", turn_id="a1", item=UserItem(content=[Text("a1")])),
        _send("c2", "b1"), _send("c1", "a3"),
        ops.FinishTurn(conversation_id="c1", turn_id="a1", interrupted=True),
        _send("c2", "b2"),
        ops.DeleteConversation(conversation_id="c2"),
        _send("c1", "a4"),
    ])
    assert not any(isinstance(r, Exception) for r in result.results)
    conn = w.conn
    assert conn.execute("SELECT id FROM message ORDER BY seq").fetchall() == [
        ("a1",), ("a2",), ("a3",), ("a4",)]
    assert sorted(conn.execute("SELECT id, state FROM turn")) == [
        ("a2", "queued"), ("a3", "queued"), ("a4", "queued")]
    seqs = [r[0] for r in conn.execute("SELECT seq FROM message ORDER BY seq")]
    offsets = {ev.offset for ev in result.events}
    assert set(seqs) <= offsets and w.next_seq - 1 == max(offsets)
    w.close()


def test_a_message_id_taken_twice_in_a_batch_fails_it_whole(tmp_path: Path) -> None:
    w = Writer(str(tmp_path / "d.db"), synchronous="FULL", outbox_cap=1000, outbox_ttl=3600)
    w.commit_batch([_create("c1")])
    with pytest.raises(StorageError):
        w.commit_batch([_send("c1", "m1"), _send("c1", "m2"), _send("c1", "m1")])
    assert w.next_seq == 2
    assert w.conn.execute("SELECT count(*) FROM message").fetchone() == (0,)
    assert w.conn.execute('SELECT count(*) FROM outbox').fetchone() == (1,)
    result = w.commit_batch([_send("c1", "m1")])
    assert result.events[0].offset == 2
    w.close()


def _retained(w: Writer) -> list[int]:
    return [r[0] for r in w.conn.execute('SELECT "offset" FROM outbox ORDER BY "offset"')]


def test_trims_run_when_due_and_keep_cap_and_ttl(tmp_path: Path) -> None:
    """The writer skips the trims when nothing can be trimmed (known from its own ``oldest`` and
    the oldest time it keeps), and still retains exactly what trimming on every commit would: the
    newest ``cap`` offsets minus every offset up to the newest one older than the TTL, a prefix
    even when the clock goes back; ``oldest`` is the lowest retained offset (next_seq when none),
    also after a reopen."""
    import random

    rng = random.Random(7)
    now = [1000.0]
    path = str(tmp_path / "t.db")
    cap, ttl = 7, 10.0

    def open_writer() -> Writer:
        return Writer(path, synchronous="OFF", outbox_cap=cap, outbox_ttl=ttl,
                      clock=lambda: now[0])

    w = open_writer()
    times: dict[int, float] = {}  # the model: offset -> created_at of every retained event
    w.commit_batch([_create("c")])
    times[1] = now[0]
    sent = 0
    for step in range(300):
        now[0] += rng.choice([0.0, 0.5, 1.0, 3.0, -2.0, 12.0, -15.0])  # and back at times
        n = rng.choice([0, 1, 1, 2, 5, 9])
        result = w.commit_batch([_send("c", f"m{sent + i}") for i in range(n)])
        sent += n
        for ev in result.events:
            times[ev.offset] = now[0]
        head = w.next_seq - 1
        if n:
            times = {o: t for o, t in times.items() if o > head - cap}
            old = [o for o, t in times.items() if t < now[0] - ttl]
            if old:
                times = {o: t for o, t in times.items() if o > max(old)}
        assert _retained(w) == sorted(times), step
        assert w.oldest == (min(times) if times else w.next_seq), step
        assert (result.oldest, result.head) == (w.oldest, head)
        if step % 50 == 49:
            w.close()
            w = open_writer()
            assert w.oldest == (min(times) if times else w.next_seq)
    w.close()


def test_the_trims_run_only_when_due(tmp_path: Path) -> None:
    statements: list[str] = []
    now = [1000.0]
    w = Writer(str(tmp_path / "s.db"), synchronous="OFF", outbox_cap=3, outbox_ttl=10.0,
               clock=lambda: now[0])
    w.conn.set_trace_callback(statements.append)
    w.commit_batch([_create("c"), _send("c", "m1")])  # offsets 1, 2
    assert not [s for s in statements if "DELETE FROM outbox" in s or "created_at <" in s]
    w.commit_batch([_send("c", "m2"), _send("c", "m3")])  # 3, 4: the cap trims 1
    assert sum("DELETE FROM outbox " in s for s in statements) == 1
    assert (w.oldest, _retained(w)) == (2, [2, 3, 4])
    statements.clear()
    now[0] = 1011.0
    w.commit_batch([_send("c", "m4")])  # 5: the cap trims 2, the TTL 3 and 4 (t=1000)
    assert sum("DELETE FROM outbox " in s for s in statements) == 2
    assert (w.oldest, _retained(w)) == (5, [5])
    statements.clear()
    now[0] = 1015.0
    w.commit_batch([_send("c", "m5")])  # 6: nothing is due (5 is 4 s old)
    assert not [s for s in statements if "outbox" in s and "INSERT" not in s]
    assert (w.oldest, _retained(w)) == (5, [5, 6])
    w.close()


def test_rows_insert_writes_every_row_in_few_statement_shapes(tmp_path: Path) -> None:
    """``RowsInsert`` writes n rows, in order, as one statement per 64 rows and one per power of
    two of the rest: seven shapes of statement whatever the batch sizes."""
    import sqlite3

    from agentik.storage.sqlite.rows import RowsInsert

    conn = sqlite3.connect(str(tmp_path / "i.db"), isolation_level=None)
    conn.execute("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT, c BLOB)")
    insert = RowsInsert("INSERT INTO t (a, b, c)", "({}, {}, {})")
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    start = 0
    counts: dict[int, int] = {}
    for n in (0, 1, 2, 3, 63, 64, 65, 100, 127, 128, 200):
        statements.clear()
        values: list[object] = []
        for i in range(n):
            values += (start + i, f"r{start + i}", bytearray(b"x"))
        insert(conn, values)
        counts[n] = len(statements)
        start += n
    assert counts == {0: 0, 1: 1, 2: 1, 3: 2, 63: 6, 64: 1, 65: 2, 100: 3, 127: 7, 128: 2,
                      200: 4}
    rows = conn.execute("SELECT a, b, c FROM t ORDER BY a").fetchall()
    assert rows == [(i, f"r{i}", b"x") for i in range(start)]
    assert len(insert.sql) == 7


def test_oldest_is_read_back_if_a_seq_had_no_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_trim``'s sums stand on every seq having its event: a batch that ever took a seq with
    none makes the writer read ``oldest`` back instead."""
    w = Writer(str(tmp_path / "h.db"), synchronous="OFF", outbox_cap=3, outbox_ttl=3600)
    w.commit_batch([_create("c"), _send("c", "m1"), _send("c", "m2")])  # 1, 2, 3
    real = apply.APPLY[ops.AppendUserMessage]

    def holey(t, op):  # type: ignore[no-untyped-def]
        if op.message_id == "hole":
            t.alloc()  # a seq, no event, no outbox row
            return None
        return real(t, op)

    monkeypatch.setitem(apply.APPLY, ops.AppendUserMessage, holey)
    # 4, (5), 6, 7: the cap trims 1-4, and 5 is no row
    w.commit_batch([_send("c", "m3"), _send("c", "hole"), _send("c", "m4"), _send("c", "m5")])
    assert _retained(w) == [6, 7]
    assert w.oldest == 6
    w.close()


@pytest.mark.parametrize("body", TRICKY)
def test_a_journal_row_s_payload_is_its_message_s_json(tmp_path: Path, body: str) -> None:
    """A journal row's payload is cut from its event's encoding (``sqlite.rows.journal``): it is
    exactly the message encoded on its own, for every op that journals, tricky text included;
    the event and its outbox row are the record's."""
    w = Writer(str(tmp_path / "j.db"), synchronous="FULL", outbox_cap=1000, outbox_ttl=3600)
    cid = 'c"message":'
    w.commit_batch([ops.CreateConversation(conversation_id=cid, title=None, is_temporal=False,
                                           system_prompt="s")])
    batch = [op for op in journal_ops(cid, body) if not isinstance(op, ops.RenameConversation)]
    result = w.commit_batch(batch)
    assert not any(isinstance(r, Exception) for r in result.results)
    rows = w.conn.execute("SELECT id, payload FROM message ORDER BY seq").fetchall()
    records = {ev.event.event.record.id: ev.event.event.record  # type: ignore[union-attr]
               for ev in result.events if hasattr(ev.event.event, "record")}
    assert [r[0] for r in rows] == list(records)
    for mid, payload in rows:
        assert payload == encode(records[mid].message)
    outbox = w.conn.execute('SELECT payload FROM outbox WHERE "offset" >= ? ORDER BY "offset"',
                            (result.events[0].offset,)).fetchall()
    assert [bytes(p[0]) for p in outbox] == [ev.raw for ev in result.events]
    assert [decode_common_event(ev.raw) for ev in result.events] == [
        ev.event for ev in result.events]
    w.close()


def test_coded_columns_are_stored_as_their_text(tmp_path: Path) -> None:
    """An outbox row's kind, a journal row's type and a turn's state are bound as small ints and
    stored as their text by the statement (``sqlite.rows.RowsInsert``'s CASE): every kind, every
    message type and both states come back as the text they stood for; the batch's one time is
    every row's."""
    from agentik.storage.sqlite import rows as sqlite_rows

    now = [1234.5]
    w = Writer(str(tmp_path / "k.db"), synchronous="OFF", outbox_cap=1000, outbox_ttl=3600,
               clock=lambda: now[0])
    w.commit_batch([_create("c")])
    result = w.commit_batch([
        *journal_ops("c", "b"), _send("c", "queued-one"),
        # a round's pauses and their answers (no turn: the turn rows below stay queued)
        ops.AppendToolCalls(conversation_id="c", item=None, calls=(), pauses=(
            ("p1", ApprovalRequest(call_id="9", tool="n", arguments="{}")),
            ("p2", InputRequest(call_id="8", question="which?")))),
        ops.AnswerPause(conversation_id="c", message_id="p3",
                        answer=ApprovalAnswer(call_id="9", approve=True), resume=False),
        ops.AnswerPause(conversation_id="c", message_id="p4",
                        answer=InputAnswer(call_id="8", text="that"), resume=False),
        ops.PutA2ATask(task_id="t", context_id="x", conversation_id="c", state="working",
                       expect_seq=None, task=b"{}", update=b"{}"),
    ])
    assert not any(isinstance(r, Exception) for r in result.results)
    conn = w.conn
    outbox = conn.execute('SELECT "offset", kind, created_at FROM outbox ORDER BY "offset"')
    assert [(o, k) for o, k, _ in outbox] == [(1, "agent")] + [
        (ev.offset, ev.kind) for ev in result.events]
    assert {ev.kind for ev in result.events} | {"agent"} == set(KINDS.values())
    types = conn.execute("SELECT type, created_at FROM message ORDER BY seq").fetchall()
    tags = [ev.event.event.record.message.__struct_config__.tag  # type: ignore[union-attr]
            for ev in result.events if hasattr(ev.event.event, "record")]
    assert [t for t, _ in types] == tags
    assert set(tags) == {c.__struct_config__.tag for c in typing.get_args(sqlite_rows.Message)}
    assert {t for _, t in types} == {1234.5}
    assert sorted(conn.execute("SELECT id, state FROM turn")) == [
        ("g1", "queued"), ("queued-one", "queued"), ("u-b", "queued")]
    w.commit_batch([ops.AppendUserMessage(conversation_id="c", message_id="s",
                                          message=UserMessage(content=[Text(body="s")]),
                                          start=UserItem(content=[Text("s")]))])
    assert conn.execute("SELECT state FROM turn WHERE id='s'").fetchone() == ("running",)
    w.close()


@pytest.mark.parametrize("refused", [False, True])
def test_a_row_s_constraint_error_fails_the_batch_whole(tmp_path: Path, refused: bool) -> None:
    """The row inserts are OR ROLLBACK (no statement journal): a message id taken in another
    conversation ends the transaction, in the first pass or in the SAVEPOINT pass (a refused op
    in the batch); nothing of the batch is stored and the next batch commits as if it never
    came."""
    w = Writer(str(tmp_path / "u.db"), synchronous="OFF", outbox_cap=1000, outbox_ttl=3600)
    w.commit_batch([_create("c1"), _create("c2")])
    batch: list[ops.AnyOp] = [_send("c1", "m1"), _send("c2", "m1")]
    if refused:
        batch.insert(1, _send("missing", "x"))
    with pytest.raises(StorageError):
        w.commit_batch(batch)
    conn = w.conn
    assert not conn.in_transaction and w.next_seq == 3
    for table in ("message", "turn"):
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    assert _retained(w) == [1, 2]
    result = w.commit_batch([_send("c2", "m1")])
    assert [ev.offset for ev in result.events] == [3] and _retained(w) == [1, 2, 3]
    w.close()
