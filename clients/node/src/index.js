// idem from Node: the SQL API of the idem extension on a pg client (or
// anything with pg's query(text, values)), in the caller's transaction
// (api.js); its errors (errors.js); the HTTP middleware (http.js).
export * from './api.js';
export * from './errors.js';
export { useSchema } from './schema.js';
export { createIdempotency } from './http.js';
