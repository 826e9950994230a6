"""Bad input: schemathesis over the OpenAPI document, hypothesis over WebSocket frames.

Both run against one real server in a subprocess (``agentik serve``), so a crash shows as a dead
process, and blocking HTTP calls (schemathesis uses ``requests``) do not stall a trio loop the
server shares. Invariants: no 5xx for any generated request; every WebSocket input gets error
frames or a proper close code, never a crash; the server still answers afterwards and never logs
a traceback. ``AGENTIK_LONG=1`` generates many more examples.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import requests
import schemathesis
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from schemathesis.checks import not_a_server_error
from trio_websocket import ConnectionClosed, open_websocket_url

from agentik.web.openapi import openapi_dict
from benchmarks.serverproc import REPO, free_port

# Hypothesis keeps caches in ./.hypothesis by default: keep the work tree clean.
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "agentik-hypothesis"))

LONG = os.environ.get("AGENTIK_LONG") == "1"
MAX_BODY = 65_536
SSE_PATHS = ("/events", "/live")


class LiveServer:
    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http") + "/agentik/ws"

    def alive(self) -> None:
        assert self.process.poll() is None, f"server died: {self.log.read_text()[-3000:]}"
        with urllib.request.urlopen(self.url + "/healthz", timeout=10) as response:
            assert response.status == 200


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server with no LLM reachable (turns fail fast with an error record, which is fine here)
    and a small body limit so oversized inputs are cheap to make."""
    tmp = tmp_path_factory.mktemp("fuzz")
    port = free_port()
    log = tmp / "server.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "AGENTIK_DB_PATH": str(tmp / "fuzz.db"),
        "OPENAI_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",  # nothing listens there
        "OPENAI_API_KEY": "k",
        "AGENTIK_LLM_MAX_RETRIES": "0",
        "AGENTIK_MAX_BODY_BYTES": str(MAX_BODY),
        "AGENTIK_SQLITE_SYNCHRONOUS": "NORMAL",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "agentik.cli", "serve", "--port", str(port),
         "--graceful-timeout", "0.5"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=str(REPO),
    )
    serving = threading.Event()

    def copy_output() -> None:
        # The server's output goes to the log file line by line; "Running on" says it serves.
        assert process.stdout is not None
        with open(log, "wb") as out:
            for line in process.stdout:
                out.write(line)
                out.flush()
                if b"Running on" in line:
                    serving.set()
        serving.set()  # the process ended: wake the fixture, which then sees it exited

    copier = threading.Thread(target=copy_output, daemon=True)
    copier.start()
    server = LiveServer(f"http://127.0.0.1:{port}", process, log)
    try:
        assert serving.wait(30), "the server did not start within 30 s"
        assert process.poll() is None, log.read_text(errors="replace")
        server.alive()
        yield server
        server.alive()
        text = log.read_text(errors="replace")
        records = re.split(r"\n(?=\d{4}-\d\d-\d\d )", text)  # one per log record
        tracebacks = [r for r in records if "Traceback" in r]
        assert not tracebacks, tracebacks[0][:5000]
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        copier.join(5)


# --- schemathesis over the OpenAPI document ---------------------------------------------------------

schema = schemathesis.openapi.from_dict(openapi_dict())


@schema.parametrize()
@settings(
    max_examples=300 if LONG else 25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=not LONG,
    database=None,
)
def test_openapi_no_server_error(case: Any, live: LiveServer) -> None:
    """Every generated request (valid and invalid bodies, parameters, ids, cursors) gets an
    answer below 500. SSE routes are opened, judged by their status, and closed."""
    if case.path.endswith(SSE_PATHS):
        # schemathesis reads whole bodies; an SSE stream never ends, so judge its status only.
        kwargs = case.as_transport_kwargs(base_url=live.url)
        with requests.request(**kwargs, stream=True, timeout=10) as raw:
            assert raw.status_code < 500, (kwargs, raw.status_code, raw.text[:500])
        return
    response = case.call(base_url=live.url, timeout=10)
    case.validate_response(response, checks=[not_a_server_error])


def test_openapi_document_is_served_and_matches(live: LiveServer) -> None:
    with urllib.request.urlopen(live.url + "/agentik/openapi.json", timeout=10) as response:
        assert json.loads(response.read()) == json.loads(json.dumps(openapi_dict()))


# --- hypothesis over WebSocket frames ---------------------------------------------------------------

COMMANDS = ["create", "get", "list", "send", "interrupt", "rename", "delete", "snapshot",
            "subscribe", "unsubscribe", "ping", "pong"]
SERVER_FRAMES = {"reply", "error", "events", "ping", "pong", "gap"}
# Normal, going away, unsupported data, invalid payload, policy violation, too big.
CLEAN_CLOSE = {1000, 1001, 1003, 1007, 1008, 1009}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
#: cursors that once were 500s or were wrongly accepted (issue 11 #8)
BAD_CURSORS = ["x:\u00b2", "x:\u0661\u0662", "x:\uff11", "x:" + "9" * 5000, "x:" + "9" * 20]
field_values = st.one_of(
    json_values,
    st.sampled_from(["", "events", "conversation", "live", "0:0", "x:1", "nope", "-1", "1e9",
                     *BAD_CURSORS]),
)
command_frames = st.fixed_dictionaries(
    {"type": st.sampled_from(COMMANDS)},
    optional={
        "id": st.one_of(st.text(max_size=10), st.integers(), st.none()),
        "conversation_id": field_values,
        "stream": field_values,
        "after": field_values,
        "subscription": field_values,
        "title": field_values,
        "temp": field_values,
        "content": st.one_of(
            field_values,
            st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image", "x"])},
                                            optional={"body": field_values, "data": field_values,
                                                      "mime": field_values}), max_size=3),
        ),
        "context": field_values,
        "offset": field_values,
        "limit": field_values,
    },
).map(lambda d: msgspec.json.encode(d).decode())

