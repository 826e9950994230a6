"""The one error tree of agentik, and the one map of it onto HTTP answers.

Every error agentik raises on purpose is an :class:`AgentikError`. Third-party errors (sqlite3,
openai, mcp, msgspec, httpx2) are converted at the boundary of the module that owns the library, so
code above that boundary only ever sees this tree. The HTTP answer of each class (status, ``code``)
is in :data:`HTTP_ERRORS`, read by the server (``agentik.web.errors``: error -> answer) and by the
client (``agentik.client.errors``: answer -> error), so in-process code catches the same classes::

    AgentikError                   500 internal (the code of a class not in HTTP_ERRORS)
     ├── ConfigError               500 config      a bad configuration value; names the variable
     │     raised by: Config.from_env, open_runtime (backend choice), the llm backends' set-up,
     │                storage (missing_extra: a setting whose optional dependency is not installed)
     ├── InvalidInputError         400 invalid_input  input that fails validation (msgspec's message)
     │   │ raised by: the Agent API (limits, empty content), api.decode_input, Cursor.parse,
     │   │            the web routes (query parameters, frames), the client (bad arguments)
     │   ├── PayloadTooLargeError  413 too_large   a body or WebSocket message over max_body_bytes
     │   │     raised by: agentik.web (read_body); the client for a 413
     │   └── UnsupportedParameterError 400 unsupported_parameter  an OpenAI request parameter
     │         raised by: agentik.openai_api       agentik cannot honour (``param`` names it)
     ├── UnauthorizedError         401 unauthorized  no bearer token, or one the server does not know
     │     raised by: agentik.web.auth; the client for a 401 (``agentik.client.AuthError``, the
     │                same class: retrying with the same token never helps)
     ├── ForbiddenError            403 forbidden   a user asked for what admins only see (web)
     ├── NotFoundError             404 not_found   unknown conversation id (another user's too)
     │   │ raised by: the Agent API, the web routes, the client
     │   └── ModelNotFoundError    404 model_not_found  an OpenAI request names no agent
     │         raised by: agentik.openai_api
     ├── ConversationFailedError   409 conversation_failed  crashed too often; takes no turns
     │     raised by: ConversationHandle.submit (send)
     ├── ConflictError             409 conflict    a write based on a stale read (an A2A task
     │     raised by: the storage writer, pausing.py   changed meanwhile; a pause answered); none stored
     ├── BusyError                 409 busy        a send with on_busy=reject while a turn runs or
     │     raised by: ConversationHandle.submit        waits; nothing was stored
     ├── IdempotencyKeyReusedError 422 idempotency_key_reused  an Idempotency-Key already used
     │     raised by: the storage writer               with another request; nothing was stored
     ├── OutboxGapError            410 gap         a dead cursor: evicted, another epoch, ahead of head
     │     raised by: EventHub (check, stream), so by every durable events iterator; the client
     │                for a 410 or an SSE ``event: gap`` frame
     ├── MailboxFullError          429 mailbox_full  the conversation's mailbox is full (Retry-After)
     │   │ raised by: ConversationHandle.submit (send)
     │   └── RateLimitedError      429 rate_limited  a user over a limit (agentik_users, USERS.md)
     ├── StorageError              503 storage     the database failed; a failed write was not stored
     │   │                                          (but see StorageOutcomeUnknownError)
     │   │ raised by: the storage actor and its reader (agentik.storage)
     │   ├── StorageUnavailableError 503 storage  the store refuses writes for now (disk full,
     │   │   │ raised by: the storage actor        read-only, I/O error, connection lost,
     │   │   │                                    AGENTIK_DB_TIMEOUT passed); nothing stored
     │   │   └── StorageOutcomeUnknownError 503 storage  (PostgreSQL) the connection failed with
     │   │         raised by: the PostgreSQL writer,   the write's commit in flight: it may be
     │   │           passed on by the storage actor    stored; a retry checks (ops.rechecked)
     │   ├── NotOwnerError         503 not_owner   (PostgreSQL cluster) another live node owns the
     │   │     raised by: the PostgreSQL writer, pg_lease   conversation; the Agent forwards to it
     │   └── LeaseLostError        503 lease_lost  (PostgreSQL cluster) this node's fence is stale:
     │         raised by: the PostgreSQL writer, pg_lease   write refused, the local actor stopped
     ├── RuntimeClosedError        503 closed      the runtime is starting, shutting down or closed
     │     raised by: the Agent API after close, the registry, the web app outside its lifespan,
     │                a closed client
     ├── LlmError                  502 llm         a backend failed a turn (stored as an Error)
     │    │ raised by: agentik.llm (openai, litert); caught by the turn
     │    ├── LlmConnectionError   502 llm_connection  the endpoint could not be reached
     │    ├── LlmTimeoutError      502 llm_timeout     no answer in time
     │    ├── LlmAuthError         502 llm_auth        the endpoint refused our credentials
     │    └── LlmResponseError     502 llm_response    an error answer or a malformed one
     │         └── LlmContextOverflowError  502 context_overflow  the prompt does not fit the
     │               model's context window (the turn compacts and retries once)
     ├── ToolError                 502 tool        a tool call failed (error, exception, timeout)
     │     raised by: agentik.tools; caught by the turn (a ToolFailed event)
     ├── A2AError                  (A2A only) an A2A JSON-RPC error: ``rpc_code``, ErrorInfo ``reason``
     │     raised by: agentik.a2a (answered as a JSON-RPC error object, HTTP 200)
     ├── AgentikConnectionError    (client only; also a builtin ConnectionError) no answer at all:
     │     raised by: agentik.client   refused, reset, timed out, a stream cut in the middle
     └── ServerError               (client only) an HTTP answer the protocol does not define
           raised by: agentik.client   (a 500, a proxy's 502 page, a malformed body); ``.status``
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentik.wire import Cursor


class AgentikError(Exception):
    """Base of every error agentik raises on purpose."""

    code = "internal"


class ConfigError(AgentikError):
    """A configuration value is missing or malformed; ``variable`` names it."""

    code = "config"

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


def missing_extra(variable: str, needs: str, extra: str, exc: ImportError) -> ConfigError:
    """The error of a setting (``variable``) that ``needs`` an optional dependency which is not
    installed: one line naming the extra to install. From a checkout (``-e .``), because the name
    ``agentik`` on the package index belongs to an unrelated project."""
    missing = f"no module named {exc.name!r}" if exc.name else str(exc)
    return ConfigError(variable, f"{needs}, which is not installed ({missing}): "
                                 f"pip install -e '.[{extra}]'")


class InvalidInputError(AgentikError):
    """Input failed validation; the message says what and where."""

    code = "invalid_input"


class PayloadTooLargeError(InvalidInputError):
    """A request body (or WebSocket message) over ``config.max_body_bytes``."""

    code = "too_large"


class UnsupportedParameterError(InvalidInputError):
    """An OpenAI-compatible request asks for something agentik cannot honour (``n`` > 1,
    client-side ``tools``, ...): refused rather than answered wrongly. ``param`` names it."""

    code = "unsupported_parameter"

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class UnauthorizedError(AgentikError):
    """A missing or unknown bearer token. Retrying with the same token never helps."""

    code = "unauthorized"


class ForbiddenError(AgentikError):
    """A user asked for what only admins may see (docs/USERS.md)."""
    code = "forbidden"


class NotFoundError(AgentikError):
    """An unknown id (conversation, message)."""

    code = "not_found"


class ModelNotFoundError(NotFoundError):
    """An OpenAI-compatible request names a model that is no agent of this server."""

    code = "model_not_found"


class MailboxFullError(AgentikError):
    """The conversation already holds as many queued turns as its mailbox allows."""

    code = "mailbox_full"

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimitedError(MailboxFullError):
    """A user over a limit of theirs (docs/USERS.md): come back after ``retry_after`` s."""
    code = "rate_limited"


class OutboxGapError(AgentikError):
    """The cursor is dead: the client must resync from a snapshot and never retry it."""

    code = "gap"

    def __init__(self, message: str, oldest: Cursor, current: Cursor) -> None:
        super().__init__(message)
        self.oldest = oldest
        self.current = current


class StorageError(AgentikError):
    """The database failed. For a write, nothing of that write was stored or acknowledged;
    except for :class:`StorageOutcomeUnknownError` (PostgreSQL: it may have committed)."""

    code = "storage"


class StorageUnavailableError(StorageError):
    """The store refused a whole batch for a reason that can pass (disk or database full,
    read-only, an I/O error, a lost connection, a lock or a statement past AGENTIK_DB_TIMEOUT):
    nothing of it was stored (but see :class:`StorageOutcomeUnknownError`), and the same write
    may succeed later. Turn endings are retried on it (``Storage.write_until_stored``); /readyz
    answers 503 until a write succeeds again."""

    code = "storage"


class StorageOutcomeUnknownError(StorageUnavailableError):
    """PostgreSQL: the connection failed (or the server stopped answering for
    ``2 x AGENTIK_DB_TIMEOUT``) while the batch's commit statement was in flight, so whether it
    was stored is unknown: its server session may have committed it. The writer ends that
    session before it plans anything else, so a retry's plan sees what it left: a retry with
    the same Idempotency-Key, or of a turn's write in its rechecked form (``ops.rechecked``:
    ``Storage.write_until_stored`` retries with it), is stored once. A plain retry of another
    write may store it twice. The store refuses writes meanwhile, as for its base class."""

    code = "storage"


class NotOwnerError(StorageError):
    """PostgreSQL cluster: another live node owns the conversation (its lease is current), so
    this node may not run it or write to it. ``addr`` is the owner's base URL (None when it
    advertises none); the Agent forwards the command there."""

    code = "not_owner"

    def __init__(self, message: str, *, node_id: str, addr: str | None) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.addr = addr


class LeaseLostError(StorageError):
    """PostgreSQL cluster: the write's fence is stale (another node claimed the conversation, e.g.
    after this node froze past its lease): nothing was stored, and the local actor is stopped."""

    code = "lease_lost"


class ConflictError(AgentikError):
    """A conditional write found the row changed since it was read (``expect_seq`` mismatch):
    nothing was stored; re-read and decide again."""

    code = "conflict"


class BusyError(AgentikError):
    """A send said ``on_busy="reject"`` and the conversation is running (or has queued) a turn:
    nothing was stored."""

    code = "busy"


class IdempotencyKeyReusedError(AgentikError):
    """An ``Idempotency-Key`` already stored with another request (other body, other route or
    conversation): nothing was stored."""

    code = "idempotency_key_reused"


class ConversationFailedError(AgentikError):
    """The conversation's actor crashed more often than its restart limit allows."""

    code = "conversation_failed"


