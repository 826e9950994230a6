"""A2A push notifications (docs/WEBHOOKS.md, docs/A2A.md): the push-notification config methods of
A2A v1.0 (Create, Get, List and Delete TaskPushNotificationConfig) over ``agent.webhooks``, where a
config is a subscription to one task's changes, delivered as the webhooks are (at least once, in
order, retried, across restarts). A config belongs to its task: a task the caller cannot see
answers as a missing one (-32001)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from agentik.a2a import errors as e
from agentik.a2a.executor import CALLER
from agentik.a2a.store import TaskStore
from agentik.a2a.types import (
    ListPushConfigsParams,
    ListPushConfigsResponse,
    PushConfigParams,
    TaskPushNotificationConfig,
    check_id,
    encode,
)
from agentik.errors import InvalidInputError
from agentik.ids import new_id
from agentik.webhooks import Push, check_url, split_push

if TYPE_CHECKING:
    from agentik.agent_webhooks import Webhooks

#: configs a List answers at most on one page
MAX_PAGE_SIZE = 100


class PushConfigs:
    """The push-notification config methods (``A2AService.pushes``)."""

    def __init__(self, store: TaskStore, hooks: Webhooks) -> None:
        self.store = store
        self.hooks = hooks

    async def _task(self, task_id: str) -> None:
        why = check_id("taskId", task_id)
        if why is not None:
            raise e.invalid_params(why)
        if await self.store.get(task_id, CALLER.get().user) is None:
            raise e.task_not_found(task_id)

    async def create(self, config: TaskPushNotificationConfig, task_id: str | None = None
                     ) -> TaskPushNotificationConfig:
        """``config`` for its task (``task_id``: a task this request is making, whose first
        change is not stored yet: no look-up). Raises A2AError (-32602 for a URL it may not
        name, docs/WEBHOOKS.md)."""
        if task_id is None:
            task_id = config.task_id
            await self._task(task_id)
        config_id = config.id or new_id()
        why = check_id("id", config_id)
        if why is not None:
            raise e.invalid_params(why)
        made = msgspec.structs.replace(config, id=config_id, task_id=task_id, tenant=None)
        auth = config.authentication
        push = Push(token=config.token, scheme=None if auth is None else auth.scheme,
                    credentials=None if auth is None else auth.credentials)
        try:
            await self.hooks.put_push(task_id, config_id, config.url, push, encode(made))
        except InvalidInputError as exc:
            raise e.invalid_params(f"url: {exc}") from None
        return made

    async def get(self, params: PushConfigParams) -> TaskPushNotificationConfig:
        await self._task(params.task_id)
        row = await self.hooks.get_push(params.task_id, params.id)
        if row is None:
            raise e.invalid_params(f"push notification config {params.id!r} of task "
                                   f"{params.task_id!r} not found")
        return _config(row.spec.config)

    async def list(self, params: ListPushConfigsParams) -> ListPushConfigsResponse:
        await self._task(params.task_id)
        size = params.page_size or MAX_PAGE_SIZE
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise e.invalid_params(f"pageSize must be 1..{MAX_PAGE_SIZE}, got {size}")
        token = params.page_token or "0"
        if not token.isdigit():
            raise e.invalid_params("pageToken is not one this server gave")
        start = int(token)
        rows = await self.hooks.pushes(params.task_id)
        page = rows[start:start + size]
        more = start + size < len(rows)
        return ListPushConfigsResponse(configs=[_config(r.spec.config) for r in page],
                                       next_page_token=str(start + size) if more else "")

    async def delete(self, params: PushConfigParams) -> dict[str, object]:
        """Idempotent: a config already gone answers as a deleted one."""
        await self._task(params.task_id)
        await self.hooks.delete_push(params.task_id, params.id)
        return {}


async def check_push(pushes: PushConfigs | None, config: TaskPushNotificationConfig) -> None:
    """A config given with a message (SendMessage's ``taskPushNotificationConfig``), checked
    before its task is made. Raises A2AError."""
    if pushes is None:
        raise e.error(e.PUSH_NOT_SUPPORTED, "push notifications are not supported")
    if config.id and (why := check_id("id", config.id)) is not None:
        raise e.invalid_params(why)
    try:
        await pushes.hooks.check_push_url(check_url(config.url))
    except InvalidInputError as exc:
        raise e.invalid_params(f"url: {exc}") from None


def _config(stored: bytes | None) -> TaskPushNotificationConfig:
    return msgspec.json.decode(split_push(stored)[1], type=TaskPushNotificationConfig)
