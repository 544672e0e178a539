"""Traces across Kafka: W3C ``traceparent`` in record headers, a span per executed item.

Through ``opentelemetry-api`` only: with no SDK installed and configured by the application,
every call here is OpenTelemetry's no-op (a span that records nothing, no header written). With
an SDK (``opentelemetry-sdk`` and an exporter, set up by the user), a service's
:meth:`streamsched.Producer.send`, the outbox relay and the events a worker emits carry the
current trace in a ``traceparent`` header (and ``tracestate`` if any); the worker opens a span
per executed item as a child of the trace its record carries, so a chain service -> scheduler
-> downstream scheduler is one trace.

What a span carries is bounded and safe: the scheduler, partition, offset, fence, attempt, the
outcome and the ``sched_`` identity digest; never a payload, a tenant, a target or an error
message.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from opentelemetry import propagate, trace
from opentelemetry.context import Context

__all__ = ["TRACE_HEADERS", "current_trace_id", "enabled", "extract", "inject", "span", "use_provider",
           "with_trace"]

TRACE_HEADERS: Final = ("traceparent", "tracestate")
"""The W3C Trace Context headers (the only ones read from or written to records)."""
_MAX_HEADER = 512

Header = tuple[str, bytes]
_provider: trace.TracerProvider | None = None


def use_provider(provider: trace.TracerProvider | None) -> None:
    """Trace through ``provider`` instead of the global one (None: back to the global). For
    tests and for applications that keep several providers; OpenTelemetry's global provider can
    be set only once per process."""
    global _provider
    _provider = provider


def _tracer() -> trace.Tracer:
    return (_provider or trace.get_tracer_provider()).get_tracer("streamsched")


_SDK_SEEN = False
"""Set once a global SDK provider was found: OpenTelemetry's global provider is set only once."""
_NOT_YET_UNTIL = 0.0
"""Until when (monotonic) a "no SDK" answer is reused."""
RECHECK_S = 1.0
"""How long "no SDK" is believed before the global provider is asked again: asking reads the
environment each time (measured: 2 % of a Kafka-native worker's CPU when asked per item)."""


def enabled() -> bool:
    """Whether the application configured a tracer provider (an SDK). Without one every span is a
    no-op, so the worker skips even creating them on its hot path. An SDK set up after the worker
    started is noticed within :data:`RECHECK_S`."""
    global _SDK_SEEN, _NOT_YET_UNTIL
    if _provider is not None or _SDK_SEEN:
        return True
    now = time.monotonic()
    if now < _NOT_YET_UNTIL:
        return False
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        _SDK_SEEN = True
        return True
    _NOT_YET_UNTIL = now + RECHECK_S
    return False


def inject(context: Context | None = None) -> list[Header]:
    """The trace headers of ``context`` (default: the current one); empty without an SDK or an
    active span."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return [(k, v.encode("ascii", "replace")) for k, v in carrier.items() if k in TRACE_HEADERS]


def with_trace(headers: Iterable[Header] | None, context: Context | None = None) -> list[Header]:
    """``headers`` without any trace header, plus the current trace's (a record re-sent under a
    new span carries that span, not a stale parent)."""
    out = [(k, v) for k, v in headers or () if k not in TRACE_HEADERS]
    return out + inject(context)


def extract(headers: Iterable[tuple[str, bytes]] | None) -> Context:
    """The trace a record's headers carry (an empty context if none, or if malformed)."""
    carrier: dict[str, str] = {}
    for key, value in headers or ():
        if key in TRACE_HEADERS and len(value) <= _MAX_HEADER:
            carrier[key] = bytes(value).decode("ascii", "replace")
    return propagate.extract(carrier)


@contextlib.contextmanager
def span(name: str, *, parent: Context | None = None, attributes: Mapping[str, str | int] | None = None,
         kind: trace.SpanKind = trace.SpanKind.INTERNAL) -> Iterator[trace.Span]:
    """A span named ``name`` (child of ``parent``, else of the current span), current in the block.
    An exception ends it with status ERROR and its type only (no message: it may carry data)."""
    with _tracer().start_as_current_span(name, context=parent, kind=kind, attributes=dict(attributes or {}),
                                       record_exception=False, set_status_on_exception=False) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
            raise


def current_trace_id() -> str | None:
    """The current span's trace id (32 hex digits) when one is recording, for log lines."""
    ctx = trace.get_current_span().get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else None
