"""The facade's task logic: A2A methods over the task store and an executor (see
:mod:`agentik.a2a.executor`). No HTTP here; :mod:`agentik.a2a.web` maps JSON-RPC onto it.

- A message without ``taskId`` starts a new task in its context (a new context when it has no
  ``contextId``); the executor runs in the service's own nursery, so the task goes on when the
  request that started it ends. The task is stored when the executor first reports on it
  (``returnImmediately`` stores it SUBMITTED at once); a direct reply stores nothing. If the
  context's conversation is deleted between the lookup and that first store, storage refuses
  the task: the message is answered with :func:`~agentik.a2a.errors.conversation_gone` (-32603,
  nothing stored, before any stream opens), and sent again it starts a new conversation.
- An execution's A2AError is the request's answer, also when it is raised inside a nursery of
  the executor (an exception group of agentik errors only); anything else is an unexpected
  failure (logged, -32603).
- A message with ``taskId`` is a follow-up of a task that waits for input: it joins the task's
  history and runs the executor again (cancelling such a task: ``executor.withdraw``). A
  terminal task refuses it (-32004), an unknown one -32001, another ``contextId`` -32602.
- Streams are "the task as of seq N, then its changes after N" from the store, so a stream that
  starts late (or a second subscriber) misses nothing and sees the same events.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import msgspec
import trio

from agentik.a2a import errors as e
from agentik.a2a.executor import CALLER, Executor, RequestContext
from agentik.a2a.push import PushConfigs, check_push
from agentik.a2a.run import Execute, Run, Updater
from agentik.a2a.store import StoredTask, TaskStore, status_change, trim_task
from agentik.a2a.types import (
    CANCELED,
    INTERRUPTED,
    SUBMITTED,
    TERMINAL,
    WORKING,
    ListTasksParams,
    ListTasksResponse,
    Message,
    SendMessageParams,
    SendMessageResponse,
    StreamResponse,
    Task,
    TaskStatus,
    check_id,
    check_part,
    encode,
    text_part,
    timestamp,
)
from agentik.errors import AgentikError, NotFoundError
from agentik.ids import new_id

log = logging.getLogger("agentik.a2a")

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 100
#: how long CancelTask waits for an executor to end a cancelled execution by itself
CANCEL_GRACE = 10.0


def _check_id(name: str, value: str) -> str:
    why = check_id(name, value)
    if why is not None:
        raise e.invalid_params(why)
    return value


def _check_history_length(value: int | None) -> None:
    if value is not None and value < 0:
        raise e.invalid_params(f"historyLength must be >= 0, got {value}")


class A2AService:
    """A2A's methods. ``nursery`` runs the executions (it must outlive requests)."""

    #: the push-notification config methods (None: push notifications are not offered)
    pushes: PushConfigs | None = None

    def __init__(self, store: TaskStore, executor: Executor, nursery: trio.Nursery) -> None:
        self.store = store
        self.executor = executor
        self._nursery = nursery
        self._runs: dict[str, Run] = {}
        self._contexts: dict[tuple[str | None, str], str | None] = {}
        self._bind_lock = trio.Lock()

    # --- SendMessage / SendStreamingMessage ------------------------------------------------------

    def _check_message(self, message: Message) -> None:
        if message.role != "ROLE_USER":
            raise e.invalid_params(
                f"message.role must be ROLE_USER (a message to the agent), got {message.role}")
        _check_id("message.messageId", message.message_id)
        # The same rule as a conversation's ids; empty means absent (ProtoJSON's default).
        for name, value in (("message.contextId", message.context_id),
                            ("message.taskId", message.task_id)):
            if value:
                _check_id(name, value)
        if not message.parts:
            raise e.invalid_params("message.parts must not be empty")
        for i, part in enumerate(message.parts):
            why = check_part(part)
            if why is not None:
                raise e.invalid_params(f"message.parts[{i}]: {why}")

    async def _previous(self, context_id: str) -> str | None:
        """The conversation the caller's latest message of the context went to (None: none)."""
        key = (CALLER.get().owner, context_id)  # a user's contexts are their own
        if key in self._contexts:
            return self._contexts[key]
        # (another user's conversation: the executor makes this user one of their own)
        return (await self.store.context_conversation(context_id))[1]

    async def _claim(self, message: Message) -> None:
        """A message of a task or context whose conversation another live node runs goes there
        whole (NotOwnerError, :mod:`agentik.a2a.forward`), before anything is counted or stored
        here: the owner alone writes that conversation's records (its tasks too)."""
        if message.task_id:
            stored = await self.store.get(message.task_id, CALLER.get().user)
            conversation = None if stored is None else stored.conversation_id
        else:
            conversation = await self._previous(message.context_id) if message.context_id else None
        if conversation is not None:
            await self.executor.claim(conversation)

    async def _conversation_for(self, context_id: str, agent: str | None) -> str | None:
        key = (CALLER.get().owner, context_id)
        async with self._bind_lock:
            previous = await self._previous(context_id)
            conversation = await self.executor.conversation(context_id, previous, agent)
            if len(self._contexts) > 10_000:
                self._contexts.clear()
            self._contexts[key] = conversation
            return conversation

    async def start(self, params: SendMessageParams, agent: str | None = None) -> Run:
        """Validate a message and start its execution, a new context's with ``agent`` (None:
        the default one). Raises A2AError."""
        message = params.message
        self._check_message(message)
        await self._claim(message)
        admit = CALLER.get().admit
        if admit is not None:  # the user's limits, before anything is stored
            await admit()
        self.executor.check(message)
        config = params.configuration
        push = msgspec.UNSET if config is None else config.task_push_notification_config
        if not isinstance(push, msgspec.UnsetType):  # checked before anything is stored
            await check_push(self.pushes, push)
        if config is not None:
            _check_history_length(config.history_length)
        if message.task_id:
            run = await self._follow_up(message)
        else:
            context_id = message.context_id or new_id()
            conversation = await self._conversation_for(context_id, agent)
            task_id = new_id()
            request = RequestContext(
                message=msgspec.structs.replace(message, context_id=context_id, task_id=task_id),
                task_id=task_id, context_id=context_id, task=None, conversation_id=conversation,
            )
            run = Run(request=request, is_new=True)
            if config is not None and config.return_immediately:
                task = Task(id=task_id, context_id=context_id,
                            status=TaskStatus(state=SUBMITTED, timestamp=timestamp()),
                            history=[request.message])
                try:
                    run.snapshot = await self.store.create(task, conversation)
                except NotFoundError:  # deleted since the lookup: storage refuses the task
                    raise e.conversation_gone(context_id) from None
                run.ready.set()
        if not isinstance(push, msgspec.UnsetType) and self.pushes is not None:
            await self.pushes.create(push, run.request.task_id)  # before the task's first change
        run.updater = Updater(self.store, run)
        self._runs[run.request.task_id] = run
        self._nursery.start_soon(self._execute, run)
        return run

    async def _follow_up(self, message: Message) -> Run:
        task_id = message.task_id
        assert task_id is not None
        stored = await self.store.get(task_id, CALLER.get().user)
        if stored is None:
            raise e.task_not_found(task_id)
        task = stored.task
        if message.context_id and message.context_id != task.context_id:
            raise e.invalid_params(
                f"contextId {message.context_id!r} is not the context of task {task_id!r}"
            )
        if task.status.state in TERMINAL:
            raise e.error(e.UNSUPPORTED_OPERATION,
                          f"task {task_id!r} is {task.status.state}: it takes no more messages")
        previous = self._runs.get(task_id)
        if previous is not None and previous.final:
            # The last execution has said its final word (e.g. asked for input) and is ending.
            await previous.done.wait()
        if task_id in self._runs or task.status.state not in INTERRUPTED:
            raise e.error(e.UNSUPPORTED_OPERATION,
                          f"task {task_id!r} is working: a follow-up waits until it asks for input")
        message = msgspec.structs.replace(message, context_id=task.context_id, task_id=task_id)
        status = TaskStatus(state=WORKING, timestamp=timestamp())

        def join(current: Task) -> tuple[Task, StreamResponse] | None:
            if current.status.state not in INTERRUPTED:
                return None
            new, update = status_change(current, status)
            return msgspec.structs.replace(new, history=[*new.history, message]), update

        joined = await self.store.change(task_id, join)
        if joined is None or joined.task.status.state != WORKING:
            raise e.error(e.UNSUPPORTED_OPERATION, f"task {task_id!r} changed meanwhile")
        request = RequestContext(message=message, task_id=task_id, context_id=task.context_id,
                                 task=joined.task, conversation_id=stored.conversation_id)
        run = Run(request=request, is_new=False, snapshot=joined)
        run.ready.set()
        return run

    def resume(self, stored: StoredTask, execute: Execute) -> None:
        """Run ``execute`` as the execution of a task a dead process left unfinished."""
        run = Run.resumed(stored, self.store)
        self._runs[stored.task.id] = run
        self._nursery.start_soon(self._execute, run, execute)

    async def _execute(self, run: Run, execute: Execute | None = None) -> None:
        updater = run.updater
        assert updater is not None
        try:
            try:
                with run.cancel_scope:
                    await (execute or self.executor.execute)(run.request, updater)
            except Exception as exc:
                run.error = e.answer_of(exc)
                if run.error is None:
                    log.exception("the A2A executor failed on task %s", run.request.task_id)
                    run.error = e.error(e.INTERNAL_ERROR, f"the agent failed: {type(exc).__name__}")
            if not run.final:
                await self._settle(run, updater)
        except AgentikError as exc:
            log.error("task %s: storing its outcome failed: %s", run.request.task_id, exc)
            run.error = run.error or e.error(e.INTERNAL_ERROR, str(exc))
        finally:
            self._runs.pop(run.request.task_id, None)
            run.done.set()
            run.ready.set()

    async def _settle(self, run: Run, updater: Updater) -> None:
        """An execution ended without a final word: cancelled, failed, or silent."""
        if run.cancel_requested:
            if run.snapshot is not None:
                await updater.canceled()
            return
        why = str(run.error) if run.error is not None else "the agent ended without an answer"
        if run.snapshot is not None:
            await updater.fail(updater.agent_message([text_part(why)]))
        elif run.error is None:
            run.error = e.error(e.INTERNAL_ERROR, why)

    async def send(
        self, params: SendMessageParams, agent: str | None = None
    ) -> SendMessageResponse:
        """SendMessage: waits for the task's final word (terminal or input required) unless
        ``returnImmediately``."""
        run = await self.start(params, agent)
        config = params.configuration
        if config is not None and config.return_immediately:
            await run.ready.wait()
        else:
            await run.done.wait()
        if run.snapshot is None:
            if run.reply is not None:
                return SendMessageResponse(message=run.reply)
            raise run.error or e.error(e.INTERNAL_ERROR, "no answer")
        stored = await self.store.get(run.request.task_id)
        if stored is None:  # deleted with its conversation meanwhile
            raise e.task_not_found(run.request.task_id)
        return SendMessageResponse(
            task=trim_task(stored.task, config.history_length if config else None)
        )

    async def open_stream(
        self, params: SendMessageParams, agent: str | None = None
    ) -> AsyncIterator[bytes]:
        """SendStreamingMessage. Raises A2AError before anything is streamed; then yields the
        StreamResponse JSON of each event until the task's final word."""
        run = await self.start(params, agent)
        await run.ready.wait()
        if run.snapshot is None:
            if run.reply is not None:
                return _one(encode(StreamResponse(message=run.reply)))
            raise run.error or e.error(e.INTERNAL_ERROR, "no answer")
        return self._task_stream(run.snapshot, interrupted_ends=True, snapshot_ends=run.is_new)

    async def subscribe(self, task_id: str) -> AsyncIterator[bytes]:
        """SubscribeToTask: the task now, then its changes until it reaches a terminal state."""
        _check_id("id", task_id)
        stored = await self.store.get(task_id, CALLER.get().user)
        if stored is None:
            raise e.task_not_found(task_id)
        if stored.task.status.state in TERMINAL:
            raise e.error(e.UNSUPPORTED_OPERATION,
                          f"task {task_id!r} is {stored.task.status.state}: nothing to subscribe to")
        return self._task_stream(stored, interrupted_ends=False, snapshot_ends=False)

    async def _task_stream(
        self, snapshot: StoredTask, *, interrupted_ends: bool, snapshot_ends: bool
    ) -> AsyncIterator[bytes]:
        def ends(state: str) -> bool:
            return state in TERMINAL or (interrupted_ends and state in INTERRUPTED)

        yield encode(StreamResponse(task=snapshot.task))
        if snapshot_ends and ends(snapshot.task.status.state):
            return
        async for _, event in self.store.events(snapshot):
            yield bytes(event.update)
            if ends(event.state):
                return
        # The events end only when the task's conversation was deleted, and the task with it.
        raise e.task_not_found(snapshot.task.id)

    # --- GetTask / ListTasks / CancelTask --------------------------------------------------------

    async def get_task(self, task_id: str, history_length: int | None) -> Task:
        _check_id("id", task_id)
        _check_history_length(history_length)
        stored = await self.store.get(task_id, CALLER.get().user)
        if stored is None:
            raise e.task_not_found(task_id)
        return trim_task(stored.task, history_length)

    async def list_tasks(self, params: ListTasksParams) -> ListTasksResponse:
        size = DEFAULT_PAGE_SIZE if params.page_size is None else params.page_size
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise e.invalid_params(f"pageSize must be 1..{MAX_PAGE_SIZE}, got {params.page_size}")
        _check_history_length(params.history_length)
        if params.context_id:
            _check_id("contextId", params.context_id)
        before: int | None = None
        if params.page_token:
            if not params.page_token.isdigit():
                raise e.invalid_params(f"invalid pageToken {params.page_token!r}")
            before = int(params.page_token)
        state = params.status if params.status != "TASK_STATE_UNSPECIFIED" else None
        rows, total = await self.store.page(params.context_id or None, state, before, size + 1,
                                            CALLER.get().user)
        more = len(rows) > size
        rows = rows[:size]
        tasks = [trim_task(r.task, params.history_length, bool(params.include_artifacts))
                 for r in rows]
        token = str(rows[-1].first_seq) if more and rows else ""
        return ListTasksResponse(tasks=tasks, next_page_token=token, page_size=size,
                                 total_size=total)

    async def cancel(self, task_id: str) -> Task:
        _check_id("id", task_id)
        stored = await self.store.get(task_id, CALLER.get().user)
        if stored is None:
            raise e.task_not_found(task_id)
        if stored.task.status.state in TERMINAL:
            raise e.error(e.TASK_NOT_CANCELABLE,
                          f"task {task_id!r} is {stored.task.status.state}")
        if stored.conversation_id is not None:  # its owner cancels it (_claim)
            await self.executor.claim(stored.conversation_id)
        run = self._runs.get(task_id)
        if run is not None and run.updater is not None:
            run.cancel_requested = True
            ends_itself = await self.executor.cancel(run.request, run.updater)
            if ends_itself:
                with trio.move_on_after(CANCEL_GRACE):
                    await run.done.wait()
            run.cancel_scope.cancel()
            await run.done.wait()
        else:
            if stored.task.status.state in INTERRUPTED:  # its turn may wait for a person
                await self.executor.withdraw(stored.task, stored.conversation_id)
            status = TaskStatus(state=CANCELED, timestamp=timestamp())
            await self.store.change(task_id, lambda task: None if task.status.state in TERMINAL
                                    else status_change(task, status))
        final = await self.store.get(task_id)
        if final is None:  # deleted with its conversation meanwhile
            raise e.task_not_found(task_id)
        if final.task.status.state != CANCELED:
            raise e.error(e.TASK_NOT_CANCELABLE,
                          f"task {task_id!r} ended {final.task.status.state} before the cancel")
        return final.task


async def _one(item: bytes) -> AsyncIterator[bytes]:
    yield item
