"""Issues 11 #5 and 17: ``/readyz`` means the same in a PostgreSQL cluster. A node that cannot
heartbeat its leases cannot run conversations, so it is not ready; a role that lost its write
privilege (an operator's REVOKE) is a store refusing writes for now, not a wrong batch: the node
is not ready and an accepted turn's writes are retried until the privilege returns.

Real server (hypercorn on 127.0.0.1), real PostgreSQL, a schema per test and a non-superuser
role per test (trust auth; the server connects as the role with ``user=`` in its URL).
"""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
import psycopg
import pytest
import trio

from agentik.errors import LeaseLostError, StorageError
from agentik.storage.engine import is_transient
from tests.conftest import PG_BASE_URL
from tests.scripted_openai import Reply, ScriptedOpenAI
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    allow_error_logs,
    make_config,
    no_error_logs,
    open_sse,
    openai,
    serve_app,
)

#: how often the tests poll a route: readiness has no event a client can wait on
POLL = 0.05


@dataclass
class Role:
    name: str
    schema: str
    url: str
    admin: psycopg.Connection[Any]

    def sql(self, statement: str) -> None:
        self.admin.execute(statement.format(role=self.name, schema=self.schema))  # type: ignore[arg-type]


@contextmanager
def login_role(pg_url: str) -> Iterator[Role]:
    """A non-superuser role that owns the test's schema; dropped afterwards."""
    name = f"agentik_{uuid.uuid4().hex[:10]}"
    schema = pg_url.rsplit("%3D", 1)[1]
    admin = psycopg.connect(PG_BASE_URL, autocommit=True)
    role = Role(name, schema, pg_url.replace("postgres@", f"{name}@", 1), admin)
    assert role.url != pg_url
    try:
        role.sql("CREATE ROLE {role} LOGIN")
        role.sql("GRANT ALL ON SCHEMA {schema} TO {role}")
        yield role
    finally:
        if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
            role.sql("DROP OWNED BY {role}")  # its tables in the test's schema, its grants
            role.sql("DROP ROLE {role}")
        admin.close()


def text(body: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "body": body}]}


async def ready_until(client: httpx2.AsyncClient, status: int) -> dict[str, Any]:
    """Poll /readyz until it answers ``status``; its body."""
    while True:
        response = await client.get("/readyz")
        if response.status_code == status:
            return dict(response.json())
        await trio.sleep(POLL)


async def answered(client: httpx2.AsyncClient, cid: str, turn: str) -> dict[str, Any]:
    """The terminal record of ``turn``, once it is stored (read from the live stream's wake-ups
    and the journal)."""
    async with open_sse(client, f"/agentik/conversations/{cid}/live") as stream:
        while True:
            response = await client.get(f"/agentik/conversations/{cid}/messages",
                                        params={"limit": 1000})
            assert response.status_code == 200, response.text
            for r in response.json():
                m = r["message"]
                if m["type"] in ("assistant_message", "error") and m.get("turn_id") == turn:
                    return dict(m)
            await stream.next_event()


async def metric(client: httpx2.AsyncClient, sample: str) -> float:
    """One sample of ``GET /metrics`` (``name`` or ``name{labels}``); 0 when absent."""
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


async def test_a_node_that_cannot_heartbeat_its_leases_is_not_ready_until_it_can(
    pg_url: str, openai: ScriptedOpenAI, allow_error_logs: None, tmp_path: Any
) -> None:
    """The lease heartbeat fails (INSERT/UPDATE on ``nodes`` revoked from the node's role; its
    other writes still work): /readyz 503 with "leases: cannot heartbeat: <why>" while storage
    itself is writable; past 0.6 TTL the node stops its actors and refuses to run
    conversations (503 lease_lost). Once heartbeats succeed again: 200, and a turn runs."""
    openai.default = Reply("fine")
    with login_role(pg_url) as role:
        config = make_config(tmp_path, openai, database_url=role.url, lease_ttl=1.0)
        async with (
            serve_app(config) as srv,
            httpx2.AsyncClient(base_url=srv.url, timeout=10) as client,
        ):
            with trio.fail_after(30):
                assert (await ready_until(client, 200))["status"] == "ready"
                cid = (await client.post("/agentik/conversations", json={})).json()["id"]
                sent = await client.post(f"/agentik/conversations/{cid}/messages",
                                         json=text("hello"))
                assert sent.status_code == 202, sent.text
                await answered(client, cid, sent.json()["message_id"])
                failures = await metric(client, "agentik_cluster_heartbeat_failures_total")
                stops = await metric(client, 'agentik_cluster_actor_stops_total{reason="no_heartbeat"}')
                assert await metric(client, "agentik_cluster_leases") == 1  # cid's

                role.sql("REVOKE INSERT, UPDATE ON {schema}.nodes FROM {role}")
                body = await ready_until(client, 503)
                assert body["status"] == "not_ready" and body["runtime"] == "running", body
                assert body["storage"]["writable"] is True, body
                (reason,) = body["reasons"]
                assert reason.startswith("leases: cannot heartbeat: "), body
                assert "permission denied" in reason, body
                while True:  # past 0.6 TTL it stops its actors and claims nothing
                    refused = await client.post(f"/agentik/conversations/{cid}/messages",
                                                json=text("refused"))
                    if refused.status_code == 503:
                        break
                    assert refused.status_code == 202, refused.text
                    await trio.sleep(POLL)
                assert refused.json()["error"]["code"] == "lease_lost", refused.text
                assert (await client.get("/readyz")).status_code == 503
                assert (await client.get("/healthz")).status_code == 200  # liveness is not it
                # what an operator's alert sees: failed heartbeats, the actor stopped for want
                # of one, no lease held
                assert await metric(client, "agentik_cluster_heartbeat_failures_total") > failures
                assert await metric(
                    client, 'agentik_cluster_actor_stops_total{reason="no_heartbeat"}') == stops + 1
                assert await metric(client, "agentik_cluster_leases") == 0

                role.sql("GRANT INSERT, UPDATE ON {schema}.nodes TO {role}")
                assert (await ready_until(client, 200))["reasons"] == []
                after = await client.post(f"/agentik/conversations/{cid}/messages",
                                          json=text("and now?"))
                assert after.status_code == 202, after.text
                end = await answered(client, cid, after.json()["message_id"])
                assert end["type"] == "assistant_message", end
        assert not srv.fatal


