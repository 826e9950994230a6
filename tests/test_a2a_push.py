"""A2A push notifications (docs/WEBHOOKS.md, docs/A2A.md) against a real hypercorn, the scripted
OpenAI server and a real receiver: a config given with SendMessage gets every change of its task
as a StreamResponse (validated with a2a-sdk's protobuf types) with its token and credentials,
in order; the config methods' answers; a push URL into the server's own network is refused
unless AGENTIK_PUSH_ALLOW_PRIVATE."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

from pathlib import Path

import msgspec
import trio
from a2a.types import a2a_pb2 as pb

from agentik.config import Config
from tests.receiver import open_receiver
from tests.scripted_openai import Reply, ScriptedOpenAI
from tests.test_a2a import a2a_server, message, pb_check
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    make_config,
    no_error_logs,
    openai,
)


def push_config(url: str, **more: object) -> dict[str, object]:
    return {"url": url, "token": "tok-1",
            "authentication": {"scheme": "Bearer", "credentials": "secret-1"}, **more}


async def test_a_config_given_with_the_message_gets_each_change_in_order(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    cfg: Config = make_config(tmp_path, openai, push_allow_private=True)
    openai.push(Reply("Paris."))
    with trio.fail_after(30):
        async with open_receiver() as receiver, a2a_server(cfg) as (server, rpc):
            sent = await rpc.call("SendMessage", {
                "message": message("Capital of France?"),
                "configuration": {"taskPushNotificationConfig": push_config(
                    receiver.url + "/push", id="p1")}}, pb.SendMessageResponse)
            task = sent["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED"

            def done(r: object) -> bool:
                return any(b"TASK_STATE_COMPLETED" in got.body for got in receiver.accepted)

            await receiver.wait(done)
            listed = await rpc.call("ListTaskPushNotificationConfigs", {"taskId": task["id"]})
            # its task ended and its last change is sent: the config stops following the outbox
            await server.agent.webhooks.deliveries.wait_stopped(f"a2a/{task['id']}/p1")
    assert listed["configs"] == [{"id": "p1", "taskId": task["id"], **push_config(
        receiver.url + "/push")}]
    assert listed["nextPageToken"] == ""
    updates = []
    for got in receiver.accepted:
        assert got.headers["x-a2a-notification-token"] == "tok-1"
        assert got.headers["authorization"] == "Bearer secret-1"
        body = msgspec.json.decode(got.body)
        pb_check(body, pb.StreamResponse)
        (kind,) = body  # one field: task, statusUpdate, artifactUpdate or message
        updates.append((got.headers["webhook-id"], kind, body[kind]))
    ids = [int(i.rpartition(":")[2]) for i, _, _ in updates]
    assert ids == sorted(set(ids))
    assert all(u[2].get("taskId", u[2].get("id")) == task["id"] for u in updates)
    last = updates[-1]
    assert last[1] == "statusUpdate" and last[2]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_the_config_methods(tmp_path: Path, openai: ScriptedOpenAI) -> None:
    """Create (an id made when none is given), Get, List, Delete (twice: no error), Get after
    it: an error; an unknown task: -32001; a loopback URL: -32602 without
    AGENTIK_PUSH_ALLOW_PRIVATE."""
    cfg = make_config(tmp_path, openai)
    openai.push(Reply("ok"))
    with trio.fail_after(30):
        async with a2a_server(cfg) as (_, rpc):
            task = (await rpc.call("SendMessage", {"message": message("hi")}))["task"]
            tid = task["id"]
            public = "https://8.8.8.8/hook"  # never posted to: the task has ended
            made = await rpc.call("CreateTaskPushNotificationConfig",
                                  {"taskId": tid, **push_config(public)},
                                  pb.TaskPushNotificationConfig)
            assert made["id"] and made["taskId"] == tid and made["url"] == public
            snake = await rpc.call("CreateTaskPushNotificationConfig",
                                   {"task_id": tid, "id": "two", "url": public})
            assert snake == {"id": "two", "taskId": tid, "url": public}
            got = await rpc.call("GetTaskPushNotificationConfig", {"taskId": tid, "id": "two"})
            assert got == snake
            listed = await rpc.call("ListTaskPushNotificationConfigs", {"taskId": tid})
            assert {c["id"] for c in listed["configs"]} == {made["id"], "two"}
            page = await rpc.call("ListTaskPushNotificationConfigs",
                                  {"taskId": tid, "pageSize": 1})
            assert len(page["configs"]) == 1 and page["nextPageToken"]
            for _ in range(2):
                await rpc.call("DeleteTaskPushNotificationConfig", {"taskId": tid, "id": "two"})
            await rpc.error("GetTaskPushNotificationConfig", {"taskId": tid, "id": "two"},
                            -32602)
            await rpc.error("GetTaskPushNotificationConfig", {"taskId": "nope", "id": "x"},
                            -32001)
            await rpc.error("ListTaskPushNotificationConfigs", {"taskId": "nope"}, -32001)
            for private in ("http://127.0.0.1:9/", "http://10.0.0.1/", "http://[::1]/",
                            "http://localhost/", "http://169.254.169.254/latest"):
                error = await rpc.error("CreateTaskPushNotificationConfig",
                                        {"taskId": tid, "url": private}, -32602)
                assert "private" in error["message"]
            # refused before anything is stored (returnImmediately stores a task at once)
            await rpc.error("SendMessage", {"message": message("again", message_id="m2"),
                                            "configuration": {"returnImmediately": True,
                                                              "taskPushNotificationConfig": {
                                                                  "url": "http://127.0.0.1:9/"}}},
                            -32602)
            assert (await rpc.call("ListTasks", {}))["totalSize"] == 1


async def test_webhooks_are_for_admins_and_a_push_config_for_the_tasks_user(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    """With a users file: a user gets 403 from every webhook route, an admin 201; bob's push
    config calls on alice's task answer as for a missing task (-32001), alice's succeed."""
    import httpx2

    from tests.test_a2a import Rpc
    from tests.usersutil import bearer, write_users
    from tests.webutil import serve_app

    users = write_users(tmp_path / "users.toml")
    cfg = make_config(tmp_path, openai, users_file=str(users))
    openai.push(Reply("ok"))
    with trio.fail_after(30):
        async with serve_app(cfg) as server:
            clients = {who: httpx2.AsyncClient(base_url=server.url, timeout=10,
                                               headers=bearer(who)) for who in
                       ("alice", "bob", "root")}
            async with clients["alice"], clients["bob"], clients["root"]:
                body = {"url": "http://127.0.0.1:9/h", "events": ["turn.failed"]}
                for method, path in (("POST", "/agentik/webhooks"), ("GET", "/agentik/webhooks"),
                                     ("GET", "/agentik/webhooks/x"),
                                     ("DELETE", "/agentik/webhooks/x"),
                                     ("GET", "/agentik/webhooks/x/deliveries")):
                    response = await clients["alice"].request(
                        method, path, json=body if method == "POST" else None)
                    assert response.status_code == 403, (method, path, response.text)
                made = await clients["root"].post("/agentik/webhooks", json=body)
                assert made.status_code == 201
                alice, bob = Rpc(clients["alice"]), Rpc(clients["bob"])
                task = (await alice.call("SendMessage", {"message": message("hi")}))["task"]
                # a public address (a push URL's rule), never posted to: the task has ended
                config = {"taskId": task["id"], "id": "p", "url": "https://8.8.8.8/h"}
                await bob.error("CreateTaskPushNotificationConfig", config, -32001)
                await alice.call("CreateTaskPushNotificationConfig", config)
                for method in ("GetTaskPushNotificationConfig",
                               "DeleteTaskPushNotificationConfig"):
                    await bob.error(method, {"taskId": task["id"], "id": "p"}, -32001)
                await bob.error("ListTaskPushNotificationConfigs", {"taskId": task["id"]},
                                -32001)
                assert (await alice.call("GetTaskPushNotificationConfig",
                                         {"taskId": task["id"], "id": "p"}))["id"] == "p"
