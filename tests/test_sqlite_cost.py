"""The SQLite writer's cheaper per-event work (issue 13, durable rate): ops dispatched by type,
payloads bound as bytearrays, rows written in one executemany per table, the outbox trim run
only when something can be trimmed. Each keeps what the slower form stored."""

from __future__ import annotations

import typing
from pathlib import Path

from agentik.storage import ops, sqlite_ops
from agentik.storage.writer import Writer
from agentik.wire import Text, UserMessage, decode_common_event, encode


def _create(cid: str) -> ops.CreateConversation:
    return ops.CreateConversation(conversation_id=cid, title=None, is_temporal=False,
                                  system_prompt="s")


def _send(cid: str, mid: str) -> ops.AppendUserMessage:
    return ops.AppendUserMessage(conversation_id=cid, message_id=mid,
                                 message=UserMessage(content=[Text(body=mid)]))


def test_every_op_has_its_function() -> None:
    assert set(sqlite_ops._APPLY) == set(typing.get_args(ops.AnyOp))


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