class RuntimeClosedError(AgentikError):
    """The runtime is closing or closed and takes no more work."""

    code = "closed"


class LlmError(AgentikError):
    """A backend could not complete a turn."""

    code = "llm"


class LlmConnectionError(LlmError):
    code = "llm_connection"


class LlmTimeoutError(LlmError):
    code = "llm_timeout"


class LlmAuthError(LlmError):
    code = "llm_auth"


class LlmResponseError(LlmError):
    code = "llm_response"


class LlmContextOverflowError(LlmResponseError):
    """The backend refused or could not finish a round because the prompt does not fit the
    model's context window. ``window`` is the window the backend knows now (named by the server,
    reported by the engine, or learned from the refusal), ``tokens`` the prompt's size when the
    backend said. The conversation compacts and retries; only this class means "too long"."""

    code = "context_overflow"

    def __init__(self, message: str, *, window: int | None = None,
                 tokens: int | None = None) -> None:
        super().__init__(message)
        self.window = window
        self.tokens = tokens


class ToolError(AgentikError):
    """A tool call failed; the turn goes on with a ``ToolFailed`` event."""

    code = "tool"


class AgentikConnectionError(AgentikError, ConnectionError):
    """The server could not be reached, or the connection broke before the answer was complete
    (refused, reset, timed out, a stream cut in the middle). Also a builtin ``ConnectionError``.
    Transient: :class:`~agentik.client.ReconnectingOutbox` retries it."""

    code = "connection"


