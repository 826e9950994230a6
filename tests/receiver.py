"""A webhook receiver for tests: a real hypercorn on 127.0.0.1:<free port> that records every
request (headers and the body's bytes as sent) and answers 204, or 503 while ``down``.

    async with open_receiver() as receiver:
        url = receiver.url + "/hook"
        ...
        await receiver.wait(lambda got: len(got) >= 3)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import hypercorn.config
import hypercorn.trio
import trio
from quart import Response, request
from quart_trio import QuartTrio


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    #: what the receiver answered
    status: int


@dataclass
class Receiver:
    url: str = ""
    #: answer 503 to everything while set
    down: bool = False
    #: every request, in the order they came
    requests: list[Received] = field(default_factory=list)
    _changed: trio.Event = field(default_factory=trio.Event)

    @property
    def accepted(self) -> list[Received]:
        """The requests answered 2xx: the ones a sender counts as delivered."""
        return [r for r in self.requests if r.status < 300]

    async def wait(self, done: Callable[[Receiver], bool]) -> None:
        while not done(self):
            await self._changed.wait()

    def _record(self, got: Received) -> None:
        self.requests.append(got)
        self._changed.set()
        self._changed = trio.Event()


@asynccontextmanager
async def open_receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = QuartTrio(__name__)

    @app.route("/<path:path>", methods=["POST"])
    async def hook(path: str) -> Response:
        body = await request.get_data()
        status = 503 if receiver.down else 204
        receiver._record(Received("/" + path, {k.lower(): v for k, v in request.headers.items()},
                                  body, status))
        return Response(b"", status=status)

    cfg = hypercorn.config.Config()
    cfg.bind = ["127.0.0.1:0"]
    cfg.accesslog = None
    cfg.graceful_timeout = 0.5
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(hypercorn.trio.serve, app, cfg,
                                            shutdown_trigger=stop.wait))
        receiver.url = binds[0]
        try:
            yield receiver
        finally:
            stop.set()
