"""Durable A2A tasks over agentik's storage (docs/A2A.md).

Every change of a task is ONE storage op (:class:`agentik.storage.ops.PutA2ATask`): the task's
whole record as of the change (seq = N) and a ``TaskUpdated`` event at offset N carrying the
StreamResponse its subscribers get; an artifact chunk of a task still streaming is stored as the
chunk (its event only: ``PutA2ATask.chunk``), folded back in by :meth:`TaskStore.get`. So:

- ``GetTask``/``ListTasks`` read rows, which survive restarts;
- a subscription is "the task as of its seq N, then its events after N" (:meth:`events`), the
  same for every subscriber, with nothing lost in between (the cursor protocol);
- changes of one task are serialised by a per-task lock here and made conditional on the seq
  last read (``expect_seq``), so two writers can never both win;
- a task goes with its conversation (deleted, or a temporary one purged): reads no longer find
  it, a change of it changes nothing (storage refuses a task of a conversation that is gone)
  and its subscriptions end after the conversation's ``Deleted``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import trio

from agentik.a2a.types import (
    FAILED,
    INTERRUPTED,
    RUNNING,
    TERMINAL,
    Artifact,
    Part,
    StreamResponse,
    Task,
    TaskStatus,
    TaskStatusUpdateEvent,
    agent_message,
    decode_task,
    decode_update,
    encode,
    text_part,
    timestamp,
)
from agentik.agent import TaskRecords
from agentik.errors import AgentikError, NotFoundError
from agentik.ids import new_id
from agentik.wire import TaskUpdated

if TYPE_CHECKING:
    from agentik.storage.types import A2ATaskRow

#: what a change returns: the task after it and the StreamResponse announcing it (None: no change)
Change = Callable[[Task], tuple[Task, StreamResponse] | None]


@dataclass(frozen=True)
class StoredTask:
    """A task as read: ``seq`` is its row's (its last whole change: what the next change
    expects), ``after`` the last change ``task`` holds (later than ``seq`` by the artifact
    chunks stored since, ``ops.PutA2ATask.chunk``: a subscription goes on after it)."""

    task: Task
    seq: int
    first_seq: int
    conversation_id: str | None
    after: int


def merge_artifact(artifacts: list[Artifact], chunk: Artifact, append: bool) -> list[Artifact]:
    """The task's artifacts after one artifactUpdate: a new artifact is added, an ``append``
    chunk extends its artifact's parts (consecutive text parts are joined into one), any other
    update replaces the artifact."""
    out = list(artifacts)
    for i, old in enumerate(out):
        if old.artifact_id != chunk.artifact_id:
            continue
        if not append:
            out[i] = chunk
            return out
        parts = list(old.parts)
        for part in chunk.parts:
            last = parts[-1] if parts else None
            if (
                last is not None and last.text is not None and part.text is not None
                and last.metadata is None and part.metadata is None
            ):
                parts[-1] = Part(text=last.text + part.text, media_type=last.media_type)
            else:
                parts.append(part)
        out[i] = msgspec.structs.replace(old, parts=parts)
        return out
    out.append(chunk)
    return out


def _chunk(update: StreamResponse, expect: int | None, state: str) -> bool:
    """Whether a change is stored as its chunk alone: an artifact chunk appended to an
    existing task that goes on streaming (its last chunk stores the whole task again)."""
    art = update.artifact_update
    return (expect is not None and art is not None and art.append and not art.last_chunk
            and state not in TERMINAL)


class TaskStore:
    def __init__(self, records: TaskRecords) -> None:
        self.records = records
        self._locks: dict[str, tuple[trio.Lock, int]] = {}
        #: the last stored version of every task that is running, the base of its next change
        #: (this process is its only writer, so a stale one can only be refused: a conversation
        #: deleted with its tasks); reads go to storage
        self._running: dict[str, StoredTask] = {}

    # --- reads -----------------------------------------------------------------------------------

    async def get(self, task_id: str, user: str | None = None) -> StoredTask | None:
        """The task now: its row, and the artifact chunks stored after it folded in; None also
        for a task of another ``user``'s conversation (docs/USERS.md)."""
        row = await self.records.get(task_id, user)
        return None if row is None else await self._stored(row)

    async def _stored(self, row: A2ATaskRow) -> StoredTask:
        task, after = decode_task(row.payload), row.seq
        for offset, event in await self.records.changes_after(row.seq, row.conversation_id,
                                                              row.id):
            art = decode_update(bytes(event.update)).artifact_update
            if art is not None:
                task = msgspec.structs.replace(
                    task, artifacts=merge_artifact(task.artifacts, art.artifact, art.append))
            after = offset
        return StoredTask(task, row.seq, row.first_seq, row.conversation_id, after)

    async def context_conversation(self, context_id: str) -> tuple[bool, str | None]:
        """(whether a task has used the context, the conversation of its latest task)."""
        row = await self.records.latest_of_context(context_id)
        return (False, None) if row is None else (True, row.conversation_id)

    async def page(
        self, context_id: str | None, state: str | None, before_first_seq: int | None, limit: int,
        user: str | None = None,
    ) -> tuple[list[StoredTask], int]:
        """``user``: only the tasks of that user's conversations (docs/USERS.md)."""
        rows, total = await self.records.page(context_id, state, before_first_seq, limit, user)
        return [await self._stored(r) for r in rows], total

    async def events(self, stored: StoredTask) -> AsyncIterator[tuple[int, TaskUpdated]]:
        """The task's changes after ``stored`` (a snapshot of it), replayed then live, in order,
        until the consumer stops, or until its conversation is deleted (and the task with it)."""
        async for offset, event in self.records.updates(stored.after, stored.conversation_id):
            if event.task_id == stored.task.id:
                yield offset, event

    # --- writes ----------------------------------------------------------------------------------

    async def _lock(self, task_id: str) -> trio.Lock:
        lock, users = self._locks.get(task_id, (trio.Lock(), 0))
        self._locks[task_id] = (lock, users + 1)
        return lock

    def _unlock(self, task_id: str) -> None:
        lock, users = self._locks[task_id]
        if users <= 1:
            del self._locks[task_id]
        else:
            self._locks[task_id] = (lock, users - 1)

    async def _put(
        self, task: Task, update: StreamResponse, conversation_id: str | None, expect: int | None,
        first_seq: int | None,
    ) -> StoredTask:
        chunk = _chunk(update, expect, task.status.state)
        try:
            seq = await self.records.put(
                task_id=task.id, context_id=task.context_id, conversation_id=conversation_id,
                state=task.status.state, record=b"" if chunk else encode(task),
                update=encode(update), expect_seq=expect, chunk=chunk,
            )
        except AgentikError:
            self._running.pop(task.id, None)  # the next change reads what is stored
            raise
        row = expect if chunk and expect is not None else seq  # a chunk leaves the row as it was
        stored = StoredTask(task, row, seq if first_seq is None else first_seq, conversation_id,
                            seq)
        if task.status.state in TERMINAL or task.status.state in INTERRUPTED:
            self._running.pop(task.id, None)
        else:
            self._running[task.id] = stored
        return stored

    async def create(self, task: Task, conversation_id: str | None) -> StoredTask:
        """Store a new task; its first event is the whole task. Raises ConflictError if the id
        is taken."""
        lock = await self._lock(task.id)
        try:
            async with lock:
                return await self._put(task, StreamResponse(task=task), conversation_id, None, None)
        finally:
            self._unlock(task.id)

    async def change(self, task_id: str, fn: Change) -> StoredTask | None:
        """Apply ``fn`` to the task's current version and store the result (serialised per task).
        Returns the stored version, the current one if ``fn`` changed nothing, None for an
        unknown task (also one deleted with its conversation meanwhile)."""
        lock = await self._lock(task_id)
        try:
            async with lock:
                current = self._running.get(task_id) or await self.get(task_id)
                if current is None:
                    return None
                result = fn(current.task)
                if result is None:
                    return current
                task, update = result
                try:
                    return await self._put(task, update, current.conversation_id, current.seq,
                                           current.first_seq)
                except NotFoundError:  # its conversation was deleted, and the task with it
                    return None
        finally:
            self._unlock(task_id)

    async def fail(self, task_id: str, reason: str = "interrupted by restart") -> None:
        """The task ends FAILED with ``reason`` (unless it has ended)."""
        await self.change(task_id, lambda task: fail_change(task, reason))

    async def recover(self, reason: str = "interrupted by restart") -> int:
        """Start-up of a facade without turns to follow: every task left SUBMITTED or WORKING
        by a dead process ends FAILED (agentik's own start-up: :mod:`agentik.a2a.serve`)."""
        rows = await self.records.in_states(RUNNING)
        for row in rows:
            await self.fail(row.id, reason)
        return len(rows)


