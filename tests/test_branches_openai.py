"""Issue 32: the OpenAI-compatible route and branches, through the official openai SDK: a
request whose history stops short of the stored branch at a turn is an edit of that turn's user
message (another text) or a regenerate of its answer (the same text; an empty history still
continues the conversation); the model sees the branch's history (the requests the scripted
model got); a history that differs elsewhere is still a 409 and stores nothing."""

# ruff: noqa: F811 - pytest fixtures imported from other test modules are parameters here

from __future__ import annotations

import openai
import pytest
import trio

from agentik.wire import AssistantMessage, Text, UserMessage
from tests.scripted_openai import Echo, ScriptedOpenAI
from tests.test_openai_api import CID, aclient, assistant, scripted, server, user  # noqa: F401
from tests.webutil import Server, no_error_logs  # noqa: F401 - fixtures are used by name

pytestmark = pytest.mark.usefixtures("engine")


def seen(scripted: ScriptedOpenAI) -> list[str]:
    return [m["content"] for m in scripted.requests[-1]["messages"][1:]]


async def test_a_shorter_history_edits_or_regenerates(server: Server, scripted: ScriptedOpenAI
                                                      ) -> None:
    scripted.default = Echo(prefix="re ")
    with trio.fail_after(30):
        client = aclient(server)
        raw = await client.chat.completions.with_raw_response.create(
            model="default", messages=[user("one")], store=True)
        cid = raw.headers[CID]
        history = [user("one"), assistant("re one")]
        await client.chat.completions.create(
            model="default", messages=[*history, user("two")], extra_headers={CID: cid})
        # the history up to the second turn, another text: an edit of message two
        edited = await client.chat.completions.create(
            model="default", messages=[*history, user("deux")], extra_headers={CID: cid})
        assert edited.choices[0].message.content == "re deux"
        assert seen(scripted) == ["one", "re one", "deux"]
        # the same text again: a regenerate of its answer
        scripted.push(Echo(prefix="again "))
        again = await client.chat.completions.create(
            model="default", messages=[*history, user("deux")], extra_headers={CID: cid})
        assert again.choices[0].message.content == "again deux"
        assert seen(scripted) == ["one", "re one", "deux"]
        conv = await server.agent.get_conversation(cid)
        assert conv is not None
        listing = await conv.get_messages()
        assert [c.body for r in listing for c in r.message.content  # type: ignore[union-attr]
                if isinstance(c, Text)] == ["one", "re one", "deux", "again deux"]
        # the versions are all there: message two has two, the answer to its edit two
        assert (listing[2].siblings, listing[3].siblings) == (2, 2)
        journal = await server.agent.journal.list(conversation_id=cid)
        assert sum(isinstance(r.message, UserMessage) for r in journal) == 3
        assert sum(isinstance(r.message, AssistantMessage) for r in journal) == 4
        # the whole current branch and a new message is a plain send (an empty history too)
        more = await client.chat.completions.create(
            model="default", messages=[*history, user("deux"), assistant("again deux"),
                                       user("trois")], extra_headers={CID: cid})
        assert more.choices[0].message.content == "re trois"
        assert seen(scripted) == ["one", "re one", "deux", "again deux", "trois"]
        # a history that differs inside a turn is still a conflict, and stores nothing
        before = len(await server.agent.journal.list(conversation_id=cid))
        with pytest.raises(openai.ConflictError):
            await client.chat.completions.create(
                model="default", messages=[user("one"), assistant("not said"), user("x")],
                extra_headers={CID: cid})
        assert len(await server.agent.journal.list(conversation_id=cid)) == before
