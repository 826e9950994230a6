"""The parts of the OpenAPI route table (``web/openapi.py``): a route, a parameter, the
parameters several routes share, and the routes of branches (docs/PROTOCOL.md "Branches"; here to
keep ``openapi.py`` within its size)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentik.protocol_branches import BranchBody, EditMessageBody, ForkBody, RegenerateBody
from agentik.web.types import MessageAccepted
from agentik.wire import ChatSnapshot, ConversationRecord, MessageRecord


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "query" | "path" | "header"
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})
    required: bool = False


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    operation_id: str
    summary: str
    ok: int
    ok_type: Any = None  # a msgspec type; None = no body
    ok_media: str = "application/json"
    body: Any = None
    params: tuple[Param, ...] = ()
    errors: tuple[int, ...] = ()
    query_token: bool = False
    open: bool = False  # no auth
    #: the body of the error answers when it is not ErrorBody (/healthz, /readyz answer 503
    #: with their own report)
    error_type: Any = None


def _int(name: str, description: str, minimum: int = 0) -> Param:
    return Param(name, "query", description, {"type": "integer", "minimum": minimum})


CID = Param("conversation_id", "path", "conversation id", required=True)
IDEMPOTENCY_KEY = Param(
    "Idempotency-Key", "header",
    "makes a retry return the first answer and store nothing (kept AGENTIK_IDEMPOTENCY_TTL, "
    "24 h by default; the same key with another request: 422)",
    {"type": "string", "minLength": 1, "maxLength": 255},
)
MID = Param("message_id", "path", "message id", required=True)
_M = "/agentik/conversations/{conversation_id}/messages/{message_id}"

BRANCH_ROUTES: tuple[Route, ...] = (
    Route("post", f"{_M}/edit", "editMessage", "A new version of a user message, answered (a "
          "send's busy policy)", 202, MessageAccepted, body=EditMessageBody,
          params=(CID, MID, IDEMPOTENCY_KEY), errors=(400, 404, 409, 413, 422, 429)),
    Route("post", f"{_M}/regenerate", "regenerate", "A new answer to the user message it "
          "answers (or is); `message_id`: the turn's id", 202, MessageAccepted,
          body=RegenerateBody, params=(CID, MID, IDEMPOTENCY_KEY), errors=(400, 404, 409, 422, 429)),
    Route("get", f"{_M}/siblings", "siblings", "Every version at a message's place, oldest first",
          200, list[MessageRecord], params=(CID, MID), errors=(404,)),
    Route("post", "/agentik/conversations/{conversation_id}/branch", "switchBranch",
          "Make a version current (the newest path below it); the conversation as it then is",
          200, ChatSnapshot, body=BranchBody, params=(CID, IDEMPOTENCY_KEY),
          errors=(400, 404, 409, 422, 429)),
    Route("post", "/agentik/conversations/{conversation_id}/fork", "fork", "A new conversation "
          "whose history is this one's up to a message", 201, ConversationRecord, body=ForkBody,
          params=(CID, IDEMPOTENCY_KEY), errors=(400, 404, 422, 429)),
)
