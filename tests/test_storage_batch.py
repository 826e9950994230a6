"""How one batch is applied (issue 13, durable rate): the SQLite writer runs a batch without a
SAVEPOINT per op and starts over with them only when an op is refused; a conversation's seq is
written once per batch; a write is queued without an extra schedule point but never for a caller
already cancelled; a full request queue still takes every write."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from agentik.errors import ConflictError, NotFoundError
from agentik.storage import apply, ops
from agentik.storage.actor import Storage, run_storage
from agentik.storage.sqlite.writer import Writer
from agentik.wire import Text, UserMessage
from tests.conftest import StorageTarget


def _writer(tmp_path: Path) -> Writer:
    w = Writer(str(tmp_path / "b.db"), synchronous="FULL", outbox_cap=1000, outbox_ttl=3600)
    w.commit_batch([_create("c1"), _create("c2")])
    return w


def _create(cid: str) -> ops.CreateConversation:
    return ops.CreateConversation(conversation_id=cid, title=None, is_temporal=False,
                                  system_prompt="s")


def _send(cid: str, mid: str) -> ops.AppendUserMessage:
    return ops.AppendUserMessage(conversation_id=cid, message_id=mid,
                                 message=UserMessage(content=[Text(body=mid)]))


def _stored(w: Writer) -> dict[str, Any]:
    conn = w.conn
    return {
        "messages": [r[0] for r in conn.execute("SELECT id FROM message ORDER BY seq")],
        "turns": sorted(r[0] for r in conn.execute("SELECT id FROM turn")),
        "offsets": [r[0] for r in conn.execute('SELECT "offset" FROM outbox ORDER BY "offset"')],
        "seqs": dict(conn.execute("SELECT id, seq FROM conversation").fetchall()),
    }


def test_op_refused_after_writing_rows_leaves_none_and_the_batch_runs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused op is rolled back alone even when it wrote rows before it was refused: the
    batch, first run without SAVEPOINTs, starts over with one per op; the ops before it are
    stored once, the ops after it continue the offsets without a hole, and its conversation keeps
    the seq it had before it."""
    w = _writer(tmp_path)
    real = apply.APPLY[ops.AppendUserMessage]

    def append_user(t: Any, op: ops.AppendUserMessage) -> Any:
        result = real(t, op)  # its message, turn and event are written, its seq taken
        if op.message_id == "bad":
            raise ConflictError("refused after writing")
        return result

    # both passes (``apply_all``, then ``apply_op`` in SAVEPOINTs) dispatch through APPLY
    monkeypatch.setitem(apply.APPLY, ops.AppendUserMessage, append_user)
    # "bad" bumps c1 again (to the seq m2 then takes, for c2) before it is refused.
    result = w.commit_batch([_send("c1", "m1"), _send("c1", "bad"), _send("c2", "m2")])
    assert isinstance(result.results[1], ConflictError)
    assert [r.seq for r in (result.results[0], result.results[2])] == [3, 4]
    assert [e.offset for e in result.events] == [3, 4]
    assert (result.head, w.next_seq) == (4, 5)
    stored = _stored(w)
    assert stored["messages"] == ["m1", "m2"]
    assert stored["turns"] == ["m1", "m2"]
    assert stored["offsets"] == [1, 2, 3, 4]
    assert stored["seqs"] == {"c1": 3, "c2": 4}
    w.close()


