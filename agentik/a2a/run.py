"""One execution of the A2A executor and what it reports through: :class:`Run` (the state
:class:`~agentik.a2a.service.A2AService` keeps of it) and :class:`Updater` (the
:class:`~agentik.a2a.executor.TaskUpdater` an executor gets). The updater creates the task on
its first report (unless the service stored it SUBMITTED already), turns each report into one
stored change (a status, an artifact chunk), and says nothing more once the task said its final
word; a reply without a task is kept on the run, stored nowhere.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
import trio

from agentik.a2a import errors as e
from agentik.a2a.executor import RequestContext
from agentik.a2a.store import StoredTask, TaskStore, merge_artifact, status_change
from agentik.a2a.types import (
    CANCELED,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    INTERRUPTED,
    REJECTED,
    TERMINAL,
    WORKING,
    Artifact,
    Message,
    Part,
    StreamResponse,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    agent_message,
    timestamp,
)
from agentik.errors import A2AError, NotFoundError
from agentik.ids import new_id


@dataclass(eq=False)
class Run:
    """One execution of the executor for one message."""

    request: RequestContext
    is_new: bool
    #: set once the task exists (``snapshot``), or the run ended without one
    ready: trio.Event = field(default_factory=trio.Event)
    #: set once ``execute`` returned and the outcome is stored
    done: trio.Event = field(default_factory=trio.Event)
    #: the task as this run's stream starts it: as created (new), as continued (follow-up)
    snapshot: StoredTask | None = None
    reply: Message | None = None
    error: A2AError | None = None
    final: bool = False
    cancel_requested: bool = False
    cancel_scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    updater: Updater | None = None

    @classmethod
    def resumed(cls, stored: StoredTask, store: TaskStore) -> Run:
        """The run of a task a dead process left unfinished (start-up: it follows the task's
        turn), so a cancel, its outcome and its streams are as for a task a message started."""
        task = stored.task
        request = RequestContext(message=task.history[0], task_id=task.id,
                                 context_id=task.context_id, task=task,
                                 conversation_id=stored.conversation_id)
        run = cls(request=request, is_new=False, snapshot=stored)
        run.ready.set()
        run.updater = Updater(store, run)
        return run


class Updater:
    """What an executor reports through (the :class:`~agentik.a2a.executor.TaskUpdater` of one
    run)."""

    def __init__(self, store: TaskStore, run: Run) -> None:
        self._store = store
        self._run = run
        self._request = run.request
        #: one creation at a time: the executor's tasks report concurrently (its first text
        #: chunk's start and a tool call's WORKING can race to create the task twice)
        self._creating = trio.Lock()

    def agent_message(self, parts: list[Part]) -> Message:
        return agent_message(parts, context_id=self._request.context_id,
                             task_id=self._request.task_id, message_id=new_id())

    async def _ensure_task(self, state: TaskState, message: Message | None) -> bool:
        """Create the run's task if it does not exist yet; True if this call did (with the given
        status). Raises :func:`~agentik.a2a.errors.conversation_gone` when the context's
        conversation was deleted before the task was stored."""
        async with self._creating:
            return await self._create(state, message)

    async def _create(self, state: TaskState, message: Message | None) -> bool:
        run = self._run
        if run.snapshot is not None:
            return False
        task = Task(
            id=self._request.task_id, context_id=self._request.context_id,
            status=TaskStatus(state=state, message=message, timestamp=timestamp()),
            history=[self._request.message],
        )
        try:
            run.snapshot = await self._store.create(task, self._request.conversation_id)
        except NotFoundError:  # storage refuses a task of a conversation that is gone
            raise e.conversation_gone(self._request.context_id) from None
        run.ready.set()
        return True

    async def _status(self, state: TaskState, message: Message | None = None) -> None:
        if self._run.final and state not in TERMINAL:
            return
        if not await self._ensure_task(state, message):
            status = TaskStatus(state=state, message=message, timestamp=timestamp())

            def change(task: Task) -> tuple[Task, StreamResponse] | None:
                if task.status.state in TERMINAL:
                    return None
                return status_change(task, status)

            await self._store.change(self._request.task_id, change)
        if state in TERMINAL or state in INTERRUPTED:
            self._run.final = True

    async def start(self, message: Message | None = None) -> None:
        await self._status(WORKING, message)

    async def working(self, message: Message) -> None:
        await self._status(WORKING, message)

    async def require_input(self, message: Message | None = None) -> None:
        await self._status(INPUT_REQUIRED, message)

    async def complete(self, message: Message | None = None) -> None:
        await self._status(COMPLETED, message)

    async def fail(self, message: Message | None = None) -> None:
        await self._status(FAILED, message)

    async def reject(self, message: Message | None = None) -> None:
        await self._status(REJECTED, message)

    async def canceled(self, message: Message | None = None) -> None:
        await self._status(CANCELED, message)

    async def reply(self, message: Message) -> None:
        run = self._run
        if run.snapshot is None:
            run.reply = message
            run.final = True
            run.ready.set()
        else:  # a task exists already: the reply is its answer
            await self.complete(message)

    async def add_artifact(
        self,
        parts: list[Part],
        *,
        artifact_id: str | None = None,
        name: str | None = None,
        append: bool = False,
        last_chunk: bool = False,
    ) -> str:
        if self._run.final:
            return artifact_id or ""
        await self._ensure_task(WORKING, None)
        chunk = Artifact(artifact_id=artifact_id or uuid.uuid4().hex, name=name, parts=parts)

        def change(task: Task) -> tuple[Task, StreamResponse] | None:
            if task.status.state in TERMINAL:
                return None
            new = msgspec.structs.replace(
                task, artifacts=merge_artifact(task.artifacts, chunk, append)
            )
            update = StreamResponse(artifact_update=TaskArtifactUpdateEvent(
                task_id=task.id, context_id=task.context_id, artifact=chunk, append=append,
                last_chunk=last_chunk,
            ))
            return new, update

        await self._store.change(self._request.task_id, change)
        return chunk.artifact_id


#: what runs as a task's execution: ``Executor.execute``, or what ``A2AService.resume`` is given
Execute = Callable[[RequestContext, Updater], Awaitable[None]]
