"""Webhooks (docs/WEBHOOKS.md), the pure parts: which agentik event is which webhook event and
what its body says (one table, :data:`EVENT_TYPES`), whether a subscription wants an event, the
retry rule (backoff, give up), the secret, the settings file (AGENTIK_WEBHOOKS) parsed and
checked, and which push URLs a caller may give (A2A push notifications). No I/O: the delivery
loop (``agentik/webhook_delivery.py``) does the sending and the storing.
"""

from __future__ import annotations

import base64
import ipaddress
import re
import secrets
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec

from agentik.errors import InvalidInputError
from agentik.storage import ops
from agentik.wire import (
    AssistantMessage,
    AssistantMessageEvent,
    CommonEvent,
    Created,
    Deleted,
    Error,
    ErrorEvent,
    Event,
    Interrupted,
    MessageRecord,
    event_type,
)

#: what a webhook's ``data`` says of an agentik event: the conversation's id (the caller adds
#: it) and these fields
Data = dict[str, Any]


def _record(record: MessageRecord) -> Data:
    return {"turn_id": getattr(record.message, "turn_id", None), "message_id": record.id}


def _completed(event: Event) -> Data | None:
    assert isinstance(event, AssistantMessageEvent)
    answer = event.record.message
    assert isinstance(answer, AssistantMessage)
    if answer.interrupted:  # its ``interrupted`` event says it: turn.interrupted
        return None
    tokens = None if answer.tokens is None else msgspec.to_builtins(answer.tokens)
    return {**_record(event.record), "finish_reason": answer.finish_reason, "tokens": tokens}


def _failed(event: Event) -> Data:
    assert isinstance(event, ErrorEvent)
    error = event.record.message
    assert isinstance(error, Error)
    return {**_record(event.record), "error": {"code": error.code, "message": error.message}}


def _fields(event: Event) -> Data:
    """The fields of the record the event carries (a person in the loop's request: its call id,
    tool, question, deadline… whatever they grow) and the record's id."""
    record = getattr(event, "record", None)
    if not isinstance(record, MessageRecord):
        return {}
    data = msgspec.to_builtins(record.message)
    data.pop("type", None)
    return {"message_id": record.id, **data}


#: agentik's durable event type -> (the webhook event type, its data or None: not sent). The one
#: table: a kind a subscription may name is a value here (issue 30's events are named by their
#: type, so they are sent once they exist)
EVENT_TYPES: dict[str, tuple[str, Callable[[Event], Data | None]]] = {
    "assistant_message": ("turn.completed", _completed),
    "error": ("turn.failed", _failed),
    "interrupted": ("turn.interrupted", lambda e: {"turn_id": getattr(e, "turn_id", None)}),
    "created": ("conversation.created", lambda e: {
        "agent": e.conversation.agent, "title": e.conversation.title} if isinstance(
            e, Created) else None),
    "deleted": ("conversation.deleted", lambda e: {"agent": e.agent} if isinstance(
        e, Deleted) else None),
    "approval_requested": ("approval.requested", _fields),
    "input_requested": ("input.requested", _fields),
}

#: the webhook event types a subscription may name
WEBHOOK_TYPES: tuple[str, ...] = tuple(sorted({t for t, _ in EVENT_TYPES.values()}))

#: a delivery log line's outcome: sent (2xx), failed (retried), given up (retry time over), the
#: events the outbox trimmed before they were sent (lost)
OUTCOMES = ("delivered", "failed", "gave_up", "lost")

_ = Interrupted  # (its type is named by its tag in the table)


def conversation_of(common: CommonEvent) -> str | None:
    event = common.event
    if isinstance(event, Created):
        return event.conversation.id
    if isinstance(event, Deleted):
        return event.conversation_id
    return common.conversation_id


def webhook_event(common: CommonEvent) -> tuple[str, Data] | None:
    """The webhook event type and ``data`` of an agentik event, or None (no webhook event)."""
    found = EVENT_TYPES.get(event_type(common.event))
    if found is None:
        return None
    kind, make = found
    data = make(common.event)
    if data is None:
        return None
    return kind, {"conversation_id": conversation_of(common), **data}


def wants(spec: ops.WebhookSpec, kind: str, conversation_id: str | None,
          agent: str | None) -> bool:
    """Whether the subscription takes a webhook event of ``kind`` (its conversation's agent
    ``agent``, when known)."""
    return (kind in spec.events
            and (spec.conversation_id is None or spec.conversation_id == conversation_id)
            and (spec.agent is None or spec.agent == agent))


def timestamp(at: float) -> str:
    """ISO 8601, UTC, to the millisecond."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def event_time(common: CommonEvent) -> float | None:
    """When the event happened, where the event says (its record's time, the conversation's)."""
    event = common.event
    record = getattr(event, "record", None)
    if isinstance(record, MessageRecord):
        return record.created_at
    if isinstance(event, Created):
        return event.conversation.created_at
    return None


_body = msgspec.json.Encoder()


def body(kind: str, at: float, data: Data) -> bytes:
    """The JSON body of one delivery (docs/WEBHOOKS.md)."""
    return _body.encode({"type": kind, "timestamp": timestamp(at), "data": data})


# --- retries -------------------------------------------------------------------------------------


def backoff(attempts: int, max_backoff: float) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: 1 s, doubling, at most
    ``max_backoff``."""
    return min(max_backoff, 2.0 ** min(max(attempts - 1, 0), 62))


def give_up(failing_since: float, now: float, retry_for: float) -> bool:
    """Whether an event failing since ``failing_since`` is given up at ``now``."""
    return now - failing_since >= retry_for


