#!/usr/bin/python3
"""One trace from an HTTP request through the outbox, the relay and Redis
Streams to the consumer's effect, and through a task to its worker, with
idem_pg's spans (opentelemetry-api) recorded by the OpenTelemetry SDK's
in-memory exporter (test/brokers/run.sh installs both in the stage's venv).

In one process: a WSGI application behind ``idem_pg.wsgi``'s middleware
whose handler emits a message and submits a task, the relay
(``idem_pg.relay.Relay``) and a ``RedisConsumer`` in threads, a
``TaskWorker``.  The request's span, the message's ``traceparent``
header, the consumer's span and the task's span must share one trace,
each resuming from the request's span; no span carries a key or an owner.

The relay's copy of the traceparent into the broker's own headers is
checked for each broker (RabbitMQ and Kafka with ``traces.py KIND URL
--header-only``).

    traces.py redis|rabbitmq|kafka BROKER_URL [--header-only]

Prints one "ok - ..." / "not ok - ..." line per check.
"""
import io
import json
import os
import sys
import threading
import time

import psycopg
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from idem_pg import TaskWorker, emit, submit
from idem_pg.consumer import RedisConsumer
from idem_pg.http import Routes, Settings
from idem_pg.relay import Relay
from idem_pg.wsgi import IdempotencyMiddleware, context

KIND, URL = sys.argv[1], sys.argv[2]
DSN = os.environ.get("PIPELINE_DSN", "dbname=idem_brokers")
WAIT = float(os.environ.get("IDEM_WAIT") or os.environ.get("PG_TEST_TIMEOUT_DEFAULT") or 180)
RUN = "tr%d" % os.getpid()
TOPIC, OPERATION, TASK_OP = RUN + ".orders", "TRACED_ORDER", "TRACED_EXPORT"
KEY = "trace-key-%s-0000001" % RUN
OWNER = 4242

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


def check(what, ok, detail=""):
    print(("ok - traces: %s" % what) if ok else ("not ok - traces: %s (%s)" % (what, detail)))
    sys.stdout.flush()


def db():
    return psycopg.connect(DSN, autocommit=True)


def app(environ, start_response):
    """The handler, in the claim's transaction: a message and a task."""
    ctx = context(environ)
    body = json.loads(environ["wsgi.input"].read() or b"{}")
    emit(ctx.conn, TOPIC, {"order": body["sku"]}, key="sku-%s" % body["sku"])
    submit(ctx.conn, OWNER, TASK_OP, KEY.replace("key", "task"), {"sku": body["sku"]})
    start_response("201 Created", [("Content-Type", "application/json")])
    return [b'{"created": true}']


middleware = IdempotencyMiddleware(app, Routes().add("POST", "/orders", OPERATION, request=["sku"]),
                                   Settings(owner=lambda environ: OWNER, connection=lambda: psycopg.connect(DSN)))


def post(body, key=KEY):
    raw = json.dumps(body).encode()
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/orders", "CONTENT_LENGTH": str(len(raw)),
               "CONTENT_TYPE": "application/json", "HTTP_IDEMPOTENCY_KEY": key, "wsgi.input": io.BytesIO(raw)}
    status = []
    out = b"".join(middleware(environ, lambda s, h, e=None: status.append(s)))
    return int(status[0].split()[0]), out


