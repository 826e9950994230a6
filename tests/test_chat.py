"""``agentik chat`` through a pseudo-terminal: a real child process (``python -m agentik.cli
chat``) on a pty, against a real server in this test's trio loop with the scripted LLM. Ctrl-C is
the byte 0x03 written to the pty, which the terminal turns into SIGINT for the child (it is the
session leader with the pty as its controlling terminal)."""

from __future__ import annotations

import fcntl
import io
import itertools
import json
import os
import pty
import re
import subprocess
import sys
import termios
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path

import pytest
import trio

from agentik.client.chat_input import EndOfInput, Entered, Erased, LineEditor, Typed
from agentik.client.chat_screen import ChatScreen
from agentik.config import Config
from agentik.tools.base import FunctionTools
from agentik.wire import (
    AppendText,
    AssistantMessage,
    AssistantMessageEvent,
    End,
    Interrupted,
    MessageRecord,
    Text,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    ToolResultEvent,
    Working,
)
from tests.scripted_openai import Hang, Reply, ScriptedOpenAI, ToolCalls
from tests.webutil import serve_app

ROOT = Path(__file__).resolve().parent.parent
#: a whole test's bound: it waits on events only, but starts a Python process and a server on a
#: machine that may be loaded
TIMEOUT = 45


def _controlling_tty() -> None:
    # Runs in the child after fork (start_new_session made it a session leader): adopt the pty
    # on fd 0 as controlling terminal so ^C from the pty becomes SIGINT.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """The test's side of the pty: write keys, wait for text on the screen."""

    def __init__(self, master: int, process: trio.Process) -> None:
        self.stream = trio.lowlevel.FdStream(master)
        self.process = process
        self.screen = ""
        self._seen = 0

    async def write(self, data: str) -> None:
        await self.stream.send_all(data.encode())

    async def expect(self, text: str) -> str:
        """Wait until ``text`` appears after what the previous expect matched."""
        while True:
            index = self.screen.find(text, self._seen)
            if index >= 0:
                self._seen = index + len(text)
                return self.screen
            try:
                data = await self.stream.receive_some(4096)
            except (OSError, trio.BrokenResourceError):  # EIO: the child exited, closing the pty
                data = b""
            if not data:
                raise AssertionError(f"{text!r} never appeared; screen:\n{self.screen}")
            self.screen += data.decode("utf-8", "replace").replace("\r\n", "\n")

    async def drain(self) -> None:
        """Read until the child closes the pty."""
        while True:
            try:
                data = await self.stream.receive_some(4096)
            except (OSError, trio.BrokenResourceError):
                return
            if not data:
                return
            self.screen += data.decode("utf-8", "replace").replace("\r\n", "\n")


@asynccontextmanager
async def chat(*args: str) -> AsyncIterator[Terminal]:
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "dumb", "PYTHONPATH": str(ROOT)}
    env.pop("AGENTIK_TOKEN", None)
    env.pop("AGENTIK_URL", None)
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "agentik.cli", "chat", *args],
            stdin=slave, stdout=slave, stderr=slave, cwd=str(ROOT), env=env,
            start_new_session=True, preexec_fn=_controlling_tty,
        )
    finally:
        os.close(slave)
    term = Terminal(master, process)
    try:
        yield term
    finally:
        print(f"--- screen of agentik chat {' '.join(args)} ---\n{term.screen}")  # shown on failure
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
            await term.stream.aclose()


@pytest.fixture
def tools() -> FunctionTools:
    tools = FunctionTools()
    tools.add(lambda a, b: a + b, name="add", description="add two numbers",
              parameters={"type": "object", "properties": {"a": {"type": "number"},
                                                            "b": {"type": "number"}}})
    return tools


def _notes_and_answer(turn: str) -> tuple[list[str], str]:
    """A turn's screen taken apart: its note lines in order, and the answer's text (the pieces
    after each ``agent: ``; a note between two pieces interrupts the answer's line)."""
    notes, pieces = [], []
    for line in turn.splitlines()[1:]:  # after the line typed
        if line.startswith("[") and line.endswith("]"):
            notes.append(line)
        elif line.startswith("agent: "):
            pieces.append(line.removeprefix("agent: "))
        elif line:
            pieces.append("\n" + line)
    return notes, "".join(pieces)


