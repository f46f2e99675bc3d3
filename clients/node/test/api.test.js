// idem-pg's API against a real server (the libpq variables name it; the
// database of test/clients/run.sh): node --test test/
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import * as idem from 'idem-pg';

const key = () => `node-${randomUUID().replaceAll('-', '')}`;
const connect = async (config = {}) => {
  const c = new pg.Client(config);
  await c.connect();
  return c;
};

test('claim, then a replay in another spelling, byte for byte', async () => {
  const c = await connect();
  const k = key();
  await c.query('BEGIN');
  const first = await idem.claim(c, { owner: 1, operation: 'DEBIT', key: k, request: { account: 7, amount: 100 } },
    (claim) => claim.finish(201, new idem.RawJson('{"b":1,  "a":2}'), { resourceId: 9, headers: { location: '/d/9' } }));
  await c.query('COMMIT');
  const again = await idem.begin(c, { owner: 1, operation: 'DEBIT', key: k, request: { amount: 100, account: 7.0 } });
  assert.equal(first.replayed, false);
  assert.deepEqual([again.replayed, again.httpStatus, again.body, again.resourceId, again.headers],
    [true, 201, '{"b":1,  "a":2}', '9', { location: '/d/9' }]);
  assert.ok(again.expiresAt.getTime() - Date.now() > 23 * 3600 * 1000);
  await c.end();
});

test('a claim the work does not finish is NoClaim', async () => {
  const c = await connect();
  await c.query('BEGIN');
  await assert.rejects(idem.claim(c, { owner: 1, operation: 'DEBIT', key: key(), request: {} }, async () => {}),
    idem.NoClaim);
  await c.query('ROLLBACK');
  await c.end();
});

test('one error class per SQLSTATE', async () => {
  const c = await connect();
  const k = key();
  await c.query('BEGIN');
  await idem.begin(c, { owner: 1, operation: 'DEBIT', key: k, request: { n: 1 } });
  await idem.finish(c, { owner: 1, operation: 'DEBIT', key: k, status: 200, body: {} });
  await c.query('COMMIT');
  const cases = [
    [idem.KeyReused, 'IK001', () => idem.begin(c, { owner: 1, operation: 'DEBIT', key: k, request: { n: 2 } })],
    [idem.NoClaim, 'IK003', () => idem.finish(c, { owner: 1, operation: 'DEBIT', key: key(), status: 200 })],
    [idem.InvalidRequest, '22023', () => idem.begin(c, { owner: 1, operation: 'DEBIT', key: 'short', request: {} })],
    [idem.InvalidRequest, '22004', () => idem.begin(c, { owner: 1, operation: 'DEBIT', key: key(), request: null })],
  ];
  for (const [Cls, state, call] of cases) {
    await c.query('BEGIN');
    await assert.rejects(call(), (e) => e instanceof Cls && e.sqlstate === state && e.cause instanceof Error);
    await c.query('ROLLBACK');
  }
  // IK007: an expired key of an operation that refuses reuse (1.11)
  const ek = key();
  await c.query("SELECT public.idem_set_policy('EXPIRING'::pg_catalog.text, audit_ttl => '30 days'::pg_catalog.interval,"
    + " reuse_after_expiry => 'refuse'::pg_catalog.text)");
  await c.query('BEGIN');
  await idem.begin(c, { owner: 1, operation: 'EXPIRING', key: ek, request: {} });
  await idem.finish(c, { owner: 1, operation: 'EXPIRING', key: ek, status: 201, body: {} });
  await c.query('COMMIT');
  await c.query("UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 minute' WHERE idempotency_key = $1", [ek]);
  await assert.rejects(idem.begin(c, { owner: 1, operation: 'EXPIRING', key: ek, request: {} }),
    (e) => e instanceof idem.KeyExpired && e.sqlstate === 'IK007');
  await c.query("SELECT public.idem_drop_policy('EXPIRING'::pg_catalog.text)");
  const holder = await connect();
  const other = await connect({ options: '-c idem.wait_timeout=0' });
  const held = key();
  await holder.query('BEGIN');
  await idem.begin(holder, { owner: 1, operation: 'DEBIT', key: held, request: {} });
  await assert.rejects(idem.begin(other, { owner: 1, operation: 'DEBIT', key: held, request: {} }), idem.InFlight);
  await holder.query('ROLLBACK');
  const ro = await connect({ options: '-c default_transaction_read_only=on' });
  const rk = key();
  await ro.query('BEGIN');
  await idem.begin(ro, { owner: 1, operation: 'DEBIT', key: rk, request: {} });
  await assert.rejects(idem.finish(ro, { owner: 1, operation: 'DEBIT', key: rk, status: 201 }), idem.ReadOnly);
  const app = await connect({ user: 'shop_app' });
  await assert.rejects(idem.begin(app, { owner: 5000000, operation: 'DEBIT', key: key(), request: {} }), idem.NotAllowed);
  await Promise.all([c, holder, other, ro, app].map((x) => x.end()));
});

