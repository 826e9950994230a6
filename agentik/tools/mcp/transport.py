"""The transports of the MCP tools: a stdio child process (argument list, no shell; its stderr
read into our log) or streamable HTTP (the config's URL and headers), and the read-stream wrapper
that tells a connection its transport has ended."""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx2
import trio
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from agentik.tools.config import HttpServerConfig, ServerConfig, StdioServerConfig

__all__ = ["WatchedReadStream", "open_transport"]

log = logging.getLogger(__name__)

_STDERR_LINE_MAX = 500


def open_transport(
    name: str,
    cfg: ServerConfig,
    stderr_tail: deque[str],
    pipes: trio.Nursery,
    stderr_done: trio.Event,
) -> AbstractAsyncContextManager[tuple[Any, Any]]:
    """The transport of server ``name``: entering it spawns or connects and yields the (read,
    write) streams. A stdio child's stderr lines go to the log and ``stderr_tail`` (read by a task
    in ``pipes``, which sets ``stderr_done`` at EOF; set at once for HTTP)."""
    if isinstance(cfg, StdioServerConfig):
        return _stdio_transport(name, cfg, stderr_tail, pipes, stderr_done)
    stderr_done.set()  # no stderr to read
    return _http_transport(cfg)


@asynccontextmanager
async def _stdio_transport(
    name: str,
    cfg: StdioServerConfig,
    stderr_tail: deque[str],
    nursery: trio.Nursery,
    stderr_done: trio.Event,
) -> AsyncIterator[tuple[Any, Any]]:
    """Spawn the server (argument list, no shell) with its stderr piped into our log."""
    params = StdioServerParameters(
        command=cfg.command, args=list(cfg.args), env=dict(cfg.env) or None, cwd=cfg.cwd
    )
    read_fd, write_fd = os.pipe()
    nursery.start_soon(
        _read_stderr, name, stderr_tail, trio.lowlevel.FdStream(read_fd), stderr_done
    )
    errlog = os.fdopen(write_fd, "w")
    try:
        async with stdio_client(params, errlog=errlog) as streams:
            # The child holds its own copy now; closing ours lets the reader see EOF when the
            # child exits.
            errlog.close()
            yield streams
    finally:
        errlog.close()


@asynccontextmanager
async def _http_transport(cfg: HttpServerConfig) -> AsyncIterator[tuple[Any, Any]]:
    # The SDK's defaults (30 s, 300 s for reading the long-lived SSE stream), plus the headers.
    client = httpx2.AsyncClient(headers=dict(cfg.headers), timeout=httpx2.Timeout(30.0, read=300.0))
    async with client, streamable_http_client(cfg.url, http_client=client) as streams:
        yield streams


async def _read_stderr(
    name: str, tail: deque[str], stream: trio.lowlevel.FdStream, done: trio.Event
) -> None:
    buffer = b""

    def emit(raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip()[:_STDERR_LINE_MAX]
        if line:
            tail.append(line)
            log.debug("MCP server %r stderr: %s", name, line)

    try:
        async with stream:
            while chunk := await stream.receive_some(65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    emit(line)
                if len(buffer) > 65536:  # no newline in sight: do not grow without bound
                    emit(buffer)
                    buffer = b""
            emit(buffer)
    except (trio.ClosedResourceError, OSError):
        pass
    finally:
        done.set()


class WatchedReadStream:
    """Wraps a transport's read stream and sets ``closed`` once the session stops reading it
    (end of stream, transport failure or the session closing): the SDK has no other signal
    for a connection that ended."""

    def __init__(self, inner: Any, closed: trio.Event) -> None:
        self._inner = inner
        self._closed = closed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)  # e.g. ``last_context`` of the HTTP transport's stream

    async def receive(self) -> Any:
        return await self._inner.receive()

    async def aclose(self) -> None:
        self._closed.set()
        await self._inner.aclose()

    def __aiter__(self) -> WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        return await self._inner.__anext__()

    async def __aenter__(self) -> WatchedReadStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        self._closed.set()
        result: bool | None = await self._inner.__aexit__(*exc_info)
        return result
