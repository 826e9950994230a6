"""Parse the Claude-Desktop-format ``mcp.json`` named by ``AGENTIK_MCP_CONFIG`` (docs/TOOLS.md)::

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv"],
                  "env": {"DEBUG": "1"}, "cwd": "/srv"},
        "search": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ..."}}
    }}

An entry with ``command`` is a stdio server (started with an argument list, never through a shell);
one with ``url`` is a streamable-HTTP server. An optional ``type`` field (``stdio``, ``http``,
``streamable-http``, as other MCP clients write it) must agree with that; ``sse`` is refused (the
old HTTP+SSE transport is not supported). Keys other MCP clients add (``disabled``,
``autoApprove``, ...) are ignored, so a file shared with Claude Desktop loads as is.

Every problem raises :class:`agentik.errors.ConfigError` for ``AGENTIK_MCP_CONFIG`` whose message
names the file or the server and the field, e.g.
``AGENTIK_MCP_CONFIG: server "files": field "args": Expected `array`, got `str```.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec
import trio

from agentik.errors import ConfigError

VARIABLE = "AGENTIK_MCP_CONFIG"

_STDIO_TYPES = frozenset({"stdio"})
_HTTP_TYPES = frozenset({"http", "streamable-http", "streamable_http", "streamableHttp"})


class StdioServerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A server agentik starts as a child process and talks to over stdin/stdout."""

    command: str
    args: list[str] = []
    #: added to the small safe environment the mcp SDK gives children (HOME, PATH, USER, ...)
    env: dict[str, str] = {}
    cwd: str | None = None
    type: str | None = None


class HttpServerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A server agentik reaches over streamable HTTP."""

    url: str
    headers: dict[str, str] = {}
    type: str | None = None


ServerConfig = StdioServerConfig | HttpServerConfig


class _File(msgspec.Struct, frozen=True):
    mcpServers: dict[str, Any]  # the key Claude Desktop writes


_BYTE = re.compile(r"\s*\(byte (\d+)\)$")


def _located(exc: msgspec.DecodeError, data: bytes | str) -> str:
    """msgspec's message with its byte offset given as line and column (1-based), as an editor
    shows them."""
    text = str(exc)
    raw = data.encode() if isinstance(data, str) else data
    match = _BYTE.search(text)
    if match is not None:
        return f"{text[: match.start()]} at {_place(raw[: int(match.group(1))])}"
    if "truncated" in text:
        # A file cut short has no byte offset in msgspec's message: its end is the place.
        return f"the JSON ends early, at {_place(raw)}"
    return text


def _place(before: bytes) -> str:
    """'line L, column C' (1-based) of the byte just after ``before``."""
    line = before.count(b"\n") + 1
    column = len(before) - (before.rfind(b"\n") + 1) + 1
    return f"line {line}, column {column}"


def parse_mcp_config(data: bytes | str, source: str = "the file") -> dict[str, ServerConfig]:
    """Parse the text of an ``mcp.json``; ``source`` names it in messages. Returns the servers in
    file order. Raises ConfigError naming the server and the field."""
    try:
        parsed = msgspec.json.decode(data, type=_File)
    except msgspec.ValidationError as exc:
        raise ConfigError(VARIABLE, f"{source}: {_field_message(exc)}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(VARIABLE, f"{source} is not valid JSON: {_located(exc, data)}") from None
    except RecursionError:
        raise ConfigError(VARIABLE, f"{source} is not valid JSON: nested too deeply") from None
    return {name: _parse_server(name, entry) for name, entry in parsed.mcpServers.items()}


async def load_mcp_config(path: str) -> dict[str, ServerConfig]:
    """Read and parse the file at ``path``. Raises ConfigError naming the path when it cannot be
    read, or naming the server and the field when it is malformed."""
    try:
        data = await trio.Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(VARIABLE, f"cannot read {path!r}: {exc.strerror or exc}") from None
    return parse_mcp_config(data, source=repr(path))


def _parse_server(name: str, entry: Any) -> ServerConfig:
    where = f"server {_quote(name)}"
    if not name.strip():
        raise ConfigError(VARIABLE, "a server has an empty name")
    if not isinstance(entry, Mapping):
        raise ConfigError(VARIABLE, f"{where}: expected an object, got {_json_type(entry)}")
    kind = entry.get("type")
    if kind is not None and not isinstance(kind, str):
        raise ConfigError(VARIABLE, f'{where}: field "type": expected a string, got {_json_type(kind)}')
    if kind == "sse":
        raise ConfigError(VARIABLE, f'{where}: field "type": the "sse" transport is not supported; '
                                    "use a streamable-HTTP url")
    if kind is not None and kind not in _STDIO_TYPES | _HTTP_TYPES:
        raise ConfigError(VARIABLE, f'{where}: field "type": unknown transport {kind!r} '
                                    '(expected "stdio" or "http")')
    has_command, has_url = "command" in entry, "url" in entry
    if has_command and has_url:
        raise ConfigError(VARIABLE, f'{where}: has both "command" (stdio) and "url" (HTTP); '
                                    "keep one")
    if not has_command and not has_url:
        raise ConfigError(VARIABLE, f'{where}: needs "command" (a stdio server) or "url" '
                                    "(a streamable-HTTP server)")
    if (has_command and kind in _HTTP_TYPES) or (has_url and kind in _STDIO_TYPES):
        raise ConfigError(VARIABLE, f'{where}: field "type": {kind!r} does not match the '
                                    f'{"command" if has_command else "url"} given')
    for field in ("env", "headers"):
        # msgspec reports a bad map value as `env[...]`; name the key ourselves.
        values = entry.get(field)
        if isinstance(values, Mapping):
            for key, value in values.items():
                if not isinstance(value, str):
                    raise ConfigError(VARIABLE, f'{where}: field "{field}.{key}": expected a string, '
                                                f"got {_json_type(value)}")
    target: type[ServerConfig] = StdioServerConfig if has_command else HttpServerConfig
    try:
        server = msgspec.convert(entry, target)
    except msgspec.ValidationError as exc:
        raise ConfigError(VARIABLE, f"{where}: {_field_message(exc)}") from None
    if isinstance(server, StdioServerConfig):
        if not server.command.strip():
            raise ConfigError(VARIABLE, f'{where}: field "command": must not be empty')
    elif not server.url.startswith(("http://", "https://")):
        raise ConfigError(VARIABLE, f'{where}: field "url": must start with http:// or https://, '
                                    f"got {server.url!r}")
    return server


_AT = re.compile(r"^(?P<what>.*) - at `\$\.?(?P<path>[^`]*)`$", re.DOTALL)


def _field_message(exc: msgspec.ValidationError) -> str:
    """msgspec says ``Expected `str`, got `int` - at `$.args[0]```; put the field first."""
    text = str(exc)
    match = _AT.match(text)
    if match is None or not match["path"]:
        return text
    return f'field "{match["path"]}": {match["what"]}'


def _quote(name: str) -> str:
    return msgspec.json.encode(name).decode()


def _json_type(value: Any) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "an array"
        case _:
            return type(value).__name__