async def test_a_node_whose_heartbeat_hangs_stops_its_actors_and_is_not_ready(
    pg_url: str, openai: ScriptedOpenAI, allow_error_logs: None, tmp_path: Any
) -> None:
    """The heartbeat hangs (another session holds the ``nodes`` rows FOR UPDATE; the writer's
    reads of them are not blocked): past 0.6 TTL the watchdog stops the node's actors and
    /readyz is 503 "leases: cannot heartbeat: no heartbeat for ..." (the why only with a
    token, auth being on); when the lock goes, the heartbeat completes: 200, a turn runs."""
    openai.default = Reply("fine")
    schema = pg_url.rsplit("%3D", 1)[1]
    # 3 s, not 1: on a loaded 2-core machine a heartbeat (every TTL/5) can run 0.6 s late by
    # itself, and the watchdog then rightly stopped the node again under the final turn
    config = make_config(tmp_path, openai, database_url=pg_url, lease_ttl=3.0,
                         tokens=("s3cret",))
    auth = {"Authorization": "Bearer s3cret"}
    locker = psycopg.connect(PG_BASE_URL)  # a transaction stays open while it holds the lock
    try:
        async with (
            serve_app(config) as srv,
            httpx2.AsyncClient(base_url=srv.url, timeout=10, headers=auth) as client,
            httpx2.AsyncClient(base_url=srv.url, timeout=10) as public,
        ):
            with trio.fail_after(30):
                assert (await ready_until(public, 200))["status"] == "ready"
                cid = (await client.post("/agentik/conversations", json={})).json()["id"]
                locker.execute(f"SELECT 1 FROM {schema}.nodes FOR UPDATE")  # type: ignore[arg-type]
                body = await ready_until(client, 503)
                (reason,) = body["reasons"]
                assert reason.startswith("leases: cannot heartbeat: no heartbeat for "), body
                assert reason.endswith("its actors are stopped"), body
                assert body["storage"]["writable"] is True, body
                hidden = await public.get("/readyz")
                assert hidden.status_code == 503, hidden.text
                assert hidden.json()["reasons"] == ["leases: cannot heartbeat"], hidden.text
                refused = await client.post(f"/agentik/conversations/{cid}/messages",
                                            json=text("refused"))
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"]["code"] == "lease_lost", refused.text

                locker.rollback()
                assert (await ready_until(public, 200))["status"] == "ready"
                sent = await client.post(f"/agentik/conversations/{cid}/messages",
                                         json=text("and now?"))
                assert sent.status_code == 202, sent.text
                end = await answered(client, cid, sent.json()["message_id"])
                assert end["type"] == "assistant_message", end
        assert not srv.fatal
    finally:
        locker.close()


