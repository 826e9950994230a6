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
ends CANCELED unless the executor reported another terminal state first; a task that waits for
input (no execution runs) is cancelled after ``withdraw(task, conversation_id)``.
``claim(conversation_id)`` comes first for a message of an existing context or task and for a
cancel: on a cluster it raises NotOwnerError when another live node runs the conversation, and
the request goes to that node (:mod:`agentik.a2a.forward`) before anything is counted or stored.
``check(message)`` refuses a message the agent would refuse (raising an A2AError) before its
task is stored; ``conversation(context_id, previous, agent)`` names the conversation a context runs
in (``previous``: the one its latest task used, None for a new context; ``agent``: the agent whose
endpoint the message came to, None for the default one); None when the executor has none.

Who is asking (docs/USERS.md) is :data:`CALLER`, set by the route for each request: a user
reaches only the tasks of their own conversations (another's answers as an unknown task), a new
conversation is created for ``owner``, and ``admit`` (the user's limits) runs before a message
is taken. The default caller reaches everything (no users: the TCK's system under test).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

from agentik.a2a.types import Message, Part, Task
from agentik.users import Limits


@dataclass(frozen=True)
class Caller:
    """Who an A2A request is: ``user`` is whose conversations (and so tasks) it reaches (None:
    all), ``owner`` who new conversations are created for, ``admit`` checks their limits before
    a message is taken (raises AgentikError)."""

    user: str | None = None
    owner: str | None = None
    admit: Callable[[], Awaitable[None]] | None = None
    #: the limits a new conversation for ``owner`` is checked against (conversations kept)
    limits: Limits = field(default_factory=Limits)


#: the caller of the A2A request being served (``agentik.a2a.web.rpc`` sets it)
CALLER: ContextVar[Caller] = ContextVar(
    "agentik_a2a_caller", default=Caller())  # noqa: B039 - a frozen dataclass, never mutated


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

    async def withdraw(self, task: Task, conversation_id: str | None) -> None:
        """``task`` waits for input (no execution runs) and is cancelled: end what it waits on."""
        ...

    async def claim(self, conversation_id: str) -> None:
        """Before a message or a cancel of the conversation is taken: raise NotOwnerError when
        another live node runs it (a cluster), and the request is sent there whole."""
        ...
