// idem from Node: the SQL API of the idem extension on a pg client (or
// anything with pg's query(text, values)), in the caller's transaction.
// None of these functions commits or rolls back: the caller's transaction
// decides, so the business writes and idem's record commit together.
// int8 values (owner, resource and task ids, tokens) come back as strings,
// as pg returns them.

import { statement } from './schema.js';

import { NoClaim, SerializationFailure, translate } from './errors.js';
import * as tracing from './tracing.js';

async function plain(db, text, values) {
  try {
    return (await db.query(await statement(db, text), values)).rows;
  } catch (e) {
    throw translate(e);
  }
}

// One idem call (in a span of its own when OpenTelemetry is installed;
// operation: its attribute, when the call acts for one).
function query(db, text, values, operation) {
  return tracing.enabled() ? tracing.callSpan(text, operation, () => plain(db, text, values)) : plain(db, text, values);
}

const json = (v) => (v === undefined || v === null ? null
  : v instanceof RawJson ? v.text : Buffer.isBuffer(v) ? v.toString('utf8') : JSON.stringify(v));
const ttl = (t) => (t === undefined || t === null ? null : `${Number(t)} seconds`);

// JSON text passed as it is (a response body stored byte for byte).
export class RawJson {
  constructor(text) { this.text = Buffer.isBuffer(text) ? text.toString('utf8') : String(text); }
}

const OUTCOME = 'replayed, http_status, body::pg_catalog.text AS body, headers, resource_id, expires_at';
// Every statement names idem's schema (@idem@, schema.js) and casts every
// argument to the type of idem's parameter.
const outcome = (r) => ({
  replayed: r.replayed, httpStatus: r.http_status, body: r.body, headers: r.headers,
  resourceId: r.resource_id, expiresAt: r.expires_at,
});

// Whether the session's role may call what idem_grant(role, 'app') gives
// (asked after a 42501, which also means an owner outside
// idem.allowed_owners): { granted, role }.
export async function appGrants(db) {
  const [r] = await query(db, 'SELECT pg_catalog.has_function_privilege('
    + "'@idem@.idem_begin(bigint, text, text, jsonb, interval)', 'EXECUTE') AND pg_catalog.has_function_privilege("
    + "'@idem@.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json)', 'EXECUTE') AS granted,"
    + ' current_user::pg_catalog.text AS role', []);
  return { granted: r.granted, role: r.role };
}

// idem_begin: claim the key for this transaction ({replayed: false}), or replay.
export async function begin(db, { owner, operation, key, request, ttl: t }) {
  const [r] = await query(db, `SELECT ${OUTCOME} FROM @idem@.idem_begin($1::pg_catalog.int8, $2::pg_catalog.text, $3::pg_catalog.text, $4::pg_catalog.jsonb, $5::pg_catalog.interval)`,
    [owner, operation, key, json(request), ttl(t)], operation);
  return outcome(r);
}

// idem_finish: store this transaction's claim's answer (2xx-4xx).
const finishParams = ({ owner, operation, key, status, body, resourceId, headers }) => [owner, operation, key,
  status, json(body), resourceId ?? null, headers ? JSON.stringify(headers) : null];

export async function finish(db, args) {
  await query(db, 'SELECT @idem@.idem_finish($1::pg_catalog.int8, $2::pg_catalog.text, $3::pg_catalog.text, $4::pg_catalog.int4, $5::pg_catalog.json, $6::pg_catalog.int8, $7::pg_catalog.jsonb)', finishParams(args),
    args.operation);
}

// idem_finish_stored (idem 1.13): finish, returning the answer as stored --
// after the operation's redact policy -- exactly as a replay returns it
// ({replayed: false}): what a copy kept elsewhere (the fast layer) keeps.
export async function finishStored(db, args) {
  const [r] = await query(db, `SELECT ${OUTCOME} FROM @idem@.idem_finish_stored($1::pg_catalog.int8, $2::pg_catalog.text, $3::pg_catalog.text, $4::pg_catalog.int4, $5::pg_catalog.json, $6::pg_catalog.int8, $7::pg_catalog.jsonb)`,
    finishParams(args), args.operation);
  return outcome(r);
}

// idem_run: call the SQL handler (a regprocedure) once per key, or replay.
export async function run(db, { owner, operation, key, request, handler, ttl: t }) {
  const [r] = await query(db,
    `SELECT ${OUTCOME} FROM @idem@.idem_run($1::pg_catalog.int8, $2::pg_catalog.text, $3::pg_catalog.text, $4::pg_catalog.jsonb, $5::pg_catalog.regprocedure, $6::pg_catalog.interval)`,
    [owner, operation, key, json(request), handler, ttl(t)], operation);
  return outcome(r);
}

