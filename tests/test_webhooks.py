"""Webhooks (docs/WEBHOOKS.md) against a real hypercorn, the scripted OpenAI server and a real
receiver: subscribe, deliveries signed per Standard Webhooks (verified with the library), at
least once in cursor order across a receiver that is down and a server restart, the delivery
log, the metrics, the admin routes' answers."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from typing import Any

import httpx2
import msgspec
import pytest
import standardwebhooks
import trio

from agentik.config import Config
from tests.receiver import Receiver, open_receiver
from tests.scripted_openai import Fail, Reply, ScriptedOpenAI
from tests.test_web_ops import create, scrape, turn
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    allow_error_logs,
    client,
    config,
    make_config,
    no_error_logs,
    openai,
    serve_app,
    server,
)

pytestmark = pytest.mark.usefixtures("engine")

EVENTS = ["conversation.created", "turn.completed", "turn.failed", "conversation.deleted"]


async def subscribe(client: httpx2.AsyncClient, url: str, **more: Any) -> dict[str, Any]:
    response = await client.post("/agentik/webhooks", json={"url": url, "events": EVENTS, **more})
    assert response.status_code == 201, response.text
    made: dict[str, Any] = response.json()
    return made


def offset_of(webhook_id: str) -> int:
    return int(webhook_id.rpartition(":")[2])


async def deliveries(client: httpx2.AsyncClient, hook: str) -> list[dict[str, Any]]:
    response = await client.get(f"/agentik/webhooks/{hook}/deliveries", params={"limit": 200})
    assert response.status_code == 200, response.text
    lines: list[dict[str, Any]] = response.json()["deliveries"]
    return lines


async def test_every_event_once_in_order_across_a_down_receiver_and_a_restart(
    tmp_path: Any, openai: ScriptedOpenAI, engine: str | None, allow_error_logs: None
) -> None:
    """The receiver answers 503 while two turns end (one fails) and the server restarts; once it
    is up, every subscribed event arrives, exactly once per ``webhook-id``, in cursor order,
    each verifying with ``standardwebhooks``; the delivery log shows the failed attempts."""
    cfg: Config = make_config(tmp_path, openai, webhook_max_backoff=0.1)
    with trio.fail_after(60):
        async with open_receiver() as receiver:
            receiver.down = True
            async with serve_app(cfg) as server, httpx2.AsyncClient(
                    base_url=server.url, timeout=10) as client:
                hook = await subscribe(client, receiver.url + "/in")
                assert hook["secret"].startswith("whsec_") and hook["source"] == "api"
                cid = await create(client)
                openai.push(Reply(text="one"), Fail(status=400))
                assert "assistant_message" in await turn(client, cid)
                assert "error" in await turn(client, cid)
                await receiver.wait(lambda r: len(r.requests) >= 3)  # retried while down
                failed = await deliveries(client, hook["id"])
                assert failed and {d["outcome"] for d in failed} == {"failed"}
                assert failed[0]["status"] == 503
                shown = (await client.get(f"/agentik/webhooks/{hook['id']}")).json()
                assert shown["attempts"] >= 1 and shown["failing_since"] is not None
            async with serve_app(cfg) as server, httpx2.AsyncClient(
                    base_url=server.url, timeout=10) as client:
                openai.push(Reply(text="two"))
                assert "assistant_message" in await turn(client, cid)
                assert (await client.delete(f"/agentik/conversations/{cid}")).status_code == 204
                receiver.down = False
                await receiver.wait(lambda r: len(r.accepted) >= 5)
                await trio.sleep(0.3)  # nothing more comes (a repeat would come in this time)
                log = await deliveries(client, hook["id"])
                metrics = await scrape(client)
    accepted = receiver.accepted
    ids = [r.headers["webhook-id"] for r in accepted]
    assert len(ids) == len(set(ids)) == 5
    assert [offset_of(i) for i in ids] == sorted(offset_of(i) for i in ids)
    verifier = standardwebhooks.Webhook(hook["secret"])
    bodies = [verifier.verify(r.body, r.headers) for r in accepted]
    assert [b["type"] for b in bodies] == [
        "conversation.created", "turn.completed", "turn.failed", "turn.completed",
        "conversation.deleted"]
    assert all(b["data"]["conversation_id"] == cid for b in bodies)
    assert bodies[1]["data"]["turn_id"] and bodies[2]["data"]["error"]["code"]
    assert all(b["timestamp"].endswith("Z") for b in bodies)
    # a wrong secret does not verify
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook("whsec_" + "A" * 44).verify(accepted[0].body,
                                                           accepted[0].headers)
    assert [d["outcome"] for d in log].count("delivered") == 5
    assert "failed" in {d["outcome"] for d in log}
    assert metrics[("agentik_webhook_deliveries_total", (("outcome", "delivered"),))] >= 5


async def test_filters_and_the_admin_routes(
    client: httpx2.AsyncClient, server: Server, openai: ScriptedOpenAI
) -> None:
    """A subscription per conversation gets that conversation's events only; the routes answer
    400 for a bad body, 404 for an unknown id, 204 then 404 for a delete."""
    async with open_receiver() as receiver:
        cid = await create(client)
        other = await create(client)
        mine = await subscribe(client, receiver.url + "/mine", conversation_id=cid,
                               events=["turn.completed"])
        everything = await subscribe(client, receiver.url + "/all", events=["turn.completed"])
        openai.push(Reply(text="a"), Reply(text="b"))
        await turn(client, other)
        await turn(client, cid)
        with trio.fail_after(10):
            await receiver.wait(lambda r: len(r.accepted) >= 3)
        paths = sorted(r.path for r in receiver.accepted)
        assert paths == ["/all", "/all", "/mine"]
    listed = (await client.get("/agentik/webhooks")).json()["webhooks"]
    assert {h["id"] for h in listed} == {mine["id"], everything["id"]}
    assert all("secret" not in h for h in listed)
    for bad in ({"url": "ftp://x", "events": ["turn.completed"]},
                {"url": "http://127.0.0.1:1/", "events": []},
                {"url": "http://127.0.0.1:1/", "events": ["turn.nope"]},
                {"url": "http://127.0.0.1:1/", "events": ["turn.failed"], "agent": "nobody"},
                {"events": ["turn.failed"]}):
        response = await client.post("/agentik/webhooks", json=bad)
        assert response.status_code == 400, (bad, response.text)
    assert (await client.get("/agentik/webhooks/nope")).status_code == 404
    assert (await client.get("/agentik/webhooks/nope/deliveries")).status_code == 404
    assert (await client.delete(f"/agentik/webhooks/{mine['id']}")).status_code == 204
    assert (await client.delete(f"/agentik/webhooks/{mine['id']}")).status_code == 404
    assert (await client.get(f"/agentik/webhooks/{everything['id']}/deliveries",
                             params={"limit": 0})).status_code == 400


_ = Receiver


async def test_the_settings_file_subscriptions(
    tmp_path: Any, openai: ScriptedOpenAI, engine: str | None
) -> None:
    """AGENTIK_WEBHOOKS' subscriptions exist from start-up, deliver with the file's secret,
    cannot be deleted by the route (409), and go when the file no longer names them; a file
    with a mistake stops start-up naming the setting."""
    from agentik import open_runtime
    from agentik.errors import ConfigError
    from agentik.testing import ScriptedLlm

    secret = "whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"
    path = tmp_path / "webhooks.toml"
    async with open_receiver() as receiver:
        path.write_text(f'[[webhook]]\nid = "ops"\nurl = "{receiver.url}/ops"\n'
                        f'events = ["conversation.created"]\nsecret = "{secret}"\n')
        cfg = make_config(tmp_path, openai, webhooks_file=str(path))
        with trio.fail_after(30):
            async with serve_app(cfg) as server, httpx2.AsyncClient(
                    base_url=server.url, timeout=10) as client:
                listed = (await client.get("/agentik/webhooks")).json()["webhooks"]
                assert [(h["id"], h["source"]) for h in listed] == [("ops", "file")]
                cid = await create(client)
                await receiver.wait(lambda r: len(r.accepted) >= 1)
                got = standardwebhooks.Webhook(secret).verify(receiver.accepted[0].body,
                                                              receiver.accepted[0].headers)
                assert got["data"]["conversation_id"] == cid
                response = await client.delete("/agentik/webhooks/ops")
                assert response.status_code == 409 and "AGENTIK_WEBHOOKS" in response.text
            path.write_text("")
            async with serve_app(cfg) as server, httpx2.AsyncClient(
                    base_url=server.url, timeout=10) as client:
                assert (await client.get("/agentik/webhooks")).json()["webhooks"] == []
    path.write_text('[[webhook]]\nid = "x"\n')
    with pytest.raises(ConfigError, match="AGENTIK_WEBHOOKS"):
        async with open_runtime(cfg, llm=ScriptedLlm([])):
            pass


async def test_events_the_outbox_trimmed_before_delivery_are_recorded_as_lost(
    tmp_path: Any, openai: ScriptedOpenAI, engine: str | None
) -> None:
    """A receiver down while the outbox (cap 4) trims past the subscription's cursor: the event
    in hand is still sent, the trimmed ones are one ``lost`` line of the delivery log and the
    metric's count, the ones left are sent after it, in order, once."""
    cfg = make_config(tmp_path, openai, webhook_max_backoff=0.05, outbox_cap=4,
                      subscriber_buffer=2)
    with trio.fail_after(30):
        async with open_receiver() as receiver, serve_app(cfg) as server, httpx2.AsyncClient(
                base_url=server.url, timeout=10) as client:
            before = await scrape(client)
            hook = await subscribe(client, receiver.url + "/in", events=["conversation.created"])
            receiver.down = True
            cids = [await create(client)]
            await receiver.wait(lambda r: len(r.requests) >= 1)  # failing, held by its task
            cids += [await create(client) for _ in range(9)]
            receiver.down = False

            def last_one(r: Receiver) -> bool:
                return any(cids[-1].encode() in got.body for got in r.accepted)

            await receiver.wait(last_one)
            log = await deliveries(client, hook["id"])
            after = await scrape(client)
    got = [msgspec.json.decode(r.body)["data"]["conversation_id"] for r in receiver.accepted]
    offsets = [offset_of(r.headers["webhook-id"]) for r in receiver.accepted]
    assert offsets == sorted(set(offsets)) and got[0] == cids[0]
    (lost,) = [d for d in log if d["outcome"] == "lost"]
    assert "trimmed from the outbox before delivery" in lost["error"]
    first, last = (int(n) for n in lost["error"].split()[1].split(".."))
    assert lost["offset"] == first <= last
    # every event is either sent or counted lost, none twice: the offsets from the first on
    lost_range = set(range(first, last + 1))
    assert not lost_range & set(offsets)
    assert sorted(lost_range | set(offsets)) == list(range(offsets[0], offsets[-1] + 1))
    assert len(offsets) + len(lost_range) == len(cids)
    key = ("agentik_webhook_deliveries_total", (("outcome", "lost"),))
    assert after[key] - before.get(key, 0.0) == len(lost_range)


