"""The PostgreSQL planner's events and results, without a database (issue 17, durable rate): a
journal record's event is made once after commit and is also its op's result, and its published
bytes are its stored payload with the offsets written in (``pg.plan._splice``). Both must be
exactly what a reader makes of the stored row (``pg.queries.row_to_event``), or a stream would
differ between live and replay."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from agentik.storage import ops
from agentik.storage.pg.plan import Conv, Plan
from agentik.storage.pg.plan_ops import plan_op
from agentik.storage.pg.queries import row_to_event
from agentik.wire import (
    AssistantMessage,
    Error,
    SystemItem,
    Text,
    ToolCall,
    ToolResult,
    UserMessage,
    decode_common_event,
)

#: texts a splice could trip over: a key-like sequence in a string, escapes, non-ASCII
TRICKY = ['plain', '"seq":0, "offset":0', 'a\\"seq\\":0', 'ünïcödé ☃ \n\t\x01', '']


def _plan(conversation_id: str = 'c"seq":0') -> Plan:
    p = Plan(epoch='e"offset":0', now=1234.5)
    p.conv[conversation_id] = Conv(conversation_id, "title", False, 1.0, 2.0, 7, None, True, 3,
                                   "default", None)
    return p


def _ops(cid: str, body: str) -> list[ops.AnyOp]:
    item = SystemItem(text=body)
    return [
        ops.AppendUserMessage(conversation_id=cid, message_id=f"u-{body}",
                              message=UserMessage(content=[Text(body=body)])),
        ops.AppendUserMessage(conversation_id=cid, message_id="started",
                              message=UserMessage(content=[Text(body=body)]), start=item),
        ops.AppendToolCalls(conversation_id=cid, item=item, calls=(
            ("t1", ToolCall(call_id="1", name="n", arguments='{"seq":0}')),
            ("t2", ToolCall(call_id="2", name=body, arguments="{}")))),
        ops.AppendToolResult(conversation_id=cid, message_id="r1", item=item,
                             result=ToolResult(call_id="1", name="n", content=body)),
        ops.AppendToolResult(conversation_id=cid, message_id="r2", item=item,
                             result=ToolResult(call_id="2", name="n", content=body,
                                               is_error=True, structured={"seq": 0})),
        ops.FinishTurn(conversation_id=cid, turn_id="started", item=item, interrupted=True,
                       assistant=("a1", AssistantMessage(content=[Text(body=body)])),
                       error=("e1", Error(message=body))),
        ops.Regenerate(conversation_id=cid, turn_id="g1", of=body),  # a branch point's record
        ops.RenameConversation(conversation_id=cid, title=body),
    ]


@pytest.mark.parametrize("body", TRICKY)
@pytest.mark.parametrize("base", [0, 9, 123_456_789_012])
def test_published_events_are_what_a_reader_makes_of_the_stored_rows(body: str, base: int) -> None:
    cid = 'c"seq":0'
    p = _plan(cid)
    for op in _ops(cid, body):
        plan_op(p, op)
    events = p.events(base)
    assert [ev.offset for ev in events] == list(range(base + 1, base + p.n + 1))
    for ev, cid_, kind, payload in zip(events, p.o_cid, p.o_kind, p.o_payload, strict=True):
        read = row_to_event((ev.offset, cid_, kind, payload))
        assert ev.raw == read.raw
        assert ev.event == read.event
        assert decode_common_event(ev.raw) == ev.event


def test_a_journal_record_is_its_event_s_and_its_op_s_result() -> None:
    cid = "c"
    p = _plan(cid)
    planned = [plan_op(p, op) for op in _ops(cid, "x")]
    events = p.events(40)
    user, started, calls, result, failed, finish, regenerate, _ = planned
    records: dict[str, Any] = {ev.event.event.record.id: ev.event.event.record  # type: ignore[union-attr]
                               for ev in events if hasattr(ev.event.event, "record")}
    assert set(records) == {"u-x", "started", "t1", "t2", "r1", "r2", "a1", "e1", "g1"}
    for mid, rec in records.items():
        row = p.m_id.index(mid)
        assert rec.seq == 40 + p.m_rel[row]
        assert msgspec.json.encode(rec.message) == p.m_payload[row]
    # what PgWriter.result makes of them
    assert records["u-x"].seq == 40 + user and records["started"].seq == 40 + started
    assert [records["t1"].seq, records["t2"].seq] == [40 + r for r in calls]
    assert records["r1"].seq == 40 + result and records["r2"].seq == 40 + failed
    assert [records["a1"].seq, records["e1"].seq] == [40 + r for r in finish]
    assert records["g1"].seq == 40 + regenerate
