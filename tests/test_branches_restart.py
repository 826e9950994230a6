"""Issue 32: branch turns survive a kill. With a turn running, an edit and a regenerate are
accepted (queued behind it); the process is SIGKILLed; after the restart the running turn ends
with its Error, and the queued edit and regenerate run in order, each on its own branch (the
model's view checked through the requests the scripted model got), on SQLite and PostgreSQL."""

# ruff: noqa: F811 - the fixture imported from tests.test_runtime is a parameter here

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import trio

from agentik import Config, open_runtime
from agentik.wire import Cursor
from tests.scripted_openai import Echo, Hang, ScriptedOpenAI
from tests.test_runtime import kill_config, nth, take_until  # noqa: F401 - a fixture by name

CHILD = textwrap.dedent("""
    import sys, trio, agentik
    async def main():
        cfg = agentik.Config(db_path=sys.argv[1], openai_base_url=sys.argv[2], llm_max_retries=0,
                             database_url=sys.argv[3] or None, node_id=sys.argv[4])
        async with agentik.open_runtime(cfg) as agent:
            conv = await agent.create_conversation()
            cursor = await agent.outbox.current_cursor()
            zero = await conv.send("zero")
            async for ev in agent.outbox.conversation_events(cursor, conv.id):
                if ev.type == "touched":
                    break
            online = agent.online_outbox.online_events(conv.id)
            first = await conv.send("first")
            async for ev in online:
                if ev.type == "append_text":
                    break
            await conv.edit(zero, "zero again")  # accepted, queued behind the running turn
            await conv.regenerate(first)         # and a new answer to "first", after it
            print(conv.id, flush=True)
            await trio.sleep_forever()
    trio.run(main)
""")


async def test_queued_edit_and_regenerate_run_on_their_branches_after_a_kill(
    kill_config: Config, scripted: ScriptedOpenAI
) -> None:
    config = kill_config
    scripted.push(Echo(prefix="re "), Hang(text_before="Let me"))
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
    conv_id = line.decode().strip()
    scripted.default = Echo(prefix="after ")
    before = len(scripted.requests)
    async with open_runtime(config) as agent:
        # nobody sends: start-up ends the running turn and runs the queued ones
        await take_until(
            agent.outbox.conversation_events(Cursor(epoch=agent.id, offset=0), conv_id),
            nth("touched", 4), seconds=30)
        edit, regenerate = scripted.requests[before:before + 2]
        assert [m["content"] for m in edit["messages"][1:]] == ["zero again"]
        assert [m["content"] for m in regenerate["messages"][1:]] == ["zero", "re zero", "first"]
        conv = await agent.get_conversation(conv_id)
        assert conv is not None
        listing = await conv.get_messages()
        texts = [getattr(r.message, "content", [None])[0] for r in listing]
        assert [t.body for t in texts if t is not None] == [  # type: ignore[attr-defined]
            "zero", "re zero", "first", "after first"]
        assert (listing[-1].siblings, listing[-1].sibling_index) == (2, 1)  # the Error, then it
