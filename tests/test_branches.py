"""Branches (issue 32, docs/PROTOCOL.md "Branches"): edit a user message, regenerate an answer,
switch between versions and fork a conversation, in-process on the suite's engine (SQLite, or
PostgreSQL with AGENTIK_TEST_ENGINE=postgres). What the model sees is checked through the
requests the scripted model got."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from agentik import Config, LocalAgent, open_runtime
from agentik.agent import LocalConversation
from agentik.errors import BusyError, InvalidInputError, NotFoundError
from agentik.wire import AssistantMessage, BranchPoint, Cursor, MessageRecord, Text, UserMessage
from tests.scripted_openai import Echo, Hang, ScriptedOpenAI
from tests.test_runtime import is_type, nth, take_until


def text_of(record: MessageRecord) -> str:
    message = record.message
    assert isinstance(message, UserMessage | AssistantMessage)
    return "".join(c.body for c in message.content if isinstance(c, Text))


def seen(request: dict[str, Any]) -> list[str]:
    """The model's view in one request: role and text of each message."""
    return [f"{m['role']}:{m['content'] if isinstance(m['content'], str) else m['content'][0]['text']}"
            for m in request["messages"]]


async def turn(agent: LocalAgent, conv: LocalConversation, send: Any) -> str:
    """Run ``send()`` (a send, an edit, a regenerate) and wait for its turn's Touched; its id."""
    cursor = await agent.outbox.current_cursor()
    turn_id = await send()
    # bounded, generously: the machine may be loaded (a turn here takes milliseconds)
    await take_until(agent.outbox.conversation_events(cursor, conv.id), is_type("touched"),
                     seconds=30)
    return str(turn_id)


async def four_turns(agent: LocalAgent, conv: LocalConversation) -> list[str]:
    return [await turn(agent, conv, lambda t=t: conv.send(t)) for t in ("u1", "u2", "u3", "u4")]


