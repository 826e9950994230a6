"""The apps of the ``stack_floor`` row (``benchmarks/floor.py``), served by ``hypercorn -k trio``.

``raw``: a bare ASGI app, no framework. ``GET /stream?n=T`` answers an SSE stream of T frames
50 ms apart, each frame one ``send`` of the same bytes as one of agentik's live ``append_text``
frames; ``GET /ping`` answers a 2-byte body. ``framework``: the same ``/ping`` as a quart-trio app
(the framework agentik's routes run in). Nothing else: what they cost per frame and per request is
the floor of the stack agentik is built on.
"""

from __future__ import annotations

from typing import Any

import trio
from quart_trio import QuartTrio

#: an agentik live-stream frame of one text delta (ids and sizes as the server writes them)
FRAME = (b'id: 3f0c9a51e2b84d7c9e61b0a2d4c7e815:1234567\nevent: append_text\n'
         b'data: {"cursor":{"epoch":"3f0c9a51e2b84d7c9e61b0a2d4c7e815","offset":1234567},'
         b'"conversation_id":"c_5e1b2f0a9d8c4e7b","turn_id":"t_0a1b2c3d4e5f6a7b",'
         b'"event":{"type":"append_text","text":"t "}}\n\n')
DELAY = 0.05
_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def raw(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/ping":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    query = dict(p.split("=", 1) for p in scope["query_string"].decode().split("&") if "=" in p)
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    for _ in range(int(query.get("n", "50"))):
        await trio.sleep(DELAY)
        await send({"type": "http.response.body", "body": FRAME, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


framework = QuartTrio(__name__)


@framework.get("/ping")
async def ping() -> str:
    return "ok"
