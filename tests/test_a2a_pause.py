"""Issue 30 on A2A (docs/A2A.md, "A task that asks"), over a real hypercorn on 127.0.0.1: a task
whose turn waits for an approval or a question goes to TASK_STATE_INPUT_REQUIRED with the
question (or the tool and its arguments, and a data part) as its status message; a follow-up
message on the task answers it and the task completes; both with a2a-sdk's own client. Also:
a plain "no, <reason>" refuses, a follow-up that is no answer asks again, two pauses of one round
are asked one after the other, a paused task across a restart is still INPUT_REQUIRED and
answerable, cancelling it interrupts the waiting turn, and a tool server's question (an MCP
elicitation) is answered by a data part."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import trio
from a2a.types import a2a_pb2 as pb
from google.protobuf import json_format

from agentik.a2a.pauses import answer_of, yes_or_no
from agentik.a2a.types import Message, Part
from agentik.wire import ApprovalAnswer, ApprovalRequest, InputAnswer, InputRequest
from tests.scripted_openai import Reply, ScriptedOpenAI, ToolCalls
from tests.test_a2a import STREAM_LIMIT, V1, Rpc, message, texts
from tests.test_elicitation import TOOLBOX
from tests.test_pause import ASK, DELETE, Tool, model
from tests.webutil import make_config, openai, serve_app  # noqa: F401 - fixtures by name

#: on the suite's engine (``conftest.ENGINE``: SQLite, then PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"


def _sdk_approval(base_url: str) -> tuple[list[Any], list[Any]]:
    """a2a-sdk's asyncio client, in this worker thread: a streamed message whose task asks for
    an approval, then the approving follow-up (a data part) on the task, streamed too."""
    from a2a.client import ClientConfig, create_client

    async def go() -> tuple[list[Any], list[Any]]:
        async with httpx.AsyncClient(headers=V1, timeout=30) as http:
            client = await create_client(base_url, ClientConfig(streaming=True, httpx_client=http))
            first = [event async for event in client.send_message(pb.SendMessageRequest(
                message=pb.Message(message_id="sdk-p1", role=pb.ROLE_USER, context_id="sdk-p",
                                   parts=[pb.Part(text="delete a.txt")])))]
            task_id = first[0].task.id
            approve = pb.Part()
            json_format.ParseDict({"data": {"approve": True}}, approve)
            second = [event async for event in client.send_message(pb.SendMessageRequest(
                message=pb.Message(message_id="sdk-p2", role=pb.ROLE_USER, context_id="sdk-p",
                                   task_id=task_id, parts=[approve])))]
            return first, second

    return asyncio.run(asyncio.wait_for(go(), STREAM_LIMIT))


async def test_the_sdk_client_approves_a_paused_task_and_it_completes(
        tmp_path: Path, openai: ScriptedOpenAI) -> None:
    tool = Tool()
    config = make_config(tmp_path, openai, approval=("delete_*",))
    async with serve_app(config, model(DELETE), tool.tools) as server:
        first, second = await trio.to_thread.run_sync(_sdk_approval, server.url)
    asked = [e.status_update.status for e in first if e.HasField("status_update")][-1]
    assert asked.state == pb.TASK_STATE_INPUT_REQUIRED
    text, data = asked.message.parts
    assert "delete_file" in text.text and '{"path": "a.txt"}' in text.text
    assert json_format.MessageToDict(data)["data"] == {
        "call_id": "c1", "tool": "delete_file", "arguments": {"path": "a.txt"}}
    states = [e.status_update.status.state for e in second if e.HasField("status_update")]
    assert states[-1] == pb.TASK_STATE_COMPLETED
    final = [e.status_update.status for e in second if e.HasField("status_update")][-1]
    assert final.message.parts[0].text == "tools said: deleted a.txt"
    assert tool.runs == ["a.txt"]


async def test_a_question_is_asked_and_its_follow_up_answers_it(
        tmp_path: Path, openai: ScriptedOpenAI) -> None:
    tool = Tool()
    config = make_config(tmp_path, openai, ask_user=True)
    async with serve_app(config, model(ASK), tool.tools) as server, \
            httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
        rpc = Rpc(http)
        with trio.fail_after(STREAM_LIMIT):
            task = (await rpc.call("SendMessage", {"message": message("clean up")},
                                   pb.SendMessageResponse))["task"]
            assert task["status"]["state"] == INPUT_REQUIRED
            parts = task["status"]["message"]["parts"]
            assert parts[0]["text"] == "Which file?"
            assert parts[1]["data"]["call_id"] == "q1"
            done = (await rpc.call("SendMessage", {"message": message(
                "b.txt", message_id="m2", taskId=task["id"])}))["task"]
            assert done["status"]["state"] == "TASK_STATE_COMPLETED"
            assert texts(done["status"]["message"]["parts"]) == "tools said: b.txt"
            assert texts(done["artifacts"][0]["parts"]) == "tools said: b.txt"
            # the conversation has the same answer as any other door gave it
            cid = (await http.get("/agentik/conversations")).json()["conversations"][0]["id"]
            journal = (await http.get(f"/agentik/conversations/{cid}/messages")).json()
            kinds = [m["message"]["type"] for m in journal]
            assert "input_answer" in kinds


async def test_no_with_a_reason_refuses_and_a_non_answer_asks_again(
        tmp_path: Path, openai: ScriptedOpenAI) -> None:
    tool = Tool()
    config = make_config(tmp_path, openai, approval=("delete_*",))
    async with serve_app(config, model(DELETE), tool.tools) as server, \
            httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
        rpc = Rpc(http)
        with trio.fail_after(STREAM_LIMIT):
            task = (await rpc.call("SendMessage", {"message": message("go")}))["task"]
            assert task["status"]["state"] == INPUT_REQUIRED
            again = (await rpc.call("SendMessage", {"message": message(
                "perhaps", message_id="m2", taskId=task["id"])}, pb.SendMessageResponse))["task"]
            assert again["status"]["state"] == INPUT_REQUIRED
            assert "yes or no" in again["status"]["message"]["parts"][0]["text"]
            assert tool.runs == []
            done = (await rpc.call("SendMessage", {"message": message(
                "No, keep it.", message_id="m3", taskId=task["id"])}))["task"]
            assert done["status"]["state"] == "TASK_STATE_COMPLETED"
            assert texts(done["status"]["message"]["parts"]) == (
                "tools said: the user refused this call: keep it")
            assert tool.runs == []


async def test_two_pauses_of_a_round_are_asked_in_turn_streamed(
        tmp_path: Path, openai: ScriptedOpenAI) -> None:
    tool = Tool()
    config = make_config(tmp_path, openai, approval=("delete_*",), ask_user=True)
    async with serve_app(config, model(ASK, DELETE), tool.tools) as server, \
            httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
        rpc = Rpc(http)
        async with rpc.stream("SendStreamingMessage", {"message": message("go")}) as events:
            seen = [event async for event in events]
        task_id = seen[0]["task"]["id"]
        status = seen[-1]["statusUpdate"]["status"]
        assert status["state"] == INPUT_REQUIRED and status["message"]["parts"][0]["text"] == \
            "Which file?"
        async with rpc.stream("SendStreamingMessage", {"message": message(
                "a.txt", message_id="m2", taskId=task_id)}) as events:
            seen = [event async for event in events]
        status = seen[-1]["statusUpdate"]["status"]
        assert status["state"] == INPUT_REQUIRED
        assert status["message"]["parts"][1]["data"]["tool"] == "delete_file"
        async with rpc.stream("SubscribeToTask", {"id": task_id}) as events:
            await rpc.call("SendMessage", {"message": message(
                "yes", message_id="m3", taskId=task_id)})
            states = [e["statusUpdate"]["status"]["state"] async for e in events
                      if "statusUpdate" in e]
        assert states[-1] == "TASK_STATE_COMPLETED"
        assert tool.runs == ["a.txt"]


async def test_a_paused_task_survives_a_restart_and_a_cancel_interrupts_its_turn(
        tmp_path: Path, openai: ScriptedOpenAI) -> None:
    tool = Tool()
    config = make_config(tmp_path, openai, approval=("delete_*",))
    async with serve_app(config, model(DELETE), tool.tools) as server, \
            httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
        rpc = Rpc(http)
        with trio.fail_after(STREAM_LIMIT):
            task = (await rpc.call("SendMessage", {"message": message("go", contextId="k")})
                    )["task"]
            other = (await rpc.call("SendMessage", {"message": message(
                "go", message_id="o1", contextId="k2")}))["task"]
            assert task["status"]["state"] == other["status"]["state"] == INPUT_REQUIRED
            canceled = await rpc.call("CancelTask", {"id": other["id"]}, pb.Task)
            assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    async with serve_app(config, model(DELETE), tool.tools) as server, \
            httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
        rpc = Rpc(http)
        with trio.fail_after(STREAM_LIMIT):
            got = await rpc.call("GetTask", {"id": task["id"]}, pb.Task)
            assert got["status"]["state"] == INPUT_REQUIRED
            done = (await rpc.call("SendMessage", {"message": message(
                "yes", message_id="m2", taskId=task["id"])}))["task"]
            assert done["status"]["state"] == "TASK_STATE_COMPLETED"
            assert tool.runs == ["a.txt"]  # the cancelled task's call never ran
            # the cancelled task's turn ended: its context takes a new message at once
            openai_free = (await rpc.call("SendMessage", {"message": message(
                "go", message_id="o2", contextId="k2")}))["task"]
            assert openai_free["status"]["state"] == INPUT_REQUIRED


def test_the_answers_a_follow_up_gives() -> None:
    approval = ApprovalRequest(call_id="c1", tool="t", arguments="{}", turn_id="u")
    question = InputRequest(call_id="q1", question="?", turn_id="u")

    def msg(*parts: Part) -> Message:
        return Message(message_id="m", role="ROLE_USER", parts=list(parts))

    assert yes_or_no("Yes.") == (True, None)
    assert yes_or_no("no - not today") == (False, "not today")
    assert yes_or_no("maybe") is None
    assert answer_of(approval, msg(Part(data={"approve": False, "reason": "r"}))) == \
        ApprovalAnswer(call_id="c1", approve=False, reason="r")
    assert isinstance(answer_of(approval, msg(Part(text="hmm"))), str)
    assert answer_of(question, msg(Part(text=" b.txt "))) == InputAnswer(call_id="q1",
                                                                         text="b.txt")
    schema = InputRequest(call_id="e1", question="?", schema={"type": "object"}, turn_id="u")
    assert answer_of(schema, msg(Part(data={"n": 1}))) == InputAnswer(call_id="e1",
                                                                      data={"n": 1})


async def test_a_tool_servers_question_is_asked_and_a_data_part_answers_it(
        tmp_path: Path, openai: ScriptedOpenAI) -> None:
    """An MCP elicitation (tests/mcp_servers/toolbox.py ``book``) over A2A: INPUT_REQUIRED with
    its message as text and its schema in the data part; a follow-up's data part is the
    structured answer the server accepts."""
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {"toolbox": {
        "command": sys.executable, "args": [TOOLBOX]}}}))
    config = make_config(tmp_path, openai, mcp_config=str(mcp))
    openai.push(ToolCalls([("b1", "toolbox__book", '{"city": "Oslo"}')]), Reply("Booked."))
    async with serve_app(config) as server, \
            httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
        tools = server.agent.tools
        rpc = Rpc(http)
        with trio.fail_after(STREAM_LIMIT):
            await tools.wait_until(lambda: bool(tools.specs()))
            task = (await rpc.call("SendMessage", {"message": message("book Oslo")}))["task"]
            assert task["status"]["state"] == INPUT_REQUIRED
            text, data = task["status"]["message"]["parts"]
            assert text["text"] == "How many nights in Oslo?"
            assert data["data"]["schema"]["properties"]["nights"]["type"] == "integer"
            done = (await rpc.call("SendMessage", {"message": {
                "role": "ROLE_USER", "messageId": "m2", "taskId": task["id"],
                "parts": [{"data": {"nights": 2}}]}}))["task"]
            assert done["status"]["state"] == "TASK_STATE_COMPLETED"
        assert openai.requests[1]["messages"][-1]["content"] == \
            "booked 2 nights in Oslo, late=False"
