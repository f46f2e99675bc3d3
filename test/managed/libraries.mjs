// The Node library (its npm package) against the SQL edition: the wait
// for an in-flight original ends in 55P03 from the claim, which the library
// raises as InFlight (IK002); an application's own lock timeout stays
// 55P03.  Prints "ok - ..." / "not ok - ..." lines.
//
//   node libraries.mjs SOCKET_DIR PORT DATABASE   (from a folder whose
//   node_modules has idem-pg and pg)
import pg from 'pg';
import { begin, finish, useSchema, translate, InFlight } from 'idem-pg';

const [host, port, database] = process.argv.slice(2);
useSchema('idem');
const check = (name, ok, got) => console.log((ok ? 'ok - ' : 'not ok - ') + name + (ok ? '' : ` (got ${got})`));
const connect = async () => {
  const c = new pg.Client({ host, port: Number(port), database, user: 'postgres' });
  await c.connect();
  return c;
};

const first = await connect();
const second = await connect();
const scope = { owner: 7, operation: 'PAY', key: 'node-key-00000000001' };
try {
  await first.query('BEGIN');
  const out = await begin(first, { ...scope, request: { amount: 10 } });
  check('node: the SQL edition claims a key through begin', out.replayed === false, JSON.stringify(out));
  await second.query('BEGIN');
  await second.query('SET LOCAL idem_sql.wait_timeout = 0');
  let got = null;
  try {
    await begin(second, { ...scope, request: { amount: 10 } });
  } catch (e) {
    got = e;
  }
  await second.query('ROLLBACK');
  check('node: a duplicate of a claim in flight raises InFlight with SQLSTATE IK002 (55P03 from idem_sql_claim)',
    got instanceof InFlight && got.sqlstate === 'IK002', got && `${got.constructor.name} ${got.sqlstate} ${got.message}`);
  await finish(first, { ...scope, status: 201, body: { paid: 10 } });
  await first.query('COMMIT');
  const again = await begin(second, { ...scope, request: { amount: 10 } });
  check('node: after the original\'s commit the duplicate replays it', again.replayed && again.httpStatus === 201,
    JSON.stringify(again));

  await first.query('CREATE TABLE IF NOT EXISTS public.lib_row_node (id int PRIMARY KEY)');
  await first.query('INSERT INTO public.lib_row_node VALUES (1) ON CONFLICT DO NOTHING');
  await first.query('BEGIN');
  await first.query('SELECT * FROM public.lib_row_node FOR UPDATE');
  await second.query('BEGIN');
  got = null;
  try {
    await second.query("SET LOCAL lock_timeout = '10ms'");
    await second.query('UPDATE public.lib_row_node SET id = 1');
  } catch (e) {
    got = translate(e);
  }
  await second.query('ROLLBACK');
  await first.query('ROLLBACK');
  check('node: an application\'s own lock timeout stays 55P03, not InFlight',
    !(got instanceof InFlight) && (got?.sqlstate ?? got?.code) === '55P03', got && `${got.constructor.name} ${got.sqlstate}`);
} finally {
  await first.end();
  await second.end();
}
