"""The OpenAI-compatible routes' running part: a nursery (started by the web app's lifespan once
the runtime is up, cancelled before it closes) where each request's turn is followed, so a
follower outlives the request handler that started it (a streamed answer is written by the
response body, after the handler returned) and a temporary conversation is always deleted once
its turn is over, whether the caller read the answer or went away.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import trio

from agentik.errors import AgentikError, RuntimeClosedError
from agentik.openai_api.follow import TurnEvent, run_turn
from agentik.wire import Content, MessageContext

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


class OpenAiService:
    def __init__(self, agent: LocalAgent, nursery: trio.Nursery) -> None:
        self.agent = agent
        self._nursery = nursery

    async def start_turn(
        self, conversation_id: str, content: list[Content], context: MessageContext | None,
        *, delete_after: bool,
    ) -> TurnRun:
        """Send the message and follow its turn in the service's nursery. The agent's refusal of
        the send (busy, full mailbox, bad content, unknown conversation) is raised here; with
        ``delete_after`` the conversation is deleted once the turn is over (or refused)."""
        send, recv = trio.open_memory_channel[TurnEvent](EVENT_BUFFER)
        scope = trio.CancelScope()
        run = partial(self._run, conversation_id, content, context, send, scope, delete_after)
        turn_id: str = await self._nursery.start(run)
        return TurnRun(turn_id=turn_id, events=recv, scope=scope)

    async def _run(
        self, cid: str, content: list[Content], context: MessageContext | None,
        send: trio.MemorySendChannel[TurnEvent], scope: trio.CancelScope, delete_after: bool,
        *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            with scope:
                try:
                    await run_turn(self.agent, cid, content, context, send,
                                   task_status=task_status)
                except* trio.BrokenResourceError:
                    pass  # the reader went away
        finally:
            if delete_after:
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
