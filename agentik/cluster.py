"""Commands for a conversation owned by another node (PostgreSQL cluster, docs/SCALEOUT.md) go to the
owner: the node that received them forwards them over HTTP to the base URL the owner advertises
(``AGENTIK_NODE_URL``), with the caller's own bearer token (:data:`caller_token`, set by the front
door that authenticated the request), else this cluster's first ``AGENTIK_TOKENS`` token. The owner
answers as if the client had called it, errors included (404, 409, 429, ... come back as the same
AgentikError). Forwarding the caller's token is what lets a cluster whose users come from a users
file or JWTs run without a shared token: every node checks the same token the same way.

:class:`Peers` keeps one client (one connection pool) per owner address for the runtime's life,
so a forwarded command reuses a kept-alive connection instead of opening one per call; the
runtime closes them at shutdown (``Peers.aclose``). A request a front door cannot forward as
client calls (an A2A JSON-RPC request, whose answer is the owner's task) goes as it came
(:meth:`Peers.relay`), on a plain HTTP client per owner, kept the same way."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import httpx2
import trio

from agentik import metrics, tracing
from agentik.errors import AgentikConnectionError, AgentikError, NotOwnerError, RuntimeClosedError

if TYPE_CHECKING:
    from agentik.client.http import AgentikAgent
    from agentik.config import Config

T = TypeVar("T")

#: a relayed request's bounds: connecting to the owner and sending to it are short; its answer
#: may take as long as the turn it waits for (SendMessage), and a stream is the owner's to end
RELAY_TIMEOUT = httpx2.Timeout(10.0, read=None)

#: the bearer token of the request this task serves (None: no token, or not a request). A task
#: the request spawns inherits it, so a WebSocket's commands carry the socket's token.
caller_token: ContextVar[str | None] = ContextVar("agentik_caller_token", default=None)


class CallerAuth(httpx2.Auth):
    """Each forwarded request's ``Authorization``: the caller's token when there is one (the owner
    then sees the same principal, limits and idempotency scope), else ``shared``."""

    def __init__(self, shared: str | None) -> None:
        self.shared = shared

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        token = caller_token.get() or self.shared
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


@dataclass(eq=False)
class Relayed:
    """The owner's answer to a relayed request, its body still to come (:meth:`Peers.relay`)."""

    status: int
    content_type: str
    exc: NotOwnerError
    response: httpx2.Response

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives, unchanged; NotOwnerError (:func:`silent`) when the owner
        goes away before its end. Closes the answer when it ends or is abandoned."""
        try:
            async for chunk in self.response.aiter_raw():
                yield chunk
        except httpx2.TransportError as err:
            raise silent(self.exc, err) from err
        finally:
            await self.aclose()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):  # a cancel (the client went away) must not cut it
            await self.response.aclose()


class Peers:
    """The clients of the other nodes this node forwarded to, by base URL."""

    def __init__(self, config: Config,
                 factory: Callable[[str, str, str | None], AgentikAgent] | None = None) -> None:
        self.config = config
        self._factory = factory
        self._clients: dict[str, AgentikAgent] = {}
        self._relays: dict[str, httpx2.AsyncClient] = {}
        self._closed = False
        #: whether a node heartbeats in time (``Leases.node_live``; None: never asked)
        self.live: Callable[[str], Awaitable[bool]] | None = None

    def client(self, addr: str) -> AgentikAgent:
        """The one client for the node at ``addr`` (made on first use)."""
        if self._closed:
            raise RuntimeClosedError("the runtime is closed")
        owner = self._clients.get(addr)
        if owner is None:
            token = self.config.tokens[0] if self.config.tokens else None
            name = f"node:{self.config.node_id or 'peer'}"
            if self._factory is not None:
                owner = self._factory(name, addr, token)
            else:
                from agentik.client.http import AgentikAgent

                owner = AgentikAgent(name, addr, auth=CallerAuth(token))
            self._clients[addr] = owner
        return owner

    async def forward(self, exc: NotOwnerError, call: Callable[[AgentikAgent], Awaitable[T]]) -> T:
        """Run ``call`` against the owner node; re-raises ``exc`` (503) when it advertises no
        URL, and answers 503 too when the owner does not answer."""
        if not exc.addr:
            raise exc
        owner = self.client(exc.addr)
        metrics.CLUSTER_FORWARDED.inc()
        try:
            return await call(owner)
        except AgentikConnectionError as err:
            raise silent(exc, err) from err

    async def relay(self, exc: NotOwnerError, path: str, body: bytes,
                    headers: dict[str, str]) -> Relayed:
        """POST ``body`` to ``path`` on the owner node as the caller (``headers`` plus their
        token and the trace); its answer, whose body the caller reads (``chunks``, ``read``)
        or closes. Raises as :meth:`forward` does."""
        if not exc.addr:
            raise exc
        if self._closed:
            raise RuntimeClosedError("the runtime is closed")
        http = self._relays.get(exc.addr)
        if http is None:
            shared = self.config.tokens[0] if self.config.tokens else None
            http = self._relays[exc.addr] = httpx2.AsyncClient(
                base_url=exc.addr, auth=CallerAuth(shared), timeout=RELAY_TIMEOUT,
                limits=httpx2.Limits(max_connections=None, max_keepalive_connections=20))
        headers = dict(headers)
        tracing.inject(headers)  # the owner's spans join this request's trace
        metrics.CLUSTER_FORWARDED.inc()
        try:
            answer = await http.send(http.build_request("POST", path, content=body,
                                                        headers=headers), stream=True)
        except httpx2.TransportError as err:
            raise silent(exc, err) from err
        return Relayed(answer.status_code, answer.headers.get("content-type", ""), exc, answer)

    async def while_live(self, exc: NotOwnerError, call: Callable[[], Awaitable[T]]) -> T:
        """``call`` (a relay to the owner of ``exc``), cut short with NotOwnerError once that
        owner stops heartbeating: a frozen or cut-off node holds its connections open, and
        its answer would never come. Its lease has run out then: a live node takes the
        conversation over, so the caller tries again."""
        done: list[T] = []
        failed: list[Exception] = []

        async def run() -> None:
            try:
                done.append(await call())
            except Exception as err:  # raised below, not as an exception group
                failed.append(err)
            nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await self._owner_gone(exc.node_id)
            nursery.cancel_scope.cancel()
        if failed:
            raise failed[0]
        if done:
            return done[0]
        raise NotOwnerError(f"the node that owns this conversation ({exc.node_id}) stopped "
                            "heartbeating; try again once another node has taken it over",
                            node_id=exc.node_id, addr=exc.addr)

    async def _owner_gone(self, node_id: str) -> None:
        """Returns once ``node_id`` is no longer live (never without ``live``)."""
        if self.live is None:
            await trio.sleep_forever()
        while True:
            await trio.sleep(max(0.5, self.config.lease_ttl / 3))
            assert self.live is not None
            try:
                if not await self.live(node_id):
                    return
            except AgentikError:
                continue  # the database does not answer now: the owner may well be fine

    async def aclose(self) -> None:
        """Close every client (idempotent); forwarding is refused afterwards."""
        self._closed = True
        clients, self._clients = list(self._clients.values()), {}
        relays, self._relays = list(self._relays.values()), {}
        for owner in clients:
            await owner.close()
        for http in relays:
            await http.aclose()


def silent(exc: NotOwnerError, err: Exception) -> NotOwnerError:
    """The owner of ``exc`` did not answer (``err``). It died or is cut off: its lease runs
    out and a live node takes the conversation over, so this is "not here, try again" (503),
    not a server fault (500)."""
    return NotOwnerError(
        f"the node that owns this conversation does not answer ({str(err) or type(err).__name__}"
        "); try again once "
        "another node has taken it over", node_id=exc.node_id, addr=exc.addr)
