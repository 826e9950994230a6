"""MCP tools end to end: real MCP servers (tests/mcp_servers/toolbox.py, written with the mcp SDK)
over stdio (a child process) and streamable HTTP (served by hypercorn in the test's nursery), the
registry's supervision and reconnection, and turns in which the scripted model calls them."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import hypercorn.config
import hypercorn.trio
import mcp_types
import pytest
import trio
import trio.testing

import agentik
from agentik import Config, open_runtime
from agentik.errors import ConfigError, ToolError
from agentik.tools.config import (
    HttpServerConfig,
    ServerConfig,
    StdioServerConfig,
    load_mcp_config,
    parse_mcp_config,
)
from agentik.tools.mcp import McpRegistry, outcome_from_result, run_mcp_registry, tool_function_name
from agentik.wire import CommonEvent, ToolResult
from tests.mcp_servers.toolbox import build
from tests.scripted_openai import Reply, ScriptedOpenAI, ToolCalls

TOOLBOX = str(Path(__file__).parent / "mcp_servers" / "toolbox.py")
WAIT = 20  # seconds any single wait may take before the test fails instead of hanging


def stdio_entry(*extra: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [TOOLBOX, *extra]}


def write_config(tmp_path: Path, servers: dict[str, Any]) -> str:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return str(path)


@dataclass
class HttpToolbox:
    url: str
    #: (method, headers) of every HTTP request the server received
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)


@asynccontextmanager
async def serve_toolbox_http(name: str = "web") -> AsyncIterator[HttpToolbox]:
    """Serve the toolbox over streamable HTTP on 127.0.0.1:<free port> in this task's nursery."""
    app = build(name).streamable_http_app()
    box = HttpToolbox(url="")

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            box.requests.append((scope["method"], headers))
        await app(scope, receive, send)

    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.2
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            partial(hypercorn.trio.serve, recording, config, shutdown_trigger=stop.wait)
        )
        box.url = binds[0].rstrip("/") + "/mcp"
        try:
            yield box
        finally:
            stop.set()
            nursery.cancel_scope.deadline = trio.current_time() + 3


@asynccontextmanager
async def running_registry(servers: dict[str, ServerConfig], **kw: Any) -> AsyncIterator[McpRegistry]:
    kw.setdefault("backoff_initial", 0.05)
    kw.setdefault("backoff_max", 0.5)
    async with trio.open_nursery() as nursery:
        registry: McpRegistry = await nursery.start(partial(McpRegistry(servers, **kw).run))
        try:
            yield registry
        finally:
            nursery.cancel_scope.cancel()


