"""One conversation turn through the public Agent API, followed to its end as a few typed events:
what the OpenAI-compatible routes project (the mapping the A2A executor makes for its tasks).

:func:`run_turn` subscribes to the conversation's live events *before* it sends (so the turn's
first token cannot be missed), sends the message, reports the turn's id through
``task_status.started``, and then puts on ``out``:

- :class:`TextDelta` for each piece of streamed text of this turn (live events, lossy: a reader
  that fell behind loses the rest of them, never one in the middle);
- :class:`ToolUse` for each tool call the agent makes (durable);
- exactly one ending: :class:`Finished` (the stored answer, with the text the deltas did not
  carry as ``rest``, so the deltas and ``rest`` always add up to the answer), :class:`Failed`
  (the turn's stored Error, or the conversation closed), :class:`Cancelled` (interrupted), or
  :class:`ClientCalls`: the turn waits for the results of the caller's own tools (each of its
  client-side tool calls still without a result, read from the journal), which a later request
  answers; :func:`follow_turn` then follows the turn on from there; or, when the follower is
  told to (``ask``), :class:`PersonAsks`: the turn waits for a person's approval or answer.

A send the agent refuses (busy, full mailbox, bad content, unknown conversation) raises before
``started``, so the caller answers the request with that error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from agentik.errors import AgentikError
from agentik.turns import (
    AnswerStep,
    ClosedStep,
    ErrorStep,
    InterruptedStep,
    PartialStep,
    PauseStep,
    ToolStep,
    open_pauses,
    turn_records,
    turn_step,
)
from agentik.wire import (
    AppendText,
    Content,
    Cursor,
    End,
    InputRequest,
    MessageContext,
    Pause,
    ToolCall,
    TurnTokens,
    Working,
)

if TYPE_CHECKING:
    from agentik.agent import LocalAgent
    from agentik.storage.hub import OnlineSubscription


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolUse:
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Finished:
    answer: str
    rest: str  # the part of ``answer`` no TextDelta carried
    finish_reason: str | None
    tokens: TurnTokens | None


@dataclass(frozen=True)
class Failed:
    message: str
    code: str
    partial: str = ""


@dataclass(frozen=True)
class Cancelled:
    partial: str


@dataclass(frozen=True)
class ClientCalls:
    calls: list[ToolUse]


@dataclass(frozen=True)
class PersonAsks:
    """The turn waits for a person (an approval, a question): the first pause still open."""

    request: Pause


TurnEvent = TextDelta | ToolUse | Finished | Failed | Cancelled | ClientCalls | PersonAsks
#: the events that end a followed turn (for now: ClientCalls and PersonAsks, until answered)
ENDINGS = (Finished, Failed, Cancelled, ClientCalls, PersonAsks)


class _Online:
    """The live side: this turn's text deltas, forwarded until stopped. ``sent`` is what went
    out; ``stop`` waits until nothing more can go out."""

    def __init__(self) -> None:
        self.turn_id: str | None = None  # known once the message is sent
        self.sent: list[str] = []
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.woken = trio.Event()
        #: the text now arriving is this turn's (between its Working and its End)
        self.mine = False
        #: a pause for a person ends the following (PersonAsks)
        self.ask = False

    def wake(self) -> None:
        self.woken.set()

    async def stop(self) -> str:
        self.scope.cancel()
        await self.done.wait()
        return "".join(self.sent)

    async def forward(self, sub: OnlineSubscription, out: trio.MemorySendChannel[TurnEvent]) -> None:
        """Online events carry no turn id except Working/End: the text between this turn's
        Working and End is its own (a conversation runs one turn at a time)."""
        try:
            with self.scope:
                while True:
                    while sub.events:
                        event = sub.events.popleft().event
                        if isinstance(event, Working):
                            self.mine = event.turn_id == self.turn_id
                        elif isinstance(event, End):
                            self.mine = False
                        elif self.mine and isinstance(event, AppendText) and event.text:
                            await out.send(TextDelta(event.text))
                            self.sent.append(event.text)
                    if sub.ended:
                        await trio.sleep_forever()  # fell behind: the answer carries the rest
                    await self.woken.wait()
                    self.woken = trio.Event()
        finally:
            self.done.set()


async def run_turn(
    agent: LocalAgent,
    conversation_id: str,
    content: list[Content],
    context: MessageContext | None,
    out: trio.MemorySendChannel[TurnEvent],
    *,
    branch: tuple[str, str] | None = None,
    ended: list[TurnEvent] | None = None,
    ask: bool = False,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """See the module docstring. Closes ``out`` when done; an error after the send (storage
    failed, the stream lost its place) is reported as a :class:`Failed`. ``branch``: an edit
    or a regenerate of that user message rather than a send (``OpenAiService.start_turn``).
    The ending is put on ``ended`` as it is sent (it is known there even when the follower is
    cancelled then); ``ask``: a pause for a person ends it too (:class:`PersonAsks`)."""
    async with out:
        cursor = await agent.outbox.current_cursor()
        online = _Online()
        online.ask = ask
        sub = agent.online_outbox.subscribe(conversation_id, online.wake)
        try:
            if branch is None:
                turn_id = await agent.send(conversation_id, content, context)
            elif branch[0] == "edit":
                turn_id = await agent.edit(conversation_id, branch[1], content, context)
            else:
                turn_id = await agent.regenerate(conversation_id, branch[1])
            online.turn_id = turn_id
            task_status.started(turn_id)
            await _follow(agent, conversation_id, cursor, online, sub, out, ended)
        finally:
            sub.close()


async def follow_turn(
    agent: LocalAgent, conversation_id: str, turn_id: str, cursor: Cursor,
    out: trio.MemorySendChannel[TurnEvent],
    *, ended: list[TurnEvent] | None = None, ask: bool = False, check_from: int | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """As :func:`run_turn` for a turn already running (what it waited on was just answered):
    followed from ``cursor`` (taken before the answers) to its ending; first, what it still
    waits on (its journal from ``check_from``, its user message: no new pause event comes for
    one stored already) ends it at once."""
    ended = [] if ended is None else ended
    async with out:
        online = _Online()
        online.ask = ask
        online.turn_id = turn_id
        sub = agent.online_outbox.subscribe(conversation_id, online.wake)
        online.mine = True  # it runs already: its text until its End is its own
        try:
            task_status.started(turn_id)
            if check_from is not None and (
                    waiting := await waits_on(agent, conversation_id, turn_id, check_from, {},
                                              ask)) is not None:
                ended.append(waiting)
                await out.send(waiting)
                return
            await _follow(agent, conversation_id, cursor, online, sub, out, ended)
        finally:
            sub.close()


async def _follow(agent: LocalAgent, cid: str, cursor: Cursor, online: _Online,
                  sub: OnlineSubscription, out: trio.MemorySendChannel[TurnEvent],
                  ended: list[TurnEvent] | None) -> None:
    ended = [] if ended is None else ended
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(online.forward, sub, out)
            await _durable(agent, cid, cursor, online, out, ended)
            nursery.cancel_scope.cancel()
    except* AgentikError as group:
        first = group.exceptions[0]
        ended.append(Failed(message=str(first), code=getattr(first, "code", "internal")))
        await out.send(ended[-1])


async def waits_on(agent: LocalAgent, cid: str, turn_id: str | None, seq: int,
                   calls: dict[str, ToolCall], ask: bool) -> ClientCalls | PersonAsks | None:
    """What the turn waits on, from its journal from ``seq`` (its first pause seen): the
    client-side calls still without a result; else (with ``ask``) the first pause for a person
    still open; else None. ``calls``: the turn's calls seen so far."""
    records = await turn_records(agent, cid, seq)
    waiting = open_pauses(records, turn_id)
    client = [p for p in waiting if isinstance(p, InputRequest) and p.tool is not None]
    if not client:  # (a tool server's form is no question a chat can answer: not asked)
        person = [p for p in waiting if not (isinstance(p, InputRequest) and p.schema is not None)]
        return PersonAsks(person[0]) if ask and person else None
    for record in records:  # (calls of a round are stored before its pauses: seen already)
        if isinstance(record.message, ToolCall):
            calls.setdefault(record.message.call_id, record.message)
    uses = [ToolUse(c.call_id, c.name, c.arguments) for p in client
            if (c := calls.get(p.call_id)) is not None]
    return ClientCalls(uses)


