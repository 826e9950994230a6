"""In-process runtime scenarios: cold load of a long conversation, memory per live actor."""

from __future__ import annotations

import gc
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agentik import Config, open_runtime
from agentik.storage import ops
from agentik.wire import AssistantItem, AssistantMessage, Text, UserItem, UserMessage
from tests.scripted_openai import open_scripted_openai


def rss_kib() -> int:
    """Current resident set size in KiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() // 1024


async def _fill(agent: Any, conversation_id: str, messages: int) -> None:
    """Store ``messages`` journal + working-memory rows through the real StorageActor."""
    storage = agent._deps.storage

    async def one_turn(i: int) -> None:
        turn_id = f"u{i}"
        await storage.write(ops.AppendUserMessage(
            conversation_id=conversation_id, message_id=turn_id,
            message=UserMessage(content=[Text(body=f"question {i}")])))
        await storage.write(ops.StartTurn(conversation_id=conversation_id, turn_id=turn_id,
                                          item=UserItem(content=[Text(body=f"question {i}")])))
        answer = AssistantMessage(content=[Text(body=f"answer {i}")], turn_id=turn_id)
        await storage.write(ops.FinishTurn(
            conversation_id=conversation_id, turn_id=turn_id, assistant=(f"a{i}", answer),
            item=AssistantItem(content=answer.content)))

    # Turns of one conversation must be ordered, so fill sequentially in chunks of concurrency
    # that keep each turn's three writes in order.
    for i in range(messages // 2):
        await one_turn(i)


async def cold_load_10k(quick: bool) -> dict[str, Any]:
    """Time from send to the end of the next turn for a conversation with 10,000 stored
    messages that is not in memory (fresh runtime on the same file): load working memory, open
    the model session with the whole history, stream the answer. Median of 3."""
    n = 2_000 if quick else 10_000
    samples = []
    async with open_scripted_openai() as server:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = Config(db_path=str(Path(tmp) / "c.db"), openai_base_url=server.base_url,
                         openai_api_key="k", llm_max_retries=0)
            async with open_runtime(cfg) as agent:
                conv = await agent.create_conversation()
                await _fill(agent, conv.id, n)
            for _ in range(3):
                async with open_runtime(cfg) as agent:
                    fresh = await agent.get_conversation(conv.id)
                    assert fresh is not None
                    cursor = await agent.outbox.current_cursor()
                    start = time.perf_counter()
                    await fresh.send("and now?")
                    async for ev in agent.outbox.conversation_events(cursor, conv.id):
                        if ev.type == "touched":
                            break
                    samples.append((time.perf_counter() - start) * 1000)
            assert len(server.requests[0]["messages"]) == n + 2  # system + history + new
    return {"name": "cold_load_10k", "messages": n, "ms": round(statistics.median(samples), 1)}


async def memory_actors(quick: bool) -> dict[str, Any]:
    """RSS per live conversation actor: slope over N actors (each created and holding its
    mailbox, supervisor task and handle)."""
    n = 500 if quick else 2_000
    async with open_scripted_openai() as server:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = Config(db_path=str(Path(tmp) / "m.db"), openai_base_url=server.base_url,
                         openai_api_key="k")
            async with open_runtime(cfg) as agent:
                gc.collect()
                before = rss_kib()
                for _ in range(n):
                    await agent.create_conversation()
                gc.collect()
                after = rss_kib()
                assert len(agent._registry.live) == n
    return {"name": "memory_actors", "actors": n, "kib_per_actor": round((after - before) / n, 2)}
