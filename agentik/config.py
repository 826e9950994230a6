"""Configuration (docs/CONFIG.md). Every variable is parsed once, in :meth:`Config.from_env`; a bad value
raises :class:`agentik.errors.ConfigError` naming the variable, so start-up stops with a message
that says what to fix. The rule for each kind of value (integers, seconds, tokens, URLs, origins)
is in :mod:`agentik.config_values`, once for every setting."""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from agentik import config_values as v
from agentik.content import DEFAULT_IMAGE_TYPES, DEFAULT_MAX_IMAGE_BYTES, SIGNATURES, ImageRules
from agentik.errors import ConfigError

T = TypeVar("T")

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

#: what a send does when the conversation is running a turn (docs/PROTOCOL.md ``on_busy``)
BUSY_POLICIES = ("queue", "reject", "interrupt")

#: which tool calls wait for a person's approval (docs/AGENTS.md ``approval``): every one, none,
#: or those whose name (as the model sees it) matches one of the glob patterns
Approval = str | tuple[str, ...]
APPROVAL_WORDS = ("always", "never")


#: ``AGENTIK_DB_TIMEOUT``'s default, seconds (here, not in the PostgreSQL modules: SQLite uses it
#: too, and the bare install has no psycopg)
DEFAULT_DB_TIMEOUT = 10.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    port: int = 8080
    db_path: str = "./agentik.db"
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    llm_backend: str = "openai"
    openai_base_url: str | None = None
    openai_api_key: str | None = None
    openai_model: str = "gpt-4o-mini"
    #: seconds without a byte from the backend before a turn fails
    llm_timeout: float = 120.0
    #: retries of an openai request on connection errors and 5xx, within llm_timeout
    llm_max_retries: int = 2
    #: the model's context window in tokens, overriding what the backend knows (0 = the engine's
    #: own; for openai learned from the server's first overflow refusal); docs/CONTEXT.md
    context_window: int = 0
    litert_model_path: str | None = None
    #: sampling temperature sent with each model request (None: the backend's default); an agent
    #: of the agents file has its own
    temperature: float | None = None
    #: the agents file (TOML, docs/AGENTS.md); None: one agent, ``default``, from these settings
    agents_path: str | None = None
    litert_threads: int = 2
    #: rounds generating at once on the LiteRT-LM engine; excess turns wait
    litert_max_concurrency: int = 1
    #: most tokens one LiteRT-LM round may generate (0 = a quarter of the window, at most 4096)
    litert_max_output_tokens: int = 0
    #: most tokens one round of the openai backend may generate (0 = a quarter of the window
    #: once it is known, at most 4096; else the server's default); docs/CONTEXT.md
    max_output_tokens: int = 0
    #: most tokens a compaction summary may take (0 = an eighth of the window, at most 1024)
    summary_max_tokens: int = 0
    mcp_config: str | None = None
    tokens: tuple[str, ...] = ()
    #: durable events kept in the outbox (newest N)
    outbox_cap: int = 100_000
    #: seconds a durable event is kept in the outbox
    outbox_ttl: float = 7 * 24 * 3600.0
    #: seconds an idle conversation actor lives before it is passivated
    idle_timeout: float = 300.0
    #: queued turns per conversation before sends are refused (429)
    mailbox_size: int = 16
    tool_timeout: float = 60.0
    #: characters of a tool result kept for the model and the journal (the rest is cut, marked)
    tool_result_cap: int = 64 * 1024
    max_tool_rounds: int = 8
    #: SQLite PRAGMA synchronous for the writer connection
    sqlite_synchronous: str = "FULL"
    #: most write requests committed in one transaction
    max_batch: int = 512
    #: events a live subscriber may have queued before it falls back to the stored outbox
    subscriber_buffer: int = 4096
    #: crashes of one conversation actor within restart_period before it is marked failed
    restart_limit: int = 5
    restart_period: float = 60.0
    #: largest accepted HTTP/WebSocket body in bytes
    max_body_bytes: int = 4 * 1024 * 1024
    #: image types a message may hold (agentik checks their bytes: agentik/content.py)
    image_types: tuple[str, ...] = DEFAULT_IMAGE_TYPES
    #: largest accepted image in a message, in bytes (decoded)
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    #: seconds an idle keep-alive HTTP connection is kept open (``agentik serve``; hypercorn's
    #: ``keep_alive_timeout``)
    keep_alive_timeout: float = 5.0
    #: listen queue length of ``agentik serve``'s socket (hypercorn's default, 100, overflows when
    #: a few hundred clients connect at once: dropped SYNs are retried after 1 s)
    backlog: int = 1024
    #: the A2A agent card's name and description (docs/A2A.md)
    agent_name: str = "agentik"
    agent_description: str = "An agentik agent: conversations with an LLM and its MCP tools"
    # --- running it in production (issue 14; docs/CONFIG.md) ---
    #: origins allowed to call the API from a browser ("*": any, without credentials); empty: no
    #: CORS headers at all
    cors_origins: tuple[str, ...] = ()
    #: what a send to a conversation with a running turn does unless it says: queue, reject, interrupt
    busy_policy: str = "queue"
    #: the tool calls that wait for a person's approval: "always", "never" or glob patterns
    approval: Approval = "never"
    #: seconds a paused turn waits for an answer before it is denied (0: for ever)
    approval_timeout: float = 0.0
    #: agents get the built-in ``ask_user`` tool (a question to the person, mid-turn)
    ask_user: bool = False
    #: seconds an Idempotency-Key is remembered
    idempotency_ttl: float = 24 * 3600.0
    #: server log lines: text (default) or json (one object a line)
    log_format: str = "text"
    #: the URL OpenTelemetry traces are posted to (OTLP/HTTP; docs/OBSERVABILITY.md): set, and
    #: the [otel] extra installed, turns traces on; the SDK reads its other OTEL_* settings itself
    trace_endpoint: str | None = None
    #: message text, tool arguments and tool results recorded in spans (off: ids, sizes, counts)
    trace_content: bool = False
    # --- scale-out on PostgreSQL (docs/SCALEOUT.md) ---
    #: libpq URL of a PostgreSQL database; when set it replaces the SQLite file (db_path)
    database_url: str | None = None
    #: this node's id in the cluster's lease table ("" = hostname-pid)
    node_id: str = ""
    #: seconds a node's conversation leases live without a heartbeat
    lease_ttl: float = 10.0
    #: seconds a database statement may run or wait for a lock before it fails (PostgreSQL:
    #: statement and lock timeouts, and the longest wait for an answer; SQLite: busy timeout)
    db_timeout: float = DEFAULT_DB_TIMEOUT
    #: this node's base URL as other nodes reach it (commands for its conversations are forwarded)
    node_url: str | None = None
    #: the server process's garbage collector: once started, everything made so far is frozen
    #: out of collections and a collection runs every this many new container objects (0: the
    #: interpreter's own settings). Only the server's own process (``agentik serve``, the
    #: ``agentik.web:app`` hypercorn serves) does this, never an embedding program
    gc_threshold: int = 50_000
    #: the users file (TOML: users, their roles, token digests and limits; docs/USERS.md)
    users_file: str | None = None
    #: JWT bearer tokens: the JWKS file or URL, the required issuer and audience, the claim that
    #: holds the role (a dotted path; "admin" or a list holding it makes an admin)
    jwt_jwks: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_role_claim: str = "role"
    # --- webhooks and A2A push notifications (docs/WEBHOOKS.md) ---
    #: the webhooks file (TOML: the subscriptions that must exist at start-up)
    webhooks_file: str | None = None
    #: the longest wait between two attempts of one delivery, seconds (it doubles from 1 s)
    webhook_max_backoff: float = 60.0
    #: seconds an event is retried before it is given up (logged, counted)
    webhook_retry_for: float = 24 * 3600.0
    #: A2A push URLs may name loopback, private and link-local addresses (tests, one network)
    push_allow_private: bool = False

    @property
    def auth_enabled(self) -> bool:
        """Any of AGENTIK_TOKENS, AGENTIK_USERS, AGENTIK_JWT_JWKS set: requests need a token."""
        return bool(self.tokens or self.users_file or self.jwt_jwks)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Read the variables of docs/CONFIG.md from ``env`` (default ``os.environ``). Raises ConfigError.
        (Over 60 lines: one line a variable, and its one parser.)"""
        env = os.environ if env is None else env
        kw: dict[str, Any] = {}

        def get(name: str, field: str, parse: Callable[[str], Any], *, secret: bool = False) -> None:
            raw = env.get(name)
            if raw is None or raw == "":
                return
            try:
                kw[field] = parse(raw)
            except (ValueError, TypeError, ArithmeticError) as exc:
                # One line whatever the value (repr escapes line breaks), never a secret.
                shown = "(not shown: a secret)" if secret else repr(raw[:200]) + (
                    "..." if len(raw) > 200 else "")
                raise ConfigError(name, f"invalid value {shown}: {exc}") from None

        get("AGENTIK_PORT", "port", v.port)
        get("AGENTIK_DB_PATH", "db_path", str)
        get("AGENTIK_SYSTEM_PROMPT", "system_prompt", str)
        get("AGENTIK_LLM_BACKEND", "llm_backend", v.choice("openai", "litert"))
        get("OPENAI_BASE_URL", "openai_base_url", v.url)
        get("OPENAI_API_KEY", "openai_api_key", v.token, secret=True)
        get("OPENAI_MODEL", "openai_model", v.line)
        get("AGENTIK_LLM_TIMEOUT", "llm_timeout", v.seconds)
        get("AGENTIK_LLM_MAX_RETRIES", "llm_max_retries", v.non_negative_int)
        get("AGENTIK_CONTEXT_WINDOW", "context_window", v.non_negative_int)
        get("AGENTIK_LITERT_MODEL_PATH", "litert_model_path", str)
        get("AGENTIK_LITERT_THREADS", "litert_threads", v.positive_int)
        get("AGENTIK_LITERT_MAX_CONCURRENCY", "litert_max_concurrency", v.positive_int)
        get("AGENTIK_LITERT_MAX_OUTPUT_TOKENS", "litert_max_output_tokens", v.non_negative_int)
        get("AGENTIK_MAX_OUTPUT_TOKENS", "max_output_tokens", v.non_negative_int)
        get("AGENTIK_SUMMARY_MAX_TOKENS", "summary_max_tokens", v.non_negative_int)
        get("AGENTIK_MCP_CONFIG", "mcp_config", str)
        get("AGENTIK_AGENTS", "agents_path", str)
        get("AGENTIK_TEMPERATURE", "temperature", v.number(0.0, 2.0))
        get("AGENTIK_TOKENS", "tokens", v.tokens, secret=True)
        get("AGENTIK_OUTBOX_CAP", "outbox_cap", v.positive_int)
        get("AGENTIK_OUTBOX_TTL", "outbox_ttl", v.seconds)
        get("AGENTIK_IDLE_TIMEOUT", "idle_timeout", v.seconds)
        get("AGENTIK_MAILBOX_SIZE", "mailbox_size", v.positive_int)
        get("AGENTIK_TOOL_TIMEOUT", "tool_timeout", v.seconds)
        get("AGENTIK_TOOL_RESULT_CAP", "tool_result_cap", v.positive_int)
        get("AGENTIK_MAX_TOOL_ROUNDS", "max_tool_rounds", v.positive_int)
        get("AGENTIK_SQLITE_SYNCHRONOUS", "sqlite_synchronous",
            v.choice("OFF", "NORMAL", "FULL", "EXTRA", upper=True))
        get("AGENTIK_MAX_BATCH", "max_batch", v.positive_int)
        get("AGENTIK_SUBSCRIBER_BUFFER", "subscriber_buffer", v.positive_int)
        get("AGENTIK_RESTART_LIMIT", "restart_limit", v.positive_int)
        get("AGENTIK_RESTART_PERIOD", "restart_period", v.seconds)
        get("AGENTIK_MAX_BODY_BYTES", "max_body_bytes", v.positive_int)
        get("AGENTIK_IMAGE_TYPES", "image_types", _image_types)
        get("AGENTIK_MAX_IMAGE_BYTES", "max_image_bytes", v.positive_int)
        get("AGENTIK_KEEP_ALIVE_TIMEOUT", "keep_alive_timeout", v.seconds)
        get("AGENTIK_BACKLOG", "backlog", v.backlog)
        get("AGENTIK_AGENT_NAME", "agent_name", v.line)
        get("AGENTIK_AGENT_DESCRIPTION", "agent_description", v.line)
        get("AGENTIK_CORS_ORIGINS", "cors_origins", v.origins)
        get("AGENTIK_BUSY_POLICY", "busy_policy", v.choice(*BUSY_POLICIES))
        get("AGENTIK_APPROVAL", "approval", approval)
        get("AGENTIK_APPROVAL_TIMEOUT", "approval_timeout", v.seconds_or_zero)
        get("AGENTIK_ASK_USER", "ask_user", _flag)
        get("AGENTIK_IDEMPOTENCY_TTL", "idempotency_ttl", v.seconds)
        get("AGENTIK_LOG_FORMAT", "log_format", v.choice("text", "json"))
        get("OTEL_EXPORTER_OTLP_ENDPOINT", "trace_endpoint", _traces_url)
        get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "trace_endpoint", v.url)  # the more specific
        get("AGENTIK_TRACE_CONTENT", "trace_content", _flag)
        get("AGENTIK_DATABASE_URL", "database_url", v.postgres_url, secret=True)
        get("AGENTIK_NODE_ID", "node_id", v.line)
        get("AGENTIK_LEASE_TTL", "lease_ttl", v.seconds)
        get("AGENTIK_DB_TIMEOUT", "db_timeout", v.db_seconds)
        get("AGENTIK_NODE_URL", "node_url", v.url)
        get("AGENTIK_GC_THRESHOLD", "gc_threshold", v.non_negative_int)
        get("AGENTIK_USERS", "users_file", str)
        get("AGENTIK_JWT_JWKS", "jwt_jwks", str)
        get("AGENTIK_JWT_ISSUER", "jwt_issuer", str)
        get("AGENTIK_JWT_AUDIENCE", "jwt_audience", str)
        get("AGENTIK_JWT_ROLE_CLAIM", "jwt_role_claim", v.line)
        get("AGENTIK_WEBHOOKS", "webhooks_file", str)
        get("AGENTIK_WEBHOOK_MAX_BACKOFF", "webhook_max_backoff", v.seconds)
        get("AGENTIK_WEBHOOK_RETRY_FOR", "webhook_retry_for", v.seconds)
        get("AGENTIK_PUSH_ALLOW_PRIVATE", "push_allow_private", _flag)
        return cls(**kw)

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    @property
    def image_rules(self) -> ImageRules:
        return ImageRules(types=self.image_types, max_bytes=self.max_image_bytes)

    @property
    def database(self) -> str:
        """The database in use, for logs: the SQLite file, or the PostgreSQL URL with any
        password masked."""
        if self.database_url is None:
            return self.db_path
        parts = urllib.parse.urlsplit(self.database_url)
        netloc = parts.netloc
        userinfo, at, host = netloc.rpartition("@")
        if at and ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
        query = "&".join("password=***" if q.lower().startswith("password=") else q
                         for q in parts.query.split("&")) if parts.query else ""
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def _traces_url(raw: str) -> str:
    # OTLP/HTTP's rule: the base endpoint's traces are sent to its /v1/traces
    return v.url(raw).rstrip("/") + "/v1/traces"


def approval(raw: str) -> Approval:
    """``always``, ``never``, or comma-separated glob patterns over tool names."""
    text = raw.strip()
    if text.lower() in APPROVAL_WORDS:
        return text.lower()
    patterns = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not patterns:
        raise ValueError("must be always, never or comma-separated tool name patterns")
    for pattern in patterns:
        if not pattern.isprintable():
            raise ValueError("a pattern must be printable text (no control characters)")
    return patterns


def _flag(raw: str) -> bool:
    return v.choice("0", "1")(raw) == "1"


def _image_types(raw: str) -> tuple[str, ...]:
    types = tuple(dict.fromkeys(t.strip().lower() for t in raw.split(",") if t.strip()))
    if not types:
        raise ValueError("no image type in the list")
    for kind in types:
        if kind not in SIGNATURES:
            raise ValueError(f"{kind!r} is not an image type agentik can check "
                             f"(one of {', '.join(SIGNATURES)})")
    return types
