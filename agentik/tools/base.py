"""The ToolRegistry interface the turn loop runs tools through, and two plain implementations:
``NoTools`` (plain chat) and ``FunctionTools`` (Python callables, for embedding programs and tests).
MCP servers implement the same interface in ``agentik.tools.mcp``.

Contract: ``call`` returns a ToolOutcome (``is_error=True`` for an error result) or raises
ToolError; it may be cancelled at any await (interrupt, timeout), and must leave the registry
usable afterwards. Timeouts, argument parsing, unknown names and size caps are enforced by the turn
loop, not by implementations.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any, Literal, Protocol

import msgspec

from agentik.errors import ToolError
from agentik.llm.base import ToolSpec


class ToolOutcome(msgspec.Struct, frozen=True, kw_only=True):
    content: str
    is_error: bool = False
    structured: Any = None


#: the ``_meta`` of the tool call being run (``agentik/call_id`` and ``agentik/conversation_id``,
#: docs/TOOLS.md): set by the turn around each call, sent by the MCP registry with its request so
#: a server can tell a call it has seen (a registry of plain functions has no use for it). A
#: context variable rather than an argument: a ToolRegistry of an embedding program keeps its
#: two-argument ``call``.
CALL_META: ContextVar[dict[str, str] | None] = ContextVar("agentik_call_meta", default=None)



class Elicited(msgspec.Struct, frozen=True, kw_only=True):
    """A person's answer to a tool server's question during a call (MCP elicitation): accept
    (with ``content``, the structured answer), decline (they refused), cancel (no answer:
    the deadline passed, the turn ended)."""

    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] | None = None


#: asks the person behind the running call a tool server's question (its message, the JSON
#: schema of the answer): set by the turn around each call as CALL_META is; None: nobody to ask
Elicit = Callable[[str, dict[str, Any]], Awaitable[Elicited]]
ELICIT: ContextVar[Elicit | None] = ContextVar("agentik_elicit", default=None)


class ToolRegistry(Protocol):
    def specs(self) -> Sequence[ToolSpec]:
        """The tools offered to the model right now."""
        ...

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Run one tool. Raises ToolError when the tool cannot be run."""
        ...


class NoTools:
    def specs(self) -> Sequence[ToolSpec]:
        return ()

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        raise ToolError(f"unknown tool {name!r}")


ToolFn = Callable[..., Any] | Callable[..., Awaitable[Any]]


class FunctionTools:
    """Tools backed by Python callables: ``tools.add(fn, name=..., description=..., parameters=...)``.

    The callable receives the model's arguments as keyword arguments; a str result is sent as is,
    anything else as JSON. An exception from the callable becomes an error result carrying its
    message (the model sees what went wrong and can try again).
    """

    def __init__(self) -> None:
        self._tools: dict[str, tuple[ToolSpec, ToolFn]] = {}

    def add(
        self,
        fn: ToolFn,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        tool_name = name or fn.__name__
        spec = ToolSpec(
            name=tool_name,
            description=description or inspect.getdoc(fn) or "",
            parameters=parameters or {"type": "object", "properties": {}},
        )
        self._tools[tool_name] = (spec, fn)

    def specs(self) -> Sequence[ToolSpec]:
        return [spec for spec, _ in self._tools.values()]

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        entry = self._tools.get(name)
        if entry is None:
            raise ToolError(f"unknown tool {name!r}")
        _, fn = entry
        try:
            result = fn(**arguments)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            return ToolOutcome(content=f"{type(exc).__name__}: {exc}", is_error=True)
        if isinstance(result, str):
            return ToolOutcome(content=result)
        return ToolOutcome(content=msgspec.json.encode(result).decode(), structured=result)


class AllowedTools:
    """The part of a registry one agent may use (its profile's ``mcp_servers`` and ``tools``
    patterns): the others are neither offered to its model nor run for it (an unknown tool, as
    one the model made up). A tool's MCP server is the registry's ``server_of(name)`` where it
    has one (the MCP registry), else none."""

    def __init__(self, inner: ToolRegistry, allows: Callable[[str, str | None], bool]) -> None:
        self.inner = inner
        self._allows = allows
        self._server_of: Callable[[str], str | None] = getattr(
            inner, "server_of", lambda name: None)
        #: the inner list last filtered, and what was kept of it (the MCP registry makes a new
        #: list on every change, so a turn usually filters nothing)
        self._seen: Sequence[ToolSpec] | None = None
        self._kept: list[ToolSpec] = []

    def specs(self) -> Sequence[ToolSpec]:
        specs = self.inner.specs()
        if specs is not self._seen:
            self._kept = [s for s in specs if self._allows(s.name, self._server_of(s.name))]
            self._seen = specs
        return self._kept

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        if not self._allows(name, self._server_of(name)):
            raise ToolError(f"unknown tool {name!r}")
        return await self.inner.call(name, arguments)