class ServerError(AgentikError):
    """An HTTP answer the protocol does not define (a 500, a proxy's 502 page, ...)."""

    code = "server"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# --- the HTTP map --------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpError:
    """One row of :data:`HTTP_ERRORS`: ``error`` is answered with ``status`` and ``error.code``."""

    error: type[AgentikError]
    status: int
    #: the class a client gives an answer of this status whose code it does not know (a proxy's
    #: page, an older server); False where such an answer means nothing (410 without cursors,
    #: a 502 that is not ours)
    default_for_status: bool = False


#: The one map of error classes onto HTTP answers: the server answers an error with the row of the
#: first class of its MRO here (none: 500 with its own code, e.g. ConfigError); the client turns an
#: answer into its code's class if the status agrees, else the status's default, else ServerError.
HTTP_ERRORS: tuple[HttpError, ...] = (
    HttpError(InvalidInputError, 400, default_for_status=True),
    HttpError(UnauthorizedError, 401, default_for_status=True),
    HttpError(ForbiddenError, 403, default_for_status=True),
    HttpError(NotFoundError, 404, default_for_status=True),
    HttpError(ConversationFailedError, 409, default_for_status=True),
    HttpError(ConflictError, 409),
    HttpError(BusyError, 409),
    HttpError(IdempotencyKeyReusedError, 422, default_for_status=True),
    HttpError(OutboxGapError, 410),
    HttpError(PayloadTooLargeError, 413, default_for_status=True),
    HttpError(MailboxFullError, 429, default_for_status=True),
    HttpError(RateLimitedError, 429),
    HttpError(LlmError, 502),
    HttpError(LlmConnectionError, 502),
    HttpError(LlmTimeoutError, 502),
    HttpError(LlmAuthError, 502),
    HttpError(LlmResponseError, 502),
    HttpError(LlmContextOverflowError, 502),
    HttpError(ToolError, 502),
    HttpError(RuntimeClosedError, 503, default_for_status=True),
    HttpError(StorageError, 503),
)

