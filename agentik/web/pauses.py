"""The answer routes of a paused turn (docs/PROTOCOL.md, "A person in the loop"): each maps one
request onto one call of the Agent API (``approve``, ``answer``) and returns the stored answer's
record. NotFoundError (404: no such conversation, or call waiting; another user's as missing),
ConflictError (409: answered otherwise, or its turn has ended), InvalidInputError (400)."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response

from agentik.agent import LocalAgent
from agentik.web._state import json_response, scope, state
from agentik.web.http import json_body
from agentik.web.types import Answer, ApprovalBody, Approve, InputBody
from agentik.wire import MessageRecord

bp = Blueprint("agentik_pauses", __name__)


@bp.post("/agentik/conversations/<conversation_id>/approvals/<call_id>")
async def approve(conversation_id: str, call_id: str) -> Response:
    agent = state().require_agent()
    body = await json_body(ApprovalBody)
    record = await agent.approve(conversation_id, call_id, body.approve, body.reason,
                                 user=scope())
    return json_response(record, 200)


@bp.post("/agentik/conversations/<conversation_id>/inputs/<call_id>")
async def answer(conversation_id: str, call_id: str) -> Response:
    agent = state().require_agent()
    body = await json_body(InputBody)
    record = await agent.answer(conversation_id, call_id, body.text, data=body.data, user=scope())
    return json_response(record, 200)


async def ws_answer(agent: LocalAgent, frame: Any, user: str | None) -> MessageRecord | None:
    """The WebSocket's ``approve`` and ``answer`` commands (as the routes above); None for any
    other frame."""
    if isinstance(frame, Approve):
        return await agent.approve(frame.conversation_id, frame.call_id, frame.approve,
                                   frame.reason, user=user)
    if isinstance(frame, Answer):
        return await agent.answer(frame.conversation_id, frame.call_id, frame.text,
                                  data=frame.data, user=user)
    return None
