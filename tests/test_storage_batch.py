"""How one batch is applied (issue 13, durable rate): the SQLite writer runs a batch without a
SAVEPOINT per op and starts over with them only when an op is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentik.errors import ConflictError
from agentik.storage import ops
from agentik.storage import writer as writer_module
from agentik.storage.writer import Writer
from agentik.wire import Text, UserMessage


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
    real = writer_module.apply_op

    def apply_op(conn: Any, tx: Any, op: ops.AnyOp) -> Any:
        result = real(conn, tx, op)  # its message, turn and event are written, its seq taken
        if isinstance(op, ops.AppendUserMessage) and op.message_id == "bad":
            raise ConflictError("refused after writing")
        return result

    monkeypatch.setattr(writer_module, "apply_op", apply_op)
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
