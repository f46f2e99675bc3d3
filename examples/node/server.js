// The article's HTTP API on idem, in Node: node:http and pg (npm) with its pool.
//
//   POST /api/orders                Idempotency-Key, X-Owner-Id; {"skuId": 1, "quantity": 2}
//   POST /api/accounts/{id}/debit   Idempotency-Key, X-Owner-Id; {"amount": 100}
//
// X-Owner-Id stands in for real authentication: a real service takes the
// owner from its session or token, never from what the client says.
//
// Environment: PORT (8080), the libpq variables pg reads (PGHOST, PGPORT,
// PGUSER, PGDATABASE, ...), IDEM_PG_OPTIONS (e.g. "-c
// default_transaction_read_only=on"), IDEM_CONFLICT_STATUS (409, or 422 as
// the IETF draft has it), IDEM_POOL_SIZE (8).
'use strict';
const http = require('node:http');
const { Pool } = require('pg');

const CONFLICT_STATUS = Number(process.env.IDEM_CONFLICT_STATUS || 409);
const pool = new Pool({
  max: Number(process.env.IDEM_POOL_SIZE || 8),
  options: process.env.IDEM_PG_OPTIONS || undefined,
});
pool.on('error', (err) => console.error('idle client error:', err.message));

class ApiError extends Error {
  constructor(status, message, headers = {}) {
    super(message);
    this.status = status;
    this.headers = headers;
  }
}

// The HTTP answer to a database error (never its text beyond the message).
function errorOf(err) {
  switch (err.code) {
    case 'IK001': return new ApiError(CONFLICT_STATUS, 'idempotency key reused with a different request');
    case 'IK002': return new ApiError(409, 'a request with this idempotency key is in progress', { 'Retry-After': '1' });
    case '22023': case '22004': case '22003': return new ApiError(400, err.message);
    case '42501': return new ApiError(403, 'not allowed');
    case '25006': return new ApiError(503, 'the service is read-only for now', { 'Retry-After': '5' });
    default:
      console.error(`database error ${err.code}: ${err.message}`);
      return new ApiError(500, 'internal error');
  }
}

// One statement in a transaction of its own, per request.
async function call(sql, params) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const { rows } = await client.query(sql, params);
    await client.query('COMMIT');
    return rows[0];
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    if (err.code) throw errorOf(err);
    throw err;
  } finally {
    client.release();
  }
}

async function createOrder(owner, key, request) {
  const { skuId, quantity } = request;
  if (!Number.isInteger(skuId) || !Number.isInteger(quantity)) {
    throw new ApiError(400, 'skuId and quantity must be integers');
  }
  const r = await call(
    'SELECT order_id, order_no, status, http_status, replayed FROM idem_create_order($1, $2, $3, $4)',
    [owner, key, skuId, quantity]);
  // the stored response's columns, always in this order: the same bytes on a replay
  const body = JSON.stringify({ orderId: Number(r.order_id), orderNo: r.order_no, status: r.status });
  return { status: r.http_status, body, headers: { Location: `/api/orders/${r.order_id}` }, replayed: r.replayed };
}

async function debit(owner, key, account, request) {
  const { amount } = request;
  if (typeof amount !== 'number') throw new ApiError(400, 'amount must be a number');
  const r = await call(
    "SELECT replayed, http_status, body::text AS body, headers FROM idem_run($1, 'DEBIT', $2, $3::jsonb, 'debit_handler(jsonb)')",
    [owner, key, JSON.stringify({ account, amount })]);
  return { status: r.http_status, body: r.body, headers: r.headers || {}, replayed: r.replayed };
}

function send(res, status, body, headers = {}, replayed = false) {
  const data = Buffer.from(body);
  res.writeHead(status, {
    'Content-Type': 'application/json',
    'Content-Length': data.length,
    ...headers,
    ...(replayed ? { 'Idempotent-Replayed': 'true' } : {}),
  });
  res.end(data);
}

async function handle(req, raw) {
  const debitMatch = /^\/api\/accounts\/(\d{1,15})\/debit$/.exec(req.url);
  if (req.method !== 'POST' || (req.url !== '/api/orders' && !debitMatch)) throw new ApiError(404, 'not found');
  const key = req.headers['idempotency-key'];
  if (!key) throw new ApiError(400, 'the Idempotency-Key header is required');
  const ownerText = req.headers['x-owner-id'] || '';
  if (!/^-?\d{1,18}$/.test(ownerText)) throw new ApiError(400, 'the X-Owner-Id header must be an integer');
  let request;
  try {
    request = JSON.parse(raw || 'null');
  } catch {
    throw new ApiError(400, 'the body must be JSON');
  }
  if (request === null || typeof request !== 'object' || Array.isArray(request)) {
    throw new ApiError(400, 'the body must be a JSON object');
  }
  return debitMatch
    ? debit(ownerText, key, Number(debitMatch[1]), request)
    : createOrder(ownerText, key, request);
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    handle(req, Buffer.concat(chunks).toString('utf8'))
      .then((r) => send(res, r.status, r.body, r.headers, r.replayed))
      .catch((err) => {
        if (err instanceof ApiError) {
          send(res, err.status, JSON.stringify({ error: err.message }), err.headers);
        } else {
          console.error('request failed:', err); // never a stack trace in a response
          send(res, 500, JSON.stringify({ error: 'internal error' }));
        }
      });
  });
});

const port = Number(process.env.PORT || 8080);
server.listen(port, '127.0.0.1', () => console.log(`listening on 127.0.0.1:${port}`));
process.on('SIGTERM', () => server.close(() => pool.end().then(() => process.exit(0))));
