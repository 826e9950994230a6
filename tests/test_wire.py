"""Wire types: every type round-trips through JSON; malformed input names the field."""

from __future__ import annotations

import gc
import re

import msgspec
import pytest

from agentik import api
from agentik import wire as w
from agentik.errors import InvalidInputError

RECORD = w.MessageRecord(
    id="m1", seq=7, conversation_id="c1", created_at=1.5,
    message=w.UserMessage(
        content=[w.Text(body="hi"), w.Image(data="aGk=", mime="image/png")],
        context=w.MessageContext(origin=w.MessageOrigin(kind="agent", id="parent"),
                                 metadata={"k": "v"}),
    ),
)
CONV = w.ConversationRecord(id="c1", title="t", is_temporal=False, created_at=1.0,
                            updated_at=2.0, seq=3)

EVENTS: list[w.Event] = [
    w.UserMessageEvent(record=RECORD),
    w.AssistantMessageEvent(record=RECORD),
    w.ToolCallEvent(record=RECORD),
    w.ToolResultEvent(record=RECORD),
    w.ToolFailed(record=RECORD),
    w.Interrupted(turn_id="m1"),
    w.ErrorEvent(record=RECORD),
    w.ConversationClosing(reason="deleted"),
    w.CompactionTriggered(dropped_items=3, summary="s"),
    w.Created(conversation=CONV),
    w.Deleted(conversation_id="c1"),
    w.Renamed(conversation_id="c1", title="x", updated_at=3.0),
    w.Touched(conversation_id="c1", updated_at=3.0),
    w.Working(turn_id="m1"),
    w.End(turn_id="m1"),
    w.StartReasoning(),
    w.AppendReasoning(text="r"),
    w.StartResponse(),
    w.AppendText(text="t"),
    w.AppendImage(data="aGk=", mime="image/jpeg"),
]

MESSAGES: list[w.Message] = [
    RECORD.message,
    w.AssistantMessage(content=[w.Text(body="a")], reasoning="r",
                       tokens=w.TurnTokens(prompt=1, completion=2), interrupted=True, turn_id="m1"),
    w.ToolCall(call_id="c", name="n", arguments="{}"),
    w.ToolResult(call_id="c", name="n", content="x", is_error=True, structured={"a": 1}),
    w.Error(message="boom", code="llm"),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_common_event_round_trip(event: w.Event) -> None:
    common = w.CommonEvent(cursor=w.Cursor(epoch="e", offset=5), conversation_id="c1", event=event)
    raw = w.encode(common)
    assert w.decode_common_event(raw) == common
    assert msgspec.json.decode(raw)["event"]["type"] == w.event_type(event)


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_message_round_trip(message: w.Message) -> None:
    assert w.decode_message(w.encode(message)) == message


def test_tags_are_snake_case() -> None:
    tags = {w.event_type(e) for e in EVENTS}
    assert {"user_message", "tool_failed", "conversation_closing", "compaction_triggered",
            "start_reasoning", "append_text", "touched"} <= tags
    assert all(t == t.lower() and " " not in t for t in tags)


def test_working_items_round_trip() -> None:
    items: list[w.WorkingItem] = [
        w.SystemItem(text="s"), w.UserItem(content=[w.Text(body="u")]),
        w.AssistantItem(content=[], tool_calls=[w.ToolCallSpec(call_id="1", name="f",
                                                               arguments="{}")]),
        w.ToolItem(call_id="1", name="f", content="r"), w.SummaryItem(text="sum"),
    ]
    for item in items:
        assert w.decode_working_item(w.encode(item)) == item


def test_malformed_input_names_the_field() -> None:
    with pytest.raises(InvalidInputError, match=r"\$\.content\[0\]\.body"):
        api.decode_input(b'{"content": [{"type": "text", "body": 1}]}', w.UserMessage)
    with pytest.raises(InvalidInputError, match="type"):
        api.decode_input(b'{"content": [{"type": "video"}]}', w.UserMessage)
    with pytest.raises(InvalidInputError, match="invalid JSON"):
        api.decode_input(b'{"content": ', w.UserMessage)
    with pytest.raises(InvalidInputError, match="content"):
        api.convert_input({}, w.UserMessage)


def test_cursor_parse() -> None:
    assert w.Cursor.parse("abc:12") == w.Cursor(epoch="abc", offset=12)
    assert str(w.Cursor(epoch="abc", offset=12)) == "abc:12"
    for bad in ["", "abc", "abc:", ":3", "abc:-1", "abc:x"]:
        with pytest.raises(InvalidInputError):
            w.Cursor.parse(bad)


def test_new_fields_have_defaults_old_payloads_decode() -> None:
    # An AssistantMessage stored before optional fields existed still decodes.
    old = b'{"type": "assistant_message", "content": [{"type": "text", "body": "x"}]}'
    msg = w.decode_message(old)
    assert isinstance(msg, w.AssistantMessage) and msg.interrupted is False


def test_content_takes_its_fields_positionally_and_by_keyword() -> None:
    import agentik

    assert agentik.Text("hello") == w.Text(body="hello")
    assert agentik.Image("aGk=", "image/jpeg") == w.Image(data="aGk=", mime="image/jpeg")
    assert agentik.Image("aGk=").mime == "image/png"
    # the JSON is the same whichever way the struct was built
    assert w.encode(w.Text("hi")) == b'{"type":"text","body":"hi"}'
    assert w.encode(w.Image("aGk=", "image/jpeg")) == (
        b'{"type":"image","data":"aGk=","mime":"image/jpeg"}')
    assert msgspec.json.decode(b'{"type":"text","body":"hi"}', type=w.Content) == w.Text("hi")


def test_working_items_are_not_tracked_by_the_cycle_collector() -> None:
    """A live actor keeps its whole working memory: the item structs are not tracked (only their
    content lists are), so a cold load of a long conversation grows the collector's heap less and
    sets off fewer full collections (the comment above ``SystemItem`` in agentik/wire.py);
    constructed or decoded alike."""
    call = w.ToolCallSpec(call_id="c1", name="add", arguments="{}")
    items: list[w.WorkingItem] = [
        w.SystemItem(text="be brief"),
        w.UserItem(content=[w.Text(body="hi"), w.Image(data="aGk=")]),
        w.AssistantItem(content=[w.Text(body="hello")], tool_calls=[call]),
        w.ToolItem(call_id="c1", name="add", content="3"),
        w.SummaryItem(text="they met"),
    ]
    for item in items:
        decoded = w.decode_working_item(w.encode(item))
        assert decoded == item
        assert not gc.is_tracked(item), type(item).__name__
        assert not gc.is_tracked(decoded), type(item).__name__


def test_ids_are_32_hex_unique_and_ordered_by_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stored ids grow with time (index inserts land at the B-tree's right edge) and differ
    within one millisecond."""
    from agentik import ids

    now = [1_764_600_000_000 * 1_000_000]
    monkeypatch.setattr(ids.time, "time_ns", lambda: now[0])
    same_ms = [ids.new_id() for _ in range(1000)]
    now[0] += 1_000_000  # one millisecond later
    later = [ids.new_id() for _ in range(1000)]
    assert len(set(same_ms + later)) == 2000
    assert all(re.fullmatch("[0-9a-f]{32}", i) for i in same_ms + later)
    assert max(same_ms) < min(later)
