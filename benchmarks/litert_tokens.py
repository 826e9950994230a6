"""Tokens per second through the litert backend vs the LiteRT-LM engine called directly.

Both sides use the same engine, the same prompt, greedy sampling and the same output cap; each
run opens a fresh conversation (prefill + decode), and runs alternate between the two sides so
machine noise hits both alike. Prints one JSON object:
``{"tokens_per_s", "direct_tokens_per_s", "ratio", ...}`` (medians over the runs).

    python -m benchmarks.litert_tokens [--model FILE] [--tokens 128] [--runs 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import trio

from agentik.llm.base import FinishDelta, UsageDelta
from agentik.llm.litert import LiteRtLlm
from agentik.wire import Text
from tests.models import REAL, TINY

PROMPT = "Write a long story about a lighthouse keeper and the sea."


async def through_backend(llm: LiteRtLlm) -> tuple[int, float]:
    conv = await llm.open([], [])
    try:
        tokens = 0
        start = time.perf_counter()
        async with aclosing(conv.send_stream([Text(body=PROMPT)])) as stream:
            async for delta in stream:
                if isinstance(delta, UsageDelta):
                    tokens = delta.completion_tokens
                elif isinstance(delta, FinishDelta):
                    break
        return tokens, time.perf_counter() - start
    finally:
        await conv.close()


def direct(engine: Any, max_tokens: int) -> tuple[int, float]:
    import litert_lm

    sampler = litert_lm.SamplerConfig(top_k=1, temperature=0.0)
    with engine.create_conversation(max_output_tokens=max_tokens, sampler_config=sampler) as conv:
        start = time.perf_counter()
        tokens = sum(1 for _ in conv.send_message_async(PROMPT))
        return tokens, time.perf_counter() - start


async def main(args: argparse.Namespace) -> dict[str, Any]:
    llm = LiteRtLlm(args.model, threads=args.threads, max_output_tokens=args.tokens,
                    temperature=0.0, top_k=1)
    try:
        await llm.load()
        await through_backend(llm)  # warm-up, both paths share the engine
        ours: list[float] = []
        theirs: list[float] = []
        counts: set[int] = set()
        for _ in range(args.runs):
            n, seconds = await through_backend(llm)
            ours.append(n / seconds)
            counts.add(n)
            n, seconds = await trio.to_thread.run_sync(direct, llm.engine, args.tokens)
            theirs.append(n / seconds)
            counts.add(n)
    finally:
        await llm.aclose()
    backend_rate = statistics.median(ours)
    direct_rate = statistics.median(theirs)
    return {
        "model": Path(args.model).name,
        "threads": args.threads,
        "max_output_tokens": args.tokens,
        "tokens_per_run": sorted(counts),
        "runs": args.runs,
        "tokens_per_s": round(backend_rate, 1),
        "direct_tokens_per_s": round(direct_rate, 1),
        "ratio": round(backend_rate / direct_rate, 3),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    default = REAL
    if not default.is_file():
        default = TINY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(default))
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args(argv)


async def litert_tokens(quick: bool) -> dict[str, Any]:
    """The ``litert_tokens`` row of ``python -m benchmarks`` (gemma3-270m when present)."""
    args = parse_args(["--runs", "3" if quick else "5"])
    return {"name": "litert_tokens", **await main(args)}


if __name__ == "__main__":
    print(json.dumps(trio.run(main, parse_args(sys.argv[1:]))))
