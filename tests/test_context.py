"""The pure context-budget decisions (agentik/context.py), no I/O."""

from __future__ import annotations

import pytest

from agentik import context as ctx
from agentik.wire import (
    AssistantItem,
    Image,
    SummaryItem,
    SystemItem,
    Text,
    ToolCallSpec,
    ToolItem,
    UserItem,
    WorkingItem,
)


def user(text: str) -> UserItem:
    return UserItem(content=[Text(body=text)])


def answer(text: str) -> AssistantItem:
    return AssistantItem(content=[Text(body=text)])


def memory(*items: WorkingItem) -> list[tuple[int, WorkingItem]]:
    return [(i * 10, item) for i, item in enumerate(items)]


BUDGET = ctx.Budget(window=1000, output=200, margin=20, summary=100)


def test_output_budget_defaults_and_overrides() -> None:
    assert ctx.output_budget(1024, None) == 256  # a quarter of a small window
    assert ctx.output_budget(128_000, None) == ctx.OUTPUT_CAP
    assert ctx.output_budget(None, None) is None  # unknown window: the server decides
    assert ctx.output_budget(None, 300) == 300
    assert ctx.output_budget(1024, 100) == 100
    assert ctx.output_budget(1024, 5000) == 1024  # never more than the window
    budget = ctx.make_budget(1024, exact=True)
    assert (budget.output, budget.summary, budget.margin) == (256, 128, 16)
    assert ctx.make_budget(1024, exact=False).margin == 64


def test_unknown_window_always_fits() -> None:
    items = memory(SystemItem(text="s"), user("hi"))
    assert ctx.decide(items, [5, 10**9], None) == ctx.Fits(max_output=None)


def test_fits_with_the_full_output_budget() -> None:
    items = memory(SystemItem(text="s"), user("a"), answer("b"), user("c"))
    assert ctx.decide(items, [10, 100, 100, 100], BUDGET) == ctx.Fits(max_output=200)
    # exactly at the limit: 1000 - 20 margin - 200 output = 780 prompt tokens
    assert ctx.decide(items, [180, 200, 200, 200], BUDGET) == ctx.Fits(max_output=200)


def test_compacts_the_oldest_turns_keeping_recent_ones_and_room_for_a_summary() -> None:
    items = memory(
        SystemItem(text="s"),
        user("1"), answer("1"),
        user("2"), answer("2"),
        user("3"), answer("3"),
        user("now"),
    )
    counts = [20, 150, 150, 150, 150, 50, 50, 30]  # 750 prompt + 200 output <= 980: fits
    assert isinstance(ctx.decide(items, counts, BUDGET), ctx.Fits)
    counts = [20, 160, 160, 160, 160, 50, 50, 30]  # 790 prompt + 200 output > 980
    plan = ctx.decide(items, counts, BUDGET)
    assert isinstance(plan, ctx.Compact)
    # room for history = 1000-20-50(protected)-200 = 730; summary 100; keep <= 315: turn 3 (100)
    assert plan.before_order_idx == items[5][0]
    assert plan.dropped == [item for _, item in items[1:5]]
    assert plan.summary_room == 100
    assert plan.kept_tokens == 20 + 30 + 100
    # what is kept plus the summary plus the full output fits
    assert plan.kept_tokens + plan.summary_room + BUDGET.output <= BUDGET.window - BUDGET.margin
    assert ctx.summary_fits(plan, 100, BUDGET)


def test_an_earlier_summary_is_compacted_again() -> None:
    items = memory(SystemItem(text="s"), SummaryItem(text="old"), user("1"), answer("1"),
                   user("now"))
    plan = ctx.decide(items, [20, 100, 400, 300, 30], BUDGET)
    assert isinstance(plan, ctx.Compact)
    assert plan.dropped == [items[1][1], items[2][1], items[3][1]]
    assert plan.before_order_idx == items[4][0]


def test_tool_rounds_of_the_current_turn_are_never_dropped() -> None:
    call = ToolCallSpec(call_id="c", name="t", arguments="{}")
    items = memory(SystemItem(text="s"), user("old"), answer("old"), user("now"),
                   AssistantItem(content=[], tool_calls=[call]),
                   ToolItem(call_id="c", name="t", content="x" * 100))
    plan = ctx.decide(items, [20, 300, 300, 30, 20, 200], BUDGET)
    assert isinstance(plan, ctx.Compact)
    assert plan.dropped == [items[1][1], items[2][1]]
    assert plan.before_order_idx == items[3][0]