async def test_an_event_failing_past_the_retry_time_is_given_up_and_the_next_goes(
    tmp_path: Any, openai: ScriptedOpenAI, engine: str | None
) -> None:
    """AGENTIK_WEBHOOK_RETRY_FOR after its first failure an event is given up (a ``gave_up``
    line, counted) and the next one is sent; the lag metric says how long the failing one has
    been failing, and 0 once nothing fails."""
    cfg = make_config(tmp_path, openai, webhook_max_backoff=0.05, webhook_retry_for=0.5)
    with trio.fail_after(30):
        async with open_receiver() as receiver, serve_app(cfg) as server, httpx2.AsyncClient(
                base_url=server.url, timeout=10) as client:
            hook = await subscribe(client, receiver.url + "/in", events=["conversation.created"])
            receiver.down = True
            first = await create(client)
            await receiver.wait(lambda r: len(r.requests) >= 2)
            lag = ("agentik_webhook_lag_seconds", ())
            assert (await scrape(client))[lag] > 0
            while True:  # (the given-up line: a row, polled; no request follows it to wait on)
                if any(d["outcome"] == "gave_up" for d in await deliveries(client, hook["id"])):
                    break
                await trio.sleep(0.05)
            receiver.down = False
            second = await create(client)
            await receiver.wait(lambda r: len(r.accepted) >= 1)
            log = await deliveries(client, hook["id"])
            metrics = await scrape(client)
    assert [msgspec.json.decode(r.body)["data"]["conversation_id"]
            for r in receiver.accepted] == [second]
    gave_up = [d for d in log if d["outcome"] == "gave_up"]
    assert len(gave_up) == 1 and gave_up[0]["status"] == 503
    assert all(d["outcome"] == "failed" for d in log if d["offset"] == gave_up[0]["offset"]
               and d["attempt"] < gave_up[0]["attempt"])
    assert metrics[lag] == 0
    assert metrics[("agentik_webhook_deliveries_total", (("outcome", "gave_up"),))] >= 1
    _ = first


