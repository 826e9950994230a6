"""Branch routes (docs/PROTOCOL.md "Branches"): edit, regenerate, siblings, branch and fork
under ``/agentik/conversations/{id}``, each one call of the in-process Agent API; and the same
calls as WebSocket commands (:func:`command`, answered with what the route returns)."""

from __future__ import annotations

from typing import Any, assert_never

from quart import Blueprint, Response

from agentik.agent import LocalAgent
from agentik.protocol_branches import (
    BranchBody,
    BranchCommand,
    EditMessage,
    EditMessageBody,
    ForkBody,
    ForkConversation,
    GetSiblings,
    RegenerateAnswer,
    RegenerateBody,
    SwitchBranch,
)
from agentik.users import Principal
from agentik.web._state import json_response, principal, scope, state
from agentik.web.http import idempotency_key, json_body
from agentik.web.types import MessageAccepted

bp = Blueprint("agentik_branches", __name__)

_CONV = "/agentik/conversations/<conversation_id>"


@bp.post(_CONV + "/messages/<message_id>/edit")
async def edit(conversation_id: str, message_id: str) -> Response:
    agent = state().require_agent()
    body = await json_body(EditMessageBody)
    who = principal()
    await agent.users.before_send(who.user, who.limits)
    new_id = await agent.edit(conversation_id, message_id, body.content, body.context,
                              on_busy=body.on_busy, idempotency_key=idempotency_key(),
                              user=scope())
    return json_response(MessageAccepted(message_id=new_id), 202)


@bp.post(_CONV + "/messages/<message_id>/regenerate")
async def regenerate(conversation_id: str, message_id: str) -> Response:
    agent = state().require_agent()
    body = await json_body(RegenerateBody, empty=RegenerateBody())
    who = principal()
    await agent.users.before_send(who.user, who.limits)
    turn_id = await agent.regenerate(conversation_id, message_id, on_busy=body.on_busy,
                                     idempotency_key=idempotency_key(), user=scope())
    return json_response(MessageAccepted(message_id=turn_id), 202)


@bp.get(_CONV + "/messages/<message_id>/siblings")
async def siblings(conversation_id: str, message_id: str) -> Response:
    agent = state().require_agent()
    return json_response(await agent.siblings(conversation_id, message_id, user=scope()))


@bp.post(_CONV + "/branch")
async def switch_branch(conversation_id: str) -> Response:
    agent = state().require_agent()
    body = await json_body(BranchBody)
    snapshot = await agent.switch_branch(conversation_id, body.message_id, on_busy=body.on_busy,
                                         idempotency_key=idempotency_key(), user=scope())
    return json_response(snapshot)


@bp.post(_CONV + "/fork")
async def fork(conversation_id: str) -> Response:
    agent = state().require_agent()
    body = await json_body(ForkBody)
    who = principal()
    await agent.users.before_create(who.user, who.limits)
    conv = await agent.fork(conversation_id, body.message_id, title=body.title,
                            idempotency_key=idempotency_key(), user=scope(), owner=who.user)
    return json_response(conv.record, 201)


async def command(agent: LocalAgent, frame: BranchCommand, who: Principal, user: str | None
                  ) -> Any:
    """A WebSocket branch command: what its route returns. Raises AgentikError."""
    match frame:
        case EditMessage():
            await agent.users.before_send(who.user, who.limits)
            return MessageAccepted(message_id=await agent.edit(
                frame.conversation_id, frame.message_id, frame.content, frame.context,
                on_busy=frame.on_busy, idempotency_key=frame.idempotency_key, user=user))
        case RegenerateAnswer():
            await agent.users.before_send(who.user, who.limits)
            return MessageAccepted(message_id=await agent.regenerate(
                frame.conversation_id, frame.message_id, on_busy=frame.on_busy,
                idempotency_key=frame.idempotency_key, user=user))
        case SwitchBranch():
            return await agent.switch_branch(
                frame.conversation_id, frame.message_id, on_busy=frame.on_busy,
                idempotency_key=frame.idempotency_key, user=user)
        case ForkConversation():
            await agent.users.before_create(who.user, who.limits)
            return (await agent.fork(
                frame.conversation_id, frame.message_id, title=frame.title,
                idempotency_key=frame.idempotency_key, user=user, owner=who.user)).record
        case GetSiblings():
            return await agent.siblings(frame.conversation_id, frame.message_id, user=user)
        case _:
            assert_never(frame)
