"""A long conversation on the embedded engine: context management under a small window.

A 30-turn conversation (``--turns``) of ordinary questions through ``open_runtime`` on the
LiteRT-LM backend with its defaults (gemma3-270m-int4: a 1,024-token window, so a quarter of it,
256 tokens, per answer, and compaction every few turns). Prints one JSON object with per-turn
latency (send -> Touched) p50/p99, generated tokens per second over the whole conversation,
compactions, and the engine's prefill time (round start -> first chunk) on a rebuilt engine
conversation after a compaction (the whole compacted history prefilled) vs a round that reuses the
KV cache (only the new message prefilled): the cost the cache saves.

    python -m benchmarks.litert_context [--model FILE] [--turns 30] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

import agentik
from agentik import Config
from agentik.actors.compaction import SUMMARY_PROMPT
from agentik.llm.base import ToolSpec
from agentik.llm.litert import LiteRtConversation, LiteRtLlm
from agentik.wire import AssistantMessage, SystemItem, WorkingItem
from tests.models import REAL

QUESTIONS = [
    "What is the capital of France?",
    "Tell me about the history of Paris.",
    "Write a poem about the sea.",
    "Tell me about elephants.",
    "What should I cook for dinner tonight?",
    "Write a short story about a dragon who is afraid of the dark.",
    "Explain how a bicycle works.",
    "Tell me about the planets of the solar system.",
    "Write a poem about autumn leaves.",
    "What are good habits for learning a new language?",
    "Tell me about the Roman empire.",
    "Write a letter to a friend who lives far away.",
]


class Recording:
    """The real backend, remembering the conversations it opens (the main one and the
    summarisers'), so the benchmark can read each round's engine figures afterwards."""

    def __init__(self, inner: LiteRtLlm) -> None:
        self.inner = inner
        self.supports_images = inner.supports_images
        self.exact_tokens = inner.exact_tokens
        self.max_output_tokens = inner.max_output_tokens
        self.main: list[LiteRtConversation] = []

    @property
    def context_window(self) -> int | None:
        return self.inner.context_window

    async def count_tokens(self, items: Sequence[WorkingItem]) -> list[int]:
        return await self.inner.count_tokens(items)

    async def open(self, history: Sequence[WorkingItem], tools: Sequence[ToolSpec]
                   ) -> LiteRtConversation:
        conv = await self.inner.open(history, tools)
        summariser = bool(history) and history[0] == SystemItem(text=SUMMARY_PROMPT)
        if not summariser:
            self.main.append(conv)
        return conv

    async def aclose(self) -> None:
        await self.inner.aclose()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    inner = LiteRtLlm(args.model, threads=args.threads)
    llm = Recording(inner)
    await inner.load()
    turns: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(llm_backend="litert", litert_model_path=args.model,
                        litert_threads=args.threads, db_path=str(Path(tmp) / "agentik.db"))
        async with agentik.open_runtime(config, llm=llm) as agent:  # type: ignore[arg-type]
            conv = await agent.create_conversation()
            for i in range(args.turns):
                question = QUESTIONS[i % len(QUESTIONS)]
                cursor = await agent.outbox.current_cursor()
                start = time.perf_counter()
                await conv.send(question)
                types: list[str] = []
                answer: AssistantMessage | None = None
                with trio.fail_after(600):
                    async for ev in agent.outbox.conversation_events(cursor, conv.id):
                        types.append(ev.type)
                        if ev.type == "assistant_message":
                            answer = ev.event.record.message  # type: ignore[union-attr]
                        if ev.type == "touched":
                            break
                seconds = time.perf_counter() - start
                main_conv = llm.main[-1]
                generation = main_conv.last_round
                totals = generation.totals if generation is not None else None
                turns.append({
                    "seconds": seconds,
                    "error": "error" in types,
                    "compacted": "compaction_triggered" in types,
                    # a new engine conversation for this round (nothing in its KV cache
                    # before): its whole history was prefilled with the new message
                    "rebuilt": bool(totals and generation and generation.new_tokens is not None
                                    and totals.prompt_tokens == generation.new_tokens),
                    "completion": answer.tokens.completion if answer and answer.tokens else 0,
                    "prefill_s": totals.first_chunk_s if totals else None,
                    "prefill_tokens": generation.new_tokens if generation else None,
                    "finish": answer.finish_reason if answer else None,
                })
    window = inner.context_window
    latencies = [t["seconds"] for t in turns]
    after = [t for t in turns if t["compacted"] and t["prefill_s"] is not None]
    after = [t for t in after if t["rebuilt"]]
    reuse = [t for t in turns if not t["rebuilt"] and t["prefill_s"] is not None]
    generated = sum(t["completion"] for t in turns)

    def median(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return round(statistics.median(values), 3) if values else None

    return {
        "model": Path(args.model).name,
        "window": window,
        "turns": len(turns),
        "errors": sum(t["error"] for t in turns),
        "latency_p50_s": round(pct(latencies, 0.5), 2),
        "latency_p99_s": round(pct(latencies, 0.99), 2),
        "generated_tokens": generated,
        "tokens_per_s": round(generated / sum(latencies), 1),
        "answers_cut_at_budget": sum(t["finish"] == "length" for t in turns),
        "compactions": sum(t["compacted"] for t in turns),
        "latency_compaction_turn_p50_s": median([t for t in turns if t["compacted"]], "seconds"),
        "latency_plain_turn_p50_s": median([t for t in turns if not t["compacted"]], "seconds"),
        "prefill_after_compaction_s": median(after, "prefill_s"),
        "prefill_after_compaction_tokens": median(after, "prefill_tokens"),
        "prefill_kv_reuse_s": median(reuse, "prefill_s"),
        "prefill_kv_reuse_tokens": median(reuse, "prefill_tokens"),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    default = REAL
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(default))
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args(argv)


async def litert_context(quick: bool) -> dict[str, Any]:
    """The ``litert_context`` row of ``python -m benchmarks``."""
    args = parse_args(["--turns", "8" if quick else "30"])
    return {"name": "litert_context", **await main(args)}


if __name__ == "__main__":
    print(json.dumps(trio.run(main, parse_args(sys.argv[1:]))))
