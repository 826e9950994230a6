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

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from hypercorn.typing import ASGISendCallable, ASGISendEvent


def shield_response_end(send: ASGISendCallable) -> ASGISendCallable:
    """``send``, with the message that ends an HTTP response sent under a shielded scope."""

    async def send_with_shielded_end(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            with trio.CancelScope(shield=True):
                await send(message)
        else:
            await send(message)

    return send_with_shielded_end
