"""The PostgreSQL writer plans a batch from the conversation rows its last commits left
(``PgWriter._known``) instead of reading them first (issue 17, durable rate); each remembered row
is checked inside the statement, so a row changed by anybody else meanwhile makes the batch be
planned again from a read: nothing is lost, doubled or overwritten."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentik.storage import ops
from agentik.storage.pg.writer import PgWriter
from agentik.wire import SystemItem, Text, UserMessage


def _writer(url: str) -> PgWriter:
    return PgWriter(url, outbox_cap=100_000, outbox_ttl=3600.0)


@pytest.fixture
def writers(pg_url: str) -> Iterator[tuple[PgWriter, PgWriter]]:
    a = _writer(pg_url)
    b = _writer(pg_url)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _send(mid: str) -> ops.AppendUserMessage:
    return ops.AppendUserMessage(conversation_id="c", message_id=mid,
                                 message=UserMessage(content=[Text(body=mid)]),
                                 start=SystemItem(text=f"turn {mid}"))


def test_a_batch_of_remembered_conversations_reads_nothing_first(
    writers: tuple[PgWriter, PgWriter]
) -> None:
    a, _ = writers
    a.commit_batch([ops.CreateConversation(conversation_id="c", title="t", is_temporal=False,
                                           system_prompt="s")])
    assert "c" in a._known
    executed: list[str] = []
    real = a.conn.execute

    def execute(sql: str, *args: object, **kw: object) -> object:
        executed.append(sql)
        return real(sql, *args, **kw)  # type: ignore[arg-type]

    a.conn.execute = execute  # type: ignore[assignment,method-assign]
    a.commit_batch([_send("m1"), _send("m2")])
    assert executed == []  # no read: the statement itself goes out through pg_send.Sender


def test_rows_changed_by_another_writer_are_read_again(
    writers: tuple[PgWriter, PgWriter]
) -> None:
    """A and B write the same conversation in turn (as two nodes may, one after the other):
    A's remembered row is stale each time; its batch must see B's rename, B's messages and B's
    working-memory items, not overwrite or collide with them."""
    a, b = writers
    a.commit_batch([ops.CreateConversation(conversation_id="c", title="t", is_temporal=False,
                                           system_prompt="s")])
    for i in range(3):
        a.commit_batch([_send(f"a{i}")])
        b.commit_batch([_send(f"b{i}"), ops.RenameConversation(conversation_id="c",
                                                                title=f"by b {i}")])
    a.commit_batch([_send("a-last")])
    conn = a.conn
    title, seq = conn.execute("SELECT title, seq FROM conversation WHERE id = 'c'").fetchone()
    assert title == "by b 2"  # A's remembered title "t" did not overwrite B's rename
    head = conn.execute("SELECT v FROM counter WHERE id = 1").fetchone()[0]
    assert seq == head  # the last journal row of c (A's message), not an older one
    order = [r[0] for r in conn.execute(
        "SELECT order_idx FROM working_memory WHERE conversation_id = 'c' ORDER BY order_idx")]
    assert order == list(range(1, 9))  # the system item + 7 turns: no index taken twice
    messages = [r[0] for r in conn.execute(
        "SELECT id FROM message WHERE conversation_id = 'c' ORDER BY seq")]
    assert messages == ["a0", "b0", "a1", "b1", "a2", "b2", "a-last"]


# --- planning batch k+1 while k runs (pg_flight; the writer thread's steps) ----------------------


def _create(w: PgWriter) -> None:
    w.commit_batch([ops.CreateConversation(conversation_id="c", title="t", is_temporal=False,
                                           system_prompt="s")])


def _state(w: PgWriter) -> dict[str, object]:
    conn = w.conn
    return {
        "messages": [r[0] for r in conn.execute(
            "SELECT id FROM message WHERE conversation_id = 'c' ORDER BY seq")],
        "order": [r[0] for r in conn.execute(
            "SELECT order_idx FROM working_memory WHERE conversation_id = 'c' ORDER BY order_idx")],
        "offsets": [r[0] for r in conn.execute('SELECT "offset" FROM outbox ORDER BY "offset"')],
        "title": conn.execute("SELECT title FROM conversation WHERE id = 'c'").fetchone()[0],
    }


def test_a_batch_planned_while_the_one_before_runs_is_stored_after_it(
    writers: tuple[PgWriter, PgWriter]
) -> None:
    a, _ = writers
    _create(a)
    first = a.begin([_send("m1"), _send("m2")])
    second = a.follow([_send("m3"), ops.RenameConversation(conversation_id="c", title="u")], first)
    assert second is not None
    a.land(first)
    assert first.exact and a.launch(second)
    a.land(second)
    assert second.exact
    one, two = a.result(first), a.result(second)
    assert [e.offset for e in one.events + two.events] == [2, 3, 4, 5]
    assert two.results[1].seq == 5 and two.results[1].title == "u"
    assert _state(a) == {"messages": ["m1", "m2", "m3"], "order": [1, 2, 3, 4],
                         "offsets": [1, 2, 3, 4, 5], "title": "u"}


def test_a_batch_planned_after_one_that_was_planned_again_is_not_sent(
    writers: tuple[PgWriter, PgWriter]
) -> None:
    """B changes the conversation, so A's remembered row is stale and A's first batch stores
    nothing and is planned again from a read: the batch A planned after it (on the stale row)
    must not be sent; planned again itself, it sees B's rows."""
    a, b = writers
    _create(a)
    a.commit_batch([_send("a0")])
    b.commit_batch([_send("b0"), ops.RenameConversation(conversation_id="c", title="by b")])
    first = a.begin([_send("a1")])
    second = a.follow([_send("a2")], first)
    assert second is not None
    a.land(first)
    assert not first.exact and not a.launch(second)
    third = a.begin([_send("a2")])
    a.land(third)
    assert _state(a) == {"messages": ["a0", "b0", "a1", "a2"], "order": [1, 2, 3, 4, 5],
                         "offsets": [1, 2, 3, 4, 5, 6], "title": "by b"}