async def test_edit_answers_the_edited_text_and_the_old_branch_stays(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    scripted.default = Echo(prefix="re ")
    async with open_runtime(config) as agent:
        conv = await agent.create_conversation()
        ids = await four_turns(agent, conv)
        edited = await turn(agent, conv, lambda: conv.edit(ids[1], "u2 again"))
        # the model saw the history before the edited message, then the new text
        assert seen(scripted.requests[-1]) == [
            "system:You are a test assistant.", "user:u1", "assistant:re u1", "user:u2 again"]
        listing = await conv.get_messages()
        assert [text_of(r) for r in listing] == ["u1", "re u1", "u2 again", "re u2 again"]
        users = [r for r in listing if isinstance(r.message, UserMessage)]
        assert len(users) == 2
        assert (users[1].id, users[1].siblings, users[1].sibling_index) == (edited, 2, 1)
        versions = await conv.siblings(edited)
        assert [r.id for r in versions] == [ids[1], edited]
        # the old branch is still listed and can be made current again
        snapshot = await conv.switch_branch(ids[1])
        assert [text_of(r) for r in snapshot.messages] == [
            "u1", "re u1", "u2", "re u2", "u3", "re u3", "u4", "re u4"]
        assert snapshot.messages[2].sibling_index == 0 and snapshot.messages[2].siblings == 2
        await turn(agent, conv, lambda: conv.send("u5"))
        assert seen(scripted.requests[-1])[1:] == [
            "user:u1", "assistant:re u1", "user:u2", "assistant:re u2", "user:u3",
            "assistant:re u3", "user:u4", "assistant:re u4", "user:u5"]
        # every version stays in the journal
        journal = await agent.journal.list(conversation_id=conv.id)
        assert sum(isinstance(r.message, UserMessage) for r in journal) == 6


async def test_regenerate_three_times_makes_four_versions(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    async with open_runtime(config) as agent:
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        for n in range(4):
            scripted.push(Echo(prefix=f"v{n} "))
        await turn(agent, conv, lambda: conv.send("q"))
        answer = (await conv.get_messages())[-1]
        turns = [await turn(agent, conv, lambda: conv.regenerate(answer.id)) for _ in range(3)]
        # each regenerate's request is the same history: the question, once
        for request in scripted.requests[1:]:
            assert seen(request)[1:] == ["user:q"]
        listing = await conv.get_messages()
        assert [text_of(r) for r in listing] == ["q", "v3 q"]
        assert (listing[1].siblings, listing[1].sibling_index) == (4, 3)
        assert isinstance(listing[1].message, AssistantMessage)
        assert listing[1].message.turn_id == turns[-1]
        versions = await conv.siblings(listing[1].id)
        assert [text_of(r) for r in versions] == ["v0 q", "v1 q", "v2 q", "v3 q"]
        # branch_changed events are durable, under the cursor: a stream resumed from before
        # the first regenerate replays them
        events = await take_until(agent.outbox.conversation_events(cursor, conv.id),
                                  nth("branch_changed", 3), seconds=30)
        changed = [e for e in events if e.type == "branch_changed"]
        assert all(isinstance(e.cursor, Cursor) for e in changed)
        point = changed[0].event.record.message  # type: ignore[union-attr]
        assert point == BranchPoint(kind="regenerate", message_id=listing[0].id)
        # the arrows: the second version made current
        snapshot = await conv.switch_branch(versions[1].id)
        assert [text_of(r) for r in snapshot.messages] == ["q", "v1 q"]
        assert snapshot.messages[1].sibling_index == 1
        scripted.default = Echo(prefix="then ")
        await turn(agent, conv, lambda: conv.send("more"))
        assert seen(scripted.requests[-1])[1:] == ["user:q", "assistant:v1 q", "user:more"]


async def test_fork_has_the_history_up_to_the_message_and_both_go_on(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    scripted.default = Echo(prefix="re ")
    async with open_runtime(config) as agent:
        conv = await agent.create_conversation(title="original")
        for text in ("u1", "u2"):
            await turn(agent, conv, lambda text=text: conv.send(text))
        first_answer = (await conv.get_messages())[1]
        fork = await conv.fork(first_answer.id)
        assert fork.id != conv.id and fork.title == "original"
        forked = await fork.get_messages()
        assert [text_of(r) for r in forked] == ["u1", "re u1"]
        assert {r.id for r in forked}.isdisjoint(r.id for r in await conv.get_messages())
        await turn(agent, fork, lambda: fork.send("in the fork"))
        assert seen(scripted.requests[-1])[1:] == ["user:u1", "assistant:re u1",
                                                   "user:in the fork"]
        await turn(agent, conv, lambda: conv.send("in the original"))
        assert seen(scripted.requests[-1])[1:] == [
            "user:u1", "assistant:re u1", "user:u2", "assistant:re u2", "user:in the original"]
        fork_id, conv_id = fork.id, conv.id
    # after a restart (cold load): both go on, each with its own history
    async with open_runtime(config) as agent:
        conv2, fork2 = await agent.get_conversation(conv_id), await agent.get_conversation(fork_id)
        assert conv2 is not None and fork2 is not None
        await turn(agent, fork2, lambda: fork2.send("fork again"))
        assert seen(scripted.requests[-1])[1:] == [
            "user:u1", "assistant:re u1", "user:in the fork", "assistant:re in the fork",
            "user:fork again"]
        await turn(agent, conv2, lambda: conv2.send("original again"))
        assert seen(scripted.requests[-1])[-3:] == [
            "user:in the original", "assistant:re in the original", "user:original again"]
        assert len(await conv2.get_messages()) == 8 and len(await fork2.get_messages()) == 6


async def test_a_branch_after_a_restart_and_a_cold_load(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    scripted.default = Echo(prefix="re ")
    async with open_runtime(config) as agent:
        conv = await agent.create_conversation()
        ids = await four_turns(agent, conv)
        await turn(agent, conv, lambda: conv.edit(ids[2], "u3 b"))
        before = await conv.get_messages()
        conv_id = conv.id
    async with open_runtime(config) as agent:
        conv2 = await agent.get_conversation(conv_id)
        assert conv2 is not None
        assert await conv2.get_messages() == before
        await turn(agent, conv2, lambda: conv2.send("next"))
        assert seen(scripted.requests[-1])[1:] == [
            "user:u1", "assistant:re u1", "user:u2", "assistant:re u2", "user:u3 b",
            "assistant:re u3 b", "user:next"]


async def test_busy_policy_idempotency_and_bad_requests(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    scripted.default = Echo(prefix="re ")
    async with open_runtime(config) as agent:
        conv = await agent.create_conversation()
        await turn(agent, conv, lambda: conv.send("u1"))
        user, answer = await conv.get_messages()
        with pytest.raises(InvalidInputError, match="not a user message"):
            await conv.edit(answer.id, "no")
        with pytest.raises(NotFoundError):
            await conv.edit("nope", "no")
        with pytest.raises(NotFoundError):
            await conv.regenerate("nope")
        with pytest.raises(NotFoundError):
            await conv.switch_branch("nope")
        with pytest.raises(NotFoundError):
            await conv.fork("nope")
        other = await agent.create_conversation()
        with pytest.raises(NotFoundError):  # another conversation's message
            await other.edit(user.id, "no")
        # a retried edit with its key is answered with the first one's id, stored once
        first = await turn(agent, conv, lambda: conv.edit(user.id, "u1 b", idempotency_key="k"))
        assert await conv.edit(user.id, "u1 b", idempotency_key="k") == first
        assert len(await conv.siblings(first)) == 2
        # busy: reject refuses and stores nothing
        scripted.push(Hang(text_before="thinking"))
        online = agent.online_outbox.online_events(conv.id)
        await conv.send("slow")
        with trio.fail_after(10):
            async for ev in online:
                if ev.type == "append_text":
                    break
        with pytest.raises(BusyError):
            await conv.regenerate(answer.id, on_busy="reject")
        with pytest.raises(BusyError):
            await conv.switch_branch(user.id, on_busy="reject")
        cursor = await agent.outbox.current_cursor()
        regenerated = await conv.regenerate(first, on_busy="interrupt")
        await take_until(agent.outbox.conversation_events(cursor, conv.id), nth("touched", 2),
                         seconds=30)
        listing = await conv.get_messages()
        assert [text_of(r) for r in listing] == ["u1 b", "re u1 b"]
        assert listing[1].message.turn_id == regenerated  # type: ignore[union-attr]


# --- the tree alone (pure: actors/branches.py) ---------------------------------------------------


def _rec(rid: str, seq: int, message: Any) -> MessageRecord:
    return MessageRecord(id=rid, seq=seq, conversation_id="c", created_at=0.0, message=message)


def _user(rid: str, seq: int) -> MessageRecord:
    return _rec(rid, seq, UserMessage(content=[Text(body=rid)]))


def _answer(rid: str, seq: int, turn: str) -> MessageRecord:
    return _rec(rid, seq, AssistantMessage(content=[Text(body=rid)], turn_id=turn))


def test_the_tree_follows_turns_not_seq_order() -> None:
    """A message queued behind a running turn is journaled before that turn's answer; it still
    follows the answer (turns run in the order they were accepted), and each answer-side record
    belongs to its turn; regenerates, switches and edits move the current answer."""
    from agentik.actors.branches import Tree, copies, memory_items
    from agentik.wire import AssistantItem, ToolCall, ToolCallSpec, ToolItem, ToolResult, UserItem

    records = [
        _user("u1", 1), _user("u2", 2),  # u2 queued while u1's turn runs
        _rec("t1", 3, ToolCall(call_id="k", name="f", arguments="{}", turn_id="u1")),
        _rec("r1", 4, ToolResult(call_id="k", name="f", content="42", turn_id="u1")),
        _answer("a1", 5, "u1"), _answer("a2", 6, "u2"),
    ]
    tree = Tree(records)
    assert [r.id for r in tree.path()] == ["u1", "t1", "r1", "a1", "u2", "a2"]
    assert [r.id for r in tree.listing()] == ["u1", "u2", "t1", "r1", "a1", "a2"]  # seq order
    assert memory_items(tree.path()) == (
        (UserItem(content=[Text(body="u1")]), "u1"),
        (AssistantItem(content=[], tool_calls=[ToolCallSpec(call_id="k", name="f",
                                                            arguments="{}")]), None),
        (ToolItem(call_id="k", name="f", content="42"), "r1"),
        (AssistantItem(content=[Text(body="a1")]), "a1"),
        (UserItem(content=[Text(body="u2")]), "u2"),
        (AssistantItem(content=[Text(body="a2")]), "a2"))
    # regenerate u1's answer: the branch is u1 and the new answer; u2 hangs off the old one
    tree = Tree([*records, _rec("g", 7, BranchPoint(kind="regenerate", message_id="u1")),
                 _answer("a1b", 8, "g")])
    assert [r.id for r in tree.path()] == ["u1", "a1b"]
    assert [(r.siblings, r.sibling_index) for r in tree.listing()] == [(1, 0), (2, 1)]
    assert [r.id for r in tree.siblings("t1")] == ["a1", "a1b"]
    assert tree.descend("a1") == "u2" and tree.descend("u1") == "g"
    # switch back to the first answer: the newest path below it comes along
    switched = Tree([*tree.records.values(),
                     _rec("s", 9, BranchPoint(kind="switch", message_id="r1"))])
    assert [r.id for r in switched.path()] == ["u1", "t1", "r1", "a1", "u2", "a2"]
    # an edit of u2 follows what u2 followed
    edited = Tree([*switched.records.values(),
                   _rec("e", 10, BranchPoint(kind="edit", message_id="u2")), _user("u2b", 11)])
    assert [r.id for r in edited.path()] == ["u1", "t1", "r1", "a1", "u2b"]
    assert edited.edits == {"u2b"} and [r.id for r in edited.siblings("u2b")] == ["u2", "u2b"]
    # a fork's copies: new ids, each answer naming its new user message as its turn
    copied = copies(edited, edited.path_to("a1"))
    assert [type(m).__name__ for _, m in copied] == [
        "UserMessage", "ToolCall", "ToolResult", "AssistantMessage"]
    new_user = copied[0][0]
    assert new_user != "u1" and all(getattr(m, "turn_id", new_user) == new_user
                                    for _, m in copied)


async def test_compaction_works_on_the_branch(config: Config, scripted: ScriptedOpenAI) -> None:
    """An edit deep in a conversation that outgrew the window: its turn's memory is its branch
    (the edited message's old version and what followed it are not in it), compacted as usual
    to fit; a switch back compacts the other branch when it is next used."""
    from agentik.actors.compaction import SUMMARY_PROMPT
    from tests.test_context_openai import sentence

    def is_summary(body: dict[str, Any]) -> bool:
        return bool(body["messages"][0]["content"] == SUMMARY_PROMPT)

    scripted.callable_default = lambda body: (
        Echo(prefix="summary: ") if is_summary(body) else Echo(prefix="You asked: "))
    window = 600
    async with open_runtime(config.replace(context_window=window)) as agent:
        conv = await agent.create_conversation()
        ids = [await turn(agent, conv, lambda i=i: conv.send(sentence(i))) for i in range(8)]
        assert any(is_summary(b) for b in scripted.requests), "no compaction happened"
        before = len(scripted.requests)
        await turn(agent, conv, lambda: conv.edit(ids[6], "edited six"))
        after = scripted.requests[before:]
        text = json.dumps(after)
        assert "(question 6)" not in text and "(question 7)" not in text  # not on this branch
        assert "(question 5)" in text  # the branch before the edit: summarised or kept
        rounds = [b for b in after if not is_summary(b)]
        assert rounds[-1]["messages"][-1]["content"] == "edited six"
        for body in rounds:
            assert estimate(body) + body["max_completion_tokens"] <= window
        # back to the first version: the next turn's memory is that branch, fitted again
        await conv.switch_branch(ids[6])
        before = len(scripted.requests)
        await turn(agent, conv, lambda: conv.send("and now?"))
        text = json.dumps(scripted.requests[before:])
        assert "edited six" not in text and "(question 7)" in text


def estimate(body: dict[str, Any]) -> int:
    from tests.test_context_openai import our_estimate
    return our_estimate(body)


async def test_a_switch_waits_for_the_turn_before_it(config: Config, scripted: ScriptedOpenAI
                                                     ) -> None:
    """A switch takes its place among the conversation's turns (the busy policy ``queue``): sent
    while a turn runs, it is done once that turn has its answer, which stays on the branch the
    turn ran on; the model then sees the branch switched to."""
    from tests.scripted_openai import Reply

    scripted.default = Echo(prefix="re ")
    async with open_runtime(config) as agent:
        conv = await agent.create_conversation()
        ids = [await turn(agent, conv, lambda t=t: conv.send(t)) for t in ("u1", "u2")]
        edited = await turn(agent, conv, lambda: conv.edit(ids[1], "u2 b"))
        gate = trio.Event()
        scripted.push(Reply(["slow ", "answer"], gate=gate))
        online = agent.online_outbox.online_events(conv.id)
        await conv.send("u3")  # on the edited branch
        with trio.fail_after(10):
            async for ev in online:
                if ev.type == "append_text":
                    break
        switched: list[Any] = []
        async with trio.open_nursery() as nursery:
            async def switch() -> None:
                switched.append(await conv.switch_branch(ids[1]))
            nursery.start_soon(switch)
            handle = agent._registry.live[conv.id]
            with trio.fail_after(10):  # until the switch is queued (its reads run in threads)
                while not any(t.branch == "switch" for t in handle.waiting.values()):
                    await trio.testing.wait_all_tasks_blocked()
            assert not switched and handle.current is not None
            gate.set()
        [snapshot] = switched
        assert [text_of(r) for r in snapshot.messages] == ["u1", "re u1", "u2", "re u2"]
        versions = await conv.siblings(edited)
        assert [r.id for r in versions] == [ids[1], edited]
        conv_back = await conv.switch_branch(edited)
        assert [text_of(r) for r in conv_back.messages][-2:] == ["u3", "slow answer"]
        await turn(agent, conv, lambda: conv.send("u4"))
        assert seen(scripted.requests[-1])[-3:] == ["user:u3", "assistant:slow answer", "user:u4"]
