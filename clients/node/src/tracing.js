// Traces, when @opentelemetry/api is installed (an optional peer
// dependency; docs/clients.md, "Traces"); without it every function here
// does nothing.  Spans for each idempotent request, each idem call, each
// consumed message and a task's work, never with a key or an owner; the
// W3C traceparent crosses the database through idem.trace_context.
let otel = null;
try {
  otel = await import('@opentelemetry/api');
} catch {
  otel = null;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
const CALL = /@idem@\.(idem_[a-z_]+)\(/;

export const enabled = () => otel !== null;

// The active span's traceparent, or null.
export function traceparent() {
  if (!otel) return null;
  const span = otel.trace.getActiveSpan();
  const c = span && span.spanContext();
  if (!c || !otel.isSpanContextValid(c)) return null;
  return `00-${c.traceId}-${c.spanId}-${(c.traceFlags & 0xff).toString(16).padStart(2, '0')}`;
}

// The context to resume from a traceparent (string or Buffer), or undefined.
export function parentOf(value) {
  if (!otel || value === null || value === undefined) return undefined;
  const m = TRACEPARENT.exec(Buffer.isBuffer(value) ? value.toString('latin1') : String(value));
  if (!m || m[1] === 'ff') return undefined;
  const spanContext = { traceId: m[2], spanId: m[3], traceFlags: parseInt(m[4], 16), isRemote: true };
  if (!otel.isSpanContextValid(spanContext)) return undefined;
  return otel.trace.setSpanContext(otel.context.active(), spanContext);
}

// fn(span) inside a span made active (fn(null) without OpenTelemetry).
export async function inSpan(name, { kind = 'internal', parent, attributes = {} } = {}, fn) {
  if (!otel) return fn(null);
  const tracer = otel.trace.getTracer('idem-pg');
  return tracer.startActiveSpan(name, { kind: otel.SpanKind[kind.toUpperCase()], attributes },
    parent ?? otel.context.active(), async (span) => {
      try {
        return await fn(span);
      } catch (e) {
        span.recordException(e);
        span.setStatus({ code: otel.SpanStatusCode.ERROR });
        throw e;
      } finally {
        span.end();
      }
    });
}

// The span of one idem call, named after its function; none for a
// statement that calls no function of idem's (the grants' check).
export function callSpan(text, operation, fn) {
  const m = CALL.exec(text);
  if (!m) return fn(null);
  const name = m[1];
  const attributes = { 'db.system': 'postgresql', 'idem.call': name };
  if (typeof operation === 'string') attributes['idem.operation'] = operation;
  return inSpan(name, { kind: 'client', attributes }, fn);
}

export function setOutcome(span, outcome, status) {
  if (!span) return;
  span.setAttribute('idem.outcome', outcome);
  if (status !== undefined) span.setAttribute('http.response.status_code', status);
}

// SET LOCAL idem.trace_context (pg_catalog's function: no name of idem's).
export const SET_TRACE = "SELECT pg_catalog.set_config('idem.trace_context', $1::pg_catalog.text, true)";
