"""Issue 11 #3: a model stream cut mid-answer (the body ends with no finish_reason and no [DONE])
is a failed turn: the text shown so far is kept as an assistant message marked interrupted, then
the durable error (code llm_connection), then the end; the next turn works. Real server, real
scripted OpenAI endpoint, real SQLite file."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from typing import Any

import httpx2
import msgspec
import trio

from tests.scripted_openai import Raw, Reply, ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    client,
    config,
    no_error_logs,
    open_sse,
    openai,
    server,
)


def _chunk(delta: dict[str, Any]) -> str:
    return msgspec.json.encode({
        "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }).decode()


async def _turn(client: httpx2.AsyncClient, cid: str, text: str) -> list[Any]:
    """Send ``text``; return the conversation's durable events of that turn up to its end."""
    cursor = (await client.get("/agentik/cursor")).json()["current"]
    async with open_sse(client, f"/agentik/conversations/{cid}/events", after=cursor) as stream:
        sent = await client.post(
            f"/agentik/conversations/{cid}/messages",
            json={"content": [{"type": "text", "body": text}]},
        )
        assert sent.status_code == 202, sent.text
        events = []
        with trio.fail_after(20):
            while True:
                frame = (await stream.next_event()).json()["event"]
                events.append(frame)
                if frame["type"] in ("assistant_message", "error") and (
                    frame["type"] == "error" or not frame["record"]["message"]["interrupted"]
                ):
                    return events


async def test_stream_cut_mid_answer_is_a_failed_turn(
    client: httpx2.AsyncClient, openai: ScriptedOpenAI, server: Server
) -> None:
    cid = (await client.post("/agentik/conversations")).json()["id"]
    openai.push(Raw([_chunk({"role": "assistant", "content": ""}),
                     _chunk({"content": "The first 58 tok"}), _chunk({"content": "ens of"})]))
    events = await _turn(client, cid, "tell me a long story")
    kinds = [e["type"] for e in events]
    assert kinds == ["user_message", "assistant_message", "error"], kinds
    partial = events[1]["record"]["message"]
    assert partial["interrupted"] is True
    assert partial["content"] == [{"type": "text", "body": "The first 58 tokens of"}]
    error = events[2]["record"]["message"]
    assert error["code"] == "llm_connection", error
    assert "ended before the answer was complete" in error["message"]

    openai.push(Reply("a whole answer"))
    events = await _turn(client, cid, "again")
    answer = events[-1]["record"]["message"]
    assert answer["content"] == [{"type": "text", "body": "a whole answer"}]
    assert answer["interrupted"] is False
