"""A small TCP proxy on 127.0.0.1:<free port> for fault tests (trio).

Put it between a client and a server, then break the connection on purpose::

    async with open_tcp_proxy("127.0.0.1", server_port) as proxy:
        client_url = proxy.url                    # "http://127.0.0.1:<proxy port>"
        ...
        await proxy.cut_all()                     # every open connection is closed now
        proxy.faults = Faults(seed=7, cut_probability=0.05, max_cuts=20)   # random, seeded
        proxy.faults = None                       # back to a clean pipe
        proxy.retarget("127.0.0.1", new_port)     # e.g. after a server restart on a new port
        proxy.refuse = True                       # accept, then close at once (server "down")

What a fault does (per forwarded chunk, in either direction, decided by ``Faults``' own
``random.Random(seed)``: the same seed gives the same sequence of decisions, though how the
kernel splits a stream into reads, and so which bytes a decision falls on, still varies):

- ``delay=(lo, hi)``: sleep a uniform time in [lo, hi] before forwarding the chunk;
- ``chunk_size``: split reads into pieces of at most this many bytes first (so cuts and
  truncations land inside frames, not only between them);
- ``cut_probability``: with this probability the connection is cut at this chunk; with
  ``truncate=True`` a random prefix of the chunk is forwarded first (a frame cut in the middle).
  Random cuts stop once ``proxy.cuts`` (which counts ``cut_all`` too) reaches ``max_cuts``;
  after that the proxy is a clean pipe again, so a test always makes progress.

A cut closes both sockets of that connection (the client sees EOF or a reset in the middle of a
response). Counters: ``connections`` (accepted so far), ``open_connections``, ``cuts``,
``bytes_forwarded``; waits: ``await proxy.wait_connections(n)`` (n accepted in total),
``await proxy.wait_idle()`` (none open). Everything runs in the nursery of ``open_tcp_proxy``;
leaving the ``async with`` closes every connection and the listener.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import trio

__all__ = ["Faults", "TcpProxy", "open_tcp_proxy"]

READ_SIZE = 65536


@dataclass
class Faults:
    """Seeded random faults (see the module docstring). ``max_cuts`` bounds the damage so a
    test always makes progress."""

    seed: int = 0
    cut_probability: float = 0.0
    max_cuts: int = 10
    truncate: bool = True
    delay: tuple[float, float] | None = None
    chunk_size: int | None = None
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)


class _Conn:
    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope


class TcpProxy:
    """State of one proxy; made by :func:`open_tcp_proxy`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target: tuple[str, int] = (target_host, target_port)
        self.port = 0
        #: random faults applied to every chunk, or None for a clean pipe
        self.faults: Faults | None = None
        #: when True, new connections are accepted and closed at once (like a server that is down)
        self.refuse = False
        self.connections = 0
        self.cuts = 0
        self.bytes_forwarded = 0
        self._conns: set[_Conn] = set()
        self._changed = trio.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def retarget(self, host: str, port: int) -> None:
        """Forward new connections to another address (open ones keep their upstream)."""
        self.target = (host, port)

    async def cut_all(self) -> int:
        """Close every open connection now; returns how many were cut."""
        conns = list(self._conns)
        for conn in conns:
            conn.scope.cancel()
        self.cuts += len(conns)
        await trio.lowlevel.checkpoint()
        return len(conns)

    async def wait_connections(self, n: int) -> None:
        """Wait until at least ``n`` connections have been accepted in total."""
        while self.connections < n:
            await self._wait_change()

    async def wait_idle(self) -> None:
        """Wait until no connection is open."""
        while self._conns:
            await self._wait_change()

    async def _wait_change(self) -> None:
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # --- internals -------------------------------------------------------------------------------

    async def _handle(self, client: trio.SocketStream) -> None:
        self.connections += 1
        self._notify()
        scope = trio.CancelScope()
        conn = _Conn(scope)
        self._conns.add(conn)
        try:
            with scope:
                if self.refuse:
                    return
                try:
                    upstream = await trio.open_tcp_stream(*self.target)
                except OSError:
                    return  # the target is down: the client sees its connection closed
                async with upstream, trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, client, upstream, scope)
                    nursery.start_soon(self._pump, upstream, client, scope)
        finally:
            self._conns.discard(conn)
            self._notify()
            with trio.CancelScope(shield=True):
                await client.aclose()

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, scope: trio.CancelScope
    ) -> None:
        try:
            while True:
                data = await source.receive_some(READ_SIZE)
                if not data:
                    # Half-close is rare in HTTP; ending both directions keeps it simple.
                    scope.cancel()
                    return
                for piece in self._pieces(data):
                    faults = self.faults
                    if faults is not None and faults.delay is not None:
                        await trio.sleep(faults.rng.uniform(*faults.delay))
                    if faults is not None and self._should_cut(faults):
                        if faults.truncate and len(piece) > 1:
                            await sink.send_all(piece[: faults.rng.randrange(1, len(piece))])
                        self.cuts += 1
                        scope.cancel()
                        return
                    await sink.send_all(piece)
                    self.bytes_forwarded += len(piece)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            scope.cancel()

    def _pieces(self, data: bytes) -> list[bytes]:
        faults = self.faults
        if faults is None or not faults.chunk_size:
            return [data]
        size = faults.chunk_size
        return [data[i : i + size] for i in range(0, len(data), size)]

    def _should_cut(self, faults: Faults) -> bool:
        if faults.cut_probability <= 0 or self.cuts >= faults.max_cuts:
            return False
        return faults.rng.random() < faults.cut_probability


@asynccontextmanager
async def open_tcp_proxy(
    target_host: str, target_port: int, *, faults: Faults | None = None
) -> AsyncIterator[TcpProxy]:
    """Listen on 127.0.0.1:<free port> and forward each connection to the target."""
    proxy = TcpProxy(target_host, target_port)
    proxy.faults = faults
    async with trio.open_nursery() as nursery:
        listeners: list[trio.SocketListener] = await nursery.start(
            partial(trio.serve_tcp, proxy._handle, 0, host="127.0.0.1")
        )
        proxy.port = listeners[0].socket.getsockname()[1]
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
