// One trace in Node: a request through idem-pg's Express middleware whose
// handler emits a message and submits a task; the Python relay
// (python3 -m idem_pg.relay) to Redis Streams; idem-pg/consumer's
// RedisConsumer; a TaskWorker's task.traced.  Spans recorded by the
// OpenTelemetry SDK's in-memory exporter (test/brokers/run.sh installs
// @opentelemetry/api, sdk-trace-base and context-async-hooks in the Node
// app).  Prints one "ok - ..." / "not ok - ..." line per check.
//
//   node traces.mjs REDIS_URL          (PY, PIPELINE_DSN, the libpq variables)
import { spawn } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import express from 'express';
import pg from 'pg';
import { createClient } from 'redis';
import { createIdempotency, emit, submit, TaskWorker } from 'idem-pg';
import { RedisConsumer } from 'idem-pg/consumer';

const url = process.argv[2];
const WAIT = Number(process.env.IDEM_WAIT || process.env.PG_TEST_TIMEOUT_DEFAULT || 180) * 1000;
const RUN = `trn${process.pid}`;
const TOPIC = `${RUN}.orders`;
const OWNER = 4343;
const KEY = `trace-key-${RUN}-0000001`;

const exporter = new InMemorySpanExporter();
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));

const check = (what, ok, detail = '') => console.log(ok ? `ok - traces: node: ${what}` : `not ok - traces: node: ${what} (${JSON.stringify(detail)})`);
const spans = (name) => exporter.getFinishedSpans().filter((s) => s.name === name);
const parentOf = (s) => s.parentSpanContext?.spanId ?? s.parentSpanId;

const pool = new pg.Pool({ database: 'idem_brokers', max: 4 });
const idem = createIdempotency({ pool, owner: () => OWNER });
const app = express();
app.post('/orders', idem.route('TRACED_ORDER_NODE', { request: ['sku'] }), async (req, res) => {
  await emit(req.idem.client, { topic: TOPIC, payload: { order: req.body.sku }, key: `sku-${req.body.sku}` });
  await submit(req.idem.client, { owner: OWNER, operation: 'TRACED_EXPORT_NODE', key: KEY.replace('key', 'task'),
    request: { sku: req.body.sku } });
  res.status(201).json({ created: true });
});
const server = app.listen(0, '127.0.0.1');
await new Promise((r) => server.once('listening', r));
const post = async (sku) => (await fetch(`http://127.0.0.1:${server.address().port}/orders`, {
  method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': KEY }, body: JSON.stringify({ sku }),
})).status;

const db = new pg.Client({ database: 'idem_brokers' });
await db.connect();
await db.query('DROP TABLE IF EXISTS trace_effect_node');
await db.query('CREATE TABLE trace_effect_node (message_id text)');
const statuses = [await post(7), await post(7), await post(8)];
const requests = spans('idem.request');
const outcomes = requests.map((s) => s.attributes['idem.outcome']);
check('three requests with one key: 201, 201, 409, spans executed, replayed, conflict',
  JSON.stringify(statuses) === '[201,201,409]' && JSON.stringify(outcomes) === '["executed","replayed","conflict"]', [statuses, outcomes]);
const first = requests[0];
const inside = exporter.getFinishedSpans().filter((s) => s.name.startsWith('idem_') && parentOf(s) === first.spanContext().spanId);
check(`each idem call of the first request is a span inside it (${inside.map((s) => s.name).join(', ')})`,
  ['idem_begin', 'idem_outbox_emit', 'idem_submit', 'idem_finish_stored'].every((n) => inside.some((s) => s.name === n)));
const words = JSON.stringify(exporter.getFinishedSpans().map((s) => s.attributes));
check('no span carries the key or the owner', !words.includes(KEY) && !words.includes(String(OWNER)), words.slice(0, 200));
const { rows: [m] } = await db.query('SELECT headers FROM idem_internal.idem_outbox WHERE topic = $1', [TOPIC]);
const tp = m?.headers?.traceparent ?? '';
check('the message carries the request\'s traceparent (SET LOCAL idem.trace_context by the middleware)',
  tp.split('-')[1] === first.spanContext().traceId && tp.split('-')[2] === first.spanContext().spanId, tp);

// the Python relay to Redis Streams, the Node consumer
const relay = spawn(process.env.PY, ['-m', 'idem_pg.relay', '--dsn', process.env.PIPELINE_DSN, '--topic', TOPIC,
  '--broker', url, '--partitions', '2', '--poll', '0.2'], { stdio: 'ignore' });
const redis = createClient({ url });
redis.on('error', () => {});
await redis.connect();
const consumer = new RedisConsumer({ pg: db, redis, topic: TOPIC, consumer: 'traced-node', name: 'traced-node-1', partitions: 2, lease: 2 });
const running = consumer.run(async (client, message) => {
  await client.query('INSERT INTO trace_effect_node VALUES ($1)', [message.messageId]);
});
const probe = new pg.Client({ database: 'idem_brokers' });
await probe.connect();
for (const end = Date.now() + WAIT; Date.now() < end; await sleep(100)) {
  if ((await probe.query('SELECT count(*)::int AS n FROM trace_effect_node')).rows[0].n > 0) break;
}
consumer.stop();
await running;
relay.kill('SIGTERM');
const consumed = spans('idem.consume');
check('the consumer\'s span resumes the request\'s trace, its parent the request\'s span, its outcome applied',
  consumed.length === 1 && consumed[0].spanContext().traceId === first.spanContext().traceId
  && parentOf(consumed[0]) === first.spanContext().spanId && consumed[0].attributes['idem.outcome'] === 'applied',
  consumed.map((s) => [s.spanContext().traceId, s.attributes['idem.outcome']]));

const [task] = await new TaskWorker('TRACED_EXPORT_NODE', 'traced-worker').lease(probe);
const span = await task.traced(probe, async (s) => {
  await task.complete(probe, 200, { exported: true });
  return s;
});
check('the task\'s span resumes the request\'s trace (idem_task_trace_context), its parent the request\'s span',
  span !== null && span.spanContext().traceId === first.spanContext().traceId && parentOf(span) === first.spanContext().spanId);
await probe.end();
await db.end();
await redis.quit();
await pool.end();
server.close();
process.exit(0);
