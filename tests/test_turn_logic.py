"""The pure turn logic, without sockets or trio."""

from __future__ import annotations

import pytest

from agentik.actors import turn as logic
from agentik.llm.base import FinishDelta, ReasoningDelta, TextDelta, ToolCallDelta, UsageDelta
from agentik.wire import AppendReasoning, AppendText, StartReasoning, StartResponse, Text


def fold(state: logic.TurnState, deltas: list) -> list:  # type: ignore[type-arg]
    out = []
    for d in deltas:
        out.extend(logic.apply_delta(state, d))
    return out


def test_text_round_events_and_final_message() -> None:
    s = logic.TurnState(turn_id="t")
    logic.new_round(s)
    events = fold(s, [ReasoningDelta("think"), ReasoningDelta("ing"), TextDelta("Hel"),
                      TextDelta(""), TextDelta("lo"), UsageDelta(prompt_tokens=7, completion_tokens=2),
                      FinishDelta("stop")])
    assert events == [StartReasoning(), AppendReasoning(text="think"), AppendReasoning(text="ing"),
                      StartResponse(), AppendText(text="Hel"), AppendText(text="lo")]
    assert logic.round_tool_calls(s) == []
    msg = logic.final_message(s)
    assert msg is not None
    assert msg.content == [Text(body="Hello")]
    assert msg.reasoning == "thinking"
    assert msg.tokens is not None and (msg.tokens.prompt, msg.tokens.completion) == (7, 2)
    assert logic.final_item(s).content == [Text(body="Hello")]


def test_tool_call_assembly_assigns_name_and_appends_arguments() -> None:
    s = logic.TurnState(turn_id="t")
    logic.new_round(s)
    fold(s, [
        ToolCallDelta(index=1, id="b", name="g", arguments=""),
        ToolCallDelta(index=0, id="a", name="f", arguments=""),
        ToolCallDelta(index=0, arguments='{"x":'),
        # llama.cpp style: id and name repeated in every fragment
        ToolCallDelta(index=1, id="b", name="g", arguments='{"y"'),
        ToolCallDelta(index=0, arguments=" 1}"),
        ToolCallDelta(index=1, id="b", name="g", arguments=": 2}"),
        FinishDelta("tool_calls"),
    ])
    calls = logic.round_tool_calls(s)
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        ("a", "f", '{"x": 1}'), ("b", "g", '{"y": 2}')]


def test_rounds_accumulate_text_and_usage() -> None:
    s = logic.TurnState(turn_id="t")
    logic.new_round(s)
    fold(s, [TextDelta("Let me check. "), ToolCallDelta(index=0, id="a", name="f"),
             UsageDelta(prompt_tokens=5, completion_tokens=1)])
    item = logic.round_item(s, logic.round_tool_calls(s))
    assert item.content == [Text(body="Let me check. ")] and item.tool_calls[0].name == "f"
    logic.new_round(s)
    events = fold(s, [TextDelta("Done."), UsageDelta(prompt_tokens=9, completion_tokens=2)])
    assert events[0] == StartResponse()  # each round announces its response
    msg = logic.final_message(s)
    assert msg is not None and msg.content == [Text(body="Let me check. Done.")]
    assert msg.tokens is not None and (msg.tokens.prompt, msg.tokens.completion) == (14, 3)
    assert logic.final_item(s).content == [Text(body="Done.")]
    assert s.last_prompt_tokens == 9


def test_interrupted_without_text_keeps_nothing() -> None:
    s = logic.TurnState(turn_id="t")
    logic.new_round(s)
    assert logic.final_message(s, interrupted=True) is None
    fold(s, [TextDelta("partial")])
    msg = logic.final_message(s, interrupted=True)
    assert msg is not None and msg.interrupted and msg.content == [Text(body="partial")]


def test_missing_call_id_gets_one() -> None:
    s = logic.TurnState(turn_id="t")
    logic.new_round(s)
    fold(s, [ToolCallDelta(index=0, name="f", arguments="{}")])
    (call,) = logic.round_tool_calls(s)
    assert call.call_id.startswith("call_")


@pytest.mark.parametrize("raw,ok", [("{}", True), ('{"a": [1]}', True), ("", True),
                                    ("[1]", False), ("{", False), ('"s"', False)])
def test_parse_arguments(raw: str, ok: bool) -> None:
    if ok:
        assert isinstance(logic.parse_arguments(raw), dict)
    else:
        with pytest.raises(logic.BadArguments):
            logic.parse_arguments(raw)


def test_cap_text() -> None:
    assert logic.cap_text("abc", 5) == "abc"
    capped = logic.cap_text("x" * 100, 10)
    assert capped.startswith("x" * 10) and "truncated 90" in capped