def status_change(task: Task, status: TaskStatus) -> tuple[Task, StreamResponse]:
    """``task`` with a new status (the old status message goes to the history, as A2A's SDKs
    do), and the statusUpdate announcing it."""
    history = list(task.history)
    if task.status.message is not None:
        history.append(task.status.message)
    new = Task(id=task.id, context_id=task.context_id, status=status, artifacts=task.artifacts,
               history=history, metadata=task.metadata)
    update = StreamResponse(status_update=TaskStatusUpdateEvent(
        task_id=task.id, context_id=task.context_id, status=status))
    return new, update


def fail_change(task: Task, reason: str) -> tuple[Task, StreamResponse] | None:
    if task.status.state in TERMINAL:
        return None
    message = agent_message([text_part(reason)], context_id=task.context_id, task_id=task.id,
                            message_id=new_id())
    return status_change(task, TaskStatus(state=FAILED, message=message, timestamp=timestamp()))


def trim_task(task: Task, history_length: int | None, include_artifacts: bool = True) -> Task:
    """``task`` as a reader asked for it: the last ``history_length`` messages (0: none; None:
    all), artifacts only if ``include_artifacts``."""
    history = task.history
    if history_length is not None:
        history = history[-history_length:] if history_length > 0 else []
    artifacts = task.artifacts if include_artifacts else []
    if history is task.history and artifacts is task.artifacts:
        return task
    return msgspec.structs.replace(task, history=history, artifacts=artifacts)
