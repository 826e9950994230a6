"""What ``agentik chat`` shows, and the turn state it follows to show it: no network, no
input. :class:`ChatScreen` writes to a text stream; :class:`agentik.client.chat.Chat` (the
session) feeds it the durable and the live events and the user's lines.

The answer comes twice: streamed (live ``AppendText``) and whole (the durable
``AssistantMessage``). Live events missed while disconnected are lost, so a turn whose text was
not streamed is shown from its durable record instead, and late live text of such a turn is then
ignored. A turn is over (the prompt comes back) once the journal has its end (the answer, an
error or ``Interrupted``) and, if its text was streamed, the live End came too: the two streams
are not ordered with each other, and either may come first; nothing of the turn comes after
the prompt.

What the user types while a turn runs is held, unseen, and shown after the prompt when the turn
is over; a line finished meanwhile is taken then (agentik/client/chat_input.py). A turn that waits
for the user (an approval, a question: docs/PROTOCOL.md, "A person in the loop") asks on the
screen, and the next line is the answer, taken while the turn runs (one pause at a time).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO, assert_never

from agentik.client.chat_input import EndOfInput, Entered, Erased, LineEditor, Typed
from agentik.wire import (
    AppendText,
    ApprovalAnswer,
    ApprovalGiven,
    ApprovalRequest,
    ApprovalRequested,
    AssistantMessage,
    AssistantMessageEvent,
    Deleted,
    End,
    ErrorEvent,
    InputAnswer,
    InputGiven,
    InputRequest,
    InputRequested,
    Interrupted,
    MessageRecord,
    Pause,
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


@dataclass
class Input:
    """A line the user finished (None: the end of the input), and whether it is on the screen."""

    line: str | None
    shown: bool


class ChatScreen:
    """The terminal and the state of the current turn as the screen follows it."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.busy = False  # a turn is running (from send, or its Working, until it is over)
        self.interrupting = False
        self.streamed = False  # text of the current turn was printed (a newline is due)
        self.ended = False  # the online End of the current turn arrived (or is not awaited)
        self.stored = False  # the journal's end of the current turn arrived
        self.editor = LineEditor()
        #: lines finished and not taken yet, oldest first
        self.entered: deque[Input] = deque()
        self.at_prompt = False
        self.line_open = False  # the cursor is not at the start of a line
        self.live_turn: str | None = None
        self.streamed_turns: set[str | None] = set()
        self.caught_up_turns: set[str | None] = set()
        self.working_shown: set[str | None] = set()
        #: pauses of the turn waiting for the user's answer, the one asked first
        self.pauses: deque[Pause] = deque()

    def say(self, text: str, end: str = "\n") -> None:
        data = text + end
        if data:
            self.out.write(data)
            self.out.flush()
            self.line_open = not data.endswith("\n")
            self.at_prompt = False

    def note(self, text: str) -> None:
        """A status line, on its own line even in the middle of streamed text or the prompt;
        the prompt is shown again after it (unless a turn runs: it comes when the turn is
        over)."""
        reprompt = self.at_prompt and not self.busy
        if self.line_open:
            self.say("")
        self.streamed = False
        self.say(f"[{text}]")
        if reprompt:
            self.prompt()

    def prompt(self) -> None:
        """The prompt, then a line typed while the turn ran (it is taken next), or what is
        being typed."""
        held = next((i for i in self.entered if not i.shown), None)
        if held is not None:
            held.shown = True
            self.say(PROMPT + (held.line or ""))
            self.changed()
            return
        self.say(PROMPT + self.editor.text, end="")
        self.at_prompt = True

    def changed(self) -> None:
        """Called when a line may be ready to take (the session wakes its input loop)."""

    # --- what the user types -----------------------------------------------------------------

    def keys(self, keys: str | None) -> None:
        """Keys from the terminal (None: its end). Echoed while no turn runs; held unseen
        while one does (they would land inside the answer), and shown after it."""
        echo = not self.busy or bool(self.pauses)  # a pause's answer is typed while it runs
        edits = self.editor.feed(keys) if keys is not None else [EndOfInput()]
        for edit in edits:
            match edit:
                case Typed(text=text):
                    if echo:
                        self._echo(text)
                case Erased(count=count):
                    if echo:
                        self._echo("\b \b" * count)
                case Entered(line=line):
                    if echo:
                        self.say("")  # the newline
                    self.entered.append(Input(line, shown=echo))
                case EndOfInput():
                    if echo and self.line_open:
                        self.say("")
                    self.entered.append(Input(None, shown=echo))
                case _:
                    assert_never(edit)
        if self.entered:
            self.changed()

    def line(self, line: str | None) -> None:
        """A line from input that is not a terminal (not echoed there, nor here)."""
        self.entered.append(Input(line, shown=True))
        self.line_open = self.at_prompt = False
        self.changed()

    def take(self) -> Input | None:
        """The next line to act on, or None while a turn runs (unless it asks the user) or
        none is finished."""
        if (self.busy and not self.pauses) or not self.entered:
            return None
        # The line is on the screen with its newline (echoed, or shown after the prompt); from
        # a pipe it is not, and what follows goes on after the prompt.
        self.at_prompt = self.line_open = False
        return self.entered.popleft()

    def _echo(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self.line_open = True

    # --- the turn ----------------------------------------------------------------------------

    def turn_started(self) -> None:
        self.busy = True
        self.ended = self.stored = False

    def turn_stored(self, turn_id: str | None) -> None:
        """The journal has this turn's end. If none of its text was streamed, its live End is
        not awaited (it may never come), and late live text of it is ignored."""
        self.stored = True
        if turn_id not in self.streamed_turns:
            self.caught_up_turns.add(turn_id)
            self.ended = True
        self.maybe_finish_turn()

    def live_lost(self) -> None:
        """The live stream broke: what it streamed of this turn is incomplete, so the answer
        is shown whole from the journal, and its End is not awaited."""
        self.streamed_turns.discard(self.live_turn)
        if self.streamed:
            self.say("")
            self.streamed = False
        if self.stored:
            self.turn_stored(self.live_turn)

    def maybe_finish_turn(self) -> None:
        """Show the prompt once the turn is over: the journal has its end and the live End
        came (or is not awaited)."""
        if not self.busy or not self.ended or not self.stored:
            return
        self.busy = False
        self.interrupting = False
        self.prompt()
        self.changed()

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
        # the pauses still open: asked, not answered, their turn without its end
        ended = {m.turn_id for r in records
                 if isinstance(m := r.message, AssistantMessage | ErrorMessage)}
        open_ = {m.call_id: m for r in records if isinstance(m := r.message, ApprovalRequest
                                                              | InputRequest)
                 and m.turn_id not in ended}
        for rec in records:
            if isinstance(rec.message, ApprovalAnswer | InputAnswer):
                open_.pop(rec.message.call_id, None)
        self.say("-- Ctrl-C interrupts the answer, Ctrl-C again (or Ctrl-D, /quit) quits; "
                 "/help lists the commands --")
        for pause in open_.values():
            self.busy = True
            self.ask(pause)

    # --- a person in the loop ----------------------------------------------------------------

    def ask(self, pause: Pause) -> None:
        """A pause of the turn: asked now, or after the one asked before it is answered."""
        if any(p.call_id == pause.call_id for p in self.pauses):
            return
        self.pauses.append(pause)
        if len(self.pauses) == 1:
            self._ask_first()

    def answered(self, call_id: str) -> None:
        """The pause ``call_id`` is answered (here or by another client): the next is asked."""
        first = self.pauses[0].call_id if self.pauses else None
        self.pauses = deque(p for p in self.pauses if p.call_id != call_id)
        if self.pauses and first == call_id:
            self._ask_first()

    def _ask_first(self) -> None:
        pause = self.pauses[0]
        if isinstance(pause, ApprovalRequest):
            self.note(f"approval needed: {pause.tool}({_short(pause.arguments)})")
            self.say("approve? y, or n or why not: ", end="")
        else:
            self.note(f"question: {pause.question}")
            for i, choice in enumerate(pause.choices or (), 1):
                self.say(f"  {i}) {choice}")
            self.say("answer: ", end="")
        self.changed()

    def render_pause(self, event: object) -> None:
        """A pause asked, or answered (by anyone: the journal's record)."""
        if isinstance(event, ApprovalRequested | InputRequested):
            if isinstance(msg := event.record.message, ApprovalRequest | InputRequest):
                self.ask(msg)
        elif isinstance(event, ApprovalGiven | InputGiven):
            msg = event.record.message
            if isinstance(msg, ApprovalAnswer):
                verdict = "approved" if msg.approve else "refused" + (
                    f": {msg.reason}" if msg.reason else "")
                self.note(f"{verdict}: {msg.call_id}")
            elif isinstance(msg, InputAnswer):
                self.note(f"answered: {_short(msg.text or str(msg.data))}")
            if isinstance(msg, ApprovalAnswer | InputAnswer):
                self.answered(msg.call_id)

    def render_durable(self, event: object) -> None:
        if isinstance(event, ApprovalRequested | InputRequested | ApprovalGiven | InputGiven):
            self.render_pause(event)
        elif isinstance(event, ToolCallEvent | ToolResultEvent | ToolFailed | ErrorEvent):
            msg = event.record.message
            if isinstance(msg, ToolCall):
                self.note(f"tool call: {msg.name}({_short(msg.arguments)})")
            elif isinstance(msg, ToolResult):
                verdict = "tool failed" if isinstance(event, ToolFailed) or msg.is_error else "tool result"
                self.note(f"{verdict}: {msg.name}: {_short(msg.content)}")
            elif isinstance(msg, ErrorMessage):
                self.note(f"error: {msg.message}")
                self.turn_stored(msg.turn_id)
        elif isinstance(event, AssistantMessageEvent):
            msg = event.record.message
            if isinstance(msg, AssistantMessage) and not msg.interrupted:
                if msg.turn_id not in self.streamed_turns:
                    self.note("live stream missed; the whole answer:")
                    self.say(f"agent: {_text(list(msg.content))}")
                self.turn_stored(msg.turn_id)
        elif isinstance(event, Interrupted):
            self.note("interrupted")
            self.turn_stored(event.turn_id)
        elif isinstance(event, Deleted):
            self.note("the conversation was deleted")

    def render_online(self, event: object) -> None:
        if isinstance(event, Working):
            self.live_turn = event.turn_id
            if event.turn_id in self.caught_up_turns:
                return  # a late one: the journal ended this turn already
            if not self.busy:
                self.turn_started()
            if event.turn_id not in self.working_shown and event.turn_id not in self.streamed_turns:
                # Sent when the turn starts and again while it waits (a slow or hung model):
                # say so once per turn, so a silent wait is never a blank screen.
                self.working_shown.add(event.turn_id)
                self.note("the agent is working…")
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
