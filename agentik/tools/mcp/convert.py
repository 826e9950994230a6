"""Pure conversions of the MCP tools: tool names as the model sees them, MCP tools as ToolSpecs,
tool results as text, exceptions (and exception groups) as one line. No I/O."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Container
from typing import Any

import mcp_types
import msgspec
from mcp.shared.exceptions import MCPError

from agentik.llm.base import ToolSpec
from agentik.tools.base import ToolOutcome

__all__ = ["describe", "outcome_from_result", "tool_function_name", "tool_spec"]

_NAME_MAX = 64
_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


def tool_function_name(server: str, tool: str, taken: Container[str] = frozenset()) -> str:
    """``server__tool`` made a valid OpenAI function name (``^[a-zA-Z0-9_-]{1,64}$``) that is not
    in ``taken``: invalid characters become ``_``; a name that is too long or taken is cut and
    ends in ``_`` + 8 hex digits of a hash of the original pair."""
    raw = f"{server}__{tool}"
    name = _INVALID_NAME_CHARS.sub("_", raw)
    if len(name) <= _NAME_MAX and name not in taken:
        return name
    digest = hashlib.sha256(raw.encode()).hexdigest()
    attempt = 0
    while True:
        suffix = "_" + digest[:8] + (str(attempt) if attempt else "")
        candidate = name[: _NAME_MAX - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        attempt += 1


def outcome_from_result(result: mcp_types.CallToolResult) -> ToolOutcome:
    """The text blocks joined by newlines (other blocks summarised, e.g.
    ``[image image/png, 1234 bytes]``); the structured content as JSON when there is no block."""
    parts = [_block_text(block) for block in result.content]
    structured = result.structured_content
    content = "\n".join(parts)
    if not parts and structured is not None:
        content = msgspec.json.encode(structured).decode()
    return ToolOutcome(content=content, is_error=bool(result.is_error), structured=structured)


def _block_text(block: Any) -> str:
    match block:
        case mcp_types.TextContent():
            return block.text
        case mcp_types.ImageContent():
            return f"[image {block.mime_type}, {_b64_size(block.data)} bytes]"
        case mcp_types.AudioContent():
            return f"[audio {block.mime_type}, {_b64_size(block.data)} bytes]"
        case mcp_types.ResourceLink():
            return f"[resource link {block.uri}" + (f" {block.name}" if block.name else "") + "]"
        case mcp_types.EmbeddedResource():
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                return resource.text
            mime = f" {resource.mime_type}" if resource.mime_type else ""
            blob = getattr(resource, "blob", "")
            return f"[resource {resource.uri}{mime}, {_b64_size(blob)} bytes]"
        case _:
            return f"[{getattr(block, 'type', type(block).__name__)} content]"


def _b64_size(data: str) -> int:
    """Decoded size of base64 text, without decoding it."""
    data = data.strip()
    return max(0, len(data) * 3 // 4 - data[-2:].count("="))


def describe(exc: BaseException) -> str:
    """One line for an exception or a (nested) exception group: its distinct leaves."""
    seen: list[str] = []
    for leaf in _leaves(exc):
        text = str(leaf).strip() or type(leaf).__name__
        if type(leaf) is not MCPError and type(leaf).__name__ not in text:
            text = f"{type(leaf).__name__}: {text}"
        if text not in seen:
            seen.append(text)
    return "; ".join(seen)[:2000]


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]



def tool_spec(public: str, tool: mcp_types.Tool) -> ToolSpec:
    """``tool`` offered to the model under its mapped name ``public``."""
    return ToolSpec(
        name=public,
        description=tool.description or tool.title or "",
        parameters=dict(tool.input_schema or {"type": "object", "properties": {}}),
    )