async def test_the_python_client_and_the_in_process_agent_answer_alike(
    server: Server, openai: ScriptedOpenAI
) -> None:
    """``agent.webhooks`` over HTTP (agentik.client) and in-process: the same calls, the same
    answers, the same errors."""
    from agentik.client import AgentikAgent
    from agentik.errors import InvalidInputError, NotFoundError

    local = server.agent.webhooks
    async with AgentikAgent("test", server.url) as remote:
        made = await remote.webhooks.create("http://127.0.0.1:9/in", ["turn.failed"])
        assert made.secret.startswith("whsec_")
        other = await local.create("http://127.0.0.1:9/other", ["conversation.created"],
                                   conversation_id="c")
        assert await remote.webhooks.all() == await local.all()
        assert [w.id for w in await local.all()] == [made.id, other.id]
        assert await remote.webhooks.get(other.id) == await local.get(other.id)
        assert await remote.webhooks.deliveries_of(made.id) == await local.deliveries_of(made.id)
        for agent in (remote.webhooks, local):
            with pytest.raises(InvalidInputError):
                await agent.create("http://127.0.0.1:9/", ["nope"])
            with pytest.raises(NotFoundError):
                await agent.get("nope")
        await remote.webhooks.delete(made.id)
        with pytest.raises(NotFoundError):
            await local.delete(made.id)
        with pytest.raises(InvalidInputError):
            await remote.webhooks.deliveries_of(other.id, limit=0)


