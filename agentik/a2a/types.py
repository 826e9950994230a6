"""A2A v1.0 wire types (the JSON-RPC binding's ProtoJSON), as msgspec Structs.

Field names are camelCase on the wire (``rename="camel"``); default values are left out
(``omit_defaults``), as ProtoJSON does; enums are the proto names (``TASK_STATE_*``,
``ROLE_*``). ``bytes`` encode as base64 and timestamps are RFC 3339 strings ending in ``Z``.
Incoming params are first normalised by :func:`camel_keys` (ProtoJSON parsers accept the proto
field names in snake_case too, and the official TCK sends some of them that way).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

TaskState = Literal[
    "TASK_STATE_SUBMITTED",
    "TASK_STATE_WORKING",
    "TASK_STATE_INPUT_REQUIRED",
    "TASK_STATE_AUTH_REQUIRED",
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_REJECTED",
]
Role = Literal["ROLE_USER", "ROLE_AGENT"]

SUBMITTED: TaskState = "TASK_STATE_SUBMITTED"
WORKING: TaskState = "TASK_STATE_WORKING"
INPUT_REQUIRED: TaskState = "TASK_STATE_INPUT_REQUIRED"
AUTH_REQUIRED: TaskState = "TASK_STATE_AUTH_REQUIRED"
COMPLETED: TaskState = "TASK_STATE_COMPLETED"
FAILED: TaskState = "TASK_STATE_FAILED"
CANCELED: TaskState = "TASK_STATE_CANCELED"
REJECTED: TaskState = "TASK_STATE_REJECTED"

TERMINAL: frozenset[str] = frozenset({COMPLETED, FAILED, CANCELED, REJECTED})
#: states where a task waits for the client (the execution has ended, the task has not)
INTERRUPTED: frozenset[str] = frozenset({INPUT_REQUIRED, AUTH_REQUIRED})
#: states a task can only be in while an execution runs it (start-up fails them)
RUNNING: tuple[str, ...] = (SUBMITTED, WORKING)


class A2A(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    """Base of the A2A wire structs."""


class Part(A2A, kw_only=True):
    """Exactly one of ``text``, ``raw``, ``url``, ``data`` (checked by :func:`check_part`)."""

    text: str | None = None
    raw: bytes | None = None
    url: str | None = None
    #: any JSON value; UNSET when absent (``null`` is a value)
    data: Any = msgspec.UNSET
    metadata: dict[str, Any] | None = None
    filename: str | None = None
    media_type: str | None = None


class Message(A2A, kw_only=True):
    message_id: str
    context_id: str | None = None
    task_id: str | None = None
    role: Role
    parts: list[Part]
    metadata: dict[str, Any] | None = None
    extensions: list[str] = []
    reference_task_ids: list[str] = []


class Artifact(A2A, kw_only=True):
    artifact_id: str
    name: str | None = None
    description: str | None = None
    parts: list[Part]
    metadata: dict[str, Any] | None = None
    extensions: list[str] = []


class TaskStatus(A2A, kw_only=True):
    state: TaskState
    message: Message | None = None
    timestamp: str | None = None


class Task(A2A, kw_only=True):
    id: str
    context_id: str
    status: TaskStatus
    artifacts: list[Artifact] = []
    history: list[Message] = []
    metadata: dict[str, Any] | None = None


class TaskStatusUpdateEvent(A2A, kw_only=True):
    task_id: str
    context_id: str
    status: TaskStatus
    metadata: dict[str, Any] | None = None


class TaskArtifactUpdateEvent(A2A, kw_only=True):
    task_id: str
    context_id: str
    artifact: Artifact
    append: bool = False
    last_chunk: bool = False
    metadata: dict[str, Any] | None = None


class StreamResponse(A2A, kw_only=True):
    """Exactly one member set."""

    task: Task | None = None
    message: Message | None = None
    status_update: TaskStatusUpdateEvent | None = None
    artifact_update: TaskArtifactUpdateEvent | None = None


class SendMessageResponse(A2A, kw_only=True):
    task: Task | None = None
    message: Message | None = None


class ListTasksResponse(A2A, kw_only=True):
    tasks: list[Task]
    next_page_token: str
    page_size: int
    total_size: int  # all four have no default, so all four are always sent (even "" and 0)


# --- requests ------------------------------------------------------------------------------------


class SendMessageConfiguration(A2A, kw_only=True):
    accepted_output_modes: list[str] = []
    task_push_notification_config: TaskPushNotificationConfig | msgspec.UnsetType = msgspec.UNSET
    history_length: int | None = None
    return_immediately: bool = False


class SendMessageParams(A2A, kw_only=True):
    tenant: str | None = None
    message: Message
    configuration: SendMessageConfiguration | None = None
    metadata: dict[str, Any] | None = None


class GetTaskParams(A2A, kw_only=True):
    tenant: str | None = None
    id: str
    history_length: int | None = None


class ListTasksParams(A2A, kw_only=True):
    tenant: str | None = None
    context_id: str | None = None
    status: TaskState | Literal["TASK_STATE_UNSPECIFIED"] | None = None
    page_size: int | None = None
    page_token: str | None = None
    history_length: int | None = None
    status_timestamp_after: str | None = None
    include_artifacts: bool | None = None


class TaskIdParams(A2A, kw_only=True):
    """CancelTask and SubscribeToTask."""

    tenant: str | None = None
    id: str
    metadata: dict[str, Any] | None = None


# --- push notifications (docs/WEBHOOKS.md) ------------------------------------------------------


class AuthenticationInfo(A2A, kw_only=True):
    """The credentials a push receiver wants in ``Authorization`` (``scheme credentials``)."""

    scheme: str
    credentials: str | None = None


class TaskPushNotificationConfig(A2A, kw_only=True):
    """A task's push config: CreateTaskPushNotificationConfig's params and every answer's."""

    tenant: str | None = None
    id: str = ""
    task_id: str = ""
    url: str
    token: str | None = None
    authentication: AuthenticationInfo | None = None


