// What the library does when the database is not set up for it: a role
// without idem's grants (a 500 and one log line, not the owner binding's
// 403), an overload making idem's functions ambiguous (an error naming it),
// and idem's schema named in every statement (useSchema).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import pg from 'pg';
import * as idem from 'idem-pg';

const key = () => `node-${randomUUID().replaceAll('-', '')}`;
const su = async () => {
  const c = new pg.Client();
  await c.connect();
  return c;
};

async function withRole(work) {
  const c = await su();
  const role = `idem_node_${randomUUID().slice(0, 8)}`;
  await c.query(`CREATE ROLE "${role}" LOGIN`);
  try {
    return await work(c, role);
  } finally {
    await c.query(`DROP OWNED BY "${role}"`);
    await c.query(`DROP ROLE "${role}"`);
    await c.end();
  }
}

// POST one request through the middleware on node:http, connected as role
async function post(role, owner, logged) {
  const pool = new pg.Pool({ user: role, max: 2 });
  const mw = idem.createIdempotency({ pool, owner: () => owner, log: (m) => logged.push(m) });
  const server = http.createServer(mw.handler('SETUP_TEST', {}, async (req, res) => {
    res.writeHead(201, { 'content-type': 'application/json' });
    res.end('{"ok":true}');
  }));
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  try {
    const answer = await fetch(`http://127.0.0.1:${server.address().port}/things`, {
      method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key() }, body: '{"n":1}' });
    return { status: answer.status, body: await answer.json() };
  } finally {
    server.close();
    await pool.end();
  }
}

test('a role without idem\'s grants is a 500, logged once naming idem_grant', async () => {
  await withRole(async (c, role) => {
    const logged = [];
    const first = await post(role, 7, logged);
    const second = await post(role, 7, logged);
    assert.deepEqual([first.status, second.status], [500, 500]);
    assert.match(first.body.type, /internal/);
    assert.equal(logged.filter((m) => m.includes(`idem_grant('${role}', 'app')`)).length, 1, logged.join('\n'));
  });
});

test('an owner outside idem.allowed_owners is a 403', async () => {
  await withRole(async (c, role) => {
    await c.query("SELECT count(*) FROM public.idem_grant($1::pg_catalog.regrole, 'app'::pg_catalog.text)", [role]);
    await c.query(`ALTER ROLE "${role}" SET idem.allowed_owners = '1-5'`);
    assert.equal((await post(role, 7, [])).status, 403);
    assert.equal((await post(role, 3, [])).status, 201);
  });
});

test('an overload that makes idem_begin ambiguous: Misconfigured, naming it', async () => {
  const c = await su();
  const { rows: [{ schema }] } = await c.query(
    "SELECT extnamespace::regnamespace::text AS schema FROM pg_extension WHERE extname = 'idem'");
  await c.query(`CREATE FUNCTION ${schema}.idem_begin(bigint, text, text, jsonb, interval DEFAULT NULL, extra int DEFAULT 0)`
    + " RETURNS boolean LANGUAGE sql AS 'SELECT false'");
  try {
    const { rows: [h] } = await c.query('SELECT shadowing_functions FROM public.idem_health()');
    assert.ok(h.shadowing_functions.some((f) => f.includes('idem_begin')), String(h.shadowing_functions));
    await c.query('BEGIN');
    await assert.rejects(idem.begin(c, { owner: 1, operation: 'DEBIT', key: key(), request: {} }),
      (e) => e instanceof idem.Misconfigured && /idem_begin/.test(e.message) && /not unique/.test(e.message));
    await c.query('ROLLBACK');
  } finally {
    await c.query(`DROP FUNCTION ${schema}.idem_begin(bigint, text, text, jsonb, interval, int)`);
    await c.end();
  }
});

test('useSchema names the schema in every statement', async () => {
  const c = await su();
  const { rows: [{ schema }] } = await c.query(
    "SELECT extnamespace::regnamespace::text AS schema FROM pg_extension WHERE extname = 'idem'");
  try {
    idem.useSchema('no_such_schema');
    await c.query('BEGIN');
    await assert.rejects(idem.begin(c, { owner: 1, operation: 'DEBIT', key: key(), request: {} }), idem.Misconfigured);
    await c.query('ROLLBACK');
    idem.useSchema(schema);
    await c.query('BEGIN');
    const k = key();
    assert.equal((await idem.begin(c, { owner: 1, operation: 'DEBIT', key: k, request: {} })).replayed, false);
    await idem.finish(c, { owner: 1, operation: 'DEBIT', key: k, status: 201, body: {} });
    await c.query('COMMIT');
  } finally {
    idem.useSchema(null);
    await c.end();
  }
});
