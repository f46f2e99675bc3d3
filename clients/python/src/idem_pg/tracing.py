"""Traces, when ``opentelemetry-api`` is installed (the ``otel`` extra;
docs/clients.md, "Traces"); without it every function here does nothing.

- a span for each idempotent request (``idem.request``) and each idem call
  (``idem_begin``, ...), with the attributes ``idem.operation``,
  ``idem.outcome`` (executed, replayed, conflict, waited, error) and
  ``idem.call``; never a key or an owner;
- the trace context crosses the database: the request's transaction sets
  ``idem.trace_context`` (SET LOCAL) to the current span's W3C
  ``traceparent``, which ``idem_outbox_emit`` copies into the message's
  headers and ``idem_submit`` into the task; the relay copies it into the
  broker's headers, and the consumers and task workers resume from it.

The spans go wherever the application's OpenTelemetry SDK sends them.
"""
from __future__ import annotations

import re
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator, Mapping, Optional

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    _PROPAGATOR: Any = TraceContextTextMapPropagator()
except ImportError:         # the otel extra is not installed
    _trace = None
    _PROPAGATOR = None

_CALL_NAME = re.compile(r"@idem@\.(idem_[a-z_]+)\(")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def enabled() -> bool:
    """Whether opentelemetry-api is installed."""
    return _trace is not None


def traceparent() -> Optional[str]:
    """The current span's W3C traceparent, or None (no span, or no OpenTelemetry)."""
    if _PROPAGATOR is None:
        return None
    carrier: dict = {}
    _PROPAGATOR.inject(carrier)
    value = carrier.get("traceparent")
    return value if value and _TRACEPARENT.match(value) else None


def parent_of(value: Any) -> Any:
    """The context to resume from a traceparent (str or bytes), or None."""
    if _PROPAGATOR is None or value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return None
    return _PROPAGATOR.extract({"traceparent": str(value)})


def traceparent_of(fields: Mapping[str, Any], headers: Any = None) -> Any:
    """A delivery's traceparent: the broker's header, else the message's headers' (JSON object)."""
    value = fields.get("traceparent")
    if value is None and isinstance(headers, Mapping):
        value = headers.get("traceparent")
    return value


@contextmanager
def span(name: str, kind: str = "internal", parent: Any = None,
         attributes: Optional[Mapping[str, Any]] = None) -> Iterator[Any]:
    """A span made current for the block (None without OpenTelemetry)."""
    if _trace is None:
        yield None
        return
    tracer = _trace.get_tracer("idem_pg")
    with tracer.start_as_current_span(name, context=parent, kind=getattr(_trace.SpanKind, kind.upper()),
                                      attributes=dict(attributes or {})) as current:
        yield current


def call_span(sql: str, operation: Optional[str] = None) -> Any:
    """The span of one idem call, named after its function; a context that
    does nothing without OpenTelemetry, or for a statement that calls no
    function of idem's (the grants' check, the trace context's set_config)."""
    m = _CALL_NAME.search(sql) if _trace is not None else None
    if m is None:
        return nullcontext()
    name = m.group(1)
    attributes = {"db.system": "postgresql", "idem.call": name}
    if operation is not None:
        attributes["idem.operation"] = operation
    return span(name, "client", attributes=attributes)


def set_outcome(current: Any, outcome: str, status: Optional[int] = None) -> None:
    """Record a request's or a delivery's outcome on its span."""
    if current is None:
        return
    current.set_attribute("idem.outcome", outcome)
    if status is not None:
        current.set_attribute("http.response.status_code", status)


__all__ = ["enabled", "traceparent", "parent_of", "traceparent_of", "span", "call_span", "set_outcome"]
