"""The seam between the facade's task logic and what the agent does.

The facade runs ``executor.execute(request, updater)`` for each message that starts or continues
a task, in a task of its own (it outlives the HTTP request that started it). The executor
reports through the :class:`TaskUpdater` the facade gives it:

- ``start()``                      the task is WORKING
- ``working(message)``             a WORKING status update with a message (e.g. a tool call)
- ``add_artifact(parts, ...)``     stream parts: a whole artifact, or chunks of one (``append``)
- ``require_input(message)``       INPUT_REQUIRED: the task waits for a follow-up message
- ``complete(message)``            COMPLETED
- ``fail(message)``                FAILED
- ``reject(message)``              REJECTED
- ``reply(message)``               answer with a direct Message instead of a task
- ``canceled(message)``            CANCELED (after the facade asked ``executor.cancel``)

``execute`` returns once it reported a final word (a terminal state, INPUT_REQUIRED, or a
reply); returning without one fails the task, raising an A2AError before the task exists answers
the request with that error. ``cancel(request, updater)`` asks a running execution to stop and
returns whether ``execute`` will end by itself (else the facade cancels it at once); the task
ends CANCELED unless the executor reported another terminal state first.
``check(message)`` refuses a message the agent would refuse (raising an A2AError) before its
task is stored; ``conversation(context_id, previous, agent)`` names the conversation a context runs
in (``previous``: the one its latest task used, None for a new context; ``agent``: the agent whose
endpoint the message came to, None for the default one); None when the executor has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from agentik.a2a.types import Message, Part, Task


@dataclass(frozen=True)
class RequestContext:
    """One message for an executor: the user's ``message`` (its ``taskId`` and ``contextId`` are
    filled in), the ``task`` it continues (None for a new task), the context's conversation."""

    message: Message
    task_id: str
    context_id: str
    task: Task | None
    conversation_id: str | None = None


class TaskUpdater(Protocol):
    async def start(self, message: Message | None = None) -> None: ...

    async def working(self, message: Message) -> None: ...

    async def add_artifact(
        self,
        parts: list[Part],
        *,
        artifact_id: str | None = None,
        name: str | None = None,
        append: bool = False,
        last_chunk: bool = False,
    ) -> str:
        """Returns the artifact's id (pass it back to append chunks to the same artifact)."""
        ...

    async def require_input(self, message: Message | None = None) -> None: ...

    async def complete(self, message: Message | None = None) -> None: ...

    async def fail(self, message: Message | None = None) -> None: ...

    async def reject(self, message: Message | None = None) -> None: ...

    async def reply(self, message: Message) -> None: ...

    async def canceled(self, message: Message | None = None) -> None: ...

    def agent_message(self, parts: list[Part]) -> Message:
        """An agent Message of this task (ids filled in)."""
        ...


class Executor(Protocol):
    def check(self, message: Message) -> None:
        """Raise an A2AError (invalid params) for a message the agent refuses (e.g. an image it
        does not take), before any task of it is stored."""
        ...

    async def conversation(
        self, context_id: str, previous: str | None, agent: str | None = None
    ) -> str | None: ...

    async def execute(self, request: RequestContext, updater: TaskUpdater) -> None: ...

    async def cancel(self, request: RequestContext, updater: TaskUpdater) -> bool: ...