// idem_submit: start a long flow, or tell its state.
export async function submit(db, { owner, operation, key, request, payload, ttl: t }) {
  const [r] = await query(db, 'SELECT replayed, status, http_status, body::pg_catalog.text AS body, headers, resource_id, task_id'
    + ' FROM @idem@.idem_submit($1::pg_catalog.int8, $2::pg_catalog.text, $3::pg_catalog.text, $4::pg_catalog.jsonb, $5::pg_catalog.jsonb, $6::pg_catalog.interval)',
  [owner, operation, key, json(request), json(payload), ttl(t)], operation);
  // reconciling: the task's outcome is being reconciled (idem 1.16); body is
  // then a problem (application/problem+json) to answer with its 202
  return { replayed: r.replayed, status: r.status, httpStatus: r.http_status, body: r.body,
    headers: r.headers, resourceId: r.resource_id, taskId: r.task_id,
    reconciling: r.body != null && r.body.includes('"urn:idem:task:reconciling"') };
}

// idem_consume: true the first time the consumer sees the message.
// owner (idem 1.11): kept with the inbox entry, for idem_forget_owner.
export async function consume(db, { consumer, messageId, ttl: t, owner }) {
  const [r] = owner == null
    ? await query(db, 'SELECT @idem@.idem_consume($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.interval) AS first', [consumer, messageId, ttl(t)])
    : await query(db, 'SELECT @idem@.idem_consume($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.interval, $4::pg_catalog.int8) AS first',
      [consumer, messageId, ttl(t), String(owner)]);
  return r.first;
}

// idem_outbox_emit: a message published once this transaction commits; its id.
export async function emit(db, { topic, payload, key, headers }) {
  const [r] = await query(db, 'SELECT @idem@.idem_outbox_emit($1::pg_catalog.text, $2::pg_catalog.jsonb, $3::pg_catalog.text, $4::pg_catalog.jsonb) AS id',
    [topic, json(payload), key ?? null, headers ? JSON.stringify(headers) : null]);
  return r.id;
}

// claim(db, scope, work): begin; a replay returns its outcome; otherwise
// work({finish}) runs (in the caller's transaction) and must finish.
export async function claim(db, scope, work) {
  const o = await begin(db, scope);
  if (o.replayed) return o;
  let finished = null;
  const c = {
    outcome: o,
    // the answer as stored (after the operation's redact policy), as a
    // replay returns it: c.outcome too from then on
    async finish(status, body, { resourceId, headers } = {}) {
      finished = await finishStored(db, { ...scope, status, body, resourceId, headers });
      c.outcome = finished;
      return finished;
    },
  };
  await work(c);
  if (!finished) throw new NoClaim('the claim of the key was not finished: call finish() in the work', 'IK003');
  return finished;
}

// Run transaction() (which opens, does and commits one transaction) again
// on 40001, up to attempts times, with a random backoff in between.
export async function retrySerializable(transaction, { attempts = 5, baseDelayMs = 10, maxDelayMs = 1000 } = {}) {
  for (let i = 0; ; i++) {
    try {
      return await transaction();
    } catch (e) {
      const t = translate(e);
      if (!(t instanceof SerializationFailure) || i === attempts - 1) throw t;
      await new Promise((r) => setTimeout(r, Math.random() * Math.min(maxDelayMs, baseDelayMs * 2 ** i)));
    }
  }
}

// A long flow's worker: leases due tasks of one operation; each task
// carries its fencing token for heartbeat, complete and fail (StaleToken
// when it was taken over: nothing changes).
export class TaskWorker {
  constructor(operation, worker, { leaseSeconds = 30, bindSession = false } = {}) {
    Object.assign(this, { operation, worker, leaseSeconds, bindSession });
  }

  async lease(db, batch = 1) {
    const rows = await query(db, 'SELECT task_id, owner, key, request, payload, attempt, token, lease_expires_at'
      + ' FROM @idem@.idem_lease($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.interval, $4::pg_catalog.int4, $5::pg_catalog.bool)',
    [this.operation, this.worker, ttl(this.leaseSeconds), batch, this.bindSession], this.operation);
    return rows.map((r) => new Task(r));
  }

  // Tasks whose outcome is uncertain (idem 1.16), each with a new token and
  // its attempts so far; a plain lease never returns them.
  async leaseReconcile(db, batch = 1) {
    const rows = await query(db, 'SELECT task_id, owner, key, request, payload, attempt, token, lease_expires_at,'
      + ' uncertain_since, attempts'
      + ' FROM @idem@.idem_lease_reconcile($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.interval, $4::pg_catalog.int4, $5::pg_catalog.bool)',
    [this.operation, this.worker, ttl(this.leaseSeconds), batch, this.bindSession], this.operation);
    return rows.map((r) => new ReconcileTask(r));
  }
}

export class Task {
  constructor(r) {
    Object.assign(this, { taskId: r.task_id, owner: r.owner, key: r.key, request: r.request,
      payload: r.payload, attempt: r.attempt, token: r.token, leaseExpiresAt: r.lease_expires_at });
  }

  async heartbeat(db, extendSeconds) {
    const [r] = await query(db, 'SELECT @idem@.idem_heartbeat($1::pg_catalog.int8, $2::pg_catalog.int8, $3::pg_catalog.interval) AS until',
      [this.taskId, this.token, ttl(extendSeconds)]);
    this.leaseExpiresAt = r.until;
    return r.until;
  }

