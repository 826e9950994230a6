"""AGENTIK_LOG_FORMAT=json (issue 14): a real ``agentik serve`` process; every line it writes,
hypercorn's own included, parses as one JSON object with the listed fields."""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path

import httpx2
import trio

from agentik.web.logjson import JsonFormatter
from tests.scripted_openai import Reply, open_scripted_openai
from tests.test_web_lifespan import env_for, spawn

SERVE = [sys.executable, "-m", "agentik.cli", "serve", "--port", "0"]


async def test_json_logs_parse_line_by_line(tmp_path: Path) -> None:
    async with open_scripted_openai() as openai:
        openai.default = Reply(text="ok")
        env = env_for(tmp_path, openai, AGENTIK_LOG_FORMAT="json")
        async with spawn(SERVE, env, tmp_path) as p:
            with trio.fail_after(60):
                url = await p.base_url()
            async with httpx2.AsyncClient(base_url=url, timeout=10,
                                          headers={"X-Client-Id": "tester\x1b1"}) as http:
                cid = (await http.post("/agentik/conversations", json={})).json()["id"]
                sent = await http.post(f"/agentik/conversations/{cid}/messages",
                                       json={"content": [{"type": "text", "body": "hi"}]})
                assert sent.status_code == 202
                assert (await http.get("/agentik/nowhere?x=1")).status_code == 404
            p.process.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                assert await p.exit_code() == 0, p.output
    lines = [line for line in p.output.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records), records
    assert any(r["logger"] == "hypercorn.error" and "Running on" in r["msg"] for r in records)
    access = [r for r in records if r["logger"] == "agentik.web.access"]
    posted = next(r for r in access if r["method"] == "POST" and r["path"].endswith("/messages"))
    assert posted["status"] == 202 and isinstance(posted["duration_ms"], float)
    assert posted["client_id"] == "tester\\x1b1"  # escaped as in text mode
    missing = next(r for r in access if r["status"] == 404)
    assert missing["path"] == "/agentik/nowhere?x=1"


def test_turn_fields_and_exceptions_in_json() -> None:
    record = logging.LogRecord("agentik.actors", logging.ERROR, __file__, 1, "turn %s", ("t",),
                               None)
    record.conversation_id = "c1"
    record.turn_id = "t1"
    out = json.loads(JsonFormatter().format(record))
    assert out["msg"] == "turn t" and out["level"] == "ERROR" and out["logger"] == "agentik.actors"
    assert (out["conversation_id"], out["turn_id"]) == ("c1", "t1")
    assert out["ts"].endswith("Z")
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line and "ValueError" in json.loads(line)["exc"]
