"""MCP tools (docs/TOOLS.md): the servers of a Claude-Desktop ``mcp.json`` as one ToolRegistry.

``run_mcp_registry(config)`` parses ``AGENTIK_MCP_CONFIG`` (a malformed or missing file raises
ConfigError before anything starts), hands back an :class:`McpRegistry` at once and then
supervises one task per server: connect (stdio child process or streamable HTTP), ``initialize``,
``tools/list``, keep the session open; a server that fails to start, dies or stops answering is
logged, shown in :meth:`McpRegistry.status` and reconnected with exponential backoff, without
blocking the others or start-up. ``notifications/tools/list_changed`` re-lists that server's tools.

The model sees each tool as ``SERVER__TOOL``, sanitised to OpenAI's function-name rule
``^[a-zA-Z0-9_-]{1,64}$`` (other characters become ``_``; a name too long or already taken is cut
and given a short hash suffix), so names from different servers never collide.

Security
--------
- Processes are started only from the ``command``/``args`` of the operator's config file, as an
  argument list handed to the SDK's process spawner: never through a shell, so nothing in them is
  shell-interpreted. The child gets the SDK's small inherited environment (HOME, LOGNAME, PATH,
  SHELL, TERM, USER) plus the entry's ``env``, not agentik's own (API keys, tokens).
- HTTP servers are contacted only at the ``url`` of the config file, with its ``headers`` (which may
  hold credentials); the SDK follows redirects only within that origin. Nothing the model or a
  client sends can name a command, a URL or a server that is not in the file.
- The model only chooses among the tools the servers listed, by their mapped names; its arguments
  are passed to the server as JSON data.
- Tool descriptions, schemas and results are untrusted data from the server. Results are turned
  into text and passed to the model and the journal (the turn loop caps their size); agentik never
  evaluates, executes or renders them. Non-text blocks are only summarised, never decoded.
- A server's stderr is read into agentik's log (DEBUG, logger ``agentik.tools.mcp.transport``)
  and the last lines of it into the status error, bounded in size.

Modules: :mod:`~agentik.tools.mcp.convert` (pure: names, specs, results),
:mod:`~agentik.tools.mcp.transport` (stdio and HTTP), :mod:`~agentik.tools.mcp.connection` (one
server's state and supervised connection), :mod:`~agentik.tools.mcp.registry` (the registry).
"""

from __future__ import annotations

from agentik.tools.mcp.connection import CLEANUP_TIMEOUT, McpConnection, ServerState
from agentik.tools.mcp.convert import outcome_from_result, tool_function_name
from agentik.tools.mcp.registry import McpRegistry, run_mcp_registry

__all__ = [
    "CLEANUP_TIMEOUT",
    "McpConnection",
    "McpRegistry",
    "ServerState",
    "outcome_from_result",
    "run_mcp_registry",
    "tool_function_name",
]