def deep_json(depth: int, opener: str) -> str:
    """JSON nested ``depth`` deep (deeper than msgspec's recursion limit: issue 11 #8)."""
    closer = {"[": "]", '{"a":': "}"}[opener]
    return opener * depth + ("1" if opener != "[" else "") + closer * depth


deep_frames = st.builds(
    deep_json, st.integers(min_value=1_000, max_value=MAX_BODY // 5), st.sampled_from(["[", '{"a":'])
)
frames = st.one_of(
    command_frames,
    json_values.map(lambda v: msgspec.json.encode(v).decode()),
    st.text(max_size=200),
    st.binary(max_size=200),
    deep_frames,
)


async def _exchange(url: str, batch: list[str | bytes]) -> int | None:
    """Send ``batch`` then a probe ping on one socket. Returns None if the probe was answered,
    else the close code the server sent; then checks that a fresh socket works."""
    code: int | None = None
    with trio.fail_after(20):
        with trio.CancelScope() as scope:
            async with open_websocket_url(url) as ws:
                try:
                    for frame in batch:
                        await ws.send_message(frame)
                    await ws.send_message('{"type": "ping", "id": "probe"}')
                    while True:
                        frame = json.loads(await ws.get_message())
                        assert frame["type"] in SERVER_FRAMES, frame
                        if frame["type"] == "pong" and frame.get("id") == "probe":
                            return None  # the socket survived the bad input and still answers
                except ConnectionClosed as closed:
                    assert closed.reason is not None
                    code = closed.reason.code
                    assert code in CLEAN_CLOSE, closed.reason
                    # When hypercorn closes a socket itself (1009 over its message size limit)
                    # it drops the TCP connection without waiting for our close reply, and
                    # trio-websocket's closing handshake then never ends: leave without it.
                    scope.cancel()
        # Closed: a fresh socket must work.
        async with open_websocket_url(url) as ws:
            await ws.send_message('{"type": "ping", "id": "again"}')
            while True:
                frame = json.loads(await ws.get_message())
                if frame["type"] == "pong":
                    assert frame.get("id") == "again"
                    return code


@settings(
    max_examples=1000 if LONG else 60,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=not LONG,
    database=None,
)
@given(batch=st.lists(frames, min_size=1, max_size=3))
def test_websocket_frames_never_crash(live: LiveServer, batch: list[str | bytes]) -> None:
    trio.run(_exchange, live.ws_url, batch)


@pytest.mark.parametrize("size", [MAX_BODY + 1, 2 * MAX_BODY, 16 * MAX_BODY])
def test_oversized_frame_closes_1009(live: LiveServer, size: int) -> None:
    """A frame over AGENTIK_MAX_BODY_BYTES closes the socket with 1009; the server goes on."""
    code = trio.run(_exchange, live.ws_url, ['{"type": "ping", "id": "' + "x" * size + '"}'])
    assert code == 1009


def test_empty_binary_frame(live: LiveServer) -> None:
    """Quart's ``websocket.receive()`` gives None for an empty binary frame (found by the fuzzer
    below; it used to kill the handler): an error frame, not a crash."""
    async def check() -> None:
        with trio.fail_after(10):
            async with open_websocket_url(live.ws_url) as ws:
                await ws.send_message(b"")
                frame = json.loads(await ws.get_message())
                assert frame["type"] == "error", frame

    trio.run(check)


@pytest.mark.parametrize("frame", [
    deep_json(MAX_BODY // 6, "["),
    deep_json(MAX_BODY // 6, '{"a":'),
    '{"type": "subscribe", "id": "s", "stream": "events", "after": "x:\u00b2"}',
    '{"type": "subscribe", "id": "s", "stream": "events", "after": "x:' + "9" * 5000 + '"}',
], ids=["deep-array", "deep-object", "cursor-superscript-digit", "cursor-5000-digits"])
def test_bad_frame_gets_an_error_frame_and_the_socket_stays_open(
    live: LiveServer, frame: str
) -> None:
    """Issue 11 #8: a frame nested deeper than the decoder's limit (it closed the socket with 1000
    and no error frame) or a bad cursor gets an error frame, and the socket still answers."""
    async def check() -> None:
        with trio.fail_after(20):
            async with open_websocket_url(live.ws_url) as ws:
                await ws.send_message(frame)
                error = json.loads(await ws.get_message())
                assert error["type"] == "error", error
                assert error["error"]["code"] == "invalid_input", error
                assert error["error"]["message"], error
                await ws.send_message('{"type": "ping", "id": "after"}')
                assert json.loads(await ws.get_message()) == {"type": "pong", "id": "after"}

    trio.run(check)


def test_server_still_healthy_after_fuzzing(live: LiveServer) -> None:
    live.alive()