def test_rows_changed_between_the_two_batches_are_read_again(
    writers: tuple[PgWriter, PgWriter]
) -> None:
    """B writes after A's first batch landed and before A's second (planned on the first's
    rows) is sent: the second's checks fail, it stores nothing and is planned again."""
    a, b = writers
    _create(a)
    first = a.begin([_send("a1")])
    second = a.follow([_send("a2")], first)
    assert second is not None
    a.land(first)
    b.commit_batch([_send("b1"), ops.RenameConversation(conversation_id="c", title="by b")])
    assert a.launch(second)
    a.land(second)
    assert not second.exact
    assert _state(a) == {"messages": ["a1", "b1", "a2"], "order": [1, 2, 3, 4],
                         "offsets": [1, 2, 3, 4, 5], "title": "by b"}


def test_what_needs_a_read_does_not_follow(writers: tuple[PgWriter, PgWriter]) -> None:
    a, _ = writers
    _create(a)
    first = a.begin([_send("m1")])
    keyed = ops.AppendUserMessage(conversation_id="c", message_id="k",
                                  message=UserMessage(content=[Text(body="k")]),
                                  idempotency=ops.Idempotency(key="K", fingerprint="f", ttl=60))
    new = ops.CreateConversation(conversation_id="d", title=None, is_temporal=False,
                                 system_prompt="s")
    unknown = ops.AppendUserMessage(conversation_id="nobody-remembers",  message_id="x",
                                    message=UserMessage(content=[Text(body="x")]))
    assert a.follow([keyed], first) is None
    assert a.follow([new], first) is None
    assert a.follow([unknown], first) is None
    assert a.follow([ops.RecoverTurns(conversation_id="c")], first) is None
    a.land(first)