def delivered(status: int) -> bool:
    """A receiver's answer that takes the event (any 2xx)."""
    return 200 <= status < 300


# --- secrets and URLs ----------------------------------------------------------------------------


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def check_secret(secret: str) -> str:
    """``secret`` if it is ``whsec_`` and base64 of 24 to 64 bytes; else ValueError."""
    raw = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(raw, validate=True)
    except ValueError:
        raise ValueError("a secret is whsec_ and base64") from None
    if not secret.startswith("whsec_") or not 24 <= len(key) <= 64:
        raise ValueError("a secret is whsec_ and the base64 of 24 to 64 bytes")
    return secret


def check_url(url: str) -> str:
    """An http(s) URL with a host; InvalidInputError otherwise."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        parts = None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
            or len(url) > 2048 or not url.isascii()
            or any(c.isspace() or not c.isprintable() for c in url)):
        raise InvalidInputError("url must be an http or https URL with a host (ASCII, no "
                                "spaces)")
    return url


def private_address(address: str) -> bool:
    """Whether an IP address is loopback, private, link-local or otherwise not public (a push
    URL a caller gives may not reach the server's own network)."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def literal_host(url: str) -> str | None:
    """The URL's host when it is an IP address (or ``localhost``), else None (a name to
    resolve)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return "127.0.0.1"
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return None
    return host


def check_events(events: object) -> tuple[str, ...]:
    """A non-empty list of known webhook event types; InvalidInputError otherwise."""
    if (not isinstance(events, list | tuple) or not events
            or not all(isinstance(e, str) for e in events)):
        raise InvalidInputError("events must be a non-empty list of event types")
    unknown = [e for e in events if e not in WEBHOOK_TYPES]
    if unknown:
        raise InvalidInputError(f"unknown event type {unknown[0]!r} (known: "
                                f"{', '.join(WEBHOOK_TYPES)})")
    return tuple(dict.fromkeys(events))


# --- A2A push configs ---------------------------------------------------------------------------


#: the A2A task states after which a task changes no more (its push configs have nothing left
#: to send once they sent it)
TASK_ENDED = frozenset({"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED",
                        "TASK_STATE_REJECTED"})


class Push(msgspec.Struct, frozen=True, kw_only=True):
    """What an A2A push config adds to its subscription: the token and the credentials its
    receiver asked for (sent with each notification)."""

    token: str | None = None
    scheme: str | None = None
    credentials: str | None = None


def join_push(push: Push, config: bytes) -> bytes:
    """A push config's stored ``WebhookSpec.config``: :class:`Push`, then its JSON as it is
    answered (the TaskPushNotificationConfig), on a line of its own."""
    return msgspec.json.encode(push) + b"\n" + config


def split_push(stored: bytes | None) -> tuple[Push, bytes]:
    """:func:`join_push` read back."""
    head, _, config = (stored or b"").partition(b"\n")
    return msgspec.json.decode(head or b"{}", type=Push), config


# --- the settings file (AGENTIK_WEBHOOKS) --------------------------------------------------------

_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_FIELDS = {"id", "url", "events", "secret", "agent", "conversation"}


class WebhooksFileError(ValueError):
    """What is wrong with the settings file, each mistake named by its subscription."""


def parse_file(text: str, agents: Mapping[str, object] | None = None) -> list[ops.WebhookSpec]:
    """The subscriptions of AGENTIK_WEBHOOKS (TOML ``[[webhook]]`` tables: id, url, events,
    secret, optional agent and conversation); ``agents``: the known agents (an unknown one is a
    mistake). Raises WebhooksFileError naming every mistake."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise WebhooksFileError(f"not TOML: {exc}") from None
    mistakes: list[str] = []
    extra = set(doc) - {"webhook"}
    if extra:
        mistakes.append(f"unknown table {sorted(extra)[0]!r} (the file holds [[webhook]] tables)")
    specs: list[ops.WebhookSpec] = []
    for n, entry in enumerate(doc.get("webhook", []), 1):
        try:
            specs.append(_entry(entry, agents))
        except (ValueError, InvalidInputError, TypeError) as exc:
            name = entry.get("id", f"#{n}") if isinstance(entry, dict) else f"#{n}"
            mistakes.append(f"webhook {name!r}: {exc}")
    ids = [s.id for s in specs]
    mistakes += [f"webhook {i!r}: the id is used twice" for i in sorted(
        {i for i in ids if ids.count(i) > 1})]
    if mistakes:
        raise WebhooksFileError("; ".join(mistakes))
    return specs


def _entry(entry: object, agents: Mapping[str, object] | None) -> ops.WebhookSpec:
    if not isinstance(entry, dict):
        raise ValueError("not a table")
    unknown = set(entry) - _FIELDS
    if unknown:
        raise ValueError(f"unknown field {sorted(unknown)[0]!r}")
    for name in ("id", "url", "secret"):
        if not isinstance(entry.get(name), str):
            raise ValueError(f"{name} is required (a string)")
    if not _ID.fullmatch(entry["id"]):
        raise ValueError("id is 1 to 64 letters, digits, '_', '.' or '-'")
    agent, conversation = entry.get("agent"), entry.get("conversation")
    for name, value in (("agent", agent), ("conversation", conversation)):
        if value is not None and (not isinstance(value, str) or not value or "\x00" in value):
            raise ValueError(f"{name} is a non-empty string")
    if agent is not None and agents is not None and agent not in agents:
        raise ValueError(f"agent {agent!r} is not one of the server's agents")
    return ops.WebhookSpec(
        id=entry["id"], url=check_url(entry["url"]), events=check_events(entry.get("events")),
        agent=agent, conversation_id=conversation, secret=check_secret(entry["secret"]),
        source="file")
