// POST /api/orders on node:http alone, with the idem-pg helper (the same
// API and environment as server.js, without Express).
import http from 'node:http';
import pg from 'pg';
import { createIdempotency } from 'idem-pg';

const pool = new pg.Pool({ max: 8, options: process.env.IDEM_PG_OPTIONS || undefined });
const idem = createIdempotency({
  pool,
  owner: (req) => (/^\d+$/.test(req.headers['x-owner-id'] ?? '') ? Number(req.headers['x-owner-id']) : null),
  conflictStatus: Number(process.env.IDEM_CONFLICT_STATUS || 409),
  errorsUrl: process.env.IDEM_ERRORS_URL || null,
});
const json = (res, status, value, headers = {}) => {
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(JSON.stringify(value));
};

const orders = idem.handler('CREATE_ORDER', { request: ['skuId', 'quantity'] }, async (req, res) => {
  const { skuId, quantity } = req.body ?? {};
  if (!Number.isInteger(skuId) || !Number.isInteger(quantity) || quantity < 1 || quantity > 100) {
    return json(res, 400, { error: 'skuId must be an integer and quantity one from 1 to 100' });
  }
  const { rows: [order] } = await req.idem.client.query(
    'INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES ($1, $2, $3) RETURNING id::int',
    [req.idem.owner, skuId, quantity]);
  req.idem.resourceId = order.id;
  json(res, 201, { orderId: order.id, skuId, quantity, status: 'CREATED' },
    { location: `/api/orders/${order.id}`, 'set-cookie': `last_order=${order.id}` });
});

const DEBIT = /^\/api\/accounts\/(\d{1,18})\/debit$/;
const debits = idem.handler('DEBIT', {
  request: (body, params) => ({ account: Number(params.id), amount: body?.amount ?? null }),
}, async (req, res) => {
  const { amount, account } = req.idem.request;
  if (typeof amount !== 'number') return json(res, 400, { error: 'amount must be a number' });
  const { rows: [d] } = await req.idem.client.query(
    'SELECT debit_id::int, balance::float8 FROM debit_account($1, $2)', [account, amount]);
  if (d.debit_id === null) return json(res, 422, { error: 'insufficient funds' });
  req.idem.resourceId = d.debit_id;
  json(res, 201, { debitId: d.debit_id, balance: d.balance }, { location: `/api/debits/${d.debit_id}` });
});

// the same order without idem (test/bench/clients_bench.sh's baseline)
async function bare(req, res) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const { skuId, quantity } = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  const { rows: [order] } = await pool.query(
    'INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES ($1, $2, $3) RETURNING id::int',
    [Number(req.headers['x-owner-id']), skuId, quantity]);
  json(res, 201, { orderId: order.id, skuId, quantity, status: 'CREATED' });
}

http.createServer((req, res) => {
  const debit = req.method === 'POST' && DEBIT.exec(req.url);
  if (req.method === 'POST' && req.url === '/api/orders') return orders(req, res);
  if (process.env.IDEM_BENCH && req.method === 'POST' && req.url === '/bare/orders') return bare(req, res);
  if (debit) {
    req.params = { id: debit[1] };
    return debits(req, res);
  }
  return json(res, 404, { error: 'not found' });
}).listen(Number(process.env.PORT || 8080), '127.0.0.1')
  .on('clientError', idem.clientError());
