"""The pure turn logic, without sockets or trio: deltas in, online events and storage ops out."""

from __future__ import annotations

import pytest

from agentik.actors import turn as logic
from agentik.llm.base import FinishDelta, ReasoningDelta, TextDelta, ToolCallDelta, UsageDelta
from agentik.storage import ops
from agentik.tools.base import ToolOutcome
from agentik.wire import (
    AppendReasoning,
    AppendText,
    AssistantItem,
    StartReasoning,
    StartResponse,
    Text,
    ToolCallSpec,
    ToolItem,
    UserItem,
)


def fold(state: logic.TurnState, deltas: list) -> list:  # type: ignore[type-arg]
    out = []
    for d in deltas:
        out.extend(logic.apply_delta(state, d))
    return out


def test_text_round_events_and_final_message() -> None:
    s = logic.TurnState(conversation_id="c", turn_id="t")
    logic.new_round(s)
    events = fold(s, [ReasoningDelta("think"), ReasoningDelta("ing"), TextDelta("Hel"),
                      TextDelta(""), TextDelta("lo"), UsageDelta(prompt_tokens=7, completion_tokens=2),
                      FinishDelta("stop")])
    assert events == [StartReasoning(), AppendReasoning(text="think"), AppendReasoning(text="ing"),
                      StartResponse(), AppendText(text="Hel"), AppendText(text="lo")]
    assert logic.round_tool_calls(s) == []
    step = logic.after_round(s, max_tool_rounds=8)
    assert isinstance(step, logic.Answer) and s.finished
    op = step.op
    assert (op.conversation_id, op.turn_id, op.error, op.interrupted) == ("c", "t", None, False)
    assert op.assistant is not None
    msg = op.assistant[1]
    assert msg.content == [Text(body="Hello")] and msg.turn_id == "t"
    assert msg.reasoning == "thinking"
    assert msg.tokens is not None and (msg.tokens.prompt, msg.tokens.completion) == (7, 2)
    assert op.item == AssistantItem(content=[Text(body="Hello")])


def test_tool_call_assembly_assigns_name_and_appends_arguments() -> None:
    s = logic.TurnState(conversation_id="c", turn_id="t")
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
    s = logic.TurnState(conversation_id="c", turn_id="t")
    logic.new_round(s)
    fold(s, [TextDelta("Let me check. "), ToolCallDelta(index=0, id="a", name="f"),
             UsageDelta(prompt_tokens=5, completion_tokens=1)])
    step = logic.after_round(s, max_tool_rounds=8)
    assert isinstance(step, logic.RunTools) and not s.finished
    item = step.op.item
    assert isinstance(item, AssistantItem)
    assert item.content == [Text(body="Let me check. ")] and item.tool_calls[0].name == "f"
    assert [(mid != "", call.call_id, call.turn_id) for mid, call in step.op.calls] == [
        (True, "a", "t")]
    assert s.pending_calls == step.calls
    done = logic.tool_done(s, logic.tool_result(s, step.calls[0], ToolOutcome(content="ok"), 100))
    assert done.item == ToolItem(call_id="a", name="f", content="ok") and s.pending_calls == []
    logic.new_round(s)
    events = fold(s, [TextDelta("Done."), UsageDelta(prompt_tokens=9, completion_tokens=2)])
    assert events[0] == StartResponse()  # each round announces its response
    answer = logic.after_round(s, max_tool_rounds=8)
    assert isinstance(answer, logic.Answer) and answer.op.assistant is not None
    msg = answer.op.assistant[1]
    assert msg.content == [Text(body="Let me check. Done.")]
    assert msg.tokens is not None and (msg.tokens.prompt, msg.tokens.completion) == (14, 3)
    # earlier rounds' text is in working memory with their calls: only the last round's here
    assert answer.op.item == AssistantItem(content=[Text(body="Done.")])
    assert s.last_prompt_tokens == 9


def test_start_puts_the_user_message_in_working_memory() -> None:
    s = logic.TurnState(conversation_id="c", turn_id="t")
    op = logic.start(s, [Text(body="hi")])
    assert op == ops.StartTurn(conversation_id="c", turn_id="t", item=UserItem(content=[Text(body="hi")]))


