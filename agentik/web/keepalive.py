"""End every HTTP response so that hypercorn's trio worker can finish the connection's bookkeeping.

Root cause of idle keep-alive connections that were never closed (issue 11 #2, hypercorn 0.18 +
quart-trio 0.12): hypercorn's HTTP/1.1 protocol does its end-of-request work *inside the app's
``send()`` of the last body message*: ``HTTPStream._send_closed`` → ``H11Protocol._maybe_recycle``
first delivers ``http.disconnect`` to the app's receive queue, and only then either re-arms the
keep-alive timer (``Updated(idle=True)`` → ``TrioSingleTask.restart`` → ``nursery.start``) or closes
the socket (``Closed`` → ``TCPServer._close``). quart-trio's ``TrioASGIHTTPConnection`` runs the
request in a nursery next to a task that waits on ``receive()``; when that task gets
``http.disconnect`` it cancels the nursery, so the task still inside ``send()`` is cancelled at its
next checkpoint, which is before the timer is started or the socket closed. The connection is then
left with no idle timer and no close: open for ever, also after ``Connection: close``, one file
descriptor per client (reproduced with a five-line quart-trio app).

The fix is on our side of the ASGI boundary: the ``send`` of the final response message (the body
message without ``more_body``) is shielded from cancellation, so hypercorn's bookkeeping runs to
its end. This adds no wait that hypercorn did not have already: it shields its own socket writes
(``TCPServer.protocol_send``), and what follows them is bookkeeping with no network wait.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

import trio

if TYPE_CHECKING:
    from hypercorn.typing import ASGISendCallable, ASGISendEvent, HTTPResponseBodyEvent


def shield_response_end(send: ASGISendCallable) -> ASGISendCallable:
    """``send``, with the message that ends an HTTP response sent under a shielded scope.

    And a response of known length (``Content-Length``) ends with the body message that
    completes it (issue 13): Quart sends its body with ``more_body`` and then an empty message
    to end it, a second pass through hypercorn for nothing; here the message that brings the
    body to its length is sent as the last one, and Quart's empty one is not passed on. A
    streamed response (no length) is passed on message by message, as it comes."""
    remaining: int | None = None  # body bytes still due, for a response of known length
    ended = False  # the response was ended by its last body message: drop Quart's empty end

    async def send_with_shielded_end(message: ASGISendEvent) -> None:
        nonlocal remaining, ended
        kind = message["type"]
        if kind == "http.response.body":
            body = cast("bytes", message.get("body", b""))
            if message.get("more_body", False):
                if remaining is None or len(body) < remaining:
                    if remaining is not None:
                        remaining -= len(body)
                    await send(message)
                    return
                # the body is complete: this message ends the response
                ended = True
                message = cast("HTTPResponseBodyEvent",
                               {"type": "http.response.body", "body": body, "more_body": False})
            elif ended:
                ended = False
                if not body:
                    return  # Quart's end of a response its last body message ended
            remaining = None
            with trio.CancelScope(shield=True):
                await send(message)
            return
        if kind == "http.response.start":
            headers = cast("Iterable[tuple[bytes, bytes]]", message.get("headers", ()))
            remaining, ended = _content_length(headers), False
        await send(message)

    return send_with_shielded_end


def _content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if len(name) == 14 and name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