test('retrySerializable retries a real 40001 and then replays', async () => {
  const a = await connect();
  const b = await connect();
  const k = key();
  let attempts = 0;
  const outcome = await idem.retrySerializable(async () => {
    attempts += 1;
    await b.query('BEGIN ISOLATION LEVEL SERIALIZABLE');
    try {
      await b.query('SELECT 1');
      if (attempts === 1) {
        await a.query('BEGIN');
        await idem.begin(a, { owner: 1, operation: 'DEBIT', key: k, request: {} });
        await idem.finish(a, { owner: 1, operation: 'DEBIT', key: k, status: 201, body: { ok: true } });
        await a.query('COMMIT');
      }
      const o = await idem.begin(b, { owner: 1, operation: 'DEBIT', key: k, request: {} });
      await b.query('COMMIT');
      return o;
    } catch (e) {
      await b.query('ROLLBACK');
      throw e;
    }
  });
  assert.deepEqual([outcome.replayed, attempts], [true, 2]);
  await a.end();
  await b.end();
});

test('run with a SQL handler: once, then a replay', async () => {
  const c = await connect();
  await c.query('INSERT INTO account VALUES (9201, 100) ON CONFLICT (id) DO UPDATE SET balance = 100');
  const k = key();
  const scope = { owner: 1, operation: 'DEBIT', key: k, request: { account: 9201, amount: 10 }, handler: 'debit_handler(jsonb)' };
  const r1 = await idem.run(c, scope);
  const r2 = await idem.run(c, scope);
  assert.deepEqual([r1.replayed, r2.replayed, r1.httpStatus, r1.body], [false, true, 201, r2.body]);
  await c.end();
});

test('submit, lease, fail, takeover: the stale token is LeaseLost', async () => {
  const c = await connect();
  const op = `SHIP_${randomUUID().slice(0, 8)}`;
  const k = key();
  const s = await idem.submit(c, { owner: 1, operation: op, key: k, request: { order: 7 }, payload: { p: 1 } });
  assert.deepEqual([s.replayed, s.status, s.httpStatus], [false, 'PROCESSING', 202]);
  const [t1] = await new idem.TaskWorker(op, 'w1').lease(c, 10);
  assert.deepEqual([t1.key, t1.request, t1.payload, t1.attempt], [k, { order: 7 }, { p: 1 }, 1]);
  assert.equal(await t1.fail(c, { carrier: 'timeout' }), 'FAILED_RETRYABLE');
  await c.query("UPDATE idem_internal.idempotency_record SET task_due_at = now() - interval '1 second' WHERE id = $1", [t1.taskId]);
  const [t2] = await new idem.TaskWorker(op, 'w2').lease(c);
  assert.ok(BigInt(t2.token) > BigInt(t1.token));
  await assert.rejects(t1.complete(c, 201, { tracking: 'stale' }), idem.LeaseLost);
  await t2.heartbeat(c);
  await t2.complete(c, 201, { tracking: 'JD0123' }, { resourceId: 7 });
  const done = await idem.submit(c, { owner: 1, operation: op, key: k, request: { order: 7 } });
  assert.deepEqual([done.replayed, done.status, done.body], [true, 'SUCCEEDED', '{"tracking":"JD0123"}']);
  await c.end();
});

