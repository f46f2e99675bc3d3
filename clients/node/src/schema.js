// Where idem is installed: its schema, named in every statement of this
// library.  A statement names idem's functions as @idem@.idem_begin(...);
// the schema replaces @idem@ before it is sent, looked up once per client
// or pool in pg_extension (or set once with useSchema), and every argument
// is cast to the exact type of idem's parameter.  So a function of the same
// name elsewhere on the caller's search_path, or an overload in idem's own
// schema that an untyped parameter would match better, never runs in
// idem's place (docs/security.md).

const LOOKUP = 'SELECT n.nspname FROM pg_catalog.pg_extension e'
  + ' JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace'
  + " WHERE e.extname OPERATOR(pg_catalog.=) 'idem'";

let configured = null;
const found = new WeakMap();

// A schema name as an SQL identifier.
export const quote = (name) => `"${String(name).replace(/"/g, '""')}"`;

// Name idem's schema for every client instead of looking it up (null: look it up again).
export function useSchema(name) {
  configured = name == null ? null : quote(name);
}

async function lookup(db) {
  const { rows } = await db.query(LOOKUP);
  if (rows.length === 0) {
    throw Object.assign(new Error('idem is not installed in this database (CREATE EXTENSION idem)'), { code: '42883' });
  }
  return quote(rows[0].nspname);
}

// The statement with idem's schema in place of @idem@.
export async function statement(db, text) {
  if (!text.includes('@idem@')) return text;
  let schema = configured ?? found.get(db);
  if (schema === undefined) {
    schema = lookup(db);
    found.set(db, schema);
    schema.catch(() => found.delete(db));
  }
  return text.replaceAll('@idem@', await schema);
}