class PushConfigParams(A2A, kw_only=True):
    """GetTaskPushNotificationConfig and DeleteTaskPushNotificationConfig."""

    tenant: str | None = None
    task_id: str
    id: str


class ListPushConfigsParams(A2A, kw_only=True):
    tenant: str | None = None
    task_id: str
    page_size: int | None = None
    page_token: str | None = None


class ListPushConfigsResponse(A2A, kw_only=True):
    configs: list[TaskPushNotificationConfig]
    next_page_token: str  # no default: always sent, "" on the last page


# --- agent card ----------------------------------------------------------------------------------


class AgentInterface(A2A, kw_only=True):
    url: str
    protocol_binding: str
    protocol_version: str


class AgentProvider(A2A, kw_only=True):
    url: str
    organization: str


class AgentCapabilities(A2A, kw_only=True):
    # Sent even when false: the card states what is not offered.
    streaming: bool
    push_notifications: bool
    extended_agent_card: bool


class AgentSkill(A2A, kw_only=True):
    id: str
    name: str
    description: str
    tags: list[str]


class HTTPAuthSecurityScheme(A2A, kw_only=True):
    description: str | None = None
    scheme: str
    bearer_format: str | None = None


class SecurityScheme(A2A, kw_only=True):
    http_auth_security_scheme: HTTPAuthSecurityScheme


class StringList(A2A, kw_only=True):
    list: list[str] = []


class SecurityRequirement(A2A, kw_only=True):
    schemes: dict[str, StringList]


class AgentCard(A2A, kw_only=True):
    name: str
    description: str
    supported_interfaces: list[AgentInterface]
    provider: AgentProvider | None = None
    version: str
    documentation_url: str | None = None
    capabilities: AgentCapabilities
    security_schemes: dict[str, SecurityScheme] | None = None
    security_requirements: list[SecurityRequirement] = []
    default_input_modes: list[str]
    default_output_modes: list[str]
    skills: list[AgentSkill]


# --- helpers -------------------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()
encode = _encoder.encode
decode_task = msgspec.json.Decoder(Task).decode
decode_update = msgspec.json.Decoder(StreamResponse).decode

_SNAKE = re.compile(r"_([a-z0-9])")
#: members holding free-form JSON (their keys are data, not field names)
_OPAQUE = frozenset({"metadata", "data", "params", "header"})


def camel_keys(value: Any) -> Any:
    """``value`` with every field name in camelCase (``context_id`` -> ``contextId``), leaving the
    contents of free-form members (metadata, data parts) untouched."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            name = _SNAKE.sub(lambda m: m.group(1).upper(), key) if isinstance(key, str) else key
            out[name] = item if name in _OPAQUE else camel_keys(item)
        return out
    if isinstance(value, list):
        return [camel_keys(v) for v in value]
    return value


#: the longest id a client chooses (``contextId``, ``taskId``, ``messageId``) and the longest
#: JSON-RPC string ``id`` answered with; a JSON-RPC integer ``id`` is a signed 64-bit integer
MAX_ID_CHARS = 256
MAX_RPC_INT_ID = 2**63 - 1


def check_id(name: str, value: str) -> str | None:
    """Why ``value`` is not a valid client-chosen id (1..MAX_ID_CHARS printable characters, no
    control characters), or None. The value itself is not repeated: it may be huge."""
    if not value:
        return f"{name} must not be empty"
    if len(value) > MAX_ID_CHARS:
        return f"{name} must be at most {MAX_ID_CHARS} characters (got {len(value)})"
    if not value.isprintable():
        return f"{name} must be printable characters (no control characters)"
    return None


def valid_rpc_id(value: Any) -> bool:
    """A JSON-RPC ``id`` answered with as is: null, a string of at most MAX_ID_CHARS
    characters, or an integer within 64 bits (never a bool or a float)."""
    if value is None:
        return True
    if isinstance(value, str):
        return len(value) <= MAX_ID_CHARS
    return isinstance(value, int) and not isinstance(value, bool) and (
        -MAX_RPC_INT_ID - 1 <= value <= MAX_RPC_INT_ID)


def check_part(part: Part) -> str | None:
    """Why ``part`` is invalid (not exactly one content member), or None."""
    present = [
        name for name, set_ in (
            ("text", part.text is not None), ("raw", part.raw is not None),
            ("url", part.url is not None), ("data", part.data is not msgspec.UNSET),
        ) if set_
    ]
    if len(present) != 1:
        return f"a part needs exactly one of text, raw, url, data (got {present or 'none'})"
    return None


def timestamp(now: float | None = None) -> str:
    """RFC 3339 UTC with milliseconds and ``Z``."""
    moment = datetime.fromtimestamp(time.time() if now is None else now, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def text_part(text: str) -> Part:
    return Part(text=text)


def agent_message(
    parts: list[Part], *, context_id: str, task_id: str | None, message_id: str
) -> Message:
    return Message(message_id=message_id, context_id=context_id, task_id=task_id,
                   role="ROLE_AGENT", parts=parts)
