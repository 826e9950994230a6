"""What ``agentik chat`` shows, and the turn state it follows to show it: no network, no
input. :class:`ChatScreen` writes to a text stream; :class:`agentik.client.chat.Chat` (the
session) feeds it the durable and the live events and the user's lines.

The answer comes twice: streamed (live ``AppendText``) and whole (the durable
``AssistantMessage``). Live events missed while disconnected are lost, so a turn whose text was
not streamed is shown from its durable record instead, and late live text of such a turn is then
ignored. A turn is over (the prompt comes back) once its End arrived and, if the user
interrupted it, its Interrupted too (the two come on different streams, in either order).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from agentik.wire import (
    AppendText,
    AssistantMessage,
    AssistantMessageEvent,
    Deleted,
    End,
    ErrorEvent,
    Interrupted,
    MessageRecord,
    Text,
    ToolCall,
    ToolCallEvent,
    ToolFailed,
    ToolResult,
    ToolResultEvent,
    UserMessage,
    Working,
)
from agentik.wire import Error as ErrorMessage

PROMPT = "you> "


def _text(content: list[object]) -> str:
    return "".join(c.body for c in content if isinstance(c, Text))


def _short(text: str, n: int = 200) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


class ChatScreen:
    """The terminal and the state of the current turn as the screen follows it."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.busy = False  # a turn of ours is running (from send until End)
        self.interrupting = False
        self.streamed = False  # text of the current turn was printed (a newline is due)
        self.ended = False  # the online End of the current turn arrived
        self.interrupted = False  # the durable Interrupted of the current turn arrived
        self.at_prompt = False
        self.line_open = False  # the cursor is not at the start of a line
        self.live_turn: str | None = None
        self.streamed_turns: set[str | None] = set()
        self.caught_up_turns: set[str | None] = set()
        self.working_shown: set[str | None] = set()

    def say(self, text: str, end: str = "\n") -> None:
        data = text + end
        if data:
            self.out.write(data)
            self.out.flush()
            self.line_open = not data.endswith("\n")
            self.at_prompt = False

    def note(self, text: str) -> None:
        """A status line, on its own line even in the middle of streamed text or the prompt;
        the prompt is shown again after it."""
        reprompt = self.at_prompt
        if self.line_open:
            self.say("")
        self.streamed = False
        self.say(f"[{text}]")
        if reprompt:
            self.prompt()

    def prompt(self) -> None:
        self.say(PROMPT, end="")
        self.at_prompt = True

    def catch_up(self, turn_id: str | None) -> None:
        """The durable stream ended this turn; its live End may never come."""
        self.caught_up_turns.add(turn_id)
        self.ended = True
        self.maybe_finish_turn()

    def turn_started(self) -> None:
        self.busy = True
        self.ended = self.interrupted = False

    def maybe_finish_turn(self) -> None:
        """Show the prompt once the turn is over: its End arrived and, if the user interrupted
        it, its Interrupted too (the two come on different streams, in either order)."""
        if not self.busy or not self.ended or (self.interrupting and not self.interrupted):
            return
        self.busy = False
        self.interrupting = False
        self.prompt()

    def show_records(self, title: str | None, conversation_id: str,
                     records: Sequence[MessageRecord]) -> None:
        """A conversation's last messages, as the chat opens it."""
        self.say(f"-- conversation {title or '(untitled)'} [{conversation_id}] --")
        for rec in records:
            msg = rec.message
            if isinstance(msg, UserMessage):
                self.say(f"you: {_text(list(msg.content))}")
            elif isinstance(msg, AssistantMessage):
                said = " ".join(t for t in (_text(list(msg.content)),
                                             "[interrupted]" if msg.interrupted else "") if t)
                self.say(f"agent: {said}")
            elif isinstance(msg, ToolCall):
                self.say(f"[tool call: {msg.name}({_short(msg.arguments)})]")
            elif isinstance(msg, ToolResult):
                verdict = "tool failed" if msg.is_error else "tool result"
                self.say(f"[{verdict}: {msg.name}: {_short(msg.content)}]")
            elif isinstance(msg, ErrorMessage):
                self.say(f"[error: {msg.message}]")
        self.say("-- Ctrl-C interrupts the answer, Ctrl-C again (or Ctrl-D, /quit) quits; "
                 "/help lists the commands --")

    def render_durable(self, event: object) -> None:
        if isinstance(event, ToolCallEvent | ToolResultEvent | ToolFailed | ErrorEvent):
            msg = event.record.message
            if isinstance(msg, ToolCall):
                self.note(f"tool call: {msg.name}({_short(msg.arguments)})")
            elif isinstance(msg, ToolResult):
                verdict = "tool failed" if isinstance(event, ToolFailed) or msg.is_error else "tool result"
                self.note(f"{verdict}: {msg.name}: {_short(msg.content)}")
            elif isinstance(msg, ErrorMessage):
                self.note(f"error: {msg.message}")
                self.catch_up(msg.turn_id)
        elif isinstance(event, AssistantMessageEvent):
            msg = event.record.message
            if (
                isinstance(msg, AssistantMessage) and not msg.interrupted
                and msg.turn_id not in self.streamed_turns
            ):
                self.note("live stream missed; the whole answer:")
                self.say(f"agent: {_text(list(msg.content))}")
                self.catch_up(msg.turn_id)
        elif isinstance(event, Interrupted):
            self.note("interrupted")
            self.interrupted = True
            self.maybe_finish_turn()
        elif isinstance(event, Deleted):
            self.note("the conversation was deleted")

    def render_online(self, event: object) -> None:
        if isinstance(event, Working):
            if not self.busy:
                self.turn_started()
            if event.turn_id not in self.working_shown and event.turn_id not in self.streamed_turns:
                # Sent when the turn starts and again while it waits (a slow or hung model):
                # say so once per turn, so a silent wait is never a blank screen.
                self.working_shown.add(event.turn_id)
                self.note("the agent is working…")
            self.live_turn = event.turn_id
        elif isinstance(event, AppendText):
            if self.live_turn in self.caught_up_turns:
                return
            self.streamed_turns.add(self.live_turn)
            if not self.streamed:
                self.say("agent: ", end="")
            self.streamed = True
            self.say(event.text, end="")
        elif isinstance(event, End):
            if event.turn_id in self.caught_up_turns:
                return  # finished from the durable stream already
            if self.streamed:
                self.say("")
            self.streamed = False
            self.ended = True
            self.maybe_finish_turn()
