"""agentik: an agent runtime server on trio.

In-process use::

    async with agentik.open_runtime(agentik.Config.from_env()) as agent:
        conv = await agent.create_conversation()
        await conv.send(agentik.Text(body="hello"))

Errors are in :mod:`agentik.errors` (re-exported here); wire types in :mod:`agentik.wire`.
"""

from agentik.agent import LocalAgent, LocalConversation
from agentik.config import Config
from agentik.errors import (
    AgentikError,
    ConfigError,
    ConversationFailedError,
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

__all__ = [
    "AgentikError",
    "CommonEvent",
    "Config",
    "ConfigError",
    "ConversationFailedError",
    "Cursor",
    "FunctionTools",
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
