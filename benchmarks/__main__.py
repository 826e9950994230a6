"""``python -m benchmarks [--quick] [--json FILE] [--only NAME ...]``

Runs every scenario (each in its own ``trio.run``), prints one table row per scenario and, with
``--json``, writes the rows as a JSON list of ``{"name": ..., <figures>}``. ``--quick`` runs a
short form of each (a few minutes in all on 2 cores). See docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from benchmarks import (
    concurrency,
    floor,
    litert_context,
    litert_tokens,
    markdown,
    openai_compat,
    pg,
    runtime,
    storage,
    traces,
    users,
    web,
    webhooks,
)

Scenario = Callable[[bool], Awaitable[dict[str, Any]]]

SCENARIOS: dict[str, Scenario] = {
    "storage_group_commit": storage.storage_group_commit,
    "storage_full_outbox": storage.storage_full_outbox,
    "turn_overhead_ttft": web.turn_overhead_ttft,
    "openai_ttft": openai_compat.openai_ttft,
    "fanout_tokens": web.fanout_tokens,
    "concurrency": concurrency.concurrency,
    "stack_floor": floor.stack_floor,
    "replay": web.replay,
    "memory": web.memory,
    "cold_load_10k": runtime.cold_load_10k,
    "stalled_subscriber": web.stalled_subscriber,
    "litert_tokens": litert_tokens.litert_tokens,
    "litert_context": litert_context.litert_context,
    "pg_group_commit": pg.pg_group_commit,
    "pg_fanout": pg.pg_fanout,
    "web_markdown": markdown.web_markdown,
    "users_replay": users.users_replay,
    "traces_turn_cost": traces.traces_turn_cost,
    "webhook_slow_receiver": webhooks.webhook_slow_receiver,
}
#: not in the default run: in-process, so its figure is noisy (see docs/BENCHMARKS.md)
EXTRA: dict[str, Scenario] = {"memory_actors": runtime.memory_actors}


def _innermost(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:200]


def format_table(rows: list[dict[str, Any]]) -> str:
    width = max(len(r["name"]) for r in rows) if rows else 4
    lines = [f"{'scenario':<{width}}  figures", "-" * (width + 60)]
    for row in rows:
        figures = "  ".join(f"{k}={v}" for k, v in row.items() if k != "name")
        lines.append(f"{row['name']:<{width}}  {figures}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short form of every scenario")
    parser.add_argument("--json", metavar="FILE", help="write the rows as a JSON list to FILE")
    parser.add_argument("--only", nargs="+", choices=sorted({**SCENARIOS, **EXTRA}), metavar="NAME",
                        help=f"run only these scenarios ({', '.join({**SCENARIOS, **EXTRA})})")
    args = parser.parse_args(argv)
    names = args.only or list(SCENARIOS)
    rows: list[dict[str, Any]] = []
    failed = False
    for name in names:
        start = time.perf_counter()
        try:
            row = trio.run({**SCENARIOS, **EXTRA}[name], args.quick)
        except Exception as exc:
            traceback.print_exc()
            row = {"name": name, "error": _innermost(exc)}
            failed = True
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        print(format_table([row]).splitlines()[-1], flush=True)
    print()
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
            f.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