def _as_shown(screen: str) -> str:
    """The screen as a terminal shows it: a backspace moves back, the next character
    overwrites."""
    lines = []
    for text in screen.split("\n"):
        cells: list[str] = []
        at = 0
        for ch in text:
            if ch == "\b":
                at = max(0, at - 1)
                continue
            cells[at:at + 1] = [ch]
            at += 1
        lines.append("".join(cells))
    return "\n".join(lines)


async def test_chat_streams_interrupts_and_quits(
    config: Config, scripted: ScriptedOpenAI, tools: FunctionTools
) -> None:
    gate = trio.Event()
    with trio.fail_after(TIMEOUT):
        async with serve_app(config, tools=tools) as srv, chat("--url", srv.url) as term:
            await term.expect("you> ")  # no conversations yet: a new one was created
            # A turn with a tool call, then the answer.
            scripted.push(ToolCalls([("call_1", "add", '{"a": 2, "b": 3}')]), Reply("It is 5."))
            await term.write("what is 2+3?\n")
            screen = await term.expect("you> ")
            # The live text and the durable tool lines travel on different connections, so a
            # tool line may land inside the streamed answer (which then goes on after it), in
            # any order; the prompt waits for both streams' end of the turn.
            turn = screen[screen.index("what is 2+3?"):screen.rindex("you> ")]
            notes, answer = _notes_and_answer(turn)
            tools = [n for n in notes if n.startswith("[tool")]  # the journal's order
            assert tools == ['[tool call: add({"a": 2, "b": 3})]', "[tool result: add: 5]"], turn
            assert "[the agent is working…]" in notes and len(notes) == 3, turn
            assert answer == "It is 5.", turn

            # A turn that hangs after its first words: Ctrl-C interrupts it.
            scripted.push(Reply(["Once ", "upon ", "a ", "time"], gate=gate))
            await term.write("tell me a story\n")
            await term.expect("agent: Once ")
            await term.write("\x03")
            await term.expect("[interrupted]")
            await term.expect("you> ")
            gate.set()

            # Idle: Ctrl-C quits.
            await term.write("\x03")
            await term.expect("bye")
            assert await term.process.wait() == 0
            conv = (await srv.agent.conversations_snapshot()).conversations[0]
            messages = await (await srv.agent.get_conversation(conv.id)).get_messages()  # type: ignore[union-attr]
            last = messages[-1].message
            assert getattr(last, "interrupted", False)  # what the user saw was kept


