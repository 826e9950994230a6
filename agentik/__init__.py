"""agentik: an agent runtime server on trio.

In-process use::

    async with agentik.open_runtime(agentik.Config.from_env()) as agent:
        conv = await agent.create_conversation()
        await conv.send(agentik.Text(body="hello"))

Errors are in :mod:`agentik.errors` (re-exported here); wire types in :mod:`agentik.wire`.

The names below are loaded on first use (PEP 562 ``__getattr__``), so importing a part of the
package (``import agentik.client``, ``import agentik.wire``) does not load the server: a client
program imports only the client, the wire and protocol types and the error tree.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentik.agent import LocalAgent, LocalConversation
    from agentik.config import Config
    from agentik.errors import (
        AgentikError,
        BusyError,
        ConfigError,
        ConversationFailedError,
        IdempotencyKeyReusedError,
        InvalidInputError,
        LlmError,
        MailboxFullError,
        NotFoundError,
        OutboxGapError,
        RuntimeClosedError,
        StorageError,
        ToolError,
    )
    from agentik.runtime import open_runtime
    from agentik.tools.base import FunctionTools, NoTools, ToolOutcome, ToolRegistry
    from agentik.wire import CommonEvent, Cursor, Image, MessageContext, MessageOrigin, Text

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "open_runtime": "agentik.runtime",
    "LocalAgent": "agentik.agent",
    "LocalConversation": "agentik.agent",
    "Config": "agentik.config",
    **dict.fromkeys(
        [
            "AgentikError", "BusyError", "ConfigError", "ConversationFailedError",
            "IdempotencyKeyReusedError", "InvalidInputError",
            "LlmError", "MailboxFullError", "NotFoundError", "OutboxGapError",
            "RuntimeClosedError", "StorageError", "ToolError",
        ],
        "agentik.errors",
    ),
    **dict.fromkeys(["FunctionTools", "NoTools", "ToolOutcome", "ToolRegistry"], "agentik.tools.base"),
    **dict.fromkeys(
        ["CommonEvent", "Cursor", "Image", "MessageContext", "MessageOrigin", "Text"], "agentik.wire"
    ),
}

__all__ = [
    "AgentikError",
    "BusyError",
    "CommonEvent",
    "Config",
    "ConfigError",
    "ConversationFailedError",
    "Cursor",
    "FunctionTools",
    "IdempotencyKeyReusedError",
    "Image",
    "InvalidInputError",
    "LlmError",
    "LocalAgent",
    "LocalConversation",
    "MailboxFullError",
    "MessageContext",
    "MessageOrigin",
    "NoTools",
    "NotFoundError",
    "OutboxGapError",
    "RuntimeClosedError",
    "StorageError",
    "Text",
    "ToolError",
    "ToolOutcome",
    "ToolRegistry",
    "__version__",
    "open_runtime",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentik' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
