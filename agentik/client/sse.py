"""A minimal Server-Sent Events parser (WHATWG line protocol) over a byte stream.

Our own rather than a dependency: the server's frames are simple (``id``/``event``/``data`` and
``:`` comments), and parsing bytes ourselves lets the caller tell a clean end of stream from a cut.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass


@dataclass(slots=True)
class SseFrame:
    """One dispatched frame, or a comment (``comment`` set, the rest empty)."""

    id: str | None = None
    event: str | None = None
    data: str = ""
    comment: str | None = None


async def _lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[str]:
    buf = b""
    async for chunk in chunks:
        buf += chunk
        while True:
            # Lines end with \n, \r\n or \r; the server uses \n.
            nl = buf.find(b"\n")
            cr = buf.find(b"\r")
            if nl < 0 and cr < 0:
                break
            if cr >= 0 and (nl < 0 or cr < nl):
                if cr == len(buf) - 1:
                    break  # a \r at the end may be the first half of \r\n: wait for more
                end, skip = cr, 2 if buf[cr + 1 : cr + 2] == b"\n" else 1
            else:
                end, skip = nl, 1
            line, buf = buf[:end], buf[end + skip :]
            yield line.decode("utf-8", "replace")
    # A partial last line without its newline is an incomplete frame: dropped, as the spec says.


async def parse_sse(chunks: AsyncIterable[bytes]) -> AsyncIterator[SseFrame]:
    """Frames and comments in arrival order. A frame cut before its blank line is not yielded."""
    current = SseFrame()
    data: list[str] = []
    seen = False
    async for line in _lines(chunks):
        if line == "":
            if seen:
                current.data = "\n".join(data)
                yield current
            current, data, seen = SseFrame(), [], False
            continue
        if line.startswith(":"):
            yield SseFrame(comment=line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        seen = True
        if name == "id":
            current.id = value
        elif name == "event":
            current.event = value
        elif name == "data":
            data.append(value)
