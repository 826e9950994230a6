"""OpenTelemetry traces (docs/OBSERVABILITY.md): the one module every other calls through.

On only when the ``[otel]`` extra is installed and an OTLP endpoint is configured
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``): :func:`setup` then
imports the SDK and the OTLP/HTTP exporter, which read the other standard ``OTEL_*`` variables
themselves. Off, nothing of ``opentelemetry`` is imported and every call here is a test of one
module global: :func:`span` hands back one shared no-op, :func:`carry` ``None``.

A span made here becomes the current one of the task that entered it (contextvars), so spans
entered below it in the same task nest under it. A turn runs in its conversation's actor, another
task: the sender's context is taken along explicitly (:func:`carry`, kept on the mailbox
message) and given as ``parent``. Across processes the W3C ``traceparent`` header carries it
(:func:`extract` from a request, :func:`inject` into a model request or a forwarded command;
an MCP request's ``_meta`` gets it from the mcp SDK itself, which reads the current span).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Link, Tracer
    from opentelemetry.trace import Span as OtelSpan

log = logging.getLogger(__name__)

Kind = Literal["internal", "server", "client"]
#: what an attribute may hold (OpenTelemetry's own rule: primitives and their sequences)
Value = str | bool | int | float | tuple[str, ...]

_tracer: Tracer | None = None
_provider: TracerProvider | None = None
#: AGENTIK_TRACE_CONTENT: message text, tool arguments and results go into spans
_content = False


class Span:
    """What a caller may do with the span it is in; this base class is the no-op (traces off)."""

    __slots__ = ()

    def set(self, key: str, value: Value | None) -> None:
        pass

    def set_content(self, key: str, value: str) -> None:
        """Set ``key`` only where content may be recorded (AGENTIK_TRACE_CONTENT=1)."""

    def fail(self, message: str) -> None:
        """Mark the span failed (an error the code handled: a failed turn, a failed tool)."""

    def rename(self, name: str) -> None:
        """A better name learned inside it (a request's route, known once routed)."""


class _Noop:
    """The one no-op context manager :func:`span` returns while traces are off."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return _NOOP_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


_NOOP_SPAN = Span()
NOOP = _Noop()


class _Live(Span):
    __slots__ = ("_span",)

    def __init__(self, span: OtelSpan) -> None:
        self._span = span

    def set(self, key: str, value: Value | None) -> None:
        if value is not None:
            self._span.set_attribute(key, value)

    def set_content(self, key: str, value: str) -> None:
        if _content:
            self._span.set_attribute(key, value)

    def fail(self, message: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.set_status(Status(StatusCode.ERROR, message))

    def rename(self, name: str) -> None:
        self._span.update_name(name)


def enabled() -> bool:
    return _tracer is not None


def content() -> bool:
    """Whether spans may record what was said (AGENTIK_TRACE_CONTENT=1, and traces on)."""
    return _content and _tracer is not None


def setup(*, endpoint: str | None, content: bool = False, service: str = "agentik") -> bool:
    """Turn traces on when ``endpoint`` (the URL spans are posted to) is set and the SDK is
    installed (once per process: the provider is the process's; later calls only change
    ``content``). Whether they are on."""
    global _tracer, _provider, _content
    _content = content
    if _tracer is not None or not endpoint:
        return _tracer is not None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning("an OTLP endpoint is set but traces are off: install agentik[otel] (%s)", exc)
        return False
    # Resource.create reads OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES over this default.
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    # the exporter reads its headers, timeout and compression from OTEL_*; the batch processor
    # its delay and sizes (OTEL_BSP_*), and exports from its own thread
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    _provider, _tracer = provider, provider.get_tracer("agentik")
    return True


def shutdown() -> None:
    """Export what is left and turn traces off (blocking: a worker thread; tests, process end)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def flush(timeout_s: float = 5.0) -> None:
    """Export the spans ended so far (blocking: call it in a worker thread)."""
    if _provider is not None:
        _provider.force_flush(int(timeout_s * 1000))


def span(name: str, *, kind: Kind = "internal", parent: Context | None = None,
         attributes: Mapping[str, Value] | None = None,
         links: Sequence[Context | None] = ()) -> AbstractContextManager[Span]:
    """``with span(name) as s:`` a span, current in this task while inside; ``parent``: a context
    taken along from another task (:func:`carry`) or request (:func:`extract`), else this task's
    current span; ``links``: contexts whose spans it relates to without being their child. An
    exception leaving it marks it failed, a cancellation does not."""
    if _tracer is None:
        return NOOP
    return _span(_tracer, name, kind, parent, attributes, links)


@contextmanager
def _span(tracer: Tracer, name: str, kind: Kind, parent: Context | None,
          attributes: Mapping[str, Value] | None,
          links: Sequence[Context | None]) -> Iterator[Span]:
    from opentelemetry import trace

    kinds = {"internal": trace.SpanKind.INTERNAL, "server": trace.SpanKind.SERVER,
             "client": trace.SpanKind.CLIENT}
    otel = tracer.start_span(name, context=parent, kind=kinds[kind], attributes=attributes,
                             links=_links(links))
    live = _Live(otel)
    with trace.use_span(otel, end_on_exit=True, record_exception=False,
                        set_status_on_exception=False):
        try:
            yield live
        except Exception as exc:
            otel.record_exception(exc)
            live.fail(f"{type(exc).__name__}: {exc}")
            raise
        except BaseException:  # trio.Cancelled, KeyboardInterrupt: not a failure of its own
            otel.set_attribute("agentik.cancelled", True)
            raise


#: the most links a span made by :func:`record` keeps (a batch may hold hundreds of writes)
MAX_LINKS = 32


def record(name: str, seconds: float, *, links: Sequence[Context | None] = (),
           attributes: Mapping[str, Value] | None = None, failed: str | None = None) -> None:
    """A span for work timed elsewhere (a worker thread) that ended just now, ``seconds`` long:
    a root, linked to the spans current in ``links`` (those with one, the first MAX_LINKS)."""
    if _tracer is None:
        return

    end = time.time_ns()
    otel = _tracer.start_span(name, context=root(), attributes=attributes, links=_links(links),
                              start_time=end - int(seconds * 1e9))
    if failed is not None:
        _Live(otel).fail(failed)
    otel.end(end_time=end)


def _links(contexts: Sequence[Context | None]) -> list[Link]:
    from opentelemetry import trace

    spans = [trace.get_current_span(c).get_span_context() for c in contexts if c is not None]
    return [trace.Link(s) for s in spans if s.is_valid][:MAX_LINKS]


def root() -> Context | None:
    """A parent that is none: the span starts a trace of its own (None while traces are off)."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    return trace.set_span_in_context(trace.INVALID_SPAN)


def current() -> Span:
    """The span this task is in (a no-op one while traces are off or outside any)."""
    if _tracer is None:
        return _NOOP_SPAN
    from opentelemetry import trace

    return _Live(trace.get_current_span())


def carry() -> Context | None:
    """This task's trace context, to hand to another task (None while traces are off)."""
    if _tracer is None:
        return None
    from opentelemetry.context import get_current

    return get_current()


def extract(headers: Mapping[str, str]) -> Context | None:
    """The context a caller's ``traceparent`` (and ``tracestate``) header names, if any."""
    if _tracer is None or "traceparent" not in headers:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(headers)


def inject(headers: MutableMapping[str, str]) -> None:
    """Add this task's ``traceparent`` (and ``tracestate``) to outgoing ``headers``."""
    if _tracer is None:
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    TraceContextTextMapPropagator().inject(headers)


def child_of(traceparent: str | None) -> Context | None:
    """The context a ``traceparent`` carried in a message names (a WebSocket command's); without
    one, a new trace's (:func:`root`)."""
    if _tracer is None:
        return None
    return extract({"traceparent": traceparent}) if traceparent else root()


def log_ids() -> tuple[str, str] | None:
    """(trace id, span id) of this task's current span, in hex, for a log line; None if none."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
