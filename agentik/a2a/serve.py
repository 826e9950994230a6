"""A2A served on agentik's runtime: the mount on its web app and the service's life, which starts
by settling the tasks a dead process left SUBMITTED or WORKING.

A task is a projection of its conversation turn, so at start-up it follows what the runtime does
with that turn (start-up closes a running turn with an Error; a queued one, accepted but not
started, runs after the restart, ``Registry.resume_queued``):

- its turn is found by the task's user message, stored after the task (a task is stored
  SUBMITTED before its message is sent, ``returnImmediately``) and naming it in its metadata
  (``a2a_task_id``); the execution re-attaches to that turn as if it had sent it, replaying the
  conversation from the task's creation, so the turn's ending is seen whether it came before or
  after this start-up: COMPLETED with its answer, FAILED with the Error that closed a turn
  running at the kill, CANCELED when it is withdrawn or interrupted (``tasks/cancel`` works on
  it as on any task, and ``tasks/get``/``subscribe`` see the task as it goes);
- a task whose message is not found after it (the process died before the message was stored;
  a task stored only once its turn ran, which a restart closed) ends FAILED "interrupted by
  restart";
- on a PostgreSQL cluster, only the tasks of the conversations this node may own are settled:
  another live node's are its own (running there, or settled by its start-up), and those of a
  dead node's conversation are taken over with it (``LocalAgent.own``), so its turn's ending
  ("interrupted: node lost") ends the task.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

import trio

from agentik.a2a.cards import card_info_for
from agentik.a2a.push import PushConfigs
from agentik.a2a.runtime import AgentikExecutor
from agentik.a2a.service import A2AService
from agentik.a2a.store import StoredTask, TaskStore
from agentik.a2a.types import RUNNING
from agentik.a2a.web import A2AMount, CardInfo, mount
from agentik.errors import AgentikError, NotOwnerError
from agentik.wire import Cursor, UserMessage

if TYPE_CHECKING:
    from quart import Quart

    from agentik.agent import LocalAgent
    from agentik.web._state import WebState

log = logging.getLogger("agentik.a2a")

#: messages read at a time looking for a task's message after it
PAGE = 100
#: pages read at most: the task's message is stored right after the task, behind at most the
#: other sends to its conversation in that moment
MAX_PAGES = 10


async def turn_of(agent: LocalAgent, stored: StoredTask) -> str | None:
    """The turn a task's message started (its user message's id), None if it is not found."""
    cid = stored.conversation_id
    conversation = None if cid is None else await agent.get_conversation(cid)
    if conversation is None:
        return None
    after = stored.first_seq
    for _ in range(MAX_PAGES):
        # the journal, not the current branch (a task's message may be a version left since)
        page = await agent.journal.list(conversation.id, after_seq=after, limit=PAGE)
        for record in page:
            message = record.message
            if (isinstance(message, UserMessage) and message.context is not None
                    and message.context.metadata.get("a2a_task_id") == stored.task.id):
                return record.id
        if len(page) < PAGE:
            return None
        after = page[-1].seq
    return None


async def recover(agent: LocalAgent, service: A2AService, executor: AgentikExecutor
                  ) -> tuple[int, int]:
    """Start-up: each task a dead process left SUBMITTED or WORKING re-attaches to its turn or
    ends FAILED (see the module's docstring); returns (re-attached, failed)."""
    store = service.store
    head = await agent.outbox.current_cursor()
    resumed = failed = 0
    for row in await store.records.in_states(RUNNING):
        stored = await store.get(row.id)
        if stored is None or stored.task.status.state not in RUNNING:
            continue
        if stored.conversation_id is not None:
            try:  # a cluster: claimed here (a dead node's), or another live node's to settle
                await agent.own(stored.conversation_id)
            except NotOwnerError:
                continue
        turn_id = await turn_of(agent, stored)
        if turn_id is None:
            await store.fail(row.id)
            failed += 1
            continue
        after = Cursor(epoch=head.epoch, offset=stored.first_seq)
        service.resume(stored, partial(executor.resume, turn_id=turn_id, after=after))
        resumed += 1
    return resumed, failed


async def run_a2a(
    mount: A2AMount, agent: LocalAgent, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve A2A on ``agent`` until cancelled: settle the tasks a dead process left running,
    then hold the nursery the executions run in."""
    executor = AgentikExecutor(agent)
    async with trio.open_nursery() as nursery:
        service = A2AService(TaskStore(agent.task_records), executor, nursery)
        service.pushes = PushConfigs(service.store, agent.webhooks)
        try:
            resumed, failed = await recover(agent, service, executor)
        except AgentikError as exc:
            log.error("A2A: settling the tasks left running failed: %s", exc)
            resumed = failed = 0
        if resumed or failed:
            log.info("start-up: A2A tasks left running by a dead process: %d follow their "
                     "queued turn, %d marked FAILED", resumed, failed)
        mount.service = service
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            mount.service = None


def mount_agentik(app: Quart, st: WebState, *, heartbeat: float = 15.0) -> A2AMount:
    """Mount the A2A routes on agentik's app, served on the runtime's agent while it runs."""

    def card_info() -> CardInfo:
        return card_info_for(st.require_agent())

    def agent_card_info(agent_id: str) -> CardInfo:
        return card_info_for(st.require_agent(), agent_id)

    a2a = mount(app, card_info, heartbeat=heartbeat, agent_card_info=agent_card_info)
    a2a.peers = lambda: st.require_agent().peers
    st.services.append(partial(run_a2a, a2a))
    return a2a
