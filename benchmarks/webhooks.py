"""Whether a slow webhook receiver slows the send path (docs/WEBHOOKS.md, issue 33).

Two server processes on the same scripted model; the second has a subscription to every turn and
conversation event, posted to a receiver on 127.0.0.1 that takes ``RECEIVER_DELAY`` seconds to
answer each delivery (its deliveries queue up behind it for the whole run). Turns alternate
between the servers, so both see the same noise; a turn is timed from the POST of its message to
its ``end`` on the live SSE stream. Afterwards the receiver is made fast and the backlog drained,
to count what was delivered (``delivered`` of ``turns + 1`` events within ``DRAIN`` seconds).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import hypercorn.config
import hypercorn.trio
import trio
from quart import Response, request
from quart_trio import QuartTrio

from benchmarks.serverproc import spawn_server
from benchmarks.web import _create, _send, _until
from tests.scripted_openai import Reply, open_scripted_openai
from tests.webutil import open_sse

TIMEOUT = 30.0
#: seconds the slow receiver takes to answer each delivery
RECEIVER_DELAY = 1.0
#: seconds the backlog is given to drain once the receiver is fast
DRAIN = 60.0


@asynccontextmanager
async def _receiver() -> AsyncIterator[tuple[str, list[float], list[int], dict[int, trio.Event]]]:
    """A receiver answering 204 after ``delay[0]`` seconds; (its URL, delay, [deliveries], the
    event set when the count reaches a key)."""
    app = QuartTrio("receiver")
    delay = [RECEIVER_DELAY]
    count = [0]
    reached: dict[int, trio.Event] = {}

    @app.post("/hook")
    async def hook() -> Response:
        await request.get_data()  # (a handler that leaves the body unread stalls h11 reuse)
        await trio.sleep(delay[0])
        count[0] += 1
        if count[0] in reached:
            reached[count[0]].set()
        return Response(b"", status=204)

    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(hypercorn.trio.serve, app, config))
        yield binds[0].rstrip("/") + "/hook", delay, count, reached
        nursery.cancel_scope.cancel()


async def webhook_slow_receiver(quick: bool) -> dict[str, Any]:
    turns = 40 if quick else 200
    plain: list[float] = []
    hooked: list[float] = []
    async with open_scripted_openai() as scripted, _receiver() as (url, delay, delivered, reached):
        scripted.callable_default = lambda body: Reply(["It is", " 42."])
        with tempfile.TemporaryDirectory() as tmp:
            async with (
                spawn_server(str(Path(tmp) / "a.db"), openai_base_url=scripted.base_url) as a,
                spawn_server(str(Path(tmp) / "b.db"), openai_base_url=scripted.base_url) as b,
                httpx2.AsyncClient(base_url=a.url, timeout=TIMEOUT) as ca,
                httpx2.AsyncClient(base_url=b.url, timeout=TIMEOUT) as cb,
            ):
                made = await cb.post("/agentik/webhooks", json={"url": url, "events": [
                    "turn.completed", "turn.failed", "conversation.created"]})
                assert made.status_code == 201, made.text
                ids = [await _create(ca), await _create(cb)]
                async with (open_sse(ca, f"/agentik/conversations/{ids[0]}/live") as la,
                            open_sse(cb, f"/agentik/conversations/{ids[1]}/live") as lb):
                    for i in range(turns):
                        for client, cid, live, out in ((ca, ids[0], la, plain),
                                                       (cb, ids[1], lb, hooked)):
                            with trio.fail_after(TIMEOUT):
                                start = time.perf_counter()
                                await _send(client, cid, f"question {i}")
                                await _until(live, "end")
                                out.append((time.perf_counter() - start) * 1000)
                behind = turns + 1 - delivered[0]  # still queued when the last turn ended
                delay[0] = 0.0
                drained = reached.setdefault(turns + 1, trio.Event())
                with trio.move_on_after(DRAIN):  # (a count only: not what is measured)
                    await drained.wait()
    plain, hooked = plain[1:], hooked[1:]  # the first of each includes connection set-up
    return {
        "name": "webhook_slow_receiver",
        "turns": turns,
        "plain_p50_ms": round(statistics.median(plain), 3),
        "hooked_p50_ms": round(statistics.median(hooked), 3),
        "added_p50_ms": round(statistics.median(hooked) - statistics.median(plain), 3),
        "deliveries_behind": behind,
        "delivered": delivered[0],
    }
