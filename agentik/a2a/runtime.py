"""agentik's A2A executor: each task is one conversation turn, through the public Agent API.

- A ``contextId`` is one conversation: the first message of a context creates one (titled
  ``A2A <contextId>``), later ones use the conversation the context's latest task used, so any
  client-chosen ``contextId`` works and the exchange is an ordinary conversation over
  ``/agentik`` too. A deleted conversation takes the context's tasks with it (storage
  deletes them in the same transaction), so the context's next message starts a new one.
- The message is sent like any other (``conversation.send``), so a busy conversation follows
  AGENTIK_BUSY_POLICY: ``queue`` (default) queues it; ``reject`` fails the send with a JSON-RPC
  error saying the conversation is busy (nothing stored); ``interrupt`` interrupts the running
  turn (its task ends CANCELED) and this message runs next.
  The turn's events become the task's: ``Working`` of the turn -> WORKING; streamed text ->
  ``artifactUpdate`` chunks (``append``) of one text artifact, coalesced while a write is in
  flight; a tool call -> a WORKING status update naming the tool; the answer -> the last chunk
  (what the stream had not carried yet) and COMPLETED with the answer as the status message;
  ``Error`` -> FAILED with its message; ``Interrupted`` -> CANCELED (the partial answer stays in
  the conversation and in the artifact).
- ``check`` refuses an image part under the rules of every send (:mod:`agentik.content`).
- ``cancel`` interrupts the conversation only while this task's own turn runs; a task whose
  message still waits in the mailbox has its turn withdrawn (``LocalAgent.cancel_turn``: it
  ends Interrupted at once and is never run; in a cluster the conversation's owner does it)
  and the facade marks it CANCELED.
- ``resume`` follows the turn of a task a dead process left unfinished, which a restart runs
  (its message was queued), as ``execute`` follows the turn it sent (:mod:`agentik.a2a.serve`).
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from agentik.a2a import errors as e
from agentik.a2a.executor import CALLER, RequestContext, TaskUpdater
from agentik.a2a.pauses import waiting_of
from agentik.a2a.types import Message, Part, Task
from agentik.a2a.waiting import Asking
from agentik.content import check_image
from agentik.errors import (
    BusyError,
    InvalidInputError,
    MailboxFullError,
    NotFoundError,
)
from agentik.turns import (
    AnsweredStep,
    AnswerStep,
    ClosedStep,
    ErrorStep,
    InterruptedStep,
    PartialStep,
    PauseStep,
    ToolStep,
    turn_step,
)
from agentik.wire import (
    AppendText,
    Content,
    Cursor,
    End,
    Image,
    MessageContext,
    MessageOrigin,
    Text,
    Working,
)

if TYPE_CHECKING:
    from agentik.agent import LocalAgent


#: online text chunks the executor may hold while a chunk is being stored (more are dropped from
#: the stream; the answer's last chunk then carries them)
CHUNK_BUFFER = 1024
#: how long a cancel waits for the task's message to be stored (its turn id comes with it)
CANCEL_WAIT = 10.0


def to_content(parts: Sequence[Part]) -> list[Content]:
    """A2A parts as agentik content: text as is, images as images, data as JSON text, a URL or
    another file as a line naming it."""
    content: list[Content] = []
    for part in parts:
        if part.text is not None:
            content.append(Text(body=part.text))
        elif part.raw is not None and (part.media_type or "").startswith("image/"):
            content.append(Image(data=base64.b64encode(part.raw).decode(),
                                 mime=part.media_type or "image/png"))
        elif part.raw is not None:
            content.append(Text(body=f"[file {part.filename or 'unnamed'} "
                                     f"({part.media_type or 'bytes'}, {len(part.raw)} bytes)]"))
        elif part.url is not None:
            content.append(Text(body=f"[file {part.filename or ''} at {part.url}]".replace("  ", " ")))
        else:
            content.append(Text(body=json.dumps(part.data, ensure_ascii=False)))
    return content


class _Turn:
    """What one execution knows about its turn."""

    def __init__(self) -> None:
        self.turn_id: str | None = None
        self.known = trio.Event()
        self.running = False
        self.artifact_id: str | None = None
        self.sent = ""  # text already streamed as chunks
        self.pause_seq: int | None = None  # the journal seq of the turn's first pause seen


class _Online:
    """The online side of one execution (live text -> chunks): stopped before the answer is
    stored, and waited for, so no chunk is stored after the final one."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.done = trio.Event()

    async def stop(self) -> None:
        self.scope.cancel()
        await self.done.wait()


