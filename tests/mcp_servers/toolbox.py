"""A small MCP server for agentik's tests, written with the mcp SDK.

Run it as a script::

    python tests/mcp_servers/toolbox.py                 # stdio (what agentik spawns)
    python tests/mcp_servers/toolbox.py --http          # streamable HTTP on 127.0.0.1:<free port>

With ``--http`` it prints one line, the endpoint URL (``http://127.0.0.1:PORT/mcp``), once it is
listening. Tests may also serve :func:`build` in-process (``build(...).streamable_http_app()``).

Tools:
- ``echo(text)``: returns ``text``; ``add(a, b)``: returns the sum (with structured content);
- ``fail(message)``: an error result carrying ``message``;
- ``hang()``: never returns (for timeouts and interrupts); ``calls()``: how many calls so far;
- ``crash()``: the process exits at once (``os._exit``), as a crashing server would; ``pid()``;
- ``environment(name)``, ``whoami()``: what the process was started with; ``big(size)``;
- ``meta()``: the ``_meta`` the call's request carried (as JSON); ``tally(path)``: counts its
  calls in a file (across restarts of the server and of agentik); ``block(path)``: counts, hangs;
- ``table(rows)``: structured content of any size;
- ``grow(name)``: adds a tool ``name`` and notifies ``tools/list_changed``;
- ``picture()``: an image content block; ``fetch.page(url)``: a name that needs sanitising;
- ``book(city)``: asks the client for a structured answer (an elicitation: ``nights``, ``late``)
  and says what came back (accepted with its content, declined, cancelled).

``--crash-on-start`` makes the process exit with a message on stderr before serving, and
``--crash-once FILE`` does so only if FILE does not exist yet (it creates it): a server that fails
its first start and works on the next.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from typing import Any

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

# A 1x1 transparent PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6300010000000500010d0a2db40000000049454e44ae426082"
)


def build(name: str = "toolbox") -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer(name, log_level="WARNING")
    counter = {"calls": 0}

    def count() -> None:
        counter["calls"] += 1

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        count()
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        count()
        return a + b

    @server.tool()
    def fail(message: str) -> str:
        """Always fails with the given message."""
        count()
        raise ToolError(message)

    @server.tool()
    async def hang() -> str:
        """Never returns."""
        count()
        await anyio.sleep_forever()
        return "unreachable"

    @server.tool()
    def calls() -> int:
        """How many tool calls this server has answered (this one included)."""
        count()
        return counter["calls"]

    @server.tool(structured_output=False)
    def big(size: int) -> str:
        """``size`` characters of text."""
        count()
        return "x" * size

    @server.tool()
    def table(rows: int) -> dict[str, list[str]]:
        """Structured content of ``rows`` rows of 20 characters each (and its JSON as text)."""
        count()
        return {"rows": ["r" * 20] * rows}

    @server.tool()
    def pid() -> int:
        """The server's process id."""
        count()
        return os.getpid()

    @server.tool()
    def environment(name: str) -> str:
        """The value of an environment variable of the server process ("<unset>" if missing)."""
        count()
        return os.environ.get(name, "<unset>")

    @server.tool()
    def whoami() -> str:
        """The server's name, its working directory and its command line."""
        count()
        return json.dumps({"name": server.name, "cwd": os.getcwd(), "argv": sys.argv})

    @server.tool()
    def meta(ctx: Context) -> str:
        """The ``_meta`` of this call's request, as JSON (a trace's ``traceparent`` rides in it)."""
        count()
        return json.dumps(dict(ctx.request_context.meta or {}))

    class Booking(BaseModel):
        nights: int = Field(description="how many nights")
        late: bool = Field(default=False, description="a late arrival")

    @server.tool()
    async def book(city: str, ctx: Context) -> str:
        """Book a room in ``city``: the client is asked how many nights (an elicitation)."""
        count()
        answer = await ctx.elicit(f"How many nights in {city}?", schema=Booking)
        if answer.action == "accept":
            return f"booked {answer.data.nights} nights in {city}, late={answer.data.late}"
        return f"not booked: {answer.action}"

    @server.tool()
    def tally(path: str, ctx: Context) -> str:
        """Count this call in the file ``path`` (one line a call, so the count outlives this
        process); the count so far and the call's ``_meta``, as JSON."""
        count()
        with open(path, "a") as f:
            f.write(json.dumps(dict(ctx.request_context.meta or {})) + "\n")
        with open(path) as f:
            calls = sum(1 for _ in f)
        return json.dumps({"count": calls, "meta": dict(ctx.request_context.meta or {})})

    @server.tool()
    async def block(path: str) -> str:
        """Count this call in the file ``path`` (as ``tally``), then never return."""
        count()
        with open(path, "a") as f:  # noqa: ASYNC230 - a line, before the wait
            f.write("call\n")
        await anyio.sleep_forever()
        return "unreachable"

    @server.tool()
    def crash() -> str:
        """Kill the server process."""
        sys.stderr.write("toolbox: crashing on purpose\n")
        sys.stderr.flush()
        os._exit(3)

    @server.tool()
    async def grow(name: str, ctx: Context) -> str:
        """Add a tool called ``name`` and tell the client the tool list changed."""
        count()

        def grown() -> str:
            return f"{name} works"

        server.add_tool(grown, name=name, description=f"a tool added at run time: {name}")
        await ctx.session.send_tool_list_changed()
        return f"added {name}"

    @server.tool()
    def picture() -> Image:
        """A tiny PNG."""
        count()
        return Image(data=PNG, format="png")

    @server.tool(name="fetch.page")
    def fetch_page(url: str) -> str:
        """A tool whose name is not a valid OpenAI function name."""
        count()
        return f"page {url}"

    return server


async def serve_http(server: MCPServer[Any], host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve streamable HTTP with hypercorn under trio and print the endpoint URL once bound."""
    import hypercorn.config
    import hypercorn.trio
    import trio

    config = hypercorn.config.Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.graceful_timeout = 0.5
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            partial(hypercorn.trio.serve, server.streamable_http_app(host=host), config)
        )
        print(binds[0].rstrip("/") + "/mcp", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP, not stdio")
    parser.add_argument("--name", default="toolbox")
    parser.add_argument("--crash-on-start", action="store_true")
    parser.add_argument("--crash-once", metavar="FILE")
    args = parser.parse_args()
    if args.crash_on_start or (args.crash_once and not os.path.exists(args.crash_once)):
        if args.crash_once:
            open(args.crash_once, "w").close()  # a marker file
        sys.stderr.write("toolbox: refusing to start (test crash)\n")
        sys.exit(2)
    server = build(args.name)
    if args.http:
        import trio

        trio.run(serve_http, server)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