async def test_an_agent_filter_knows_a_deleted_conversations_agent_after_a_restart(
    tmp_path: Any, openai: ScriptedOpenAI, engine: str | None
) -> None:
    """A conversation made before the subscription and a restart, deleted after them: its
    ``deleted`` event names its agent, so a subscription to that agent's events gets it (the
    conversation is gone by the time its event is sent: nothing else could tell)."""
    cfg = make_config(tmp_path, openai)
    with trio.fail_after(30):
        async with open_receiver() as receiver:
            async with serve_app(cfg) as server, httpx2.AsyncClient(
                    base_url=server.url, timeout=10) as client:
                cid = await create(client)  # before the subscription: its created is not seen
                await subscribe(client, receiver.url + "/in", agent="default",
                                events=["conversation.deleted"])
            async with serve_app(cfg) as server, httpx2.AsyncClient(
                    base_url=server.url, timeout=10) as client:
                assert (await client.delete(f"/agentik/conversations/{cid}")).status_code == 204
                await receiver.wait(lambda r: len(r.accepted) >= 1)
    body = msgspec.json.decode(receiver.accepted[0].body)
    assert body["type"] == "conversation.deleted"
    assert body["data"] == {"conversation_id": cid, "agent": "default"}


async def test_a_url_the_client_refuses_fails_its_attempts_and_nothing_else(
    server: Server, client: httpx2.AsyncClient, openai: ScriptedOpenAI, allow_error_logs: None
) -> None:
    """A stored subscription whose URL the HTTP client refuses (put in place below the routes'
    check, as an older server may have stored it) fails its own attempts, logged; the server
    and the other subscriptions go on."""
    from agentik.storage import ops

    storage = server.agent._deps.storage
    bad = ops.WebhookSpec(id="bad", url="http://[::1/in", events=("conversation.created",),
                          secret="whsec_" + "QUJD" * 8)
    await storage.write(ops.PutWebhook(spec=bad, after=storage.hub.head))
    with trio.fail_after(20):
        async with open_receiver() as receiver:
            await subscribe(client, receiver.url + "/ok", events=["conversation.created"])
            cid = await create(client)
            await receiver.wait(lambda r: len(r.accepted) >= 1)
            while True:  # (its first attempt's line: a row, polled)
                if await deliveries(client, "bad"):
                    break
                await trio.sleep(0.05)
    assert msgspec.json.decode(receiver.accepted[0].body)["data"]["conversation_id"] == cid
    (line, *_) = await deliveries(client, "bad")
    assert line["outcome"] == "failed" and line["status"] is None and line["error"]
    assert (await client.get("/healthz")).status_code == 200
