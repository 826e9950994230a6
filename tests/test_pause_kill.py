"""Issue 30: a pause survives a SIGKILL. A process whose turn waits for the approval of a real MCP
tool (tests/mcp_servers/toolbox.py ``tally``, which counts its calls in a file) is killed; after
the restart the turn still waits (no "interrupted by restart"), an approval completes it, and the
tool ran exactly once, with the call's id and its conversation's in the request's ``_meta``. On
SQLite, and on PostgreSQL where the restarted node keeps its id."""

# ruff: noqa: F811 - the fixture imported from tests.test_runtime is a parameter here

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import trio

from agentik import Config, open_runtime
from agentik.testing import FunctionLlm
from agentik.wire import Cursor, Error, ToolResult
from tests.test_runtime import is_type, kill_config, take_until  # noqa: F401 - a fixture by name

TOOLBOX = str(Path(__file__).parent / "mcp_servers" / "toolbox.py")

# The model both processes run: it calls toolbox__tally on a turn's first round, then answers
# with what the tool said.
MODEL = textwrap.dedent("""
    from agentik.testing import FunctionLlm
    from agentik.wire import ToolCallSpec, ToolItem

    def model(counter, tool="toolbox__tally"):
        def reply(messages, tools):
            if isinstance(messages[-1], ToolItem):
                return "the tool said " + messages[-1].content
            return [ToolCallSpec(call_id="t1", name=tool, arguments='{"path": "%s"}' % counter)]
        return FunctionLlm(reply)
""")

CHILD = MODEL + textwrap.dedent("""
    import sys, trio, agentik

    async def main():
        db, url, node, mcp, counter, tool, until = sys.argv[1:8]
        cfg = agentik.Config(db_path=db, database_url=url or None, node_id=node, mcp_config=mcp,
                             approval=("toolbox__tally",))
        async with agentik.open_runtime(cfg, llm=model(counter, tool)) as agent:
            with trio.fail_after(30):
                await agent.tools.wait_until(lambda: bool(agent.tools.specs()))
            conv = await agent.create_conversation()
            cursor = await agent.outbox.current_cursor()
            await conv.send("count once")
            async for ev in agent.outbox.conversation_events(cursor, conv.id):
                if ev.type == until:
                    break
            print(conv.id, flush=True)
            await trio.sleep_forever()
    trio.run(main)
""")


def model(counter: str, tool: str = "toolbox__tally") -> FunctionLlm:
    scope: dict[str, Any] = {}
    exec(MODEL, scope)  # the same model as the child's
    llm: FunctionLlm = scope["model"](counter, tool)
    return llm


async def killed_while_waiting(config: Config, mcp: str, counter: str,
                               tool: str = "toolbox__tally", until: str = "approval_requested"
                               ) -> str:
    """A process whose turn calls ``tool``, SIGKILLed once its conversation has the event
    ``until`` (a pause; a tool call, then the call running); the conversation's id."""
    with trio.fail_after(60):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", CHILD, config.db_path, config.database_url or "",
             config.node_id, mcp, counter, tool, until],
            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        try:
            assert proc.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1024)
                assert chunk, "child exited early"
                line += chunk
            if until == "tool_call":  # its call runs (and hangs) once the tool counted it
                while True:  # another process's file: asked until it is there
                    if await trio.Path(counter).exists():
                        break
                    await trio.sleep(0.02)
        finally:
            proc.kill()  # SIGKILL: no cleanup at all
            await proc.wait()
    return line.decode().strip()


async def test_a_turn_waiting_for_approval_survives_a_sigkill(kill_config: Config,
                                                              tmp_path: Path) -> None:
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {"toolbox": {
        "command": sys.executable, "args": [TOOLBOX]}}}))
    counter = str(tmp_path / "tally.txt")
    config = kill_config.replace(mcp_config=str(mcp), approval=("toolbox__tally",))
    conv_id = await killed_while_waiting(config, str(mcp), counter)
    assert not await trio.Path(counter).exists()  # it waited: the tool never ran
    async with open_runtime(config, llm=model(counter)) as agent:
        with trio.fail_after(30):
            await agent.tools.wait_until(lambda: bool(agent.tools.specs()))
        conv = await agent.get_conversation(conv_id)
        assert conv is not None
        records = await conv.get_messages()
        assert not any(isinstance(r.message, Error) for r in records)  # still waiting
        answer = await conv.approve("t1")
        assert answer.message.approve  # type: ignore[union-attr]
        events = await take_until(
            agent.outbox.conversation_events(Cursor(epoch=agent.id, offset=0), conv_id),
            is_type("touched"), seconds=30)
        events = [e for e in events if e.type != "created"]
        assert [e.type for e in events] == [
            "user_message", "tool_call", "approval_requested", "approval_given", "tool_result",
            "assistant_message", "touched"]
        result = events[4].event.record.message  # type: ignore[union-attr]
        assert isinstance(result, ToolResult)
        said = json.loads(result.content)
        assert said["count"] == 1  # exactly once, counted by the tool
        assert said["meta"]["agentik/call_id"] == "t1"
        assert said["meta"]["agentik/conversation_id"] == conv_id
        assert (await trio.Path(counter).read_text()).count("\n") == 1
        final = events[5].event.record.message  # type: ignore[union-attr]
        assert final.content[0].body.startswith("the tool said ")  # type: ignore[union-attr]



async def test_a_call_running_when_the_server_died_is_never_run_again(
        kill_config: Config, tmp_path: Path) -> None:
    """SIGKILL while a tool call runs (the toolbox's ``block``: counted, then it hangs): after
    the restart the call has a failed result, "outcome unknown", before the turn's restart
    error, and the tool was not called again (on PostgreSQL the restarted node keeps its id)."""
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {"toolbox": {
        "command": sys.executable, "args": [TOOLBOX]}}}))
    counter = str(tmp_path / "block.txt")
    config = kill_config.replace(mcp_config=str(mcp))
    conv_id = await killed_while_waiting(config, str(mcp), counter, "toolbox__block", "tool_call")
    async with open_runtime(config, llm=model(counter, "toolbox__block")) as agent:
        events = await take_until(
            agent.outbox.conversation_events(Cursor(epoch=agent.id, offset=0), conv_id),
            is_type("touched"), seconds=30)
        events = [e for e in events if e.type != "created"]
        assert [e.type for e in events] == [
            "user_message", "tool_call", "tool_failed", "error", "touched"]
        failed = events[2].event.record.message  # type: ignore[union-attr]
        assert isinstance(failed, ToolResult) and failed.call_id == "t1"
        assert failed.content == "outcome unknown: the server stopped while it ran"
        assert events[3].event.record.message.code == "restart"  # type: ignore[union-attr]
        assert (await trio.Path(counter).read_text()).count("\n") == 1  # not run again
