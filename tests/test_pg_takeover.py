"""What a node taking a conversation over from a dead node does beyond closing its running turn
(issue 26, points 6 and 7), with two real nodes on real PostgreSQL (``tests/test_pg_nodes.py``'s
cluster): a ``/live`` subscriber on the surviving node gets the killed turn's ``end``, and the
messages the dead node had accepted and queued are answered there, in order, without a new
send."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest
import trio

from agentik.client.http import AgentikAgent
from agentik.wire import AssistantMessage, CommonEvent, Error, event_type
from tests.scripted_openai import Echo, ScriptedOpenAI
from tests.test_pg_nodes import TAKEOVER_LIMIT, Reader, _start_long_answer, cluster, terminal_turns

pytestmark = pytest.mark.usefixtures("pg_url")


async def test_a_takeover_ends_the_live_stream_and_answers_the_queued_messages(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    async with cluster(pg_url, scripted, tmp_path) as (a, b):
        ca, cb = AgentikAgent("ca", a.url), AgentikAgent("cb", b.url)
        try:
            reader_b = Reader(b)
            live: list[CommonEvent] = []
            ends = trio.Event()
            async with trio.open_nursery() as background:
                background.start_soon(reader_b.run, (await cb.outbox.current_cursor()).epoch)
                cid, mid = await _start_long_answer(ca, scripted)  # a owns it, mid-answer
                queued = [await ca.send(cid, "second"), await ca.send(cid, "third")]
                scripted.default = Echo(prefix="answer to ")
                opened = trio.Event()
                stream = cb.online_outbox.online_events(cid, on_open=lambda _: opened.set())

                async def listen() -> None:
                    async with aclosing(stream):
                        async for ev in stream:
                            live.append(ev)
                            if [event_type(e.event) for e in live].count("end") == 3:
                                ends.set()
                                return

                background.start_soon(listen)
                with trio.fail_after(30):
                    await opened.wait()
                await a.kill()
                with trio.fail_after(TAKEOVER_LIMIT + 30):
                    await ends.wait()  # the killed turn's, then the two queued ones'
                await reader_b.wait_for(lambda: set(queued) <= terminal_turns(reader_b.events).keys())
                background.cancel_scope.cancel()
            turn_ends = [e.event.turn_id for e in live  # type: ignore[union-attr]
                         if event_type(e.event) == "end"]
            assert turn_ends == [mid, *queued]
            turns = terminal_turns(reader_b.events)
            assert turns[mid] == ["error"]
            assert [turns[q] for q in queued] == [["assistant_message"], ["assistant_message"]]
            journal = await cb.journal.list(conversation_id=cid, limit=100)
            messages = [m.message for m in journal]
            assert [type(m).__name__ for m in messages] == [
                "UserMessage", "UserMessage", "UserMessage", "Error", "AssistantMessage",
                "AssistantMessage"]
            error = messages[3]
            assert isinstance(error, Error) and (error.message, error.turn_id) == (
                "interrupted: node lost", mid)
            answers = [m for m in messages if isinstance(m, AssistantMessage)]
            assert [(m.turn_id, m.content[0].body) for m in answers] == [  # type: ignore[union-attr]
                (queued[0], "answer to second"), (queued[1], "answer to third")]
        finally:
            await ca.close()
            await cb.close()
