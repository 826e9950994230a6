"""Issue 11 #3: a model stream cut mid-answer (the body ends with no finish_reason and no [DONE])
is a failed turn: the text shown so far is kept as an assistant message marked interrupted, then
the durable error (code llm_connection), then the end; the next turn works. Real server, real
scripted OpenAI endpoint, real SQLite file."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from functools import partial
from typing import Any

import httpx2
import msgspec
import trio

from agentik.config import Config
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


async def test_hung_model_ends_the_turn_within_the_timeout(tmp_path: Any) -> None:
    """Issue 11 #4: AGENTIK_LLM_TIMEOUT bounds the whole wait for the model's answer, the SDK's
    retries included: an endpoint that accepts connections and never answers, with
    AGENTIK_LLM_TIMEOUT=3 and two retries, ends the turn within 6 s (it took 3 x 3 s plus the
    SDK's backoff); the live stream shows the turn working meanwhile."""
    from tests.webutil import serve_app

    held: list[trio.SocketStream] = []

    async def hold(stream: trio.SocketStream) -> None:
        held.append(stream)  # read nothing, answer nothing
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, hold, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        cfg = Config(
            db_path=str(tmp_path / "agentik.db"), openai_base_url=f"http://127.0.0.1:{port}/v1",
            openai_api_key="x", llm_timeout=3.0, llm_max_retries=2, sqlite_synchronous="NORMAL",
        )
        async with serve_app(cfg) as srv, httpx2.AsyncClient(base_url=srv.url, timeout=10) as http:
            cid = (await http.post("/agentik/conversations")).json()["id"]
            async with open_sse(http, f"/agentik/conversations/{cid}/live") as live:
                start = trio.current_time()
                events = []
                with trio.fail_after(20):
                    sent = await http.post(
                        f"/agentik/conversations/{cid}/messages",
                        json={"content": [{"type": "text", "body": "hello?"}]},
                    )
                    assert sent.status_code == 202
                    while True:
                        frame = await live.next_event()
                        events.append(frame.event)
                        if frame.event == "end":
                            break
                elapsed = trio.current_time() - start
            assert "working" in events, events
            assert elapsed < 6, elapsed
            snapshot = (await http.get(f"/agentik/conversations/{cid}/snapshot")).json()
            error = snapshot["messages"][-1]["message"]
            assert error["type"] == "error" and error["code"] == "llm_timeout", error
            assert "AGENTIK_LLM_TIMEOUT" in error["message"], error
        nursery.cancel_scope.cancel()
