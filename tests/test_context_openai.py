"""Context management end to end over the openai backend (docs/CONTEXT.md):
the real openai SDK against the scripted server, in its context-window mode where it refuses an
oversized request with HTTP 400 ``context_length_exceeded`` like llama.cpp, vLLM and OpenAI."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from agentik import Config, open_runtime
from agentik.actors.compaction import SUMMARY_PROMPT
from agentik.context import estimate_tokens
from agentik.llm.openai import OpenAiLlm
from agentik.storage import ops
from agentik.wire import AssistantItem, AssistantMessage, Error, Text, UserItem, UserMessage
from tests.scripted_openai import Echo, Reply, ScriptedOpenAI
from tests.test_runtime import is_type, run_turn, take_until

WORDS = ("river", "mountain", "lantern", "harbour", "meadow", "thunder", "orchard", "compass")


def sentence(i: int, n: int = 30) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n)) + f" (question {i})"


def is_summary_request(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == SUMMARY_PROMPT


def our_estimate(body: dict[str, Any]) -> int:
    """What agentik counted for this request: the same estimate, per message."""
    total = 0
    for message in body["messages"]:
        content = message["content"]
        text = content if isinstance(content, str) else json.dumps(content)
        if text.startswith("Summary of earlier conversation: "):
            text = text[len("Summary of earlier conversation: "):]
        total += estimate_tokens(text) + 8
    return total


async def test_compacts_before_a_round_that_would_not_fit(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    scripted.callable_default = lambda body: (
        Reply("They talked about rivers and mountains.") if is_summary_request(body)
        else Echo(prefix="You asked: ")
    )
    window = 600
    async with open_runtime(config.replace(context_window=window)) as agent:
        conv = await agent.create_conversation()
        seen: list[str] = []
        for i in range(8):
            events = await run_turn(agent, conv, sentence(i))
            seen += [e.type for e in events]
        assert "error" not in seen and "compaction_triggered" in seen
        bodies = scripted.requests
        summaries = [b for b in bodies if is_summary_request(b)]
        rounds = [b for b in bodies if not is_summary_request(b)]
        assert summaries, "no compaction happened"
        # every round: the prompt (as counted) plus the output budget fits the window
        budget = window // 4
        for body in rounds:
            assert body["max_completion_tokens"] <= budget
            assert our_estimate(body) + body["max_completion_tokens"] <= window
        # the summary has its own budget, and its request fits too
        for body in summaries:
            assert 0 < body["max_completion_tokens"] <= window // 8
            assert our_estimate(body) + body["max_completion_tokens"] <= window
        # after a compaction the model sees the system prompt, the summary, the recent turns
        first = bodies.index(summaries[0])
        after = bodies[first + 1]["messages"]
        assert after[0] == {"role": "system", "content": "You are a test assistant."}
        assert after[1] == {"role": "system", "content": "Summary of earlier conversation: "
                            "They talked about rivers and mountains."}
        # the round that triggered it: its own message is the last one, as before compaction
        assert after[-1] == {"role": "user", "content": sentence(first - 0)} or (
            after[-1] == bodies[first - 1]["messages"][-1])
        assert len(after) < len(bodies[first - 1]["messages"]) + 2
        # the journal keeps everything: 8 user messages, 8 answers
        records = await agent.journal.list(conversation_id=conv.id)
        assert sum(isinstance(r.message, AssistantMessage) for r in records) == 8
        assert len(records) == 16


async def test_25_turns_against_a_server_that_refuses_overflows(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    """The window is not configured: the first 400 teaches it, the round is compacted and
    retried, and no turn fails."""
    scripted.context_limit = 700
    scripted.callable_default = lambda body: (
        Reply("A summary of the talk so far.") if is_summary_request(body)
        else Echo(prefix="Here is a long answer to that question, with details: ")
    )
    llm = OpenAiLlm.from_config(config)
    async with open_runtime(config, llm=llm) as agent:
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        for i in range(25):
            events = await run_turn(agent, conv, sentence(i, 40))
            errors = [e for e in events if e.type == "error"]
            assert not errors, errors[0].event
        assert scripted.refused >= 1
        assert llm.context_window == 700  # learned from "maximum context length is 700"
        events = await take_until(agent.outbox.conversation_events(cursor, conv.id),
                                  is_type("compaction_triggered"))
        assert events[-1].type == "compaction_triggered"
        records = await agent.journal.list(conversation_id=conv.id, limit=1000)
        assert [type(r.message).__name__ for r in records].count("AssistantMessage") == 25
        assert not any(isinstance(r.message, Error) for r in records)
        # once learned, requests carry an output budget and are no longer refused
        refused_before = scripted.refused
        await run_turn(agent, conv, sentence(99, 40))
        assert scripted.refused == refused_before
        assert scripted.requests[-1]["max_completion_tokens"] == 700 // 4
    await llm.aclose()


async def test_a_server_that_names_no_window_is_bounded_from_what_it_refused(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    scripted.context_limit = 500
    scripted.context_error_text = "the request exceeds the available context size, try increasing it"
    scripted.callable_default = lambda body: (
        Reply("Summary.") if is_summary_request(body) else Echo(prefix="Answer: ")
    )
    llm = OpenAiLlm.from_config(config)
    async with open_runtime(config, llm=llm) as agent:
        conv = await agent.create_conversation()
        for i in range(15):
            events = await run_turn(agent, conv, sentence(i, 40))
            assert "error" not in [e.type for e in events]
        assert scripted.refused >= 1
        learned = llm.context_window
        assert learned is not None and learned < our_estimate(scripted.requests[0]) * 10
    await llm.aclose()


async def test_a_message_larger_than_the_window_fails_clearly_and_the_next_works(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    async with open_runtime(config.replace(context_window=1024)) as agent:
        conv = await agent.create_conversation()
        await run_turn(agent, conv, "hello")
        big = " ".join(WORDS[i % len(WORDS)] for i in range(3000))
        n_requests = len(scripted.requests)
        events = await run_turn(agent, conv, big)
        assert [e.type for e in events] == ["user_message", "error", "touched"]
        error = events[1].event.record.message  # type: ignore[union-attr]
        assert isinstance(error, Error) and error.code == "context_window"
        assert error.message.startswith("the message is about ")
        assert "tokens; the model's window is 1024" in error.message
        assert len(scripted.requests) == n_requests  # never sent
        events = await run_turn(agent, conv, "and now a short one")
        assert [e.type for e in events] == ["user_message", "assistant_message", "touched"]
        # the too-big message is in the journal, not in what the model sees
        assert [m["content"] for m in scripted.requests[-1]["messages"]] == [
            "You are a test assistant.", "hello", "echo: hello", "and now a short one"]
        assert big in [r.message.content[0].body for r in  # type: ignore[union-attr]
                       await agent.journal.list(conversation_id=conv.id)
                       if isinstance(r.message, UserMessage)]


async def test_an_answer_cut_at_the_output_budget_records_length(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    scripted.context_limit = 10_000  # the server honours max_completion_tokens
    scripted.push(Reply(" ".join(["word"] * 200)))
    async with open_runtime(config.replace(max_output_tokens=20)) as agent:
        conv = await agent.create_conversation()
        events = await run_turn(agent, conv, "talk a lot")
        answer = events[1].event.record.message  # type: ignore[union-attr]
        assert isinstance(answer, AssistantMessage)
        assert answer.finish_reason == "length"
        assert scripted.requests[-1]["max_completion_tokens"] == 20
        assert len(answer.content[0].body.split()) == 10  # type: ignore[union-attr]
        events = await run_turn(agent, conv, "short")
        assert events[1].event.record.message.finish_reason == "stop"  # type: ignore[union-attr]


async def test_a_conversation_left_too_big_recovers_after_a_restart(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    """An earlier version let working memory outgrow the window (one huge answer, then turns
    that failed, their messages left in memory): after a restart the next turn compacts it and
    is answered."""
    huge = " ".join(WORDS[i % len(WORDS)] for i in range(1500))
    async with open_runtime(config) as agent:
        conv = await agent.create_conversation()
        conv_id = conv.id
        for i, answer in enumerate([huge, None, None]):
            turn_id = f"turn{i}"
            text = [Text(body=f"question {i}")]
            await agent._deps.storage.write(ops.AppendUserMessage(
                conversation_id=conv_id, message_id=turn_id, message=UserMessage(content=text)))
            await agent._deps.storage.write(ops.StartTurn(conversation_id=conv_id, turn_id=turn_id,
                                                    item=UserItem(content=text)))
            await agent._deps.storage.write(ops.FinishTurn(
                conversation_id=conv_id, turn_id=turn_id,
                assistant=(f"a{i}", AssistantMessage(content=[Text(body=answer)]))
                if answer else None,
                item=AssistantItem(content=[Text(body=answer)]) if answer else None,
                error=None if answer else (f"e{i}", Error(message="window full", code="llm"))))
    scripted.context_limit = 1024
    scripted.callable_default = lambda body: (
        Reply("Summary.") if is_summary_request(body) else Echo())
    async with open_runtime(config.replace(context_window=1024)) as agent:
        conv2 = await agent.get_conversation(conv_id)
        assert conv2 is not None
        events = await run_turn(agent, conv2, "are you still there?")
        assert [e.type for e in events] == [
            "user_message", "compaction_triggered", "assistant_message", "touched"]
        assert scripted.refused == 0
        assert scripted.requests[-1]["messages"][-1] == {
            "role": "user", "content": "are you still there?"}


def question(i: int) -> str:
    """About 420 characters, as the probe's turns were."""
    return sentence(i, 52)[:400] + f" (question {i})"