def test_interrupted_without_text_is_an_empty_interrupted_answer() -> None:
    """The journal records the interruption (the history shows it); the model sees nothing."""
    s = logic.TurnState(conversation_id="c", turn_id="t")
    logic.new_round(s)
    (finish,) = logic.end(s, logic.Interrupted())
    assert isinstance(finish, ops.FinishTurn) and s.finished
    assert finish.assistant is not None
    empty = finish.assistant[1]
    assert (empty.content, empty.interrupted, empty.turn_id) == ([], True, "t")
    assert (finish.item, finish.error, finish.interrupted) == (None, None, True)
    for ending in (logic.Failed("llm_http", "boom"), logic.Cancelled()):  # their Error ends them
        s = logic.TurnState(conversation_id="c", turn_id="t")
        logic.new_round(s)
        (finish,) = logic.end(s, ending)
        assert finish.assistant is None and finish.error is not None
    s = logic.TurnState(conversation_id="c", turn_id="t")
    logic.new_round(s)
    fold(s, [TextDelta("partial")])
    (finish,) = logic.end(s, logic.Interrupted())
    assert isinstance(finish, ops.FinishTurn) and finish.assistant is not None
    msg = finish.assistant[1]
    assert msg.interrupted and msg.content == [Text(body="partial")]
    assert finish.item == AssistantItem(content=[Text(body="partial")])


@pytest.mark.parametrize("ending,code,interrupted", [
    (logic.Failed("llm_http", "boom"), "llm_http", False),
    (logic.Cancelled(), "cancelled", False),
    (logic.Interrupted(), None, True),
])
def test_every_ending_closes_pending_calls_then_the_turn(
    ending: logic.Ending, code: str | None, interrupted: bool
) -> None:
    s = logic.TurnState(conversation_id="c", turn_id="t")
    logic.new_round(s)
    fold(s, [TextDelta("Looking. "), ToolCallDelta(index=0, id="a", name="f"),
             ToolCallDelta(index=1, id="b", name="g")])
    step = logic.after_round(s, max_tool_rounds=8)
    assert isinstance(step, logic.RunTools)
    logic.tool_done(s, logic.tool_result(s, step.calls[0], ToolOutcome(content="1"), 100))
    closing = logic.end(s, ending)
    assert s.finished and s.pending_calls == []
    *closed, finish = closing
    assert [(type(op), op.result.call_id, op.result.is_error) for op in closed  # type: ignore[union-attr]
            ] == [(ops.AppendToolResult, "b", True)]
    assert isinstance(finish, ops.FinishTurn) and finish.interrupted is interrupted
    assert (finish.error[1].code if finish.error else None) == code
    assert finish.assistant is not None and finish.assistant[1].content == [Text(body="Looking. ")]
    assert finish.item is None  # the round's text is already in working memory with its calls


def test_too_many_tool_rounds_fail() -> None:
    s = logic.TurnState(conversation_id="c", turn_id="t")
    steps = []
    for _ in range(3):
        logic.new_round(s)
        fold(s, [ToolCallDelta(index=0, id="a", name="f")])
        steps.append(logic.after_round(s, max_tool_rounds=2))
    assert [type(step) for step in steps] == [logic.RunTools, logic.RunTools, logic.Failed]
    failed = steps[-1]
    assert isinstance(failed, logic.Failed) and failed.code == "tool_rounds" and not s.finished


def test_tool_result_caps_text_and_drops_big_structured_content() -> None:
    s = logic.TurnState(conversation_id="c", turn_id="t")
    call = ToolCallSpec(call_id="a", name="f", arguments="{}")
    small = logic.tool_result(s, call, ToolOutcome(content="x" * 5, structured={"k": 1}), 20)
    assert small.content == "x" * 5 and small.structured == {"k": 1} and small.turn_id == "t"
    big = logic.tool_result(s, call, ToolOutcome(content="x" * 50, structured={"k": "y" * 50}), 20)
    assert big.content.startswith("x" * 20) and "truncated 30" in big.content
    assert big.structured is None


def test_missing_call_id_gets_one() -> None:
    s = logic.TurnState(conversation_id="c", turn_id="t")
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
