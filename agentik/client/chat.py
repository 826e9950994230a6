"""``agentik chat``: a terminal chat against a running agentik server, over this client library.

Pick or create a conversation, then type. The answer streams as it arrives (online AppendText);
tool calls, tool results, errors and interruptions are shown from the durable stream. Ctrl-C
while a turn runs interrupts it; Ctrl-C with no turn running (or a second Ctrl-C while the
interrupt is pending) quits, as do Ctrl-D and ``/quit``. Lines starting with ``/`` are commands
(``/help`` lists them); they are never sent to the model.

Exit status: 0 when the user quits, 1 when the server cannot be reached, refuses the token, or
the conversation does not exist.
"""

from __future__ import annotations

import signal
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, contextmanager, nullcontext
from typing import TextIO

import trio

from agentik.client.chat_input import is_terminal, keys_mode, start_reader
from agentik.client.chat_screen import ChatScreen
from agentik.client.errors import AgentikConnectionError, AuthError
from agentik.client.http import AgentikAgent, HttpConversation
from agentik.client.reconnect import BackoffPolicy, Connected, Disconnected, Failed, Gap, ReconnectingOutbox
from agentik.errors import AgentikError, MailboxFullError
from agentik.wire import (
    ApprovalRequest,
    Cursor,
    Deleted,
    Pause,
    UserMessage,
)

HISTORY = 10