def test_a_big_message_with_nothing_to_drop_gets_a_smaller_output_budget() -> None:
    items = memory(SystemItem(text="s"), user("big"))
    assert ctx.decide(items, [20, 900], BUDGET) == ctx.Fits(max_output=60)


def test_a_message_that_cannot_fit_is_too_big_and_says_so() -> None:
    items = memory(SystemItem(text="s"), user("old"), answer("old"), user("huge"))
    decision = ctx.decide(items, [20, 50, 50, 4000], BUDGET)
    assert decision == ctx.TooBig(tokens=4020, message_tokens=4000, window=1000,
                                  with_tools=False)
    assert isinstance(decision, ctx.TooBig)
    text = ctx.too_big_message(decision, exact=True)
    assert text.startswith("the message is 4000 tokens; the model's window is 1000")
    assert "about 4000" in ctx.too_big_message(decision, exact=False)


def test_too_big_with_tool_results_names_the_turn() -> None:
    items = memory(SystemItem(text="s"), user("q"), ToolItem(call_id="c", name="t", content="x"))
    decision = ctx.decide(items, [20, 10, 5000], BUDGET)
    assert isinstance(decision, ctx.TooBig) and decision.with_tools
    assert "tool results" in ctx.too_big_message(decision, exact=True)


def test_forced_compaction_drops_every_old_turn() -> None:
    items = memory(SystemItem(text="s"), user("1"), answer("1"), user("2"), answer("2"),
                   user("now"))
    counts = [10, 10, 10, 10, 10, 10]
    assert isinstance(ctx.decide(items, counts, BUDGET), ctx.Fits)
    plan = ctx.decide(items, counts, BUDGET, force=True)
    assert isinstance(plan, ctx.Compact)
    assert plan.before_order_idx == items[5][0] and len(plan.dropped) == 4
    # forced with nothing left to drop: too big
    assert isinstance(ctx.decide(memory(SystemItem(text="s"), user("x")), [10, 10], BUDGET,
                                 force=True), ctx.TooBig)


def test_a_compaction_that_would_keep_everything_answers_in_the_room_left() -> None:
    # the current turn is big, the old turns tiny: nothing worth dropping
    items = memory(SystemItem(text="s"), user("a"), answer("b"), user("big"))
    decision = ctx.decide(items, [10, 5, 5, 850], BUDGET)
    assert decision == ctx.Fits(max_output=110)


def test_decide_needs_one_count_per_item() -> None:
    with pytest.raises(ValueError):
        ctx.decide(memory(user("a")), [1, 2], BUDGET)


@pytest.mark.parametrize(
    ("text", "at_least"),
    [
        ("word " * 1000, 1000),
        ("0123456789" * 10, 100),
        ("Hello, world!", 4),
        ("你好世界", 4),
    ],
)
def test_estimate_is_pessimistic(text: str, at_least: int) -> None:
    assert ctx.estimate_tokens(text) >= at_least


def test_estimate_item_counts_overhead_and_images() -> None:
    plain = ctx.estimate_item(user("hello"))
    assert plain == ctx.estimate_tokens("hello") + ctx.ESTIMATE_MESSAGE_OVERHEAD
    with_image = UserItem(content=[Text(body="hello"), Image(data="AAAA")])
    assert ctx.estimate_item(with_image) == plain + ctx.ESTIMATE_IMAGE_TOKENS
    assert ctx.estimate_item(with_image, images=False) == plain
    call = ToolCallSpec(call_id="c", name="add", arguments='{"a": 1}')
    assert "add" in ctx.item_text(AssistantItem(content=[], tool_calls=[call]))


def test_cut_transcript_keeps_the_earlier_summary_and_the_end() -> None:
    text = "Earlier summary: S\n" + "\n".join(f"User: line {i}" for i in range(100))
    cut = ctx.cut_transcript(text, tokens=1000, room=100)
    assert cut.startswith("Earlier summary: S\n[...]\n")
    assert cut.endswith("User: line 99")
    assert len(cut) < len(text) * 0.15
    assert ctx.cut_transcript(text, tokens=10, room=100) == text
    assert ctx.cut_transcript(text, tokens=1000, room=0) == ""


