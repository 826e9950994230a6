"""The OpenAPI 3.1 document served at ``/agentik/openapi.json``.

The route table below is the one list of routes in this module; the schemas of every body are
generated from the msgspec types (``msgspec.json.schema_components``), so they cannot drift from
what the server decodes and encodes. ``tests/test_web_docs.py`` checks it against the URL map.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

import agentik
from agentik.openai_api.responses_types import (
    ConversationCreate,
    ConversationObject,
    ConversationUpdate,
    Deleted,
    ItemList,
    ResponseObject,
    ResponsesRequest,
    StreamEvent,
)
from agentik.openai_api.types import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    ErrorAnswer,
    Model,
    ModelList,
)
from agentik.web.openapi_parts import BRANCH_ROUTES, CID, IDEMPOTENCY_KEY, Param, Route, _int
from agentik.web.types import (
    AgentEntry,
    AgentInfo,
    AgentList,
    ApprovalBody,
    ClientFrame,
    CountResult,
    CreateConversationBody,
    CursorPair,
    ErrorBody,
    Health,
    InputBody,
    InterruptBody,
    InterruptResult,
    MessageAccepted,
    Readiness,
    RenameConversationBody,
    SendMessageBody,
    ServerFrame,
    ToolsStatus,
    Usage,
)
from agentik.webhook_types import CreateWebhookBody, Webhook, WebhookCreated, WebhookDeliveries, WebhookList
from agentik.wire import (
    ChatSnapshot,
    CommonEvent,
    ConversationRecord,
    ConversationsSnapshot,
    MessageRecord,
)

REF = "#/components/schemas/{name}"
SSE = "text/event-stream"
HTML = "text/html"


CALL_ID = Param("call_id", "path", "a paused call's id (its pause event's call_id)",
                required=True)
AGENT_ID = Param("agent_id", "path", "agent id (GET /agentik/agents)", required=True)
AFTER = Param(
    "after", "query",
    "resume after this cursor `EPOCH:OFFSET`; absent = from the current head (live only)",
    {"type": "string", "pattern": "^.+:[0-9]+$"},
)
LAST_EVENT_ID = Param(
    "Last-Event-ID", "header", "set by a reconnecting EventSource; wins over `after`",
)
ACCESS_TOKEN = Param("access_token", "query", "bearer token, for clients that cannot set headers")
KIND = Param(
    "kind", "query",
    "only events of this kind: `agent` (created, renamed, touched, deleted), `conversation` "
    "(inside conversations), `a2a` (A2A task records)",
    {"type": "string", "enum": ["agent", "conversation", "a2a"]},
)
PROMETHEUS = "text/plain; version=0.0.4"
RID = Param("rid", "path", "a response id", required=True)
OCID = Param("cid", "path", "a conversation id", required=True)
HOOK = Param("webhook_id", "path", "a webhook subscription's id", required=True)

ROUTES: tuple[Route, ...] = (
    Route("get", "/healthz", "health", "Liveness; 503 while starting or after the runtime died",
          200, Health, errors=(503,), open=True, error_type=Health),
    Route("get", "/readyz", "ready",
          "Readiness: 503 `not_ready` while the runtime is not running or storage refuses "
          "writes, with the reasons; 200 `ready`, or `degraded` when MCP servers failed (named, "
          "with why; error texts need a token when auth is on)",
          200, Readiness, errors=(503,), open=True, error_type=Readiness),
    Route("get", "/agentik", "info", "Agent info: id, version, capabilities, cursors",
          200, AgentInfo),
    Route("get", "/agentik/cursor", "cursor", "The current and the oldest resumable cursor",
          200, CursorPair),
    Route("get", "/agentik/conversations", "listConversations",
          "Conversations snapshot (by updated_at desc) at a cursor", 200, ConversationsSnapshot,
          params=(_int("offset", "rows to skip"), _int("limit", "1..1000, default 100", 1)),
          errors=(400,)),
    Route("post", "/agentik/conversations", "createConversation",
          "Create a conversation (an empty body means {})", 201, ConversationRecord,
          body=CreateConversationBody, params=(IDEMPOTENCY_KEY,),
          errors=(400, 404, 413, 422, 429)),
    Route("get", "/agentik/agents", "listAgents",
          "The server's agents (docs/AGENTS.md) and the default one's id", 200, AgentList),
    Route("get", "/agentik/agents/{agent_id}", "getAgent",
          "One agent: name, description, image input, its tools, its A2A card", 200, AgentEntry,
          params=(AGENT_ID,), errors=(404,)),
    Route("get", "/agentik/conversations/{conversation_id}", "getConversation",
          "One conversation", 200, ConversationRecord, params=(CID,), errors=(404,)),
    Route("patch", "/agentik/conversations/{conversation_id}", "renameConversation",
          "Set or clear (null) the title", 200, ConversationRecord, body=RenameConversationBody,
          params=(CID,), errors=(400, 404, 413)),
    Route("delete", "/agentik/conversations/{conversation_id}", "deleteConversation",
          "Delete a conversation and everything of it", 204, params=(CID,), errors=(404,)),
    Route("post", "/agentik/conversations/{conversation_id}/messages", "sendMessage",
          "Queue a user message; the answer arrives as events. `on_busy` says what to do when "
          "a turn is running: queue (default AGENTIK_BUSY_POLICY), reject (409 `busy`, nothing "
          "stored) or interrupt (the running turn is interrupted, this one runs next)", 202,
          MessageAccepted, body=SendMessageBody, params=(CID, IDEMPOTENCY_KEY),
          errors=(400, 404, 409, 413, 422, 429)),
    Route("post", "/agentik/conversations/{conversation_id}/interrupt", "interrupt",
          "Cancel the running turn; with `turn_id`, that turn: withdrawn while it waits "
          "(it ends interrupted at once, never run), interrupted while it runs", 202,
          InterruptResult, body=InterruptBody, params=(CID,), errors=(400, 404)),
    Route("post", "/agentik/conversations/{conversation_id}/approvals/{call_id}", "approve",
          "Approve or refuse the paused call `call_id` (an `approval_requested` event); the "
          "stored answer (again for the same answer; 409 for another, or once its turn ended)",
          200, MessageRecord, body=ApprovalBody, params=(CID, CALL_ID),
          errors=(400, 404, 409, 413)),
    Route("post", "/agentik/conversations/{conversation_id}/inputs/{call_id}", "answer",
          "Answer the question of the paused call `call_id` (an `input_requested` event): "
          "`text`, or `data` for a structured answer; as approvals otherwise", 200,
          MessageRecord, body=InputBody, params=(CID, CALL_ID), errors=(400, 404, 409, 413)),
    Route("get", "/agentik/conversations/{conversation_id}/messages", "getMessages",
          "The current branch's messages by seq, paged", 200, list[MessageRecord],
          params=(CID, _int("after_seq", "only seq > after_seq"), _int("offset", "rows to skip"),
                  _int("limit", "1..1000, default 100", 1)),
          errors=(400, 404)),
    Route("get", "/agentik/conversations/{conversation_id}/snapshot", "chatSnapshot",
          "One conversation and its current branch's messages at a cursor", 200, ChatSnapshot,
          params=(CID,), errors=(404,)),
    *BRANCH_ROUTES,
    Route("get", "/agentik/journal", "journal", "Journal records by seq", 200, list[MessageRecord],
          params=(Param("conversation_id", "query", "only this conversation"),
                  _int("after_seq", "only seq > after_seq"),
                  _int("up_to_seq", "only seq <= up_to_seq"),
                  _int("limit", "1..1000, default 100", 1)),
          errors=(400,)),
    Route("get", "/agentik/journal/count", "journalCount", "Count of journal records", 200, CountResult,
          params=(Param("conversation_id", "query", "only this conversation"),
                  _int("after_seq", "only seq > after_seq")),
          errors=(400,)),
    Route("get", "/agentik/events", "events",
          "SSE: every durable event (agent and conversation). Frames `id: EPOCH:OFFSET`, "
          "`event: <type>`, `data: <CommonEvent JSON>`", 200, CommonEvent, ok_media=SSE,
          params=(AFTER, LAST_EVENT_ID, ACCESS_TOKEN, KIND), errors=(400, 410), query_token=True),
    Route("get", "/agentik/conversations/{conversation_id}/events", "conversationEvents",
          "SSE: one conversation's durable events; ends after its `deleted` event", 200,
          CommonEvent, ok_media=SSE, params=(CID, AFTER, LAST_EVENT_ID, ACCESS_TOKEN),
          errors=(400, 404, 410), query_token=True),
    Route("get", "/agentik/conversations/{conversation_id}/live", "liveEvents",
          "SSE: one conversation's online events (no ids, no replay)", 200, CommonEvent,
          ok_media=SSE, params=(CID, ACCESS_TOKEN), errors=(404,), query_token=True),
    Route("get", "/agentik/ws", "websocket",
          "WebSocket upgrade. Client frames: ClientFrame; server frames: ServerFrame "
          "(see docs/PROTOCOL.md)", 101, params=(ACCESS_TOKEN,), query_token=True),
    Route("get", "/agentik/usage", "usage",
          "The caller's model tokens this UTC day, their daily limit and when it resets; an "
          "admin reads another user's with `?user=` (docs/USERS.md)", 200, Usage,
          params=(Param("user", "query", "another user's (admins only)"),), errors=(400, 403)),
    Route("get", "/agentik/tools", "tools", "MCP servers with their state and tools (admins)",
          200, ToolsStatus, errors=(403,)),
    Route("post", "/agentik/webhooks", "createWebhook", "Subscribe a URL to event types; "
          "the answer alone shows its secret (admins; docs/WEBHOOKS.md)", 201, WebhookCreated,
          body=CreateWebhookBody, errors=(400, 403)),
    Route("get", "/agentik/webhooks", "listWebhooks", "Every subscription (admins)", 200,
          WebhookList, errors=(403,)),
    Route("get", "/agentik/webhooks/{webhook_id}", "getWebhook", "One subscription (admins)",
          200, Webhook, params=(HOOK,), errors=(403, 404)),
    Route("delete", "/agentik/webhooks/{webhook_id}", "deleteWebhook", "Unsubscribe (admins; "
          "409: made by the settings file)", 204, params=(HOOK,), errors=(403, 404, 409)),
    Route("get", "/agentik/webhooks/{webhook_id}/deliveries", "webhookDeliveries",
          "A subscription's delivery log, newest first (admins)", 200, WebhookDeliveries,
          params=(HOOK, _int("limit", "lines, 1..200 (50)", 1)), errors=(400, 403, 404)),
    Route("get", "/agentik/openapi.json", "openapi", "This document (admins)", 200,
          errors=(403,)),
    Route("get", "/metrics", "metrics", "Prometheus text exposition (admins)",
          200, ok_media=PROMETHEUS, errors=(403,)),
    Route("get", "/.well-known/agent-card.json", "a2aAgentCard",
          "A2A v1.0 agent card (public; see docs/A2A.md)", 200, open=True),
    Route("post", "/a2a", "a2aJsonRpc",
          "A2A v1.0 JSON-RPC 2.0; SSE for SendStreamingMessage and SubscribeToTask; errors are "
          "JSON-RPC error objects with status 200 (see docs/A2A.md)", 200),
    Route("post", "/a2a/", "a2aJsonRpcSlash", "The same A2A endpoint (no redirect)", 200),
    Route("get", "/a2a/{agent_id}/.well-known/agent-card.json", "a2aOneAgentCard",
          "One agent's A2A agent card (public; docs/AGENTS.md)", 200, open=True,
          params=(AGENT_ID,), errors=(404,)),
    Route("post", "/a2a/{agent_id}", "a2aAgentJsonRpc", "One agent's A2A JSON-RPC endpoint",
          200, params=(AGENT_ID,), errors=(404,)),
    Route("post", "/a2a/{agent_id}/", "a2aAgentJsonRpcSlash", "The same endpoint (no redirect)",
          200, params=(AGENT_ID,), errors=(404,)),
    Route("get", "/v1/models", "openaiListModels",
          "OpenAI-compatible: every agent as a model (see docs/OPENAI.md)", 200, ModelList,
          error_type=ErrorAnswer),
    Route("get", "/v1/models/{model_id}", "openaiGetModel", "OpenAI-compatible: one model",
          200, Model, params=(Param("model_id", "path", "an agent's id", required=True),),
          errors=(404,), error_type=ErrorAnswer),
    Route("post", "/v1/chat/completions", "openaiChatCompletions",
          "OpenAI-compatible Chat Completions answered by the agent named in `model`, its tools "
          "run server-side; `stream: true` answers SSE `chat.completion.chunk` events ending "
          "with `data: [DONE]`. `X-Agentik-Conversation-Id` continues a conversation (its "
          "history is checked: 409 when it differs); without it a temporary conversation "
          "(kept with `store: true`, its id in the answer's `X-Agentik-Conversation-Id`). "
          "Errors in OpenAI's shape (see docs/OPENAI.md)", 200, ChatCompletion,
          body=ChatRequest, params=(Param(
              "X-Agentik-Conversation-Id", "header", "the conversation this request continues"),),
          errors=(400, 404, 409, 413, 429, 502), error_type=ErrorAnswer),
    Route("post", "/v1/responses", "openaiCreateResponse",
          "OpenAI-compatible Responses: one turn of a conversation (`conversation`, "
          "`previous_response_id`, or a new one); `stream: true` answers SSE typed events with "
          "`sequence_number`; `background: true` answers at once (see docs/OPENAI.md)", 200,
          ResponseObject, body=ResponsesRequest, errors=(400, 404, 413, 429),
          error_type=ErrorAnswer),
    Route("get", "/v1/responses/{rid}", "openaiGetResponse",
          "A response; `?stream=true&starting_after=N` resumes its event stream after event N, "
          "at any later time, also after a restart or on another node", 200, ResponseObject,
          params=(RID, Param("stream", "query", "`true`: the response's events as SSE"),
                  _int("starting_after", "resume after this sequence_number")),
          errors=(400, 404), error_type=ErrorAnswer),
    Route("post", "/v1/responses/{rid}/cancel", "openaiCancelResponse",
          "Cancel a background response", 200, ResponseObject, params=(RID,),
          errors=(400, 404), error_type=ErrorAnswer),
    Route("delete", "/v1/responses/{rid}", "openaiDeleteResponse",
          "Delete a response with its conversation (409 when the conversation holds other "
          "turns)", 200, Deleted, params=(RID,), errors=(404, 409), error_type=ErrorAnswer),
    Route("get", "/v1/responses/{rid}/input_items", "openaiResponseInputItems",
          "The input items of a response", 200, ItemList, params=(RID,), errors=(404,),
          error_type=ErrorAnswer),
    Route("post", "/v1/conversations", "openaiCreateConversation",
          "OpenAI-compatible: create a conversation (an agentik conversation, same id)", 200,
          ConversationObject, body=ConversationCreate, errors=(400,), error_type=ErrorAnswer),
    Route("get", "/v1/conversations/{cid}", "openaiGetConversation", "A conversation", 200,
          ConversationObject, params=(OCID,), errors=(404,), error_type=ErrorAnswer),
    Route("post", "/v1/conversations/{cid}", "openaiUpdateConversation",
          "Set its metadata (`title`)", 200, ConversationObject, body=ConversationUpdate,
          params=(OCID,), errors=(400, 404), error_type=ErrorAnswer),
    Route("delete", "/v1/conversations/{cid}", "openaiDeleteConversation",
          "Delete a conversation and everything of it", 200, Deleted, params=(OCID,),
          errors=(404,), error_type=ErrorAnswer),
    Route("get", "/v1/conversations/{cid}/items", "openaiConversationItems",
          "Its messages as items (`limit`, `order`, `after`)", 200, ItemList,
          params=(OCID, _int("limit", "1..100, default 20", 1),
                  Param("order", "query", "`desc` (default) or `asc`"),
                  Param("after", "query", "an item id")),
          errors=(400, 404), error_type=ErrorAnswer),
    Route("get", "/", "webChat", "The built-in web chat (HTML page)", 200, ok_media=HTML,
          open=True),
    Route("get", "/agentik/ui", "webChatUi", "The built-in web chat (same page as `/`)", 200,
          ok_media=HTML, open=True),
    Route("get", "/agentik/ui/{name}", "webChatFile",
          "A file of the web chat (CSS, ES module); 304 on a matching If-None-Match", 200,
          params=(Param("name", "path", "file name", required=True),), errors=(404,),
          open=True),
)

_ERROR_TEXT = {
    400: "invalid input (bad JSON, a body or parameter that fails validation)",
    401: "missing or invalid bearer token",
    403: "admins only",
    404: "unknown conversation (another user's too)",
    409: "busy (on_busy=reject while a turn runs; nothing stored) or conversation_failed "
         "(it crashed too often and takes no more turns)",
    410: "dead cursor: resync from a snapshot; `oldest` and `current` are in the body",
    413: "body over the size limit",
    422: "idempotency_key_reused: this Idempotency-Key was used with another request",
    429: "the conversation's mailbox is full, or the user is over a limit of theirs; see "
         "Retry-After",
    502: "the agent's turn failed (its model's server or a tool)",
    503: "the runtime is not running",
}


@functools.cache
def openapi_dict() -> dict[str, Any]:
    """The document as a dict. (One function over 60 lines: it is the document's one template,
    route table in, OpenAPI out, and reads best whole.)"""
    body_types: list[Any] = [ErrorBody, ClientFrame, ServerFrame, ChatCompletionChunk,
                             StreamEvent]
    for route in ROUTES:
        for t in (route.ok_type, route.body, route.error_type):
            if t is not None and t not in body_types:
                body_types.append(t)
    schemas, components = msgspec.json.schema_components(body_types, ref_template=REF)
    names = dict(zip(body_types, schemas, strict=True))
    error_ref = names[ErrorBody]

    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        op: dict[str, Any] = {"operationId": route.operation_id, "summary": route.summary}
        if route.params:
            op["parameters"] = [
                {"name": p.name, "in": p.where, "description": p.description,
                 "required": p.required or p.where == "path", "schema": p.schema}
                for p in route.params
            ]
        if route.body is not None:
            op["requestBody"] = {
                "required": route.body is not CreateConversationBody,
                "content": {"application/json": {"schema": names[route.body]}},
            }
        responses: dict[str, Any] = {}
        ok: dict[str, Any] = {"description": "success"}
        if route.ok_type is not None:
            ok["content"] = {route.ok_media: {"schema": names[route.ok_type]}}
        elif route.operation_id == "openapi":
            ok["content"] = {"application/json": {"schema": {"type": "object"}}}
        elif route.ok_media != "application/json":
            ok["content"] = {route.ok_media: {"schema": {"type": "string"}}}
        responses[str(route.ok)] = ok
        statuses = set(route.errors)
        if not route.open:
            statuses |= {401, 503}
        for status in sorted(statuses):
            responses[str(status)] = {
                "description": _ERROR_TEXT[status] if route.error_type in (None, ErrorAnswer)
                else "not ready / not alive: the body says why",
                "content": {"application/json": {
                    "schema": error_ref if route.error_type is None else names[route.error_type]}},
            }
        op["responses"] = responses
        if route.open:
            op["security"] = []
        elif route.query_token:
            op["security"] = [{"bearer": []}, {"accessToken": []}]
        paths.setdefault(route.path, {})[route.method] = op

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "agentik",
            "version": agentik.__version__,
            "description": "Agent runtime server: conversations, durable resumable event "
                           "streams (SSE, WebSocket). See docs/PROTOCOL.md.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "accessToken": {"type": "apiKey", "in": "query", "name": "access_token"},
            },
        },
        "security": [{"bearer": []}],
    }


@functools.cache
def openapi_document() -> bytes:
    return msgspec.json.encode(openapi_dict())
