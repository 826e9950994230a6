"""Issue 32 on a PostgreSQL cluster: branch commands sent to the node that does not own the
conversation reach its owner (edit, regenerate, switch: forwarded, as sends are), and a fork
made on the other node goes on there; real node processes on real PostgreSQL
(``tests/test_pg_nodes.py``'s nodes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from agentik.client.http import AgentikAgent
from agentik.wire import MessageRecord, Text
from tests.scripted_openai import Echo, ScriptedOpenAI
from tests.test_pg_nodes import Reader, cluster, terminal_turns

pytestmark = pytest.mark.usefixtures("pg_url")


def texts(records: list[MessageRecord]) -> list[str]:
    return ["".join(c.body for c in getattr(r.message, "content", []) if isinstance(c, Text))
            for r in records]


async def test_branch_commands_through_the_other_node(
    pg_url: str, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    scripted.default = Echo(prefix="re ")
    async with cluster(pg_url, scripted, tmp_path) as (a, b):
        ca, cb = AgentikAgent("ca", a.url), AgentikAgent("cb", b.url)
        try:
            conv = await ca.create_conversation()  # a owns it
            reader = Reader(b)
            async with trio.open_nursery() as background:
                background.start_soon(reader.run, (await cb.outbox.current_cursor()).epoch)

                async def answered(turn_id: str) -> None:
                    await reader.wait_for(lambda: turn_id in terminal_turns(reader.events))

                await answered(await ca.send(conv.id, "one"))
                await answered(await ca.send(conv.id, "two"))
                handle = await cb.get_conversation(conv.id)
                assert handle is not None
                _, a1, two, _ = await handle.get_messages()
                # through b: an edit and a regenerate run on a, the owner
                await answered(await cb.edit(conv.id, two.id, "deux"))
                await answered(await cb.regenerate(conv.id, a1.id))
                listing = await handle.get_messages()
                assert texts(listing) == ["one", "re one"]
                assert (listing[1].siblings, listing[1].sibling_index) == (2, 1)
                snapshot = await cb.switch_branch(conv.id, a1.id)
                assert texts(snapshot.messages) == ["one", "re one", "deux", "re deux"]
                # a fork made through b: its own conversation, answered wherever it is owned
                fork = await cb.fork(conv.id, two.id, title="fork")
                assert texts(await fork.get_messages()) == ["one", "re one", "two"]
                await answered(await cb.send(fork.id, "three"))
                assert texts(await fork.get_messages()) == [
                    "one", "re one", "two", "three", "re three"]
                assert scripted.requests[-1]["messages"][-2]["content"] == "two"
                background.cancel_scope.cancel()
        finally:
            await ca.close()
            await cb.close()