def spans(name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


def broker_header(topic):
    """The traceparent header of the topic's first message in the broker (partition 0 of 1)."""
    if KIND == "redis":
        import redis
        r = redis.Redis.from_url(URL, decode_responses=True)
        entries = r.xrange("%s.0" % topic)
        r.close()
        return entries[0][1].get("traceparent") if entries else None
    if KIND == "rabbitmq":
        import pika
        conn = pika.BlockingConnection(pika.URLParameters(URL))
        method, props, _ = conn.channel().basic_get("%s.0" % topic, auto_ack=True)
        conn.close()
        return (props.headers or {}).get("traceparent") if method else None
    import dead_letters
    messages = dead_letters.kafka_read(topic)
    return dict(messages[0].headers()).get("traceparent", b"").decode() if messages else None


def relayed_header():
    """An emit under a trace: the relay puts its traceparent into the broker's headers."""
    topic = RUN + ".header"
    with trace.get_tracer("test").start_as_current_span("emitter") as emitter:
        with db() as c, c.transaction():
            c.execute("SELECT pg_catalog.set_config('idem.trace_context', %s, true)",
                      ("00-%032x-%016x-01" % (emitter.context.trace_id, emitter.context.span_id),))
            emit(c, topic, {"n": 1})
    relay = Relay(DSN, topic, URL, partitions=1, lease=5, poll=0.2)
    t = threading.Thread(target=relay.run)
    t.start()
    deadline = time.monotonic() + WAIT
    with db() as c:
        while time.monotonic() < deadline and c.execute(
                "SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = %s", (topic,)).fetchone()[0]:
            time.sleep(0.1)
    relay.stop()
    t.join(WAIT)
    header = broker_header(topic)
    check("%s: the relay copies the message's traceparent into the broker's own header" % KIND,
          header == "00-%032x-%016x-01" % (emitter.context.trace_id, emitter.context.span_id), header)


def main():
    relayed_header()
    if "--header-only" in sys.argv:
        return
    with db() as c:
        c.execute("DROP TABLE IF EXISTS trace_effect")
        c.execute("CREATE TABLE trace_effect (message_id text, traceparent text)")
    status, _ = post({"sku": 7})
    again, _ = post({"sku": 7})
    conflict, _ = post({"sku": 8})
    requests = spans("idem.request")
    outcomes = [s.attributes.get("idem.outcome") for s in requests]
    check("three requests with one key: executed 201, replayed 201, conflict 409, each a span with its outcome",
          (status, again, conflict) == (201, 201, 409) and outcomes == ["executed", "replayed", "conflict"],
          (status, again, conflict, outcomes))
    first = requests[0]
    calls = [s for s in exporter.get_finished_spans() if s.name.startswith("idem_")
             and s.parent is not None and s.parent.span_id == first.context.span_id]
    check("each idem call of the first request is a span inside it (%s)" % ", ".join(s.name for s in calls),
          {"idem_begin", "idem_finish_stored", "idem_outbox_emit", "idem_submit"} <= {s.name for s in calls},
          [s.name for s in calls])
    words = json.dumps([dict(s.attributes) for s in exporter.get_finished_spans()])
    check("no span carries the key or the owner", KEY not in words and str(OWNER) not in words, words[:300])
    with db() as c:
        headers = c.execute("SELECT headers FROM idem_internal.idem_outbox WHERE topic = %s", (TOPIC,)).fetchone()[0]
    tp = headers.get("traceparent", "")
    check("the message's headers carry the request's traceparent (idem.trace_context, SET LOCAL by the middleware)",
          tp.split("-")[1:3] == ["%032x" % first.context.trace_id, "%016x" % first.context.span_id], (tp, headers))

    relay = Relay(DSN, TOPIC, URL, partitions=2, lease=5, poll=0.2)

    def apply(conn, m):
        conn.execute("INSERT INTO trace_effect VALUES (%s, %s)", (m.message_id, (m.headers or {}).get("traceparent")))
    consumer = RedisConsumer(DSN, TOPIC, URL, consumer="traced", name="traced-1", partitions=2, lease=2.0)
    threads = [threading.Thread(target=relay.run), threading.Thread(target=consumer.run, args=(apply,))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        with db() as c:
            if c.execute("SELECT count(*) FROM trace_effect").fetchone()[0]:
                break
        time.sleep(0.1)
    relay.stop()
    consumer.stop()
    for t in threads:
        t.join(WAIT)
    consumed = spans("idem.consume")
    check("the consumer's span resumes the request's trace, its parent the request's span, its outcome applied",
          len(consumed) == 1 and consumed[0].context.trace_id == first.context.trace_id
          and consumed[0].parent.span_id == first.context.span_id
          and consumed[0].attributes.get("idem.outcome") == "applied",
          [(hex(s.context.trace_id), s.attributes.get("idem.outcome")) for s in consumed])

    worker = TaskWorker(TASK_OP, "traced-worker")
    with db() as c:
        tasks = worker.lease(c)
        with tasks[0].traced(c) as span, c.transaction():
            tasks[0].complete(c, 200, {"exported": True})
    check("the task's span resumes the request's trace (idem_task_trace_context), its parent the request's span",
          span is not None and span.context.trace_id == first.context.trace_id
          and span.parent.span_id == first.context.span_id, span)


if __name__ == "__main__":
    main()