async def test_a_heartbeat_that_hung_past_the_stop_bound_does_not_make_the_node_healthy(
    pg_url: str
) -> None:
    """A heartbeat answered after STOP_AFTER x TTL renewed the lease only from when it was sent
    (now() is its transaction's start): the node, whose watchdog stopped its actors meanwhile,
    stays unhealthy (it claims nothing) until a prompt heartbeat. Were it healthy at once, it
    took a conversation that the watchdog's next look stopped: an accepted turn cancelled."""
    from agentik.storage.pg.lease import STOP_AFTER, Leases
    from agentik.storage.pg.writer import PgWriter

    PgWriter(pg_url, outbox_cap=1000, outbox_ttl=3600.0).close()  # the schema
    schema = pg_url.rsplit("%3D", 1)[1]
    leases = Leases(pg_url, node_id="a", ttl=1.0, addr=None)
    locker = psycopg.connect(PG_BASE_URL)
    try:
        with trio.fail_after(20):
            await leases._heartbeat()
            assert leases.healthy
            locker.execute(f"SELECT 1 FROM {schema}.nodes FOR UPDATE")  # type: ignore[arg-type]
            leases.healthy = False  # what the watchdog does once the heartbeat hangs too long
            async with trio.open_nursery() as nursery:
                nursery.start_soon(leases._heartbeat)
                await trio.sleep(STOP_AFTER * leases.ttl + 0.2)  # the lock held past the bound
                locker.rollback()
            assert leases.stats["heartbeats"] == 2  # it was answered, late
            assert not leases.healthy
            with pytest.raises(LeaseLostError):
                await leases.claim("c")
            await leases._heartbeat()  # prompt
            assert leases.healthy
    finally:
        locker.close()
        for _, box in leases._lines.values():
            if box[0] is not None:
                box[0].close()


async def test_a_revoked_write_privilege_is_transient_until_granted_back(
    pg_url: str, openai: ScriptedOpenAI, allow_error_logs: None, tmp_path: Any
) -> None:
    """An operator revokes INSERT/UPDATE on agentik's tables from the node's role mid-turn (the
    lease tables stay writable, so only storage refuses): writes answer 503 ``storage``,
    /readyz 503 with PostgreSQL's "permission denied", the accepted turn's answer waits; after
    GRANT (no restart, no traffic) the probe finds the store writable, /readyz is 200 and the
    turn gets its terminal record, its whole answer."""
    gate = trio.Event()
    openai.push(Reply(["the whole ", "answer"], gate=gate))
    openai.default = Reply("fine")
    with login_role(pg_url) as role:
        config = make_config(tmp_path, openai, database_url=role.url)
        async with (
            serve_app(config) as srv,
            httpx2.AsyncClient(base_url=srv.url, timeout=10) as client,
        ):
            with trio.fail_after(30):
                cid = (await client.post("/agentik/conversations", json={})).json()["id"]
                async with open_sse(client, f"/agentik/conversations/{cid}/live") as stream:
                    sent = await client.post(f"/agentik/conversations/{cid}/messages",
                                             json=text("tell me"))
                    assert sent.status_code == 202, sent.text
                    await stream.until("append_text")  # mid-answer, held by the gate
                turn = sent.json()["message_id"]
                role.sql("REVOKE INSERT, UPDATE ON ALL TABLES IN SCHEMA {schema} FROM {role}")
                role.sql("GRANT INSERT, UPDATE ON {schema}.nodes, {schema}.conv_owner TO {role}")
                gate.set()  # the answer arrives and cannot be stored
                health = srv.agent.storage_health
                await health.wait_writable(False)
                body = await ready_until(client, 503)
                assert body["storage"]["writable"] is False, body
                assert "permission denied" in body["storage"]["error"], body
                assert body["reasons"][0].startswith("storage refuses writes: "), body
                during = await client.post(f"/agentik/conversations/{cid}/messages",
                                           json=text("during"))
                assert during.status_code == 503, during.text
                assert during.json()["error"]["code"] == "storage", during.text

                role.sql("GRANT INSERT, UPDATE ON ALL TABLES IN SCHEMA {schema} TO {role}")
                await health.wait_writable()  # the probe: nothing else is sent
                assert (await ready_until(client, 200))["status"] == "ready"
                end = await answered(client, cid, turn)
                assert end["type"] == "assistant_message", end
                assert end["content"][0]["body"] == "the whole answer", end
                assert not end["interrupted"], end
        assert not srv.fatal


def test_insufficient_privilege_from_the_server_is_transient(pg_url: str) -> None:
    """The psycopg error PostgreSQL raises for a revoked privilege (SQLSTATE 42501, a
    ProgrammingError) is transient; other ProgrammingErrors (bad SQL) stay permanent."""
    with login_role(pg_url) as role:
        role.sql("CREATE TABLE {schema}.t (x int)")
        with psycopg.connect(role.url, autocommit=True) as conn:
            for sql, transient in (("INSERT INTO t VALUES (1)", True), ("SELEC 1", False)):
                with pytest.raises(psycopg.ProgrammingError) as raised:
                    conn.execute(sql)  # type: ignore[arg-type]
                try:
                    raise StorageError(f"write failed: {raised.value}") from raised.value
                except StorageError as exc:
                    assert is_transient(exc) is transient, (sql, raised.value)
