"""``supervise``: runs a conversation's actor and restarts it after a crash (DESIGN: supervision).

A crash (an unexpected exception, i.e. a bug) ends the running turn with an Error record and a
fresh actor incarnation takes over the same handle, so queued turns survive. Too many crashes in
a period mark the conversation failed (a tombstone in the registry: sends are refused).
"""

from __future__ import annotations

import logging
import time

import trio

from agentik.actors.conversation import ConversationActor
from agentik.actors.handle import ConversationHandle
from agentik.actors.messages import Turn
from agentik.errors import ConversationFailedError

log = logging.getLogger(__name__)


async def supervise(
    handle: ConversationHandle, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run the conversation's actor, restarting it after a crash (an unexpected exception) with
    the same mailbox; a crash ends the running turn with an Error record. More than
    ``restart_limit`` crashes within ``restart_period`` seconds mark the conversation failed: its
    queued turns get an Error and later sends raise ConversationFailedError. Cancellation is never
    swallowed. Never raises anything but Cancelled."""
    cfg = handle.deps.config
    try:
        with trio.CancelScope() as scope:
            handle.actor_scope = scope
            task_status.started()
            while True:
                actor = ConversationActor(handle)
                try:
                    await actor.run()
                    return
                except Exception as exc:
                    log.exception(
                        "conversation %s crashed", handle.conversation_id,
                        extra={"conversation_id": handle.conversation_id,
                               "turn_id": None if handle.current is None
                               else handle.current.turn_id})
                    turn = handle.current
                    handle.current = None
                    handle.turn_scope = None
                    now = time.monotonic()
                    handle.crashes.append(now)
                    while handle.crashes and handle.crashes[0] < now - cfg.restart_period:
                        handle.crashes.popleft()
                    # Decide before recording: once the crash's events are out, a client may
                    # send again at once and must already see the failed state.
                    handle.failed = len(handle.crashes) > cfg.restart_limit
                    handle.failed_until = now + cfg.restart_period
                    if turn is not None:
                        await actor.end_crashed(turn, exc)
                    if handle.failed:
                        log.error("conversation %s failed: %d crashes in %g s",
                                  handle.conversation_id, len(handle.crashes), cfg.restart_period)
                        await _fail_queued(handle)
                        return
    finally:
        # A failed conversation stays registered as a tombstone (sends get
        # ConversationFailedError) until its restart period has passed; see Registry.get.
        if not handle.failed:
            handle.keeper.forget(handle)
        handle.exited.set()


async def _fail_queued(handle: ConversationHandle) -> None:
    handle.mailbox.close()
    async with handle.inbox:
        while True:
            try:
                msg = handle.inbox.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return
            if isinstance(msg, Turn):
                await msg.stored.wait()
                if msg.store_ok:
                    actor = ConversationActor(handle)
                    await actor.end_crashed(msg, ConversationFailedError("conversation failed"))