async def test_chat_holds_what_is_typed_while_an_answer_streams(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    """Typed while an answer streams: nothing of it shows inside the answer; after it, each
    finished line is shown after a prompt and taken in turn (a command, then a message), and the
    unfinished one is back on the prompt, still being typed."""
    gate = trio.Event()
    with trio.fail_after(TIMEOUT):
        async with serve_app(config) as srv, chat("--url", srv.url) as term:
            await term.expect("you> ")
            scripted.push(Reply(["Once ", "upon ", "a ", "time."], gate=gate))
            await term.write("tell me a story\n")
            start = (await term.expect("agent: Once ")).rindex("agent: Once ")
            await term.write("/title typed meanwhile\n")
            await term.write("second question\n")
            await term.write("and a pa\x7f\x7fpart")  # Backspace twice: edited, unseen
            gate.set()
            await term.expect("[the agent is working…]")  # the second question's turn
            # (Were the keys read only after the answer, the screen would echo them as typed,
            # backspaces and all, and show the same.)
            screen = _as_shown(await term.expect("part"))
            assert screen[start:] == (
                "agent: Once upon a time.\n"
                "you> /title typed meanwhile\n"
                "[title: typed meanwhile]\n"
                "you> second question\n"
                "[the agent is working…]\n"
                "agent: echo: second question\n"
                "you> and a part"
            ), screen[start:]
            await term.write("nership\n")
            await term.expect("agent: echo: and a partnership")
            await term.write("/quit\n")
            await term.expect("bye")
            assert await term.process.wait() == 0
            conv = (await srv.agent.conversations_snapshot()).conversations[0]
            assert conv.title == "typed meanwhile"
        asked = [r["messages"][-1]["content"] for r in scripted.requests]
        assert asked == ["tell me a story", "second question", "and a partnership"], asked


def _record(seq: int, message: object) -> MessageRecord:
    return MessageRecord(id=f"m{seq}", seq=seq, conversation_id="c", created_at=0.0,
                         message=message)  # type: ignore[arg-type]


def _interleavings(a: list[object], b: list[object]) -> list[list[object]]:
    """Every merge of two sequences that keeps the order within each."""
    out = []
    for picks in itertools.combinations(range(len(a) + len(b)), len(a)):
        ia, ib = iter(a), iter(b)
        out.append([next(ia) if n in picks else next(ib) for n in range(len(a) + len(b))])
    return out


def test_the_prompt_comes_after_everything_of_the_turn_whatever_the_order() -> None:
    """The live and the durable stream are not ordered with each other: in every interleaving
    of a turn's events the prompt comes once, last, after the tool lines and the whole answer
    (it used to come at the live End, before a late tool result)."""
    live = [Working(turn_id="t"), AppendText(text="It is 5."), End(turn_id="t")]
    durable = [
        ToolCallEvent(record=_record(2, ToolCall(call_id="1", name="add", arguments="{}",
                                                 turn_id="t"))),
        ToolResultEvent(record=_record(3, ToolResult(call_id="1", name="add", content="5",
                                                     turn_id="t"))),
        AssistantMessageEvent(record=_record(4, AssistantMessage(
            content=[Text(body="It is 5.")], turn_id="t"))),
    ]
    for order in _interleavings(live, durable):
        out = io.StringIO()
        screen = ChatScreen(out)
        screen.turn_started()
        for event in order:
            if event in live:
                screen.render_online(event)
            else:
                screen.render_durable(event)
        shown = out.getvalue()
        assert shown.count("you> ") == 1 and shown.endswith("you> "), (order, shown)
        assert "[tool result: add: 5]" in shown and "It is 5." in shown, (order, shown)
        assert not screen.busy


def test_an_interrupted_turn_ends_at_its_interrupted_and_its_end_in_either_order() -> None:
    live = [Working(turn_id="t"), AppendText(text="Once "), End(turn_id="t")]
    durable = [
        AssistantMessageEvent(record=_record(2, AssistantMessage(
            content=[Text(body="Once ")], turn_id="t", interrupted=True))),
        Interrupted(turn_id="t"),
    ]
    for order in _interleavings(live, durable):
        out = io.StringIO()
        screen = ChatScreen(out)
        screen.turn_started()
        screen.interrupting = True
        for event in order:
            if event in live:
                screen.render_online(event)
            else:
                screen.render_durable(event)
        shown = out.getvalue()
        assert shown.endswith("[interrupted]\nyou> ") or shown.endswith("Once \nyou> "), shown
        assert shown.count("you> ") == 1 and "[interrupted]" in shown, (order, shown)


async def test_chat_takes_piped_lines_one_answer_at_a_time(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    """Lines from a pipe wait for the answer before them too, and the end of the input quits
    after the last answer (not in the middle of it)."""
    with trio.fail_after(TIMEOUT):
        async with serve_app(config) as srv:
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            env.pop("AGENTIK_TOKEN", None)
            proc = await trio.run_process(
                [sys.executable, "-m", "agentik.cli", "chat", "--url", srv.url],
                stdin=b"first\nsecond\n/title piped\n", capture_stdout=True,
                capture_stderr=True, check=False, cwd=str(ROOT), env=env,
            )
    out = proc.stdout.decode()
    assert proc.returncode == 0, (out, proc.stderr)
    assert out.index("agent: echo: first") < out.index("agent: echo: second") \
        < out.index("[title: piped]") < out.index("bye"), out


def test_the_line_editor() -> None:
    editor = LineEditor()
    assert editor.feed("ab\x7fc\x1b[1;5Ad\x1bOPe\r") == [
        Typed("a"), Typed("b"), Erased(1), Typed("c"), Typed("d"), Typed("e"), Entered("acde"),
    ]
    assert editor.feed("one two  \x17") == [*map(Typed, "one two  "), Erased(5)]
    assert editor.text == "one "
    assert editor.feed("\x04\x15\x7f") == [Erased(4)]  # Ctrl-D ends only an empty line
    assert editor.feed("\x1b[") == [] and editor.feed("Bx\x04") == [Typed("x")]
    assert editor.feed("\x15\x04") == [Erased(1), EndOfInput()]


async def test_chat_picks_a_conversation_and_shows_history(
    config: Config, scripted: ScriptedOpenAI
) -> None:
    with trio.fail_after(TIMEOUT):
        async with serve_app(config) as srv:
            agent = srv.agent
            conv = await agent.create_conversation(title="old talk")
            cursor = agent.hub.current_cursor()
            await conv.send("remember me")
            async for ce in agent.outbox.conversation_events(cursor, conv.id):
                if ce.type == "assistant_message":
                    break
            async with chat("--url", srv.url) as term:
                await term.expect("old talk")
                await term.expect("pick a number")
                await term.write("1\n")
                await term.expect("you: remember me")
                await term.expect("agent: echo: remember me")
                await term.expect("you> ")
                await term.write("again\n")
                await term.expect("agent: echo: again")
                await term.write("/quit\n")
                await term.expect("bye")
                assert await term.process.wait() == 0
            async with chat("--url", srv.url, "--conversation", conv.id) as term:
                await term.expect("agent: echo: again")
                await term.write("\x04")  # Ctrl-D: end of input
                await term.expect("bye")
                assert await term.process.wait() == 0


async def test_chat_clear_errors(config: Config) -> None:
    with trio.fail_after(TIMEOUT):
        # Server down.
        async with chat("--url", "http://127.0.0.1:9") as term:
            await term.drain()
            assert await term.process.wait() == 1
            assert re.search(r"cannot reach the agentik server at http://127\.0\.0\.1:9", term.screen)
            assert "is the server running" in term.screen
        async with serve_app(config.replace(tokens=("right",))) as srv:
            # Wrong token, and no token.
            for args in (("--token", "wrong"), ()):
                async with chat("--url", srv.url, *args) as term:
                    await term.drain()
                    assert await term.process.wait() == 1
                    assert "refused the token" in term.screen and "--token" in term.screen
            # Unknown conversation.
            async with chat("--url", srv.url, "--token", "right", "--conversation", "nope") as term:
                await term.drain()
                assert await term.process.wait() == 1
                assert "no conversation 'nope'" in term.screen


def test_chat_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agentik.cli", "chat", "--help"], capture_output=True, text=True,
        cwd=ROOT, check=True,
    ).stdout
    assert "--url" in out and "--token" in out and "--conversation" in out


async def test_chat_shows_a_lost_connection(config: Config, scripted: ScriptedOpenAI) -> None:
    from tests.tcp_proxy import open_tcp_proxy

    with trio.fail_after(TIMEOUT):
        async with serve_app(config) as srv:
            port = int(srv.url.rsplit(":", 1)[1])
            async with open_tcp_proxy("127.0.0.1", port) as proxy, chat("--url", proxy.url) as term:
                await term.expect("you> ")
                proxy.refuse = True  # the server "goes down"
                await proxy.cut_all()
                await term.expect("[connection lost; retrying in")
                proxy.refuse = False
                await term.expect("[reconnected]")
                await term.write("still there?\n")
                await term.expect("agent: echo: still there?")
                await term.write("/quit\n")
                await term.expect("bye")
                assert await term.process.wait() == 0


async def _until(agent: object, conv_id: str, cursor: object, event_type: str) -> None:
    async for ce in agent.outbox.conversation_events(cursor, conv_id):  # type: ignore[attr-defined]
        if ce.type == event_type:
            return


async def test_chat_commands_history_and_working(
    config: Config, scripted: ScriptedOpenAI, tools: FunctionTools
) -> None:
    """Issue 11 #11: /help, /title, /new, /list (an unknown /command is not sent to the model);
    a rejoined conversation's history shows its tool calls and [interrupted] answers; a turn
    waiting on the model shows that the agent is working."""
    with trio.fail_after(TIMEOUT):
        async with serve_app(config, tools=tools) as srv:
            agent = srv.agent
            conv = await agent.create_conversation(title="with tools")
            cursor = agent.hub.current_cursor()
            scripted.push(ToolCalls([("call_1", "add", '{"a": 2, "b": 3}')]), Reply("It is 5."))
            await conv.send("what is 2+3?")
            await _until(agent, conv.id, cursor, "assistant_message")
            cursor = agent.hub.current_cursor()
            scripted.push(Hang(text_before="half an ans"))
            async with aclosing(agent.online_outbox.online_events(conv.id)) as live:
                await conv.send("tell me more")
                async for ce in live:  # the partial text reached the turn: interrupt now
                    if ce.type == "append_text":
                        break
            await conv.interrupt()
            await _until(agent, conv.id, cursor, "interrupted")

            async with chat("--url", srv.url, "--conversation", conv.id) as term:
                await term.expect("you: what is 2+3?")
                await term.expect("[tool call: add(")
                await term.expect("[tool result: add: 5")
                await term.expect("agent: It is 5.")
                await term.expect("agent: half an ans [interrupted]")
                await term.expect("you> ")
                await term.write("/help\n")
                await term.expect("/title")
                await term.expect("/list")
                await term.write("/bogus words\n")
                await term.expect("[unknown command /bogus; /help lists the commands]")
                await term.write("/title renamed here\n")
                await term.expect("[title: renamed here]")
                assert (await agent.get_conversation(conv.id)).title == "renamed here"  # type: ignore[union-attr]
                # A hung model: the chat says the agent is working, Ctrl-C interrupts.
                scripted.push(Hang())
                await term.write("are you there?\n")
                await term.expect("[the agent is working…]")
                await term.write("\x03")
                await term.expect("[interrupted]")
                await term.expect("you> ")
                assert not any("/bogus" in json.dumps(r) for r in scripted.requests)  # not sent
                await term.write("/new fresh one\n")
                await term.expect("-- conversation fresh one [")
                await term.expect("you> ")
                await term.write("/list\n")
                await term.expect("(this one)")
                await term.expect("pick a number, or Enter for keep this one: ")
                listed = (await agent.conversations_snapshot(limit=20)).conversations
                index = [c.id for c in listed].index(conv.id) + 1
                await term.write(f"{index}\n")
                await term.expect("-- conversation renamed here [")
                await term.expect("agent: half an ans [interrupted]")
                await term.write("/quit\n")
                await term.expect("bye")
                assert await term.process.wait() == 0


async def test_chat_url_without_scheme() -> None:
    async with chat("--url", "127.0.0.1:8080") as term:
        await term.drain()
        assert await term.process.wait() == 2
    assert "add http://" in term.screen and "http://127.0.0.1:8080" in term.screen


async def test_chat_asks_for_approvals_and_answers_questions(
    config: Config, scripted: ScriptedOpenAI, tools: FunctionTools
) -> None:
    """Issue 30: a turn that waits for the user asks on the terminal; the next line answers it
    (y approves; anything else refuses, with that reason; a question's answer, or its choice's
    number), and the turn goes on to its answer and the prompt."""
    with trio.fail_after(TIMEOUT):
        async with serve_app(config.replace(approval=("add",), ask_user=True), tools=tools) as srv, \
                chat("--url", srv.url) as term:
            await term.expect("you> ")
            scripted.push(ToolCalls([("call_1", "add", '{"a": 2, "b": 3}')]), Reply("It is 5."))
            await term.write("what is 2+3?\n")
            await term.expect('[approval needed: add({"a": 2, "b": 3})]')
            await term.expect("approve? y, or n or why not: ")
            await term.write("y\n")
            await term.expect("[approved: call_1]")
            await term.expect("[tool result: add: 5]")
            await term.expect("you> ")
            scripted.push(ToolCalls([("call_2", "add", '{"a": 1, "b": 1}')]), Reply("Fine."))
            await term.write("and 1+1?\n")
            await term.expect("approve? y, or n or why not: ")
            await term.write("not now\n")
            await term.expect("[refused: not now: call_2]")
            await term.expect("[tool failed: add: the user refused this call: not now]")
            await term.expect("you> ")
            scripted.push(ToolCalls([("q1", "ask_user",
                                      '{"question": "Which one?", "choices": ["red", "blue"]}')]),
                          Reply("Blue it is."))
            await term.write("pick a colour\n")
            await term.expect("[question: Which one?]")
            await term.expect("answer: ")
            await term.write("2\n")
            await term.expect("[answered: blue]")
            await term.expect("[tool result: ask_user: blue]")
            await term.expect("you> ")
            await term.write("\x03")
            await term.expect("bye")
