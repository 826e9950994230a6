"""A message the server accepted is answered (issue 26, point 7): with a turn running and more
messages queued behind it (accepted: 202), a SIGKILL and a restart end the running turn with its
Error as before, and the queued ones run after the restart, in the order they came, on SQLite
and on PostgreSQL (a node taking the conversation over: tests/test_pg_nodes.py)."""

# ruff: noqa: F811 - the fixture imported from tests.test_runtime is a parameter here

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import trio

from agentik import Config, open_runtime
from agentik.wire import AssistantMessage, Cursor, Error, UserMessage
from tests.scripted_openai import Echo, Hang, ScriptedOpenAI
from tests.test_runtime import kill_config, nth, take_until  # noqa: F401 - a fixture by name

CHILD = textwrap.dedent("""
    import sys, trio, agentik
    async def main():
        cfg = agentik.Config(db_path=sys.argv[1], openai_base_url=sys.argv[2], llm_max_retries=0,
                             database_url=sys.argv[3] or None, node_id=sys.argv[4])
        async with agentik.open_runtime(cfg) as agent:
            conv = await agent.create_conversation()
            online = agent.online_outbox.online_events(conv.id)
            await conv.send("first")
            async for ev in online:
                if ev.type == "append_text":
                    break
            await conv.send("second")  # accepted, queued behind the running turn
            await conv.send("third")
            print(conv.id, flush=True)
            await trio.sleep_forever()
    trio.run(main)
""")


async def _killed_with_queued_turns(config: Config, scripted: ScriptedOpenAI) -> str:
    """A process that accepted three messages (the first one's answer streaming, two queued),
    then SIGKILLed; the conversation's id."""
    scripted.push(Hang(text_before="Let me"))
    with trio.fail_after(60):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", CHILD, config.db_path, scripted.base_url,
             config.database_url or "", config.node_id],
            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        try:
            assert proc.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1024)
                assert chunk, "child exited early"
                line += chunk
        finally:
            proc.kill()  # SIGKILL: no cleanup at all
            await proc.wait()
    return line.decode().strip()


async def test_queued_messages_are_answered_in_order_after_a_kill(
    kill_config: Config, scripted: ScriptedOpenAI
) -> None:
    config = kill_config
    conv_id = await _killed_with_queued_turns(config, scripted)
    scripted.default = Echo(prefix="answer to ")
    async with open_runtime(config) as agent:
        # nobody sends: start-up runs the queued turns by itself
        await take_until(
            agent.outbox.conversation_events(Cursor(epoch=agent.id, offset=0), conv_id),
            nth("touched", 3), seconds=30)
        records = await agent.journal.list(conversation_id=conv_id)
        kinds = [type(r.message).__name__ for r in records]
        assert kinds == ["UserMessage", "UserMessage", "UserMessage", "Error",
                         "AssistantMessage", "AssistantMessage"], kinds
        first, second, third = records[:3]
        error = records[3].message
        assert isinstance(error, Error) and error.message == "interrupted by restart"
        assert error.turn_id == first.id
        answers = [r.message for r in records[4:]]
        assert all(isinstance(a, AssistantMessage) for a in answers)
        assert [a.turn_id for a in answers] == [second.id, third.id]  # type: ignore[union-attr]
        assert [a.content[0].body for a in answers] == [  # type: ignore[union-attr]
            "answer to second", "answer to third"]
        # the third turn's model saw the second one's question and answer before it
        assert [m["content"] for m in scripted.requests[-1]["messages"][-3:]] == [
            "second", "answer to second", "third"]
        # a new message queues behind nothing: answered next
        conv = await agent.get_conversation(conv_id)
        assert conv is not None
        await conv.send("fourth")
        await take_until(
            agent.outbox.conversation_events(Cursor(epoch=agent.id, offset=0), conv_id),
            nth("touched", 4), seconds=30)
        records = await agent.journal.list(conversation_id=conv_id)
        assert isinstance(records[-1].message, AssistantMessage)
        assert isinstance(records[-2].message, UserMessage)
    # a second restart finds nothing left to run or close
    async with open_runtime(config) as agent:
        assert len(await agent.journal.list(conversation_id=conv_id)) == len(records)


async def test_a_resumed_queued_turn_can_be_cancelled_before_it_runs(
    kill_config: Config, scripted: ScriptedOpenAI
) -> None:
    """A queued turn brought back by a restart is one the conversation waits on like any other:
    cancel_turn withdraws it (it ends interrupted, never sent to the model)."""
    config = kill_config
    conv_id = await _killed_with_queued_turns(config, scripted)
    n = len(scripted.requests)
    scripted.push(Hang(text_before="Working"))  # the second turn's answer, after the restart
    async with open_runtime(config) as agent:
        with trio.fail_after(30):
            await scripted.wait_requests(n + 1)
        records = await agent.journal.list(conversation_id=conv_id)
        second, third = records[1], records[2]
        assert scripted.requests[-1]["messages"][-1]["content"] == "second"
        assert await agent.cancel_turn(conv_id, third.id)
        conv = await agent.get_conversation(conv_id)
        assert conv is not None and await conv.interrupt()  # the second one, running
        await take_until(
            agent.outbox.conversation_events(Cursor(epoch=agent.id, offset=0), conv_id),
            nth("touched", 3), seconds=30)
        records = await agent.journal.list(conversation_id=conv_id)
        ended = [(r.message.turn_id, type(r.message).__name__) for r in records[3:]]  # type: ignore[union-attr]
        assert (third.id, "AssistantMessage") in ended
        answer = next(r.message for r in records[3:]
                      if getattr(r.message, "turn_id", None) == third.id)
        assert isinstance(answer, AssistantMessage) and answer.interrupted
        assert second.id in [t for t, _ in ended]
        assert all(m["content"] != "third" for b in scripted.requests for m in b["messages"])