  async complete(db, status, body, { resourceId, headers } = {}) {
    await query(db, 'SELECT @idem@.idem_complete($1::pg_catalog.int8, $2::pg_catalog.int8, $3::pg_catalog.int4, $4::pg_catalog.json, $5::pg_catalog.int8, $6::pg_catalog.jsonb)',
      [this.taskId, this.token, status, json(body), resourceId ?? null, headers ? JSON.stringify(headers) : null]);
  }

  async fail(db, error, retryable = true) {
    const [r] = await query(db, 'SELECT @idem@.idem_fail($1::pg_catalog.int8, $2::pg_catalog.int8, $3::pg_catalog.jsonb, $4::pg_catalog.bool) AS status',
      [this.taskId, this.token, json(error), retryable]);
    return r.status;
  }

  // fn(span) in a span ('idem.task') resuming the trace the task was
  // submitted under (idem_task_trace_context, idem 1.16); fn(null) without
  // OpenTelemetry.  Inside it, traceparent() is this span's.
  async traced(db, fn) {
    if (!tracing.enabled()) return fn(null);
    const [r] = await query(db, 'SELECT @idem@.idem_task_trace_context($1::pg_catalog.int8, $2::pg_catalog.int8) AS trace',
      [this.taskId, this.token]);
    return tracing.inSpan('idem.task', { kind: 'consumer', parent: tracing.parentOf(r.trace),
      attributes: { 'idem.task.attempt': this.attempt } }, fn);
  }

  // The attempt's outcome is unknown (a provider's timeout): 'PROCESSING'
  // when the operation reconciles, else as a retryable fail.
  async failUnknown(db, error) {
    const [r] = await query(db, 'SELECT @idem@.idem_fail_unknown($1::pg_catalog.int8, $2::pg_catalog.int8, $3::pg_catalog.jsonb) AS status',
      [this.taskId, this.token, json(error)]);
    return r.status;
  }
}

// A task leased to find out what its uncertain attempt did: ask the
// provider, then complete, fail for good, notCharged, or failUnknown again.
export class ReconcileTask extends Task {
  constructor(r) {
    super(r);
    Object.assign(this, { uncertainSince: r.uncertain_since, attempts: r.attempts ?? [] });
  }

  // The provider has no trace of the attempt: it had no effect, the task is due again.
  notCharged(db, error = { reconciled: 'not charged' }) {
    return this.fail(db, error, true);
  }
}


// An operator's actions (idem 1.16): the role needs idem_grant(role,
// 'operator'); bound by its idem.allowed_owners and allowed_operations;
// audited (idem_operator_actions) with the reason.  TaskStateConflict
// (IK008, 409) for a task whose state the action does not take.
const one = async (db, text, values) => (await query(db, text, values))[0].r;

export const cancelTask = (db, { taskId, reason }) => one(db,
  'SELECT @idem@.idem_task_cancel($1::pg_catalog.int8, $2::pg_catalog.text) AS r', [taskId, reason]);

export const retryTask = (db, { taskId, reason }) => one(db,
  'SELECT @idem@.idem_task_retry($1::pg_catalog.int8, $2::pg_catalog.text) AS r', [taskId, reason]);

export const resolveTask = (db, { taskId, status, body, reason, resourceId, headers }) => one(db,
  'SELECT @idem@.idem_task_resolve($1::pg_catalog.int8, $2::pg_catalog.int4, $3::pg_catalog.json, $4::pg_catalog.text, $5::pg_catalog.int8, $6::pg_catalog.jsonb) AS r',
  [taskId, status, json(body), reason, resourceId ?? null, headers ? JSON.stringify(headers) : null]);

export const settleTask = (db, { taskId, happened, reason, status, body, resourceId }) => one(db,
  'SELECT @idem@.idem_task_settle($1::pg_catalog.int8, $2::pg_catalog.bool, $3::pg_catalog.text, $4::pg_catalog.int4, $5::pg_catalog.json, $6::pg_catalog.int8) AS r',
  [taskId, happened, reason, status ?? null, happened ? json(body) : null, resourceId ?? null]);

export const redriveMessages = (db, { messageIds, reason }) => one(db,
  'SELECT @idem@.idem_outbox_redrive($1::pg_catalog.int8[], $2::pg_catalog.text) AS r', [messageIds, reason ?? null]);

export const discardMessages = (db, { messageIds, reason }) => one(db,
  'SELECT @idem@.idem_outbox_discard($1::pg_catalog.int8[], $2::pg_catalog.text) AS r', [messageIds, reason ?? null]);

export const redriveConsumer = (db, { consumer, messageIds, discard = false, reason }) => one(db,
  'SELECT @idem@.idem_inbox_redrive($1::pg_catalog.text, $2::pg_catalog.text[], $3::pg_catalog.bool, $4::pg_catalog.text) AS r',
  [consumer, messageIds ?? null, discard, reason ?? null]);
