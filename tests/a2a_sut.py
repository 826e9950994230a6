"""The A2A facade as the official TCK's system under test: the same blueprint, service and task
store as agentik's (``agentik.a2a``), with a scripted executor that follows the TCK's
``messageId`` prefix table (the TCK's ``scenarios/*.feature``), on a temporary SQLite database,
served by hypercorn's trio worker.

    python tests/a2a_sut.py --port 9999 [--heartbeat 0.2]
    python run_tck.py --sut-host http://127.0.0.1:9999 --transport jsonrpc --level must

``--heartbeat`` shortens the SSE streams' idle comment (``: heartbeat``) so the TCK's streams
carry some.

Tests import :func:`open_sut` to run it in their own trio run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import hypercorn.config
import hypercorn.trio
import trio
from quart_trio import QuartTrio

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentik.a2a.executor import RequestContext, TaskUpdater
from agentik.a2a.push import PushConfigs
from agentik.a2a.service import A2AService
from agentik.a2a.store import TaskStore
from agentik.a2a.types import AgentSkill, Message, Part, Task
from agentik.a2a.web import A2AMount, CardInfo, mount
from agentik.agent import TaskRecords
from agentik.agent_webhooks import Webhooks
from agentik.config import Config
from agentik.storage.actor import Storage, run_storage

#: how long the resubscription scenario stays WORKING ("2x streaming timeout" in the TCK)
RESUBSCRIBE_WAIT = 4.0

Step = Callable[[TaskUpdater], Awaitable[None]]


def _text(updater: TaskUpdater, text: str) -> Awaitable[str]:
    return updater.add_artifact([Part(text=text)])


async def _complete_hello(u: TaskUpdater) -> None:
    await u.complete(u.agent_message([Part(text="Hello from TCK")]))


async def _streamed(u: TaskUpdater, parts: list[Part]) -> None:
    await u.start()
    await u.add_artifact(parts)
    await u.complete()


async def _chunked(u: TaskUpdater) -> None:
    await u.start()
    artifact = await u.add_artifact([Part(text="chunk-1 ")], append=True)
    await u.add_artifact([Part(text="chunk-2")], artifact_id=artifact, append=True, last_chunk=True)
    await u.complete()


async def _resubscribe(u: TaskUpdater) -> None:
    await u.start()
    await trio.sleep(RESUBSCRIBE_WAIT)
    await u.complete()


async def _artifact_then_complete(u: TaskUpdater, parts: list[Part]) -> None:
    await u.add_artifact(parts)
    await u.complete()


FILE = [Part(raw=b"tck", media_type="text/plain", filename="output.txt")]

#: messageId prefix -> behaviour; the longest matching prefix wins, anything else completes
SCENARIOS: dict[str, Step] = {
    "tck-complete-task": _complete_hello,
    "tck-input-required": lambda u: u.require_input(),
    "tck-message-response": lambda u: u.reply(u.agent_message([Part(text="Direct message response")])),
    "tck-artifact-text": partial(_artifact_then_complete, parts=[Part(text="Generated text content")]),
    "tck-artifact-file": partial(_artifact_then_complete, parts=FILE),
    "tck-artifact-file-url": partial(_artifact_then_complete, parts=[Part(
        url="https://example.com/output.txt", media_type="text/plain", filename="output.txt")]),
    "tck-artifact-data": partial(_artifact_then_complete,
                                 parts=[Part(data={"key": "value", "count": 42})]),
    "tck-reject-task": lambda u: u.reject(u.agent_message([Part(text="rejected")])),
    "tck-stream-001": partial(_streamed, parts=[Part(text="Stream hello from TCK")]),
    "tck-stream-002": lambda u: u.complete(),
    "tck-stream-003": partial(_streamed, parts=[Part(text="Stream task lifecycle")]),
    "tck-stream-ordering-001": partial(_streamed, parts=[Part(text="Ordered output")]),
    "tck-stream-artifact-text": partial(_streamed, parts=[Part(text="Streamed text content")]),
    "tck-stream-artifact-file": partial(_streamed, parts=FILE),
    "tck-stream-artifact-chunked": _chunked,
    "test-resubscribe-message-id": _resubscribe,
}
_BY_LENGTH = sorted(SCENARIOS, key=len, reverse=True)


def scenario_for(message_id: str) -> Step:
    for prefix in _BY_LENGTH:
        if message_id.startswith(prefix):
            return SCENARIOS[prefix]
    return _complete_hello


class ScriptedExecutor:
    """The TCK's agent: behaviour chosen by the message's id, no conversation behind it."""

    def check(self, message: Message) -> None:
        pass  # every message is welcome: the scenario decides

    async def conversation(
        self, context_id: str, previous: str | None, agent: str | None = None
    ) -> str | None:
        return None

    async def execute(self, request: RequestContext, updater: TaskUpdater) -> None:
        await scenario_for(request.message.message_id)(updater)

    async def withdraw(self, task: Task, conversation_id: str | None) -> None:
        pass  # nothing waits behind a scripted task

    async def claim(self, conversation_id: str) -> None:
        pass  # one process: every conversation is this one's

    async def cancel(self, request: RequestContext, updater: TaskUpdater) -> bool:
        return False  # nothing to wind down: the facade cancels the execution


def card_info() -> CardInfo:
    return CardInfo(
        name="agentik A2A TCK system under test",
        description="agentik's A2A facade with a scripted executor (the TCK's prefix table)",
        version="1.0.0",
        skills=[AgentSkill(id="tck", name="TCK Conformance",
                           description="Handles TCK conformance test messages", tags=["tck"])],
        push=True,
    )


@dataclass
class Sut:
    url: str
    a2a: A2AMount
    storage: Storage


async def _serve_storage(
    a2a: A2AMount, db_path: str, *, task_status: trio.TaskStatus[Storage] = trio.TASK_STATUS_IGNORED
) -> None:
    async with trio.open_nursery() as nursery:
        storage: Storage = await nursery.start(partial(run_storage, db_path))
        store = TaskStore(TaskRecords(storage))
        await store.recover()
        # push notifications on agentik's own webhooks (the TCK's receiver is on 127.0.0.1)
        hooks = Webhooks(storage, Config(push_allow_private=True), frozenset())
        await nursery.start(hooks.start)
        async with trio.open_nursery() as runs:
            a2a.service = A2AService(store, ScriptedExecutor(), runs)
            a2a.service.pushes = PushConfigs(store, hooks)
            task_status.started(storage)
            try:
                await trio.sleep_forever()
            finally:
                a2a.service = None
                nursery.cancel_scope.cancel()


def build_app(heartbeat: float = 15.0) -> tuple[QuartTrio, A2AMount]:
    app = QuartTrio("agentik_a2a_sut")
    a2a = mount(app, card_info, heartbeat=heartbeat)
    return app, a2a


@asynccontextmanager
async def open_sut(db_path: str, *, port: int = 0, heartbeat: float = 15.0) -> AsyncIterator[Sut]:
    """Serve the SUT on 127.0.0.1:``port`` (0: a free one) for the body."""
    app, a2a = build_app(heartbeat)
    config = hypercorn.config.Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.graceful_timeout = 0.5
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        storage: Storage = await nursery.start(partial(_serve_storage, a2a, db_path))
        binds = await nursery.start(
            partial(hypercorn.trio.serve, app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
        )
        try:
            yield Sut(url=binds[0], a2a=a2a, storage=storage)
        finally:
            stop.set()
            nursery.cancel_scope.cancel()


async def _main(port: int, db_path: str | None, heartbeat: float = 15.0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = db_path or str(Path(tmp) / "a2a_sut.db")
        async with open_sut(path, port=port, heartbeat=heartbeat) as sut:
            print(f"A2A SUT on {sut.url} (card: {sut.url}/.well-known/agent-card.json, "
                  f"database {path})", flush=True)
            await trio.sleep_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument("--db", default=None, help="SQLite file (default: a temporary one)")
    parser.add_argument("--heartbeat", type=float, default=15.0,
                        help="seconds of silence before an SSE stream writes a heartbeat comment"
                             " (short values put comments in the TCK's streams)")
    args = parser.parse_args()
    try:
        trio.run(_main, args.port, args.db, args.heartbeat)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