def test_a_conversation_deleted_by_the_batch_before_is_gone_for_the_next(
    writers: tuple[PgWriter, PgWriter]
) -> None:
    a, _ = writers
    _create(a)
    first = a.begin([ops.DeleteConversation(conversation_id="c")])
    second = a.follow([_send("late")], first)
    assert second is not None
    a.land(first)
    assert a.launch(second)
    a.land(second)
    assert type(a.result(second).results[0]).__name__ == "NotFoundError"
    assert a.conn.execute("SELECT count(*) FROM message").fetchone()[0] == 0


async def test_the_writer_thread_plans_ahead_under_load_and_loses_nothing(pg_url: str) -> None:
    """200 writers, batches of at most 20, through the StorageActor: the writer thread plans
    batches while the one before runs (counted), and every write is stored once, in order per
    writer, with dense offsets and working-memory indexes."""
    from functools import partial

    import trio

    from agentik.storage.actor import Storage, run_storage

    async with trio.open_nursery() as nursery:
        st: Storage = await nursery.start(partial(run_storage, "unused.db", database_url=pg_url,
                                                  max_batch=20))
        await st.write(ops.CreateConversation(conversation_id="c", title=None,
                                              is_temporal=False, system_prompt="s"))

        async def writer(w: int) -> None:
            for i in range(5):
                await st.write(_send(f"w{w:03d}-{i}"))

        with trio.fail_after(60):
            async with trio.open_nursery() as inner:
                for w in range(200):
                    inner.start_soon(writer, w)
        journal = await st.reader.journal(None, 0, None, 2000)
        nursery.cancel_scope.cancel()
    assert st.stats.followed > 0
    ids = [r.id for r in journal]
    assert sorted(ids) == sorted(f"w{w:03d}-{i}" for w in range(200) for i in range(5))
    for w in range(200):  # each writer's messages in the order it wrote them
        mine = [x for x in ids if x.startswith(f"w{w:03d}-")]
        assert mine == [f"w{w:03d}-{i}" for i in range(5)]
    assert [r.seq for r in journal] == list(range(2, 1002))


def test_stale_fence_refuses_a_batch_planned_before_the_lease_was_lost_and_regained(
    pg_url: str
) -> None:
    """Node ``a`` holds conversation c (fence 1) and sends a batch planned with that fence;
    before the statement checks it, another node claims c (fence 2) and ``a`` claims it back
    (fence 3): ``a`` owns c again, but with a newer fence. The batch planned with fence 1 must
    store nothing (the statement's fence check: its owner's node AND fence), and is then planned
    again with fence 3 and stored once."""
    import psycopg

    from agentik.storage.pg.lease import Leases

    w = _writer(pg_url)
    w.leases = leases = Leases(pg_url, node_id="a", ttl=10.0, addr=None)
    try:
        w.commit_batch([ops.CreateConversation(conversation_id="c", title=None,
                                               is_temporal=False, system_prompt="s")])
        leases.fences["c"] = 1
        with psycopg.connect(pg_url) as other:  # the claims, held uncommitted: the row is locked
            other.execute("UPDATE conv_owner SET node_id = 'b', fence = 2 WHERE conversation_id = 'c'")
            other.execute("UPDATE conv_owner SET node_id = 'a', fence = 3 WHERE conversation_id = 'c'")
            flight = w.begin([_send("m1")])  # sent with fence 1; it waits for the row
            other.commit()
        leases.fences["c"] = 3  # the node learns it holds c again, with fence 3
        w.land(flight)
        assert flight.exact is False, "the batch planned with the stale fence was stored"
        assert [r.id for r in w.result(flight).results] == ["m1"]  # type: ignore[union-attr]
        stored = w.conn.execute("SELECT id FROM message WHERE conversation_id = 'c'").fetchall()
        assert stored == [("m1",)]
    finally:
        w.close()