def closed_port() -> int:
    """A local port nothing listens on (it was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def status_of(registry: McpRegistry, name: str) -> dict[str, Any]:
    return next(s for s in registry.status() if s["name"] == name)


async def wait_for(registry: McpRegistry, predicate: Callable[[], bool]) -> None:
    with trio.fail_after(WAIT):
        await registry.wait_until(predicate)


def connected(registry: McpRegistry, *names: str, retries: int = 0) -> Callable[[], bool]:
    return lambda: all(status_of(registry, n)["state"] == "connected"
                       and status_of(registry, n)["retries"] >= retries for n in names)


# --- mcp.json -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("servers", "expected"),
    [
        ({"x": {"command": "a", "args": "b"}}, 'server "x": field "args": Expected `array`'),
        ({"x": {"command": "a", "args": [1]}}, 'server "x": field "args[0]": Expected `str`'),
        ({"x": {"command": "a", "env": {"K": 1}}}, 'server "x": field "env.K": expected a string'),
        ({"x": {"command": "a", "cwd": 3}}, 'server "x": field "cwd": Expected `str | null`'),
        ({"x": {"command": ""}}, 'server "x": field "command": must not be empty'),
        ({"x": {"url": "ftp://h"}}, 'server "x": field "url": must start with http'),
        ({"x": {"url": "http://h", "headers": {"A": ["b"]}}},
         'server "x": field "headers.A": expected a string'),
        ({"x": {"url": "http://h", "command": "a"}}, 'server "x": has both "command"'),
        ({"x": {"comand": "a"}}, 'server "x": needs "command"'),
        ({"x": "npx"}, 'server "x": expected an object'),
        ({"x": {"type": "sse", "url": "http://h"}}, 'server "x": field "type": the "sse" transport'),
        ({"x": {"type": "stdio", "url": "http://h"}}, 'server "x": field "type"'),
    ],
)
def test_malformed_server_entries_name_the_server_and_the_field(
    servers: dict[str, Any], expected: str
) -> None:
    ok = {"fine": {"command": "true"}}
    with pytest.raises(ConfigError) as info:
        parse_mcp_config(json.dumps({"mcpServers": {**ok, **servers}}))
    assert info.value.variable == "AGENTIK_MCP_CONFIG"
    assert str(info.value).startswith("AGENTIK_MCP_CONFIG: ")
    assert expected in str(info.value)


def test_valid_config_in_claude_desktop_format() -> None:
    servers = parse_mcp_config(json.dumps({"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "server"], "env": {"A": "1"}, "cwd": "/tmp",
                  "disabled": False, "autoApprove": []},  # other clients' keys are ignored
        "search": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer t"}},
        "typed": {"type": "http", "url": "http://127.0.0.1:1/mcp"},
    }}))
    assert list(servers) == ["files", "search", "typed"]
    assert servers["files"] == StdioServerConfig(command="npx", args=["-y", "server"],
                                                 env={"A": "1"}, cwd="/tmp")
    assert isinstance(servers["search"], HttpServerConfig)
    assert servers["search"].headers == {"Authorization": "Bearer t"}
    assert parse_mcp_config('{"mcpServers": {}}') == {}


def test_a_file_cut_short_says_where_it_ends() -> None:
    # msgspec gives no byte offset for "truncated": the message must still point at a place.
    with pytest.raises(ConfigError) as info:
        parse_mcp_config('{"mcpServers": {\n  "a": {"command": "x"}\n')
    assert "ends early, at line 3, column 1" in str(info.value), str(info.value)


async def test_unreadable_or_broken_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match=r"cannot read .*nope\.json"):
        await load_mcp_config(missing)
    broken = tmp_path / "broken.json"
    broken.write_text('{"mcpServers": ')
    with pytest.raises(ConfigError, match=r"broken\.json.* is not valid JSON"):
        await load_mcp_config(str(broken))
    broken.write_text('{"servers": {}}')
    with pytest.raises(ConfigError, match="missing required field `mcpServers`"):
        await load_mcp_config(str(broken))


async def test_malformed_config_stops_start_up_before_anything_runs(
    config: Config, tmp_path: Path
) -> None:
    bad = write_config(tmp_path, {"ok": stdio_entry(), "broken": {"command": "x", "args": "-v"}})
    with pytest.raises(ConfigError, match='server "broken": field "args"'):
        async with open_runtime(config.replace(mcp_config=bad)):
            pytest.fail("start-up went on with a malformed mcp.json")
    with pytest.raises(ConfigError, match=r"missing\.json"):
        async with open_runtime(config.replace(mcp_config=str(tmp_path / "missing.json"))):
            pytest.fail("start-up went on without its mcp.json")
    # run_mcp_registry raises before task_status.started: nursery.start sees the error itself
    async with trio.open_nursery() as nursery:
        with pytest.raises(ConfigError):
            await nursery.start(run_mcp_registry, config.replace(mcp_config=bad))


# --- names and results ----------------------------------------------------------------------


def test_tool_names_follow_openais_function_name_rule() -> None:
    import re

    valid = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
    assert tool_function_name("files", "read_file") == "files__read_file"
    assert tool_function_name("my server", "fetch.page/v2") == "my_server__fetch_page_v2"
    long = tool_function_name("s", "x" * 100)
    assert valid.match(long) and len(long) == 64
    assert long != tool_function_name("s", "x" * 99)  # the hash keeps long names apart
    taken = {"a_b__t"}
    other = tool_function_name("a.b", "t", taken)  # "a.b" and "a_b" would collide
    assert valid.match(other) and other not in taken and other.startswith("a_b__t_")
    assert tool_function_name("ü", "é") == "____"


def test_results_become_text_and_non_text_blocks_are_summarised() -> None:
    result = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(type="text", text="line one"),
            mcp_types.ImageContent(type="image", data="aGVsbG8=", mime_type="image/png"),
            mcp_types.TextContent(type="text", text="line two"),
        ],
        structured_content={"n": 1},
        is_error=False,
    )
    outcome = outcome_from_result(result)
    assert outcome.content == "line one\n[image image/png, 5 bytes]\nline two"
    assert outcome.structured == {"n": 1} and not outcome.is_error
    only_structured = mcp_types.CallToolResult(content=[], structured_content={"n": 2}, is_error=True)
    assert outcome_from_result(only_structured).content == '{"n":2}'
    assert outcome_from_result(only_structured).is_error


# --- the registry against real servers ------------------------------------------------------


async def test_stdio_and_http_servers_expose_and_run_their_tools(tmp_path: Path) -> None:
    async with serve_toolbox_http() as web:
        servers = parse_mcp_config(json.dumps({"mcpServers": {
            "box": stdio_entry(), "web": {"url": web.url, "headers": {"X-Test": "yes"}}}}))
        async with running_registry(servers) as registry:
            # started() came before any connection: start-up never waits for a server
            assert {s["state"] for s in registry.status()} == {"connecting"}
            assert registry.specs() == []
            await wait_for(registry, connected(registry, "box", "web"))

            names = [spec.name for spec in registry.specs()]
            for server in ("box", "web"):
                for tool in ("echo", "add", "fail", "hang", "crash", "grow", "fetch_page"):
                    assert f"{server}__{tool}" in names
            add = next(spec for spec in registry.specs() if spec.name == "box__add")
            assert add.description == "Add two integers."
            assert add.parameters["properties"]["a"]["type"] == "integer"
            assert add.parameters["required"] == ["a", "b"]

            for server in ("box", "web"):
                outcome = await registry.call(f"{server}__add", {"a": 2, "b": 3})
                assert (outcome.content, outcome.is_error, outcome.structured) == (
                    "5", False, {"result": 5})
                failed = await registry.call(f"{server}__fail", {"message": "no such file"})
                assert failed.is_error and "no such file" in failed.content
                bad_args = await registry.call(f"{server}__echo", {})  # the server validates
                assert bad_args.is_error and "text" in bad_args.content
                picture = await registry.call(f"{server}__picture", {})
                assert picture.content == "[image image/png, 68 bytes]"
                page = await registry.call(f"{server}__fetch_page", {"url": "u"})
                assert page.content == "page u"  # mapped back to the original name "fetch.page"
            with pytest.raises(ToolError, match="unknown tool"):
                await registry.call("box__nope", {})

            status = registry.status()
            assert [s["name"] for s in status] == ["box", "web"]
            assert status[0] | {"tools": None} == {"name": "box", "transport": "stdio",
                                                   "state": "connected", "error": None,
                                                   "tools": None, "retries": 0}
            assert status[1]["transport"] == "http" and "web__add" in status[1]["tools"]
            json.dumps(status)  # JSON-ready as is
            # the configured headers went with every request
            assert web.requests and all(h.get("x-test") == "yes" for _, h in web.requests)


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_cancelled_call_leaves_the_session_usable(transport: str) -> None:
    async with serve_toolbox_http() as web:
        entry = stdio_entry() if transport == "stdio" else {"url": web.url}
        async with running_registry(parse_mcp_config(json.dumps({"mcpServers": {"s": entry}}))) as reg:
            await wait_for(reg, connected(reg, "s"))
            with trio.move_on_after(0.2) as scope:
                await reg.call("s__hang", {})
            assert scope.cancelled_caught
            with trio.fail_after(WAIT):
                assert (await reg.call("s__calls", {})).content == "2"  # hang, then this one
                assert (await reg.call("s__echo", {"text": "still here"})).content == "still here"
            assert status_of(reg, "s")["state"] == "connected"


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_tool_list_changed_updates_specs(transport: str) -> None:
    async with serve_toolbox_http() as web:
        entry = stdio_entry() if transport == "stdio" else {"url": web.url}
        async with running_registry(parse_mcp_config(json.dumps({"mcpServers": {"s": entry}}))) as reg:
            await wait_for(reg, connected(reg, "s"))
            assert "s__fresh" not in [spec.name for spec in reg.specs()]
            assert (await reg.call("s__grow", {"name": "fresh"})).content == "added fresh"
            await wait_for(reg, lambda: "s__fresh" in [spec.name for spec in reg.specs()])
            assert "s__fresh" in status_of(reg, "s")["tools"]
            assert (await reg.call("s__fresh", {})).content == "fresh works"


async def test_a_crashed_server_is_reconnected_after_backoff() -> None:
    servers = parse_mcp_config(json.dumps({"mcpServers": {"box": stdio_entry()}}))
    async with running_registry(servers) as reg:
        await wait_for(reg, connected(reg, "box"))
        first_pid = (await reg.call("box__pid", {})).content
        with pytest.raises(ToolError, match="Connection closed"):
            await reg.call("box__crash", {})
        await wait_for(reg, lambda: status_of(reg, "box")["retries"] >= 1)
        await wait_for(reg, connected(reg, "box", retries=1))
        assert (await reg.call("box__pid", {})).content != first_pid  # a fresh process
        assert (await reg.call("box__echo", {"text": "back"})).content == "back"
        assert status_of(reg, "box")["error"] is None


async def test_a_down_server_fails_calls_fast_and_records_why(tmp_path: Path) -> None:
    # A long backoff keeps the crashed server down for the rest of the test.
    servers = parse_mcp_config(json.dumps({"mcpServers": {"box": stdio_entry()}}))
    async with running_registry(servers, backoff_initial=60, backoff_max=60) as reg:
        await wait_for(reg, connected(reg, "box"))
        with pytest.raises(ToolError):
            await reg.call("box__crash", {})
        await wait_for(reg, lambda: status_of(reg, "box")["state"] == "failed")
        status = status_of(reg, "box")
        assert status["tools"] == [] and reg.specs() == []
        assert "closed the connection" in status["error"]
        assert "crashing on purpose" in status["error"]  # the server's last stderr lines
        with pytest.raises(ToolError, match="server 'box' is not connected"):
            await reg.call("box__echo", {"text": "hi"})


async def test_one_server_down_while_the_others_work(tmp_path: Path) -> None:
    marker = str(tmp_path / "started-once")
    servers = parse_mcp_config(json.dumps({"mcpServers": {
        "good": stdio_entry(),
        "missing": {"command": str(tmp_path / "no-such-binary")},
        "refused": {"url": f"http://127.0.0.1:{closed_port()}/mcp"},
        "flaky": stdio_entry("--crash-once", marker),  # fails its first start, then works
    }}))
    async with running_registry(servers) as reg:
        await wait_for(reg, connected(reg, "good", "flaky"))
        await wait_for(reg, lambda: all(status_of(reg, n)["retries"] >= 2
                                        for n in ("missing", "refused")))
        assert (await reg.call("good__echo", {"text": "fine"})).content == "fine"
        assert status_of(reg, "flaky")["retries"] >= 1
        assert status_of(reg, "flaky")["error"] is None
        missing, refused = status_of(reg, "missing"), status_of(reg, "refused")
        assert missing["state"] in ("failed", "retrying") and missing["tools"] == []
        assert "No such file" in missing["error"]
        assert refused["state"] in ("failed", "retrying") and "connect" in refused["error"].lower()
        assert {spec.name.split("__")[0] for spec in reg.specs()} == {"good", "flaky"}


async def test_stdio_servers_get_their_argument_list_env_and_cwd_without_a_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "agentik-secret")  # agentik's own environment
    marker = tmp_path / "pwned"
    workdir = tmp_path / "work"
    workdir.mkdir()
    name = f"box; touch {marker} $(touch {marker})"
    servers = parse_mcp_config(json.dumps({"mcpServers": {"box": {
        "command": sys.executable, "args": [TOOLBOX, "--name", name],
        "env": {"TOOLBOX_GREETING": "hello"}, "cwd": str(workdir)}}}))
    async with running_registry(servers) as reg:
        await wait_for(reg, connected(reg, "box"))
        who = json.loads((await reg.call("box__whoami", {})).content)
        assert who["name"] == name  # one argument, passed verbatim
        assert who["argv"][1:] == ["--name", name]
        assert Path(who["cwd"]) == workdir
        assert not marker.exists()
        env = {key: (await reg.call("box__environment", {"name": key})).content
               for key in ("TOOLBOX_GREETING", "OPENAI_API_KEY", "PATH")}
        assert env["TOOLBOX_GREETING"] == "hello"
        assert env["OPENAI_API_KEY"] == "<unset>"  # not inherited by MCP servers
        assert env["PATH"] != "<unset>"


async def test_a_server_that_never_answers_times_out_and_is_retried() -> None:
    mute = [sys.executable, "-c", "import sys; sys.stdin.read()"]  # reads, never answers
    servers = parse_mcp_config(json.dumps({"mcpServers": {
        "mute": {"command": mute[0], "args": mute[1:]}}}))
    async with running_registry(servers, connect_timeout=0.3) as reg:
        await wait_for(reg, lambda: status_of(reg, "mute")["retries"] >= 1)
        status = status_of(reg, "mute")
        assert "no answer to initialize and tools/list within 0.3 s" in status["error"]
        assert status["tools"] == []


async def test_cancelling_the_registry_closes_every_session() -> None:
    async with serve_toolbox_http() as web:
        servers = parse_mcp_config(json.dumps({"mcpServers": {
            "box": stdio_entry(), "web": {"url": web.url}}}))
        async with running_registry(servers) as reg:
            await wait_for(reg, connected(reg, "box", "web"))
            pid = int((await reg.call("box__pid", {})).content)
            os.kill(pid, 0)  # alive
            assert "DELETE" not in [method for method, _ in web.requests]
        # run() returned: the child was stopped and reaped, the HTTP session deleted, and
        # nothing is offered any more
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert [method for method, _ in web.requests][-1] == "DELETE"
        assert reg.specs() == []
        with pytest.raises(ToolError, match="not connected"):
            await reg.call("box__echo", {"text": "x"})


# --- in a turn ------------------------------------------------------------------------------


def mcp_of(agent: agentik.LocalAgent) -> McpRegistry:
    registry = agent.tools
    assert isinstance(registry, McpRegistry)
    return registry


async def events_until(
    agent: agentik.LocalAgent, conv: agentik.LocalConversation, cursor: Any, last: str = "touched"
) -> list[CommonEvent]:
    out: list[CommonEvent] = []
    with trio.fail_after(WAIT):
        async with aclosing(agent.outbox.conversation_events(cursor, conv.id)) as events:
            async for event in events:
                out.append(event)
                if event.type == last:
                    break
    return out


def results(events: list[CommonEvent]) -> list[ToolResult]:
    found = []
    for event in events:
        if event.type in ("tool_result", "tool_failed"):
            message = event.event.record.message  # type: ignore[union-attr]
            assert isinstance(message, ToolResult)
            found.append(message)
    return found


async def test_a_turn_runs_mcp_tools_over_stdio_and_http(
    config: Config, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    async with serve_toolbox_http() as web:
        path = write_config(tmp_path, {"box": stdio_entry(), "web": {"url": web.url}})
        scripted.push(
            ToolCalls([
                ("c1", "box__add", '{"a": 20, "b": 22}'),
                ("c2", "web__fail", '{"message": "disk full"}'),
                ("c3", "box__hang", "{}"),
                ("c4", "box__nope", "{}"),
                ("c5", "web__echo", '{"text": '),
                ("c6", "web__echo", '{"text": "over http"}'),
                ("c7", "box__big", '{"size": 100000}'),
            ]),
            Reply("The answer is 42."),
            ToolCalls([("c8", "box__calls", "{}")]),
            Reply("Still working."),
        )
        cfg = config.replace(mcp_config=path, tool_timeout=0.5)
        async with open_runtime(cfg) as agent:
            registry = mcp_of(agent)
            await wait_for(registry, connected(registry, "box", "web"))
            conv = await agent.create_conversation()
            cursor = await agent.outbox.current_cursor()
            await conv.send("what is 20 + 22?")
            events = await events_until(agent, conv, cursor)
            assert [e.type for e in events] == [
                "user_message", *["tool_call"] * 7,
                "tool_result", "tool_failed", "tool_failed", "tool_failed", "tool_failed",
                "tool_result", "tool_result", "assistant_message", "touched"]
            r = results(events)
            assert (r[0].content, r[0].structured) == ("42", {"result": 42})
            assert r[1].is_error and "disk full" in r[1].content  # the tool's error result
            assert r[2].is_error and "timed out after 0.5 s" in r[2].content
            assert r[3].is_error and "unknown tool" in r[3].content
            assert r[4].is_error and "JSON" in r[4].content
            assert r[5].content == "over http" and not r[5].is_error
            # an untrusted result is capped by the turn loop before it is stored or sent on
            assert r[6].content.startswith("x" * 1000) and "truncated" in r[6].content
            assert len(r[6].content) < 100000

            # the model was offered the MCP tools and got every result back as a tool message
            offered = {t["function"]["name"] for t in scripted.requests[0]["tools"]}
            assert {"box__add", "web__echo", "box__fetch_page"} <= offered
            tool_messages = [m for m in scripted.requests[1]["messages"] if m["role"] == "tool"]
            assert [m["tool_call_id"] for m in tool_messages] == [f"c{i}" for i in range(1, 8)]
            assert tool_messages[0]["content"] == "42"
            assert "disk full" in tool_messages[1]["content"]

            # the timed-out call left the stdio session usable for the next turn
            cursor = await agent.outbox.current_cursor()
            await conv.send("again")
            events = await events_until(agent, conv, cursor)
            assert results(events)[0].content == "4"  # add, hang, big, calls
            assert status_of(registry, "box")["retries"] == 0


async def test_structured_content_is_kept_only_within_the_result_cap(
    config: Config, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    """Structured content is untrusted and unbounded: a result whose structured content is over
    ``tool_result_cap`` is stored without it (its text, cut to the cap, stays)."""
    path = write_config(tmp_path, {"box": stdio_entry()})
    scripted.push(
        ToolCalls([("c1", "box__table", '{"rows": 2}'), ("c2", "box__table", '{"rows": 500}')]),
        Reply("Two tables."),
    )
    async with open_runtime(config.replace(mcp_config=path, tool_result_cap=1000)) as agent:
        registry = mcp_of(agent)
        await wait_for(registry, connected(registry, "box"))
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        await conv.send("tables")
        small, large = results(await events_until(agent, conv, cursor))
    assert small.structured == {"rows": ["r" * 20] * 2} and not small.is_error
    assert len(json.dumps({"rows": ["r" * 20] * 500})) > 1000
    assert large.structured is None and not large.is_error
    assert "truncated" in large.content and len(large.content) < 1100


async def test_interrupt_cancels_a_running_mcp_tool_call(
    config: Config, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    path = write_config(tmp_path, {"box": stdio_entry()})
    scripted.push(ToolCalls([("c1", "box__hang", "{}")]),
                  ToolCalls([("c2", "box__echo", '{"text": "after the interrupt"}')]),
                  Reply("done"))
    async with open_runtime(config.replace(mcp_config=path, tool_timeout=60)) as agent:
        registry = mcp_of(agent)
        await wait_for(registry, connected(registry, "box"))
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        await conv.send("hang please")
        events = await events_until(agent, conv, cursor, last="tool_call")
        await trio.testing.wait_all_tasks_blocked()  # the call is waiting on the server
        assert await conv.interrupt() is True
        events += await events_until(agent, conv, events[-1].cursor)
        assert [e.type for e in events] == [
            "user_message", "tool_call", "tool_failed", "assistant_message", "interrupted",
            "touched"]  # the empty interrupted answer records the interruption in the history

        cursor = await agent.outbox.current_cursor()
        await conv.send("go on")
        events = await events_until(agent, conv, cursor)
        assert results(events)[0].content == "after the interrupt"
        assert events[-2].type == "assistant_message"
        assert status_of(registry, "box")["retries"] == 0  # the same session served both


async def test_a_server_crash_mid_turn_is_a_tool_failure_and_the_next_turn_reconnects(
    config: Config, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    path = write_config(tmp_path, {"box": stdio_entry()})
    scripted.push(ToolCalls([("c1", "box__crash", "{}")]), Reply("It crashed."),
                  ToolCalls([("c2", "box__echo", '{"text": "back again"}')]), Reply("Back."))
    async with open_runtime(config.replace(mcp_config=path, tool_timeout=10)) as agent:
        registry = mcp_of(agent)
        await wait_for(registry, connected(registry, "box"))
        conv = await agent.create_conversation()
        cursor = await agent.outbox.current_cursor()
        await conv.send("crash it")
        events = await events_until(agent, conv, cursor)
        assert [e.type for e in events] == ["user_message", "tool_call", "tool_failed",
                                            "assistant_message", "touched"]
        assert "Connection closed" in results(events)[0].content
        # the runtime's registry reconnects on its own (default backoff)
        await wait_for(registry, connected(registry, "box", retries=1))
        cursor = await agent.outbox.current_cursor()
        await conv.send("try again")
        events = await events_until(agent, conv, cursor)
        assert results(events)[0].content == "back again"


# --- over the HTTP facade -------------------------------------------------------------------


async def test_a_full_turn_over_http_calls_an_mcp_tool(
    config: Config, scripted: ScriptedOpenAI, tmp_path: Path
) -> None:
    import httpx2

    from tests.webutil import open_sse, serve_app

    path = write_config(tmp_path, {"box": stdio_entry(), "down": {"command": str(tmp_path / "no")}})
    scripted.push(ToolCalls([("c1", "box__add", '{"a": 40, "b": 2}')]), Reply("It is 42."))
    async with serve_app(config.replace(mcp_config=path, tool_timeout=10)) as server:
        registry = mcp_of(server.agent)
        await wait_for(registry, lambda: connected(registry, "box")()
                       and status_of(registry, "down")["retries"] >= 1)
        async with httpx2.AsyncClient(base_url=server.url, timeout=WAIT) as client:
            tools = (await client.get("/agentik/tools")).json()
            # docs/PROTOCOL.md and the OpenAPI document: {"servers": McpRegistry.status()}
            assert isinstance(tools, dict) and list(tools) == ["servers"], tools
            box, down = tools["servers"]
            assert box["name"] == "box" and box["state"] == "connected" and box["retries"] == 0
            assert "box__add" in box["tools"] and box["error"] is None
            assert down["state"] in ("failed", "retrying") and "No such file" in down["error"]

            created = await client.post("/agentik/conversations", json={})
            cid = created.json()["id"]
            async with open_sse(client, f"/agentik/conversations/{cid}/events") as stream:
                sent = await client.post(f"/agentik/conversations/{cid}/messages",
                                         json={"content": [{"type": "text", "body": "40 + 2?"}]})
                assert sent.status_code == 202, sent.text
                with trio.fail_after(WAIT):
                    frames = await stream.until("touched")
        assert [f.event for f in frames] == ["user_message", "tool_call", "tool_result",
                                             "assistant_message", "touched"]
        [result] = results([f.common() for f in frames])
        assert (result.name, result.content, result.is_error) == ("box__add", "42", False)
        answer = frames[3].json()["event"]["record"]["message"]
        assert answer["content"] == [{"type": "text", "body": "It is 42."}]
        tool_messages = [m for m in scripted.requests[1]["messages"] if m["role"] == "tool"]
        assert [(m["tool_call_id"], m["content"]) for m in tool_messages] == [("c1", "42")]
