"""Request bodies and WebSocket commands of branches (docs/PROTOCOL.md "Branches"): an edit, a
regenerate, a switch, a fork and the versions at a place; the WebSocket's commands are members
of :data:`agentik.protocol.Command` and answer what the matching HTTP route returns."""

from __future__ import annotations

from typing import Literal

from agentik.wire import Content, MessageContext, Tagged, Wire

Busy = Literal["queue", "reject", "interrupt"]


class EditMessageBody(Wire, frozen=True, kw_only=True):
    """``POST /agentik/conversations/{id}/messages/{message_id}/edit``."""

    content: list[Content]
    context: MessageContext | None = None
    on_busy: Busy | None = None


class RegenerateBody(Wire, frozen=True, kw_only=True):
    """``POST …/messages/{message_id}/regenerate`` (the body may be absent)."""

    on_busy: Busy | None = None


class BranchBody(Wire, frozen=True, kw_only=True):
    """``POST /agentik/conversations/{id}/branch``."""

    message_id: str
    on_busy: Busy | None = None


class ForkBody(Wire, frozen=True, kw_only=True):
    """``POST /agentik/conversations/{id}/fork``; ``title``: the fork's (default: the
    original's)."""

    message_id: str
    title: str | None = None


# --- WebSocket commands (``id``: the request id echoed in the reply) ---------------------------


class EditMessage(Tagged, frozen=True, kw_only=True, tag="edit"):
    id: str
    conversation_id: str
    message_id: str
    content: list[Content]
    context: MessageContext | None = None
    on_busy: Busy | None = None
    idempotency_key: str | None = None


class RegenerateAnswer(Tagged, frozen=True, kw_only=True, tag="regenerate"):
    id: str
    conversation_id: str
    message_id: str
    on_busy: Busy | None = None
    idempotency_key: str | None = None


class SwitchBranch(Tagged, frozen=True, kw_only=True, tag="branch"):
    id: str
    conversation_id: str
    message_id: str
    on_busy: Busy | None = None
    idempotency_key: str | None = None


class ForkConversation(Tagged, frozen=True, kw_only=True, tag="fork"):
    id: str
    conversation_id: str
    message_id: str
    title: str | None = None
    idempotency_key: str | None = None


class GetSiblings(Tagged, frozen=True, kw_only=True, tag="siblings"):
    id: str
    conversation_id: str
    message_id: str


BranchCommand = EditMessage | RegenerateAnswer | SwitchBranch | ForkConversation | GetSiblings
#: the members of :data:`BranchCommand` (an ``isinstance`` check)
BRANCH_COMMANDS = (EditMessage, RegenerateAnswer, SwitchBranch, ForkConversation, GetSiblings)