class Chat(ChatScreen):
    """One chat session: the conversation, the streams that feed the screen, the user's lines."""

    def __init__(self, agent: AgentikAgent, out: TextIO) -> None:
        super().__init__(out)
        self.agent = agent
        self.conv: HttpConversation | None = None
        self.quit = trio.Event()
        #: set by /new and /list: the conversation to continue with (the session restarts on it)
        self.switch_to: HttpConversation | None = None
        self._wake = trio.Event()
        #: the live stream is in place (or failed): the first prompt waits for it, so that a
        #: line typed at once is answered on a screen that streams it
        self.live_open = trio.Event()

    # --- input -----------------------------------------------------------------------------------

    @contextmanager
    def reading(self, stdin: TextIO) -> Iterator[None]:
        """Read ``stdin`` while in the block: keys from a terminal (its own echo off), lines
        from anything else. The reading thread hands them over into trio."""
        keys = is_terminal(stdin)
        token = trio.lowlevel.current_trio_token()
        handle = self.keys if keys else self.line

        def deliver(data: str | None) -> None:
            try:
                trio.from_thread.run_sync(handle, data, trio_token=token)
            except trio.RunFinishedError:
                pass

        with keys_mode(stdin) if keys else nullcontext():
            start_reader(stdin, deliver, keys)
            yield

    def changed(self) -> None:
        self._wake.set()

    async def next_line(self) -> str | None:
        """The next line the user finished, once no turn runs (None: the end of the input)."""
        while (taken := self.take()) is None:
            self._wake = trio.Event()
            await self._wake.wait()
        return taken.line

    async def run(self, conv: HttpConversation, sigint: AsyncIterator[int]) -> int:
        return await _run(self, conv, sigint)

    # --- start-up --------------------------------------------------------------------------------

    async def pick(
        self, conversation_id: str | None, *, current: str | None = None
    ) -> HttpConversation | None:
        """The conversation to chat in: ``conversation_id``, else the user's choice from the list
        (``current``: the one already open, marked, and what Enter keeps in /list)."""
        if conversation_id is not None:
            conv = await self.agent.get_conversation(conversation_id)
            if conv is None:
                print(f"agentik chat: no conversation {conversation_id!r} on the server",
                      file=sys.stderr)
            return conv
        snapshot = await self.agent.conversations_snapshot(limit=20)
        if not snapshot.conversations:
            return await self.new_conversation()
        several = len((await self.agent.agents()).agents) > 1
        self.say("Conversations:")
        for i, rec in enumerate(snapshot.conversations, 1):
            mark = "  (this one)" if rec.id == current else ""
            agent = f"  <{rec.agent}>" if several else ""
            self.say(f"  {i:2}) {rec.title or '(untitled)'}{agent}  [{rec.id}]{mark}")
        self.say("   n) new conversation")
        keep = "keep this one" if current is not None else "a new one"
        while True:
            self.say(f"pick a number, or Enter for {keep}: ", end="")
            answer = await self.next_line()
            if answer is None:
                return None
            answer = answer.strip().lower()
            if answer == "" and current is not None:
                return None
            if answer in ("", "n"):
                return await self.new_conversation()
            if answer.isdigit() and 1 <= int(answer) <= len(snapshot.conversations):
                return HttpConversation(self.agent, snapshot.conversations[int(answer) - 1])
            self.say(f"no such choice: {answer!r}")

    async def new_conversation(self, title: str | None = None) -> HttpConversation | None:
        """A new conversation, of the agent the user picks when the server has several (Enter:
        the default one); None at the end of the input."""
        listed = await self.agent.agents()
        agent: str | None = None
        if len(listed.agents) > 1:
            self.say("Agents:")
            for i, entry in enumerate(listed.agents, 1):
                default = "  (default)" if entry.id == listed.default else ""
                about = f": {entry.description}" if entry.description else ""
                self.say(f"  {i:2}) {entry.name}{about}{default}")
            while agent is None:
                self.say("pick an agent, or Enter for the default: ", end="")
                answer = await self.next_line()
                if answer is None:
                    return None
                answer = answer.strip()
                if answer == "":
                    agent = listed.default
                elif answer.isdigit() and 1 <= int(answer) <= len(listed.agents):
                    agent = listed.agents[int(answer) - 1].id
                else:
                    self.say(f"no such choice: {answer!r}")
        return await self.agent.create_conversation(title=title, agent=agent)

    async def show_history(self, conv: HttpConversation) -> None:
        """The last messages of the conversation's current branch (docs/PROTOCOL.md
        "Branches": its other versions are not shown)."""
        snapshot = await self.agent.chat_snapshot(conv.id)
        self.show_records(conv.title, conv.id, snapshot.messages[-HISTORY:])

    # --- running ---------------------------------------------------------------------------------

    async def durable(self, conv: HttpConversation, after: Cursor) -> None:
        while True:
            async with ReconnectingOutbox(self.agent.outbox, BackoffPolicy(initial=0.5, max=5)) as recon:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.watch_status, recon)
                    async with recon.conversation_events(after, conv.id) as events:
                        async for ce in events:
                            self.render_durable(ce.event)
                            if isinstance(ce.event, Deleted):
                                self.quit.set()
                                return
                    status = recon.status
                    nursery.cancel_scope.cancel()
            if isinstance(status, Gap):
                self.note("missed some events while disconnected")
                after = status.cause.current
                continue
            if isinstance(status, Failed):
                self.note(f"giving up: {status.cause}")
            self.quit.set()
            return

    async def watch_status(self, recon: ReconnectingOutbox) -> None:
        lost = False
        async for status in recon.connection_status():
            if isinstance(status, Disconnected) and not lost:
                lost = True
                self.note(f"connection lost; retrying in {status.will_retry_in:.1f}s")
            elif isinstance(status, Connected) and lost:
                lost = False
                self.note("reconnected")

    async def online(self, conv: HttpConversation) -> None:
        while True:
            try:
                live = self.agent.online_outbox.online_events(conv.id, on_open=self._live_opened)
                async with aclosing(live) as events:
                    async for ce in events:
                        self.render_online(ce.event)
            except AgentikConnectionError:
                self.live_lost()  # the durable stream reports the connection state
            except AgentikError as exc:
                self.note(f"live stream: {exc}")
            self.live_open.set()
            await trio.sleep(0.5)

    def _live_opened(self, _cursor: Cursor | None) -> None:
        self.live_open.set()

    async def on_sigint(self, signals: AsyncIterator[int]) -> None:
        async for _ in signals:
            if self.busy and not self.interrupting and self.conv is not None:
                self.interrupting = True
                self.note("interrupting; Ctrl-C again quits")
                try:
                    await self.conv.interrupt()
                except AgentikError as exc:
                    self.note(f"cannot interrupt: {exc}")
            else:
                self.quit.set()
                return

    async def input_loop(self, conv: HttpConversation) -> None:
        await self.live_open.wait()
        if not self.pauses:
            self.prompt()
        while True:
            line = await self.next_line()
            if line is None or line.strip() == "/quit":
                self.quit.set()
                return
            if self.pauses:  # the turn asks: the line is the answer
                await self.answer_pause(conv, self.pauses[0], line.strip())
                continue
            if not line.strip():
                self.prompt()
                continue
            if line.strip().startswith("/"):
                try:
                    await self.command(line.strip(), conv)
                except AgentikError as exc:
                    self.note(f"{line.strip().split()[0]} failed: {exc}")
                if self.quit.is_set():
                    return
                self.prompt()
                continue
            try:
                self.turn_started()
                await conv.send(line)
            except MailboxFullError as exc:
                self.busy = False
                self.note(f"busy: too many queued messages, try again in {exc.retry_after:g}s")
                self.prompt()
            except AgentikError as exc:
                self.busy = False
                self.note(f"not sent: {exc}")
                self.prompt()


    async def answer_pause(self, conv: HttpConversation, pause: Pause, text: str) -> None:
        """An approval: ``y``/``yes`` approves, ``n``/``no``/nothing refuses, anything else
        refuses with that reason; a question: the text, or the choice its number names."""
        try:
            if isinstance(pause, ApprovalRequest):
                word = text.lower()
                await conv.approve(pause.call_id, approve=word in ("y", "yes"),
                                   reason=None if word in ("y", "yes", "n", "no", "") else text)
            else:
                choices = pause.choices or []
                if text.isdigit() and 1 <= int(text) <= len(choices):
                    text = choices[int(text) - 1]
                await conv.answer(pause.call_id, text)
        except AgentikError as exc:
            self.note(f"not answered: {exc}")
        self.answered(pause.call_id)

    async def command(self, line: str, conv: HttpConversation) -> None:
        """A ``/command`` line. Unknown ones are refused here, never sent to the model."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name == "/help":
            for usage, what in COMMANDS:
                self.say(f"  {usage:<14} {what}")
        elif name == "/title":
            record = await self.agent.rename_conversation(conv.id, arg or None)
            self.note(f"title: {record.title or '(untitled)'}")
        elif name == "/new":
            self.switch_to = await self.new_conversation(arg or None)
            self.quit.set()
        elif name in ("/edit", "/retry"):
            await self.branch_command(name, arg, conv)
        elif name == "/list":
            picked = await self.pick(None, current=conv.id)
            if picked is not None and picked.id != conv.id:
                self.switch_to = picked
                self.quit.set()
        else:
            self.note(f"unknown command {name}; /help lists the commands")


    async def branch_command(self, name: str, arg: str, conv: HttpConversation) -> None:
        """``/edit N TEXT``: a new version of the N-th of your messages (1: the first) of the
        current branch, answered; ``/retry``: a new answer to your last message."""
        listing = (await self.agent.chat_snapshot(conv.id)).messages
        users = [r for r in listing if isinstance(r.message, UserMessage)]
        if name == "/retry":
            if not users:
                self.note("nothing to answer again yet")
                return
            self.turn_started()
            await conv.regenerate(users[-1].id)
            self.note("answering your last message again")
            return
        number, _, text = arg.partition(" ")
        if not number.isdigit() or not 1 <= int(number) <= len(users) or not text.strip():
            self.note(f"usage: /edit N TEXT, N from 1 to {len(users)} (your messages, in order)")
            return
        self.turn_started()
        await conv.edit(users[int(number) - 1].id, text.strip())
        self.note(f"message {number} edited; the answer follows")


#: the chat's commands, for /help
COMMANDS = [
    ("/help", "this list"),
    ("/title [TEXT]", "rename this conversation (no TEXT: clear the title)"),
    ("/new [TITLE]", "start a new conversation"),
    ("/list", "list the conversations and switch to one"),
    ("/edit N TEXT", "a new version of your N-th message (1: the first), answered again"),
    ("/retry", "a new answer to your last message"),
    ("/quit", "leave (also Ctrl-D)"),
]


async def run_chat(
    url: str, token: str | None, conversation_id: str | None, *,
    stdin: TextIO | None = None, out: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    with trio.open_signal_receiver(signal.SIGINT) as sigint:
        async with AgentikAgent(f"agentik-chat-{uuid.uuid4()}", url, token) as agent:
            chat = Chat(agent, out)
            with chat.reading(stdin or sys.stdin):
                try:
                    info = await agent.info()
                    chat.say(f"connected to {info.name} {info.version} at {agent.base_url}")
                    conv = await chat.pick(conversation_id)
                    if conv is None:
                        return 1 if conversation_id is not None else 0
                except AgentikConnectionError as exc:
                    print(f"agentik chat: {exc} (is the server running? see --url)",
                          file=sys.stderr)
                    return 1
                except AuthError:
                    print(f"agentik chat: the server at {agent.base_url} refused the token; "
                          "pass the right one with --token or AGENTIK_TOKEN", file=sys.stderr)
                    return 1
                status = await chat.run(conv, sigint)
                chat.say("\nbye")
                return status


async def _run(chat: Chat, conv: HttpConversation, sigint: AsyncIterator[int]) -> int:
    """(Chat.run) The sessions: one conversation after another (/new, /list) until the user
    quits; 0, or 1 if the server stops answering."""
    while True:
        chat.conv = conv
        try:
            # The cursor BEFORE the history: nothing between the two is missed.
            after = await chat.agent.outbox.current_cursor()
            await chat.show_history(conv)
        except AgentikError as exc:
            print(f"agentik chat: {exc}", file=sys.stderr)
            return 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(chat.durable, conv, after)
            nursery.start_soon(chat.online, conv)
            nursery.start_soon(chat.on_sigint, sigint)
            nursery.start_soon(chat.input_loop, conv)
            await chat.quit.wait()
            nursery.cancel_scope.cancel()
        if chat.switch_to is None:
            return 0
        conv, chat.switch_to = chat.switch_to, None  # /new or /list: go on there
        chat.quit = trio.Event()
        chat.live_open = trio.Event()
        chat.busy = chat.interrupting = False
