"""The A2A v1.0 error codes (JSON-RPC binding) and their JSON-RPC error objects, in one place.

A2A's own errors carry ``data: [google.rpc.ErrorInfo]`` with their reason and the domain
``a2a-protocol.org``; JSON-RPC's standard errors carry a message only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from agentik.errors import A2AError, AgentikError, NotOwnerError

TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
PUSH_NOT_SUPPORTED = -32003
UNSUPPORTED_OPERATION = -32004
CONTENT_TYPE_NOT_SUPPORTED = -32005
INVALID_AGENT_RESPONSE = -32006
EXTENDED_CARD_NOT_CONFIGURED = -32007
EXTENSION_SUPPORT_REQUIRED = -32008
VERSION_NOT_SUPPORTED = -32009
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

REASONS: dict[int, str] = {
    TASK_NOT_FOUND: "TASK_NOT_FOUND",
    TASK_NOT_CANCELABLE: "TASK_NOT_CANCELABLE",
    PUSH_NOT_SUPPORTED: "PUSH_NOTIFICATION_NOT_SUPPORTED",
    UNSUPPORTED_OPERATION: "UNSUPPORTED_OPERATION",
    CONTENT_TYPE_NOT_SUPPORTED: "CONTENT_TYPE_NOT_SUPPORTED",
    INVALID_AGENT_RESPONSE: "INVALID_AGENT_RESPONSE",
    EXTENDED_CARD_NOT_CONFIGURED: "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
    EXTENSION_SUPPORT_REQUIRED: "EXTENSION_SUPPORT_REQUIRED",
    VERSION_NOT_SUPPORTED: "VERSION_NOT_SUPPORTED",
}

ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
DOMAIN = "a2a-protocol.org"
#: the domain of agentik's own reasons (``NOT_OWNER``)
AGENTIK_DOMAIN = "agentik"
NOT_OWNER = "NOT_OWNER"


def error(rpc_code: int, message: str) -> A2AError:
    return A2AError(rpc_code, message, REASONS.get(rpc_code))


def task_not_found(task_id: str) -> A2AError:
    return error(TASK_NOT_FOUND, f"task {task_id!r} not found")


def invalid_params(message: str) -> A2AError:
    return error(INVALID_PARAMS, message)


def conversation_gone(context_id: str) -> A2AError:
    """The answer to a message whose context's conversation was deleted before its task was
    first stored (storage refuses a task of a conversation that is gone): nothing of the task
    is stored, and sending the message again starts a new conversation."""
    return error(INTERNAL_ERROR, f"the conversation of context {context_id!r} was deleted before "
                                 "this message's task was stored: nothing was stored; send the "
                                 "message again to start a new conversation")


def not_owner(exc: NotOwnerError) -> A2AError:
    """A PostgreSQL cluster's "not here, try again" (the native routes' 503 ``not_owner``): the
    node that owns the conversation did not answer, or advertises no address. The request was
    not served (nothing stored); a live node takes the conversation over within the lease TTL,
    and the same request then succeeds."""
    return A2AError(INTERNAL_ERROR, str(exc), NOT_OWNER)


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for one in exc.exceptions:
            yield from _leaves(one)
    else:
        yield exc


def answer_of(exc: Exception) -> A2AError | None:
    """The JSON-RPC error an execution's exception answers with: an A2AError as is, another
    AgentikError as -32603 with its message, also when raised inside a nursery of the executor
    (an exception group holding nothing else: its first A2AError, else its first error); None
    for anything else (an unexpected failure)."""
    leaves = list(_leaves(exc))
    if not all(isinstance(leaf, AgentikError) for leaf in leaves):
        return None
    first = next((leaf for leaf in leaves if isinstance(leaf, A2AError)), leaves[0])
    return first if isinstance(first, A2AError) else error(INTERNAL_ERROR, str(first))


class ErrorInfo(msgspec.Struct, kw_only=True, rename={"type": "@type"}):
    type: str = ERROR_INFO_TYPE
    reason: str
    domain: str = DOMAIN
    metadata: dict[str, str] = {}


class RpcError(msgspec.Struct, kw_only=True, omit_defaults=True):
    code: int
    message: str
    data: list[ErrorInfo] | None = None


class RpcErrorResponse(msgspec.Struct, kw_only=True):
    jsonrpc: str = "2.0"
    id: Any = None  # str | int | None, echoed from the request
    error: RpcError


def error_object(exc: A2AError) -> RpcError:
    domain = DOMAIN if exc.reason in REASONS.values() else AGENTIK_DOMAIN
    data = [ErrorInfo(reason=exc.reason, domain=domain)] if exc.reason else None
    return RpcError(code=exc.rpc_code, message=str(exc), data=data)


def error_response(request_id: Any, exc: A2AError) -> RpcErrorResponse:
    return RpcErrorResponse(id=request_id, error=error_object(exc))