class AgentikExecutor(Asking):
    def __init__(self, agent: LocalAgent) -> None:
        self.agent = agent
        self._turns: dict[str, _Turn] = {}

    def check(self, message: Message) -> None:
        """The images of ``message`` under the rules of every send (agentik.content), so a
        refused one is answered -32602 before its task is stored."""
        rules = self.agent.config.image_rules
        for i, item in enumerate(to_content(message.parts)):
            if isinstance(item, Image):
                try:
                    check_image(item, rules, f"message.parts[{i}]")
                except InvalidInputError as exc:
                    raise e.invalid_params(str(exc)) from None

    async def conversation(
        self, context_id: str, previous: str | None, agent: str | None = None
    ) -> str | None:
        """The context's conversation (a new one, of ``agent``, when it is another user's); a
        context's messages to another agent's endpoint than its own are refused."""
        wanted = self.agent.get_agent(agent).id
        caller = CALLER.get()
        if previous is not None:
            conversation = await self.agent.get_conversation(previous, user=caller.user)
            if conversation is not None:
                owner = self.agent.agent_of(conversation.agent)
                if owner != wanted:
                    raise e.invalid_params(
                        f"context {context_id!r} belongs to agent {owner!r}: send its messages "
                        f"to /a2a/{owner}")
                return previous
        if caller.owner is not None:
            await self.agent.users.before_create(caller.owner, caller.limits)
        made = await self.agent.create_conversation(title=f"A2A {context_id}", agent=wanted,
                                                    owner=caller.owner)
        return made.id

    async def cancel(self, request: RequestContext, updater: TaskUpdater) -> bool:
        """A running turn is interrupted (the execution ends by itself, CANCELED with what was
        said); a turn still waiting behind another is withdrawn (it will never run) and the
        facade ends the execution at once. Returns whether the execution ends by itself."""
        turn = self._turns.get(request.task_id)
        cid = request.conversation_id
        if turn is None or cid is None:
            return False
        if turn.running:
            return await self.agent.interrupt(cid)
        with trio.move_on_after(CANCEL_WAIT):
            await turn.known.wait()  # the message is being stored: its turn id comes with it
        if turn.turn_id is not None:
            with contextlib.suppress(NotFoundError):  # deleted meanwhile: nothing left to run
                await self.agent.cancel_turn(cid, turn.turn_id)
        return False

    async def claim(self, conversation_id: str) -> None:
        """A cluster: NotOwnerError when another live node owns the caller's conversation (its
        request goes there whole), else this node claims it (``LocalAgent.own``)."""
        await self.agent.own(conversation_id, user=CALLER.get().user)

    async def withdraw(self, task: Task, conversation_id: str | None) -> None:
        """A task that asks for input is cancelled: its waiting turn is interrupted."""
        waiting = waiting_of(task)
        if waiting is not None and conversation_id is not None:
            with contextlib.suppress(NotFoundError):  # deleted meanwhile: nothing waits
                await self.agent.cancel_turn(conversation_id, waiting.turn_id)

    async def execute(self, request: RequestContext, updater: TaskUpdater) -> None:
        cid = request.conversation_id
        if cid is None:
            raise e.error(e.INTERNAL_ERROR, "the context has no conversation")
        conversation = await self.agent.get_conversation(cid)
        if conversation is None:  # deleted since the facade looked it up
            raise e.conversation_gone(request.context_id)
        waiting = None if request.task is None else waiting_of(request.task)
        if waiting is not None:  # a follow-up answering the pause its turn waits on
            self._turns[request.task_id] = turn = _Turn()
            try:
                return await self.follow_up(request, updater, waiting, turn, _Online())
            finally:
                self._turns.pop(request.task_id, None)
        context = MessageContext(
            origin=MessageOrigin(kind="agent", id=request.context_id),
            metadata={"a2a_context_id": request.context_id, "a2a_task_id": request.task_id,
                      "a2a_message_id": request.message.message_id},
        )
        turn = _Turn()
        self._turns[request.task_id] = turn
        online = _Online()
        try:
            cursor = await self.agent.outbox.current_cursor()
            async with trio.open_nursery() as nursery:
                # Subscribed before the send, so the turn's first online event cannot be missed.
                await nursery.start(self._online_side, cid, turn, updater, online)
                try:
                    turn.turn_id = await conversation.send(to_content(request.message.parts), context)
                except (MailboxFullError, BusyError) as exc:
                    raise e.error(e.INTERNAL_ERROR, f"the conversation is busy: {exc}") from None
                except InvalidInputError as exc:  # check() said the same before the task
                    raise e.invalid_params(str(exc)) from None
                except NotFoundError:  # deleted since the lookup
                    raise e.conversation_gone(request.context_id) from None
                finally:
                    turn.known.set()  # also when the send failed: a cancel waits for it
                try:
                    await self._watch_durable(cid, cursor, turn, updater, online)
                finally:
                    online.scope.cancel()
        finally:
            self._turns.pop(request.task_id, None)

    async def resume(
        self, request: RequestContext, updater: TaskUpdater, turn_id: str, after: Cursor
    ) -> None:
        """Follow the turn ``turn_id`` of a task a dead process left unfinished (its message was
        queued: a restart runs it) from ``after`` (before its message) to its end, as ``execute``
        does after its send; a cancel withdraws or interrupts it."""
        cid = request.conversation_id
        if cid is None:
            raise e.error(e.INTERNAL_ERROR, "the context has no conversation")
        turn = _Turn()
        turn.turn_id = turn_id
        turn.known.set()
        self._turns[request.task_id] = turn
        online = _Online()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._online_side, cid, turn, updater, online)
                try:
                    await self._watch_durable(cid, after, turn, updater, online)
                finally:
                    online.scope.cancel()
        finally:
            self._turns.pop(request.task_id, None)

    async def _online_side(
        self, cid: str, turn: _Turn, updater: TaskUpdater, online: _Online,
        *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            with online.scope:
                async with trio.open_nursery() as nursery:
                    send, recv = trio.open_memory_channel[tuple[str | None, str | None]](
                        CHUNK_BUFFER)
                    await nursery.start(self._watch_online, cid, send)
                    nursery.start_soon(self._stream_chunks, turn, recv, updater)
                    task_status.started()
        finally:
            online.done.set()

    async def _watch_online(
        self,
        cid: str,
        send: trio.MemorySendChannel[tuple[str | None, str | None]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Feed (turn id, text) pairs: (turn, None) when a turn starts, (turn, text) for its
        streamed text. Online events carry no turn id except Working/End: the text between them
        is that turn's (turns run one at a time)."""
        current: str | None = None
        events = self.agent.online_outbox.online_events(cid)
        task_status.started()
        async with send:
            async for ce in events:
                event = ce.event
                try:
                    if isinstance(event, Working):
                        current = event.turn_id
                        send.send_nowait((current, None))
                    elif isinstance(event, End):
                        current = None
                    elif isinstance(event, AppendText) and current is not None:
                        send.send_nowait((current, event.text))
                except trio.WouldBlock:
                    pass  # the answer's last chunk carries what is dropped here

    async def _stream_chunks(
        self,
        turn: _Turn,
        recv: trio.MemoryReceiveChannel[tuple[str | None, str | None]],
        updater: TaskUpdater,
    ) -> None:
        """Store the turn's text as artifact chunks: everything queued while one chunk is being
        stored goes out as the next one. Each store is shielded, so a cancel lands only between
        stores (the execution's view of what was sent stays exact)."""
        await turn.known.wait()
        async with recv:
            async for first in recv:
                batch = [first]
                while True:
                    try:
                        batch.append(recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                mine = [text for turn_id, text in batch if turn_id == turn.turn_id]
                with trio.CancelScope(shield=True):
                    if mine and not turn.running:
                        turn.running = True
                        await updater.start()
                    text = "".join(t for t in mine if t)
                    if text:
                        await self._chunk(turn, updater, text, last=False)

    async def _chunk(self, turn: _Turn, updater: TaskUpdater, text: str, *, last: bool) -> None:
        turn.artifact_id = await updater.add_artifact(
            [Part(text=text)], artifact_id=turn.artifact_id, name="answer",
            append=turn.artifact_id is not None, last_chunk=last,
        )
        turn.sent += text

    async def _final_text(self, turn: _Turn, updater: TaskUpdater, answer: str) -> None:
        """The artifact ends holding exactly ``answer``: the part the chunks did not carry yet as
        the last chunk, or the whole answer if the chunks went astray."""
        if answer.startswith(turn.sent):
            rest = answer[len(turn.sent):]
            if rest or turn.artifact_id is not None:
                await self._chunk(turn, updater, rest, last=True)
            return
        turn.artifact_id = await updater.add_artifact(
            [Part(text=answer)], artifact_id=turn.artifact_id, name="answer", append=False,
            last_chunk=True,
        )
        turn.sent = answer

    async def _watch_durable(
        self, cid: str, cursor: Cursor, turn: _Turn, updater: TaskUpdater, online: _Online
    ) -> None:
        partial: str | None = None
        events = self.agent.outbox.conversation_events(cursor, cid)
        async for ce in events:
            match turn_step(ce.event, turn.turn_id):
                case ToolStep(call=call):
                    turn.running = True
                    message = updater.agent_message([Part(text=f"Calling tool {call.name}")])
                    message.metadata = {"agentik": {"toolCall": {
                        "callId": call.call_id, "name": call.name, "arguments": call.arguments}}}
                    await updater.working(message)
                case PartialStep(text=text):
                    partial = text  # Interrupted or Error follows in the same commit
                case PauseStep(seq=seq):
                    turn.pause_seq = seq if turn.pause_seq is None else turn.pause_seq
                    if await self.ask_if_waiting(cid, turn, updater, online):
                        return
                case AnsweredStep():
                    if await self.ask_if_waiting(cid, turn, updater, online):
                        return
                case AnswerStep(text=text):
                    await online.stop()
                    await self._final_text(turn, updater, text)
                    await updater.complete(updater.agent_message([Part(text=text)]))
                    return
                case InterruptedStep():
                    await online.stop()
                    if partial:
                        await self._final_text(turn, updater, partial)
                    await updater.canceled(
                        updater.agent_message([Part(text=partial)]) if partial else None
                    )
                    return
                case ErrorStep(error=error):
                    await online.stop()
                    if partial:
                        await self._final_text(turn, updater, partial)
                    await updater.fail(updater.agent_message([Part(text=error.message)]))
                    return
                case ClosedStep(reason=reason):
                    await online.stop()
                    await updater.fail(updater.agent_message(
                        [Part(text=f"the conversation was closed ({reason})")]))
                    return

