// The article's HTTP API in Express, on the idem-pg library.
//
//   POST /api/orders                 {"skuId": 1, "quantity": 2}
//   POST /api/accounts/:id/debit     {"amount": 100}
//
// Both need an Idempotency-Key and an X-Owner-Id header (a stand-in for
// real authentication). Environment: PORT, the libpq variables,
// IDEM_CONFLICT_STATUS (409 or 422), IDEM_PG_OPTIONS, REDIS_URL (the fast layer).
import express from 'express';
import pg from 'pg';
import { createIdempotency } from 'idem-pg';

const pool = new pg.Pool({ max: 8, options: process.env.IDEM_PG_OPTIONS || undefined });
let fast = null;
if (process.env.REDIS_URL) {
  const { createClient } = await import('redis');
  const { FastLayer } = await import('idem-pg/fast');
  const redis = createClient({ url: process.env.REDIS_URL, disableOfflineQueue: true,
    socket: { connectTimeout: 50, reconnectStrategy: () => 100 } });
  redis.on('error', () => {});                       // the fast layer falls through to the database
  redis.connect().catch(() => {});
  fast = new FastLayer(redis);
}
const idem = createIdempotency({
  pool, fast,
  owner: (req) => (/^\d+$/.test(req.headers['x-owner-id'] ?? '') ? Number(req.headers['x-owner-id']) : null),
  conflictStatus: Number(process.env.IDEM_CONFLICT_STATUS || 409),
  errorsUrl: process.env.IDEM_ERRORS_URL || null,
});

const app = express();
// IDEM_BODY_PARSER (the test command's): a body parser before idem's
// middleware, as many Express applications have one; idem takes the raw
// bytes kept by `verify`, or what the parser made of them
const parsers = {
  json: () => express.json(),
  'json-verify': () => express.json({ verify: (req, res, buf) => { req.rawBody = buf; } }),
  text: () => express.text({ type: '*/*' }),
  raw: () => express.raw({ type: '*/*' }),
};
if (parsers[process.env.IDEM_BODY_PARSER]) app.use(parsers[process.env.IDEM_BODY_PARSER]());
app.post('/api/orders', idem.route('CREATE_ORDER', { request: ['skuId', 'quantity'] }), async (req, res) => {
  const { skuId, quantity } = req.body ?? {};
  if (!Number.isInteger(skuId) || !Number.isInteger(quantity) || quantity < 1 || quantity > 100) {
    return res.status(400).json({ error: 'skuId must be an integer and quantity one from 1 to 100' });
  }
  const { rows: [order] } = await req.idem.client.query(
    'INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES ($1, $2, $3) RETURNING id::int',
    [req.idem.owner, skuId, quantity]);
  req.idem.resourceId = order.id;
  res.cookie('last_order', String(order.id));          // not replayed: Set-Cookie is not stored
  res.status(201).location(`/api/orders/${order.id}`)
    .json({ orderId: order.id, skuId, quantity, status: 'CREATED' });
});

const debitRequest = (body, params) => ({ account: Number(params.id), amount: body?.amount ?? null });
app.post('/api/accounts/:id/debit', idem.route('DEBIT', { request: debitRequest }), async (req, res) => {
  const { amount } = req.idem.request;
  if (typeof amount !== 'number') return res.status(400).json({ error: 'amount must be a number' });
  const { rows: [d] } = await req.idem.client.query(
    'SELECT debit_id::int, balance::float8 FROM debit_account($1, $2)', [req.params.id, amount]);
  if (d.debit_id === null) return res.status(422).json({ error: 'insufficient funds' });
  req.idem.resourceId = d.debit_id;
  res.status(201).location(`/api/debits/${d.debit_id}`).json({ debitId: d.debit_id, balance: d.balance });
});

if (process.env.IDEM_BENCH) {               // the same order without idem (test/bench/clients_bench.sh's baseline)
  app.post('/bare/orders', express.json(), async (req, res) => {
    const { rows: [order] } = await pool.query(
      'INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES ($1, $2, $3) RETURNING id::int',
      [Number(req.headers['x-owner-id']), req.body.skuId, req.body.quantity]);
    res.status(201).json({ orderId: order.id, skuId: req.body.skuId, quantity: req.body.quantity, status: 'CREATED' });
  });
}
app.use(idem.errorHandler());                         // a handler's error reaches the middleware
const server = app.listen(Number(process.env.PORT || 8080), '127.0.0.1');
// a request Node's HTTP parser refuses (a control character in a header)
// is answered 400 problem+json, as the middleware answers a bad request
server.on('clientError', idem.clientError());