_BY_CLASS = {row.error: row for row in HTTP_ERRORS}
_BY_CODE = {row.error.code: row for row in HTTP_ERRORS}
_BY_STATUS = {row.status: row for row in reversed(HTTP_ERRORS) if row.default_for_status}


def http_status(exc: AgentikError) -> int:
    """The HTTP status ``exc`` is answered with."""
    for cls in type(exc).__mro__:
        row = _BY_CLASS.get(cls)
        if row is not None:
            return row.status
    return 500


def error_class(status: int, code: str) -> type[AgentikError] | None:
    """The class of an HTTP error answer: by ``code`` if its status agrees, else the status's
    default; None for an answer the map does not define (the client makes it a ServerError)."""
    row = _BY_CODE.get(code)
    if row is None or row.status != status:
        row = _BY_STATUS.get(status)
    return None if row is None else row.error


class A2AError(AgentikError):
    """An error the A2A facade answers as a JSON-RPC error object: ``rpc_code`` (-32001..-32099
    for A2A's own errors, -32600..-32700 for JSON-RPC's) and, for A2A's own, the ErrorInfo
    ``reason`` (``TASK_NOT_FOUND``, ...). The codes are named in :mod:`agentik.a2a.errors`."""

    code = "a2a"

    def __init__(self, rpc_code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.rpc_code = rpc_code
        self.reason = reason