async def _durable(
    agent: LocalAgent, cid: str, cursor: Cursor, online: _Online,
    out: trio.MemorySendChannel[TurnEvent], ended: list[TurnEvent],
) -> None:
    """Follow the stored events to the turn's ending (or its wait for client-side results)."""
    turn_id = online.turn_id
    partial = ""
    calls: dict[str, ToolCall] = {}
    ending: TurnEvent
    async for ce in agent.outbox.conversation_events(cursor, cid):
        match turn_step(ce.event, turn_id):
            case ToolStep(call=call):
                calls[call.call_id] = call
                await out.send(ToolUse(call.call_id, call.name, call.arguments))
                continue
            case PauseStep(seq=seq):
                waiting = await waits_on(agent, cid, turn_id, seq, calls, online.ask)
                if waiting is None:
                    continue
                await online.stop()
                ending = waiting
            case PartialStep(text=text):
                partial = text  # its Interrupted or Error follows in the same commit
                continue
            case AnswerStep(answer=answer, text=text):
                sent = await online.stop()
                rest = text[len(sent):] if text.startswith(sent) else ""
                ending = Finished(text, rest, answer.finish_reason, answer.tokens)
            case InterruptedStep():
                await online.stop()
                ending = Cancelled(partial)
            case ErrorStep(error=error):
                await online.stop()
                ending = Failed(error.message, error.code, partial)
            case ClosedStep(reason=reason):
                await online.stop()
                ending = Failed(f"the conversation was closed ({reason})", "closed", partial)
            case _:
                continue
        ended.append(ending)
        await out.send(ending)
        return
