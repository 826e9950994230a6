"""Webhooks on a PostgreSQL cluster (docs/WEBHOOKS.md "How it runs"): two nodes on one database,
one of them delivers (the holder of the job's lock); every event, made on either node, reaches
the receiver once; when the delivering node stops, the other takes over from the stored cursor
and nothing is sent twice or lost."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import standardwebhooks
import trio

from agentik.config import Config
from tests.receiver import Receiver, open_receiver
from tests.scripted_openai import ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    make_config,
    no_error_logs,
    openai,
    serve_app,
)

EVENTS = ["conversation.created", "conversation.deleted"]


async def _node(cfg: Config, stop: trio.Event,
                task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED) -> None:
    async with serve_app(cfg) as server:
        task_status.started(server)
        await stop.wait()


async def _leader(*servers: Server) -> Server:
    """The one node that delivers, once there is exactly one."""
    while True:
        leading = [s for s in servers if s.agent.webhooks.deliveries.leading]
        assert len(leading) <= 1
        if leading:
            return leading[0]
        await trio.sleep(0.05)


def _offset(received: Any) -> int:
    return int(received.headers["webhook-id"].rpartition(":")[2])


async def _settled(client: httpx2.AsyncClient, hook: str, receiver: Receiver) -> None:
    """The stored progress covers what the receiver took (nothing to send again)."""
    last = max(_offset(r) for r in receiver.accepted)
    while True:  # (a row in the database: polled, no event to wait on across nodes)
        if (await client.get(f"/agentik/webhooks/{hook}")).json()["delivered_through"] >= last:
            return
        await trio.sleep(0.05)


async def test_one_node_delivers_and_the_other_takes_over(
    tmp_path: Path, pg_url: str, openai: ScriptedOpenAI
) -> None:
    configs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        configs.append(make_config(tmp_path / name, openai, database_url=pg_url,
                                   node_id=f"node-{name}", lease_ttl=4.0,
                                   webhook_max_backoff=0.1))
    stops = [trio.Event(), trio.Event()]
    with trio.fail_after(60):
        async with open_receiver() as receiver, trio.open_nursery() as nursery:
            nodes: list[Server] = [await nursery.start(_node, cfg, stop)
                                   for cfg, stop in zip(configs, stops, strict=True)]
            leader = await _leader(*nodes)
            survivor = nodes[1 - nodes.index(leader)]
            clients = [httpx2.AsyncClient(base_url=n.url, timeout=10) for n in nodes]
            async with clients[0], clients[1]:
                made = await clients[0].post("/agentik/webhooks", json={
                    "url": receiver.url + "/in", "events": EVENTS})
                hook = made.json()
                cids = [(await c.post("/agentik/conversations")).json()["id"] for c in clients]
                await receiver.wait(lambda r: len(r.accepted) >= 2)
                await _settled(clients[0], hook["id"], receiver)
                # the delivering node goes; the other takes its lock and goes on
                stops[nodes.index(leader)].set()
                assert await _leader(survivor) is survivor
                at = nodes.index(survivor)
                on = clients[at]
                cids.append((await on.post("/agentik/conversations")).json()["id"])
                assert (await on.delete(f"/agentik/conversations/{cids[at]}")).status_code == 204
                await receiver.wait(lambda r: len(r.accepted) >= 4)
                await trio.sleep(0.3)  # a repeat would come in this time
                stops[nodes.index(survivor)].set()
    accepted = receiver.accepted
    offsets = [_offset(r) for r in accepted]
    assert len(offsets) == len(set(offsets)) == 4 and offsets == sorted(offsets)
    bodies = [standardwebhooks.Webhook(hook["secret"]).verify(r.body, r.headers)
              for r in accepted]
    assert [(b["type"], b["data"]["conversation_id"]) for b in bodies] == [
        ("conversation.created", cids[0]), ("conversation.created", cids[1]),
        ("conversation.created", cids[2]), ("conversation.deleted", cids[at])]
