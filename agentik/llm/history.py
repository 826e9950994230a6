"""Working memory as a backend's messages, walked once for every backend.

:func:`render_history` applies the rules all backends share and hands each message to the
backend's :class:`MessageFormat`, the final step that gives it the backend's shape:

- the system prompt is a system message; a summary is a system message
  ``"Summary of earlier conversation: …"``;
- a user message keeps its images only when the model takes images, else they are dropped with a
  warning;
- an assistant message is its text (images dropped with a warning: no backend takes them in an
  answer) and its tool calls;
- a tool result is one tool message.

A backend may post-process the list (OpenAI drops unanswered tool calls, LiteRT-LM merges a run of
tool results into one message).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol, TypeVar

from agentik.wire import (
    AssistantItem,
    Content,
    Image,
    SummaryItem,
    SystemItem,
    Text,
    ToolCallSpec,
    ToolItem,
    UserItem,
    WorkingItem,
)

__all__ = ["SUMMARY_PREFIX", "MessageFormat", "assistant_text", "render_history", "user_parts"]

log = logging.getLogger(__name__)

SUMMARY_PREFIX = "Summary of earlier conversation: "

M = TypeVar("M")
M_co = TypeVar("M_co", covariant=True)


class MessageFormat(Protocol[M_co]):
    """A backend's message shape: one method per kind of message."""

    def system(self, text: str) -> M_co: ...

    def user(self, parts: Sequence[Content]) -> M_co:
        """``parts`` hold Images only if the model takes them (see :func:`user_parts`)."""
        ...

    def assistant(self, text: str, calls: Sequence[ToolCallSpec]) -> M_co: ...

    def tool(self, call_id: str, name: str, content: str) -> M_co: ...


def user_parts(content: Sequence[Content], *, supports_images: bool) -> list[Content]:
    """The parts of a user message that reach the model; dropped images are logged."""
    if supports_images:
        return list(content)
    parts: list[Content] = [item for item in content if not isinstance(item, Image)]
    if len(parts) != len(content):
        log.warning("dropped %d image(s): the model does not accept images",
                    len(content) - len(parts))
    return parts


def assistant_text(content: Sequence[Content]) -> str:
    """The text of an assistant message; images are dropped (with a warning)."""
    if len(content) == 1 and isinstance(content[0], Text):  # the common case, fast
        return content[0].body
    texts = [item.body for item in content if isinstance(item, Text)]
    if len(texts) != len(content):
        log.warning("dropped image(s) from an assistant message: the model takes none")
    return "".join(texts)


def render_history(
    history: Sequence[WorkingItem], fmt: MessageFormat[M], *, supports_images: bool
) -> list[M]:
    """``history`` as ``fmt``'s messages, one per item, in order."""
    messages: list[M] = []
    append = messages.append
    user, assistant = fmt.user, fmt.assistant
    for item in history:  # one pass, the common kinds first (a cold load renders every item)
        if isinstance(item, UserItem):
            append(user(user_parts(item.content, supports_images=supports_images)))
        elif isinstance(item, AssistantItem):
            append(assistant(assistant_text(item.content), item.tool_calls))
        elif isinstance(item, ToolItem):
            append(fmt.tool(item.call_id, item.name, item.content))
        elif isinstance(item, SystemItem):
            append(fmt.system(item.text))
        elif isinstance(item, SummaryItem):
            append(fmt.system(SUMMARY_PREFIX + item.text))
    return messages
