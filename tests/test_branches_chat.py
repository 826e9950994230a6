"""Issue 32: ``agentik chat``'s /edit N TEXT and /retry, through a pseudo-terminal (a real child
process against a real server): the edit is answered on its branch, /retry answers the last
message again, and a rejoined conversation shows its current branch only."""

from __future__ import annotations

import trio

from agentik.config import Config
from tests.scripted_openai import Echo, ScriptedOpenAI
from tests.test_chat import TIMEOUT, _until, chat
from tests.webutil import serve_app


async def test_chat_edit_and_retry(config: Config, scripted: ScriptedOpenAI) -> None:
    scripted.default = Echo(prefix="re: ")
    with trio.fail_after(TIMEOUT):
        async with serve_app(config) as srv:
            agent = srv.agent
            conv = await agent.create_conversation(title="branches")
            for text in ("first", "second"):
                cursor = agent.hub.current_cursor()
                await conv.send(text)
                await _until(agent, conv.id, cursor, "touched")
            async with chat("--url", srv.url, "--conversation", conv.id) as term:
                await term.expect("agent: re: second")
                await term.expect("you> ")
                await term.write("/edit 3 nope\n")
                await term.expect("usage: /edit N TEXT, N from 1 to 2")
                await term.write("/edit 2 deuxième\n")
                await term.expect("agent: re: deuxième")
                assert scripted.requests[-1]["messages"][-1]["content"] == "deuxième"
                await term.expect("you> ")
                scripted.push(Echo(prefix="again: "))
                await term.write("/retry\n")
                await term.expect("agent: again: deuxième")
                await term.expect("you> ")
                await term.write("/quit\n")
            listing = await conv.get_messages()
            assert [r.message.content[0].body for r in listing] == [  # type: ignore[union-attr]
                "first", "re: first", "deuxième", "again: deuxième"]
            # rejoined: the current branch only (the first version of message 2 is not shown)
            async with chat("--url", srv.url, "--conversation", conv.id) as term:
                await term.expect("you: deuxième")
                await term.expect("agent: again: deuxième")
                await term.expect("you> ")
                assert "re: second" not in term.screen
                await term.write("/quit\n")