def test_conversation_seq_is_its_last_change_in_a_batch(tmp_path: Path) -> None:
    """Each conversation's row gets the seq of its last change of the batch (run without
    SAVEPOINTs: nothing refused), whatever came between: a rename, a turn's end with its
    touched, a deletion and a new conversation of the same id."""
    w = _writer(tmp_path)
    batch: list[ops.AnyOp] = [
        _send("c1", "a1"), _send("c2", "b1"), _send("c1", "a2"),          # 3 4 5
        ops.RenameConversation(conversation_id="c1", title="t"),          # 6
        _send("c1", "a3"),                                                # 7
        ops.FinishTurn(conversation_id="c1", turn_id="a1", interrupted=True),  # 8 + touched 9
        _send("c1", "a4"),                                                # 10
        _send("c2", "b2"),                                                # 11
        ops.DeleteConversation(conversation_id="c2"),                     # 12 closing, 13 deleted
        _create("c2"),                                                    # 14
        _send("c2", "b4"),                                                # 15
    ]
    result = w.commit_batch(batch)
    assert [e.offset for e in result.events] == list(range(3, 16))
    renamed = result.results[3]
    assert (renamed.title, renamed.seq) == ("t", 6)  # read back with the rename's seq
    assert result.results[9].seq == 14  # the new c2 as created
    stored = _stored(w)
    assert stored["seqs"] == {"c1": 10, "c2": 15}
    assert stored["messages"] == ["a1", "a2", "a3", "a4", "b4"]
    # The next batch starts from what is stored: its bumps are written too.
    w.commit_batch([_send("c1", "a5"), _send("c1", "a6")])
    assert _stored(w)["seqs"] == {"c1": 17, "c2": 15}
    w.close()


def test_conversation_seq_after_a_refusal_in_savepoint_mode(tmp_path: Path) -> None:
    """The same when the batch had to start over with a SAVEPOINT per op: a refused op's bumps
    are handed back with its seqs, the others' written; a send after its conversation's
    deletion in the same batch is refused."""
    w = _writer(tmp_path)
    result = w.commit_batch([
        _send("c1", "a1"), _send("c1", "a2"), _send("missing", "x"), _send("c2", "b1"),
        _send("c1", "a3"), ops.DeleteConversation(conversation_id="c2"), _send("c2", "b2"),
    ])
    assert isinstance(result.results[2], NotFoundError)
    assert isinstance(result.results[6], NotFoundError)
    assert [e.offset for e in result.events] == [3, 4, 5, 6, 7, 8]
    assert _stored(w)["seqs"] == {"c1": 6}
    w.close()


@asynccontextmanager
async def _storage(target: StorageTarget, **kw: Any) -> AsyncIterator[Storage]:
    async with trio.open_nursery() as nursery:
        storage: Storage = await nursery.start(
            partial(run_storage, target.path, database_url=target.url, **kw))
        yield storage
        nursery.cancel_scope.cancel()


async def test_write_of_a_cancelled_caller_is_not_queued(target: StorageTarget) -> None:
    async with _storage(target) as st:
        await st.write(_create("c1"))
        with trio.CancelScope() as scope:
            scope.cancel()
            await st.write(_send("c1", "never"))
        assert scope.cancelled_caught
        await st.write(_send("c1", "after"))
        journal = await st.reader.journal(None, 0, None, 100)
        assert [r.id for r in journal] == ["after"]


async def test_full_request_queue_still_takes_every_write(target: StorageTarget) -> None:
    async with _storage(target, queue_size=1) as st:
        await st.write(_create("c1"))
        with trio.fail_after(20):
            async with trio.open_nursery() as n:
                for i in range(30):
                    n.start_soon(st.write, _send("c1", f"m{i}"))
        journal = await st.reader.journal(None, 0, None, 100)
        assert sorted(r.id for r in journal) == sorted(f"m{i}" for i in range(30))
        assert sorted(r.seq for r in journal) == list(range(2, 32))


async def test_only_a_caller_cancelled_before_it_parks_takes_its_request_back() -> None:
    """``Storage.write`` has no checkpoint of its own: a caller cancelled already is told so as
    it parks, and only then does ``Request.abort`` take the request back (nothing ran since it
    was queued). A caller cancelled later, while it waits, leaves its request queued: its write
    still happens."""
    from trio.lowlevel import current_task, wait_task_rescheduled

    from agentik.storage.committer import Request

    class Home:
        def __init__(self) -> None:
            self.withdrawn: list[Request] = []

        def _withdraw(self, req: Request) -> None:
            self.withdrawn.append(req)

    home = Home()

    async def park(req: Request, scope: trio.CancelScope) -> None:
        with scope:
            req.task = current_task()
            await wait_task_rescheduled(req.abort)

    early = Request(_send("c1", "early"), home=home)
    scope = trio.CancelScope()
    scope.cancel()
    await park(early, scope)
    assert home.withdrawn == [early]

    late = Request(_send("c1", "late"), home=home)
    scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(park, late, scope)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
    assert home.withdrawn == [early]
    assert late.task is None
