"""``AGENTIK_LOG_FORMAT=json``: one JSON object a line (docs/CONFIG.md), for agentik's lines and for
hypercorn's own.

Every line has ``ts`` (ISO 8601, UTC), ``level``, ``logger`` and ``msg``; an exception adds
``exc``. The context a line was logged with (``logging``'s ``extra=``) is added under its own
names when it is one of :data:`FIELDS`: access lines carry ``method``, ``path``, ``status``,
``duration_ms`` and ``client_id``; turn lines ``conversation_id`` and ``turn_id``. A line logged
inside a traced span (traces on, docs/OBSERVABILITY.md) adds its ``trace_id`` and ``span_id``.

What came from a request is already escaped and masked by the caller (``agentik.web.logsafe``),
the same text as in text mode; JSON encoding then makes any character safe inside its string, so
one record is always one line.
"""

from __future__ import annotations

import datetime
import logging

import msgspec

from agentik import tracing

#: context fields copied from a record's ``extra`` into its JSON object
FIELDS = ("method", "path", "status", "duration_ms", "client_id", "conversation_id", "turn_id")

_encoder = msgspec.json.Encoder()


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        out: dict[str, object] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                out[name] = value
        ids = tracing.log_ids()  # formatted as it is logged: in the task of its span
        if ids is not None:
            out["trace_id"], out["span_id"] = ids
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return _encoder.encode(out).decode()


TEXT_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``AGENTIK_LOG_FORMAT`` (text or json)."""
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def use_json_for_hypercorn() -> None:
    """Give hypercorn's own handlers (plain ``hypercorn -k trio``) the JSON formatter."""
    for name in ("hypercorn.error", "hypercorn.access"):
        for handler in logging.getLogger(name).handlers:
            handler.setFormatter(JsonFormatter())
