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
  (the turn's stored Error, or the conversation closed) or :class:`Cancelled` (interrupted).

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
    ToolStep,
    turn_step,
)
from agentik.wire import (
    AppendText,
    Content,
    Cursor,
    End,
    MessageContext,
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


TurnEvent = TextDelta | ToolUse | Finished | Failed | Cancelled


class _Online:
    """The live side: this turn's text deltas, forwarded until stopped. ``sent`` is what went
    out; ``stop`` waits until nothing more can go out."""

    def __init__(self) -> None:
        self.turn_id: str | None = None  # known once the message is sent
        self.sent: list[str] = []
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.woken = trio.Event()

    def wake(self) -> None:
        self.woken.set()

    async def stop(self) -> str:
        self.scope.cancel()
        await self.done.wait()
        return "".join(self.sent)

    async def forward(self, sub: OnlineSubscription, out: trio.MemorySendChannel[TurnEvent]) -> None:
        """Online events carry no turn id except Working/End: the text between this turn's
        Working and End is its own (a conversation runs one turn at a time)."""
        mine = False
        try:
            with self.scope:
                while True:
                    while sub.events:
                        event = sub.events.popleft().event
                        if isinstance(event, Working):
                            mine = event.turn_id == self.turn_id
                        elif isinstance(event, End):
                            mine = False
                        elif mine and isinstance(event, AppendText) and event.text:
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
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """See the module docstring. Closes ``out`` when done; an error after the send (storage
    failed, the stream lost its place) is reported as a :class:`Failed`. ``branch``: an edit
    or a regenerate of that user message rather than a send (``OpenAiService.start_turn``)."""
    async with out:
        cursor = await agent.outbox.current_cursor()
        online = _Online()
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
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(online.forward, sub, out)
                    await _durable(agent, conversation_id, cursor, online, out)
                    nursery.cancel_scope.cancel()
            except* AgentikError as group:
                first = group.exceptions[0]
                await out.send(Failed(message=str(first), code=getattr(first, "code", "internal")))
        finally:
            sub.close()


async def _durable(
    agent: LocalAgent, cid: str, cursor: Cursor, online: _Online,
    out: trio.MemorySendChannel[TurnEvent],
) -> None:
    """Follow the stored events to the turn's ending."""
    turn_id = online.turn_id
    partial = ""
    async for ce in agent.outbox.conversation_events(cursor, cid):
        match turn_step(ce.event, turn_id):
            case ToolStep(call=call):
                await out.send(ToolUse(call.call_id, call.name, call.arguments))
            case PartialStep(text=text):
                partial = text  # its Interrupted or Error follows in the same commit
            case AnswerStep(answer=answer, text=text):
                sent = await online.stop()
                rest = text[len(sent):] if text.startswith(sent) else ""
                await out.send(Finished(text, rest, answer.finish_reason, answer.tokens))
                return
            case InterruptedStep():
                await online.stop()
                await out.send(Cancelled(partial))
                return
            case ErrorStep(error=error):
                await online.stop()
                await out.send(Failed(error.message, error.code, partial))
                return
            case ClosedStep(reason=reason):
                await online.stop()
                await out.send(Failed(f"the conversation was closed ({reason})", "closed",
                                      partial))
                return