def long_winded(body: dict[str, Any]) -> Reply:
    """A model behind a server that ignores ``max_tokens`` (``litert-lm serve``): it answers by
    repeating the last message, so a turn's answer is as long as its question and a "summary" as
    long as its whole transcript; the server cuts either only where its window is full."""
    return Reply(str(body["messages"][-1]["content"]))


@pytest.mark.parametrize("configured", [True, False], ids=["window_set", "window_learned"])
async def test_25_turns_against_a_server_that_ignores_max_tokens(
    config: Config, scripted: ScriptedOpenAI, configured: bool
) -> None:
    """Every answer and summary as long as the model likes, whatever the budget asked: every
    turn is answered all the same (the probe saw 8 of 25 fail)."""
    scripted.context_limit = 2048
    scripted.ignore_max_tokens = True
    scripted.callable_default = long_winded
    llm = OpenAiLlm.from_config(config.replace(context_window=2048 if configured else 0))
    async with open_runtime(config, llm=llm) as agent:
        conv = await agent.create_conversation()
        made: list[str] = []
        with trio.fail_after(60):
            for i in range(25):
                events = await run_turn(agent, conv, question(i))
                errors = [e for e in events if e.type == "error"]
                assert not errors, (i, errors[0].event)
                made += [e.event.summary for e in events  # type: ignore[union-attr]
                         if e.type == "compaction_triggered" and e.event.summary]  # type: ignore[union-attr]
        # a summary longer than its budget (an eighth of the window) is cut to it
        assert made and all(estimate_tokens(text) + 8 <= 2048 // 8 for text in made)
        records = await agent.journal.list(conversation_id=conv.id, limit=1000)
        assert [type(r.message).__name__ for r in records].count("AssistantMessage") == 25
        summaries = [b for b in scripted.requests if is_summary_request(b)]
        assert summaries, "no compaction happened"
        assert llm.context_window == 2048
    await llm.aclose()