@pytest.mark.parametrize(
    ("text", "window", "tokens"),
    [
        ("This model's maximum context length is 4096 tokens. However, your messages resulted "
         "in 5000 tokens. Please reduce the length of the messages.", 4096, 5000),
        ("This model's maximum context length is 2048 tokens. However, you requested 2100 "
         "tokens (2000 in the messages, 100 in the completion).", 2048, 2100),
        ("the request exceeds the available context size (8192 tokens), try increasing it",
         8192, None),
        ("INVALID_ARGUMENT: Input token ids are too long. Exceeding the maximum number of tokens "
         "allowed: 1045 >= 1024", 1024, 1045),
    ],
)
def test_overflow_messages_teach_the_window(text: str, window: int, tokens: int | None) -> None:
    assert ctx.is_overflow_text(text)
    assert ctx.window_from_text(text) == window
    assert ctx.tokens_from_text(text) == tokens


def test_other_errors_are_not_overflows() -> None:
    assert not ctx.is_overflow_text("Invalid value for 'temperature': must be <= 2")
    assert ctx.is_overflow_text("context_length_exceeded")


def test_learned_window_without_a_number_is_below_what_was_refused() -> None:
    assert ctx.learned_window(None, 4096, 5000) == 4096
    assert ctx.learned_window(None, None, 5000) == 4500
    assert ctx.learned_window(3000, None, 5000) == 3000


def _rounds(items: list[tuple[int, WorkingItem]], counts: list[int], budget: ctx.Budget,
            summary_tokens: int) -> tuple[ctx.Decision, int]:
    """What the conversation actor's _prepare_round does, with a summariser that returns
    ``summary_tokens`` whatever room it was given (a server ignoring max_tokens), accepted
    whenever ``summary_fits`` lets it: the round's last decision and the attempts it took."""
    for attempt in range(3):
        decision = ctx.decide(items, counts, budget)
        if ctx.last_resort(decision, attempt):
            decision = ctx.decide(items, counts, budget, force=True, summarise=False)
        if not isinstance(decision, ctx.Compact):
            return decision, attempt
        made = decision.summary_room > 0 and ctx.summary_fits(decision, summary_tokens, budget)
        cut = next(i for i, (order_idx, _) in enumerate(items)
                   if order_idx >= decision.before_order_idx)
        summary = [(1, SummaryItem(text="s"))] if made else []
        items = [items[0], *summary, *items[cut:]]
        counts = [counts[0], *([summary_tokens] if made else []), *counts[cut:]]
    raise AssertionError("no room after three compactions")


@pytest.mark.parametrize("summary_tokens", [1, 100, 250, 400, 600, 800])
@pytest.mark.parametrize("turn_tokens", [30, 60, 120, 200])
def test_a_round_always_fits_when_the_current_turn_alone_does(
    summary_tokens: int, turn_tokens: int
) -> None:
    """Whatever the summary's size, the second compaction of a round drops every old item
    without one: the round fits (the probe's server answered summaries three times their room
    and three compactions made no room)."""
    items = memory(SystemItem(text="s"), *[
        item for i in range(12) for item in (user(str(i)), answer(str(i)))], user("now"))
    counts = [20, *[turn_tokens] * 24, 100]
    decision, attempts = _rounds(items, counts, BUDGET, summary_tokens)
    assert isinstance(decision, ctx.Fits) and decision.max_output is not None
    assert decision.max_output >= BUDGET.min_output
    assert attempts <= 2


def test_the_last_resort_drops_every_old_item_without_a_summary() -> None:
    items = memory(SystemItem(text="s"), SummaryItem(text="big"), user("1"), answer("1"),
                   user("now"))
    plan = ctx.decide(items, [20, 700, 50, 50, 100], BUDGET, force=True, summarise=False)
    assert isinstance(plan, ctx.Compact)
    assert plan.summary_room == 0 and len(plan.dropped) == 3
    assert plan.before_order_idx == items[4][0] and plan.kept_tokens == 120
    assert not ctx.last_resort(plan, 0) and ctx.last_resort(plan, 1)
    assert not ctx.last_resort(ctx.Fits(max_output=10), 1)


def test_a_summary_over_its_room_is_cut_to_its_beginning() -> None:
    text = " ".join(f"fact{i}" for i in range(400))
    tokens = ctx.estimate_tokens(text)
    cut = ctx.cut_summary(text, tokens, 100)
    assert cut.startswith("fact0 fact1 ") and cut.endswith(" [...]")
    assert ctx.estimate_tokens(cut) <= 100
    assert ctx.cut_summary(text, tokens, tokens) == text
    assert ctx.cut_summary(text, tokens, 0) == ""