test('an uncertain outcome: never leased plainly again, reconciled with its attempts', async () => {
  const c = await connect();
  const op = `PAY_${randomUUID().slice(0, 8)}`;
  await c.query("SELECT public.idem_set_policy($1::pg_catalog.text, uncertain => 'reconcile'::pg_catalog.text)", [op]);
  try {
    const k = key();
    await idem.submit(c, { owner: 1, operation: op, key: k, request: { amount: 500 } });
    const worker = new idem.TaskWorker(op, 'w1');
    const [t1] = await worker.lease(c);
    assert.equal(await t1.failUnknown(c, { provider: 'timeout' }), 'PROCESSING');
    assert.deepEqual(await worker.lease(c, 10), []);
    const again = await idem.submit(c, { owner: 1, operation: op, key: k, request: { amount: 500 } });
    assert.deepEqual([again.httpStatus, again.reconciling, JSON.parse(again.body).type], [202, true, 'urn:idem:task:reconciling']);
    const [r] = await worker.leaseReconcile(c);
    assert.ok(r instanceof idem.ReconcileTask && BigInt(r.token) > BigInt(t1.token) && r.uncertainSince instanceof Date);
    assert.deepEqual(r.attempts.map((a) => [a.outcome, a.error]), [['unknown', { provider: 'timeout' }]]);
    await r.complete(c, 201, { charge: 'ch_1' });
    const done = await idem.submit(c, { owner: 1, operation: op, key: k, request: { amount: 500 } });
    assert.deepEqual([done.status, done.reconciling], ['SUCCEEDED', false]);
  } finally {
    await c.query('SELECT public.idem_drop_policy($1::pg_catalog.text)', [op]);
    await c.end();
  }
});

test('operator actions: settle, cancel (the holder fenced), IK008 as TaskStateConflict', async () => {
  const c = await connect();
  const op = `OPS_${randomUUID().slice(0, 8)}`;
  await c.query("SELECT public.idem_set_policy($1::pg_catalog.text, uncertain => 'reconcile'::pg_catalog.text)", [op]);
  try {
    const k1 = key();
    const k2 = key();
    await idem.submit(c, { owner: 1, operation: op, key: k1, request: { amount: 1 } });
    await idem.submit(c, { owner: 1, operation: op, key: k2, request: { amount: 2 } });
    const tasks = await new idem.TaskWorker(op, 'w1').lease(c, 2);
    const t1 = tasks.find((t) => t.key === k1);
    const t2 = tasks.find((t) => t.key === k2);
    assert.equal(await t1.failUnknown(c, { provider: 'timeout' }), 'PROCESSING');
    assert.equal(await idem.settleTask(c, { taskId: t1.taskId, happened: true, reason: 'found', status: 201, body: { charge: 'ch_1' } }), 'SUCCEEDED');
    assert.equal(await idem.cancelTask(c, { taskId: t2.taskId, reason: 'the customer asked' }), 'FAILED_FINAL');
    await assert.rejects(t2.complete(c, 201, { late: true }), idem.StaleToken);
    await assert.rejects(idem.retryTask(c, { taskId: t2.taskId, reason: 'too late' }),
      (e) => e instanceof idem.TaskStateConflict && e.httpStatus === 409);
  } finally {
    await c.query('SELECT public.idem_drop_policy($1::pg_catalog.text)', [op]);
    await c.end();
  }
});

test('emit, then consume once', async () => {
  const c = await connect();
  const id = await idem.emit(c, { topic: 'node-topic', payload: { order: 1 }, key: 'order-1', headers: { kind: 'x' } });
  const consumer = `billing-${randomUUID().slice(0, 6)}`;
  assert.equal(await idem.consume(c, { consumer, messageId: `node-topic-${id}` }), true);
  assert.equal(await idem.consume(c, { consumer, messageId: `node-topic-${id}` }), false);
  // an owner's entry (1.11): idem_forget_owner removes it
  const owner = 800000 + (Number(id) % 1000);
  assert.equal(await idem.consume(c, { consumer, messageId: `node-topic-${id}-owned`, owner }), true);
  const count = async () => (await c.query('SELECT count(*)::int AS n FROM idem_internal.idem_inbox WHERE owner_id = $1', [owner])).rows[0].n;
  assert.equal(await count(), 1);
  await c.query('SELECT public.idem_forget_owner($1::pg_catalog.int8)', [owner]);
  assert.equal(await count(), 0);
  await c.end();
});
