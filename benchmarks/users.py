"""Users (docs/USERS.md): what a user's filtered stream costs against the whole stream.

One SQLite store holds conversations of two users, alternating, each with user messages; the
whole outbox is replayed from its oldest cursor as an admin reads it (every event) and as one
user reads it (``UserScope.filtered``: half the events kept, every page read). Medians of a few
alternating runs, in events read per second of the whole outbox."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from functools import partial
from typing import Any

import trio

from agentik.agent_users import UserScope
from agentik.storage import ops
from agentik.storage.actor import Storage, run_storage
from agentik.wire import Text, UserMessage


async def _fill(storage: Storage, conversations: int, per: int) -> None:
    for i in range(conversations):
        await storage.write(ops.CreateConversation(
            conversation_id=f"c{i}", title=None, is_temporal=False, system_prompt="s",
            owner="a" if i % 2 else "b"))

    async def sends(i: int) -> None:
        for j in range(per):
            await storage.write(ops.AppendUserMessage(
                conversation_id=f"c{i}", message_id=f"m{i}-{j}",
                message=UserMessage(content=[Text(body="x")])))

    async with trio.open_nursery() as nursery:
        for i in range(conversations):
            nursery.start_soon(sends, i)


async def _replay(storage: Storage, user: str | None) -> tuple[float, int]:
    """Seconds to read the whole outbox as ``user`` (None: every event), and events kept."""
    head = storage.hub.current_cursor().offset
    started = time.perf_counter()
    kept = last = 0
    stream = storage.hub.stream(storage.hub.oldest_cursor())
    batches = stream if user is None else UserScope(storage).filtered(stream, user)
    async for batch in batches:
        kept += len(batch)
        last = batch[-1].offset if batch else last
        if last >= head - (0 if user is None else 1):  # the last event is the other user's
            break
    await batches.aclose()
    return time.perf_counter() - started, kept


async def users_replay(quick: bool) -> dict[str, Any]:
    conversations, per, runs = (100, 50, 3) if quick else (200, 100, 5)
    with tempfile.TemporaryDirectory() as tmp:
        async with trio.open_nursery() as nursery:
            storage: Storage = await nursery.start(partial(run_storage, os.path.join(tmp, "u.db")))
            await _fill(storage, conversations, per)
            events = storage.hub.current_cursor().offset
            whole: list[float] = []
            filtered: list[float] = []
            for _ in range(runs):
                whole.append((await _replay(storage, None))[0])
                seconds, kept = await _replay(storage, "a")
                filtered.append(seconds)
            nursery.cancel_scope.cancel()
    return {
        "name": "users_replay",
        "outbox_events": events,
        "user_events": kept,
        "whole_ms": round(1000 * statistics.median(whole), 1),
        "user_ms": round(1000 * statistics.median(filtered), 1),
        "whole_events_per_s": round(events / statistics.median(whole)),
        "user_outbox_per_s": round(events / statistics.median(filtered)),
    }
