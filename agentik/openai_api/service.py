"""The OpenAI-compatible routes' running part: a nursery (started by the web app's lifespan once
the runtime is up, cancelled before it closes) where each request's turn is followed, so a
follower outlives the request handler that started it (a streamed answer is written by the
response body, after the handler returned) and a temporary conversation is always deleted once
its turn is over, whether the caller read the answer or went away.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import trio

from agentik.errors import AgentikError, RuntimeClosedError
from agentik.openai_api.follow import (
    Cancelled,
    ClientCalls,
    Failed,
    Finished,
    TextDelta,
    TurnEvent,
    follow_turn,
    run_turn,
)
from agentik.openai_api.responses import Outcome, outcome_of
from agentik.wire import AssistantMessageEvent, Content, Cursor, ErrorEvent, MessageContext

if TYPE_CHECKING:
    from agentik.agent import LocalAgent

log = logging.getLogger("agentik.openai_api")

#: events a follower may queue ahead of its reader (then it waits; live text a slow reader did
#: not take is carried by the answer's rest)
EVENT_BUFFER = 256


@dataclass(eq=False)
class TurnRun:
    """A followed turn: its id, its events (read them to the end, or close them) and the scope
    that stops following it (the turn itself goes on unless its conversation is deleted)."""

    turn_id: str
    events: trio.MemoryReceiveChannel[TurnEvent]
    scope: trio.CancelScope
    #: the conversation named in the ids of client-side calls (None: the caller names it)
    ids_for: str | None = None


@dataclass(eq=False)
class LiveResponse:
    """A response's text so far and, once it ended, its outcome: what its streams read. Each
    change replaces ``changed`` after setting it."""

    text: str = ""
    outcome: Outcome | None = None
    changed: trio.Event = field(default_factory=trio.Event)
    #: nobody follows it any more (the server is stopping): its streams end without an ending,
    #: so their readers resume it later
    gone: bool = False

    def update(self, text: str, outcome: Outcome | None = None) -> None:
        self.text = text
        self.outcome = outcome
        self.changed.set()
        self.changed = trio.Event()

    def abandon(self) -> None:
        if self.outcome is None:
            self.gone = True
            self.update(self.text)

    async def ended(self) -> Outcome:
        while self.outcome is None:
            if self.gone:
                raise RuntimeClosedError("the server stopped following this response")
            await self.changed.wait()
        return self.outcome


def outcome_of_ending(event: Finished | Failed | Cancelled, live: str) -> Outcome:
    match event:
        case Finished():
            return Outcome("completed", event.answer, event.tokens)
        case Failed():
            text = event.partial if event.partial.startswith(live) else live
            return Outcome("failed", text, None, event.message, event.code)
        case Cancelled():
            return Outcome("cancelled", event.partial if event.partial.startswith(live) else live)


class OpenAiService:
    def __init__(self, agent: LocalAgent, nursery: trio.Nursery) -> None:
        self.agent = agent
        self._nursery = nursery
        #: responses whose turn this node follows now, by response id
        self.live: dict[str, LiveResponse] = {}

    def track(self, rid: str, run: TurnRun) -> LiveResponse:
        """Follow a response's turn into a :class:`LiveResponse` (kept here while it runs)."""
        live = self.live[rid] = LiveResponse()
        self._nursery.start_soon(self._track, rid, run, live)
        return live

    async def _track(self, rid: str, run: TurnRun, live: LiveResponse) -> None:
        text: list[str] = []
        try:
            async with run.events:
                async for event in run.events:
                    if isinstance(event, TextDelta):
                        text.append(event.text)
                        live.update("".join(text))
                    elif isinstance(event, Finished | Failed | Cancelled):
                        live.update(live.text, outcome_of_ending(event, live.text))
                        return
            live.update(live.text, Outcome("failed", live.text, None,
                                           "the turn's events ended", "internal"))
        finally:
            del self.live[rid]
            live.abandon()

    def watch(self, conversation_id: str, turn_id: str) -> LiveResponse:
        """A response followed from storage (another node runs it, or it ended): its outcome
        once its turn's record is stored."""
        live = LiveResponse()
        self._nursery.start_soon(self._watch, conversation_id, turn_id, live)
        return live

    async def _watch(self, cid: str, turn_id: str, live: LiveResponse) -> None:
        try:
            await self._watched(cid, turn_id, live)
        finally:
            live.abandon()

    async def _watched(self, cid: str, turn_id: str, live: LiveResponse) -> None:
        agent = self.agent
        try:
            cursor = await agent.outbox.current_cursor()
            outcome = outcome_of(turn_id, (await agent.chat_snapshot(cid)).messages)
            if outcome.status == "in_progress":
                async for ce in agent.outbox.conversation_events(cursor, cid):
                    if isinstance(ce.event, AssistantMessageEvent | ErrorEvent):
                        outcome = outcome_of(turn_id, (await agent.chat_snapshot(cid)).messages)
                        if outcome.status != "in_progress":
                            break
        except AgentikError as exc:
            outcome = Outcome("failed", "", None, str(exc), exc.code)
        if outcome.status == "in_progress":  # the conversation was deleted meanwhile
            outcome = Outcome("failed", "", None, "the conversation was deleted", "closed")
        live.update(outcome.text, outcome)

    async def start_turn(
        self, conversation_id: str, content: list[Content], context: MessageContext | None,
        *, delete_after: bool, branch: tuple[str, str] | None = None, ask: bool = False,
    ) -> TurnRun:
        """Send the message and follow its turn in the service's nursery. The agent's refusal of
        the send (busy, full mailbox, bad content, unknown conversation) is raised here; with
        ``delete_after`` the conversation is deleted once the turn is over (or refused), not
        while it waits for the results of client-side tools (a later request answers them).
        ``branch``: the turn is an edit of (the message is a new version of) or a regenerate of
        (the message is not sent again) that user message ("edit" | "regenerate", its id).
        ``ask``: a pause for a person ends the following too (a named conversation's: the
        caller's next message answers it)."""
        send, recv = trio.open_memory_channel[TurnEvent](EVENT_BUFFER)
        scope = trio.CancelScope()
        run = partial(self._run, conversation_id, scope, delete_after,
                      partial(run_turn, self.agent, conversation_id, content, context, send,
                              branch=branch, ask=ask))
        turn_id: str = await self._nursery.start(run)
        return TurnRun(turn_id=turn_id, events=recv, scope=scope)

    async def follow(self, conversation_id: str, turn_id: str, cursor: Cursor, check_from: int,
                     *, delete_after: bool, ask: bool) -> TurnRun:
        """Follow a running turn from ``cursor`` (what it waited on was just answered), as
        :meth:`start_turn` follows a new one; first, what it still waits on (its journal from
        ``check_from``) ends it at once."""
        send, recv = trio.open_memory_channel[TurnEvent](EVENT_BUFFER)
        scope = trio.CancelScope()
        run = partial(self._run, conversation_id, scope, delete_after,
                      partial(follow_turn, self.agent, conversation_id, turn_id, cursor, send,
                              ask=ask, check_from=check_from))
        await self._nursery.start(run)
        return TurnRun(turn_id=turn_id, events=recv, scope=scope)

    async def _run(
        self, cid: str, scope: trio.CancelScope, delete_after: bool,
        follow: Callable[..., Awaitable[None]],
        *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        ended: list[TurnEvent] = []
        try:
            with scope:
                try:
                    await follow(ended=ended, task_status=task_status)
                except* trio.BrokenResourceError:
                    pass  # the reader went away
        finally:
            # a turn that waits for client-side results keeps its conversation: the next
            # request answers them (a reader gone before it saw the calls: deleted as ever)
            if delete_after and not (ended and isinstance(ended[-1], ClientCalls)):
                with trio.CancelScope(shield=True):
                    await self.delete_quietly(cid)

    async def delete_quietly(self, cid: str) -> None:
        try:
            await self.agent.delete_conversation(cid)
        except AgentikError as exc:
            log.warning("deleting the temporary conversation %s failed: %s", cid, exc)


@dataclass(eq=False)
class OpenAiMount:
    """The routes' state in an app: the running service (None while not serving)."""

    service: OpenAiService | None = None
    created: int = 0
    heartbeat: float = 15.0
    #: open streamed answers (tests wait on it to see a disconnect released everything)
    open_streams: int = 0
    _changed: trio.Event = field(default_factory=trio.Event)

    def require(self) -> OpenAiService:
        if self.service is None:
            raise RuntimeClosedError("the runtime is not running")
        return self.service

    def stream_count(self, delta: int) -> None:
        self.open_streams += delta
        self._changed.set()
        self._changed = trio.Event()

    async def wait_open_streams(self, n: int) -> None:
        while self.open_streams != n:
            await self._changed.wait()


async def run_service(
    mount: OpenAiMount, agent: LocalAgent,
    *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    async with trio.open_nursery() as nursery:
        mount.service = OpenAiService(agent, nursery)
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            mount.service = None
