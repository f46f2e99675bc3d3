// The HTTP contract (clients/CONTRACT.md) for Express and node:http.
//
//   const idem = createIdempotency({ pool, owner: (req) => userIdOf(req) });
//   app.post('/api/orders', idem.route('CREATE_ORDER'), async (req, res) => {
//     const { rows } = await req.idem.client.query('INSERT ... RETURNING id', [...]);  // the claim's transaction
//     req.idem.resourceId = rows[0].id;
//     res.status(201).json({ orderId: rows[0].id });
//   });
//   http.createServer(idem.handler('CREATE_ORDER', {}, async (req, res) => { ... }));   // node:http
//
// The handler's answer is buffered and sent once the transaction committed.
import { appGrants, begin, finishStored, RawJson } from './api.js';
import * as tracing from './tracing.js';
import { Forbidden, IdemError, InFlight, InvalidRequest, KeyExpired, KeyReused, Misconfigured, ReadOnly,
  SerializationFailure, translate } from './errors.js';

const KEY_PATTERN = /^[A-Za-z0-9_-]{16,128}$/;       // idem's own key check
const SF_STRING = /^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$/;
const HOP_BY_HOP = ['connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'proxy-connection',
  'te', 'trailer', 'transfer-encoding', 'upgrade'];
const NOT_STORED = new Set([...HOP_BY_HOP, 'date', 'content-length', 'server', 'idempotent-replayed',
  'idempotency-expires']);
const TITLES = {
  'key-missing': 'Idempotency-Key header required',
  'key-malformed': 'Malformed Idempotency-Key header',
  'key-reused': 'Idempotency key reused with a different request',
  'key-expired': 'Idempotency key expired',
  'in-flight': 'A request with this idempotency key is in progress',
  'read-only': 'The service is read-only for now',
  forbidden: 'Not allowed',
  'no-owner': 'No authenticated owner',
  'body-too-large': 'Request body too large',
  'body-not-json': 'Request body is not valid JSON',
  'invalid-request': 'Invalid request',
  retry: 'The request raced another; retry it',
  internal: 'The request could not be completed',
};

export class Problem extends Error {
  constructor(status, slug, detail, headers = {}) {
    super(detail);
    Object.assign(this, { status, slug, detail, headers });
  }

  answer(settings) {
    const body = Buffer.from(JSON.stringify({ type: `urn:idem:error:${this.slug}`, title: TITLES[this.slug],
      status: this.status, detail: this.detail }));
    // a Link only to documentation the application names: an absolute URL
    const link = settings.errorsUrl ? [['link', `<${settings.errorsUrl}#${this.slug}>; rel="describedby"`]] : [];
    // Idempotent-Replayed on every answer (the article's flag): nothing here was replayed
    return { status: this.status, body, headers: [['content-type', 'application/problem+json'],
      ['idempotent-replayed', 'false'], ...link, ...Object.entries(this.headers)] };
  }
}

const DEFAULTS = {
  conflictStatus: 409, maxBodyBytes: 1024 * 1024, ttlSeconds: null, inFlightRetryAfter: 1,
  readOnlyRetryAfter: 5, replaySetCookie: false, errorsUrl: null, fast: null,
  log: (message) => console.error(message),
};

// The key of the Idempotency-Key header: an RFC 8941 sf-string or a bare
// value; null when absent; a Problem when malformed.
export function parseKey(raw) {
  if (raw === undefined) return null;
  if (Array.isArray(raw) || raw.includes(',')) throw new Problem(400, 'key-malformed', 'send one Idempotency-Key header');
  let value = raw.trim();
  if (value.startsWith('"')) {
    const m = SF_STRING.exec(value);
    if (!m) throw new Problem(400, 'key-malformed', 'the Idempotency-Key is not a valid structured-field string');
    value = m[1].replace(/\\(["\\])/g, '$1');
  }
  if (!KEY_PATTERN.test(value)) {
    throw new Problem(400, 'key-malformed', "an idempotency key is 16 to 128 characters of A-Z, a-z, 0-9, '_' and '-'");
  }
  return value;
}

// The response headers kept with the record: lower-case names, one string
// each (Set-Cookie lines joined by a newline, and only if allowed).
// What joins the lines of Set-Cookie in the one stored value: the unit
// separator, a control character no cookie may hold (RFC 6265), never a
// newline (idem 1.13 refuses a CR or LF in a stored header: a replay would
// split the response).  A replay splits on it, and on the newline 1.12 used.
const COOKIE_SEP = '\x1f';

export function storedHeaders(headers, settings) {
  const named = new Set(String(headers.connection ?? '').split(',').map((s) => s.trim().toLowerCase()));
  const kept = {};
  for (const [name, value] of Object.entries(headers)) {
    const n = name.toLowerCase();
    if (NOT_STORED.has(n) || named.has(n) || (n === 'set-cookie' && !settings.replaySetCookie)) continue;
    kept[n] = Array.isArray(value) ? value.join(n === 'set-cookie' ? COOKIE_SEP : ', ') : String(value);
  }
  return kept;
}

// A header a server may send: an RFC 9110 token for a name, a value with
// no control character but a tab.  A stored one that is not (a record
// written before idem 1.14 checked names) is never replayed.
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const sendable = (value) => !/[\x00-\x08\x0a-\x1f\x7f]/.test(value);

export function replayedHeaders(stored) {
  const out = [];
  for (const [name, value] of Object.entries(stored ?? {})) {
    if (!TOKEN.test(name)) continue;
    if (name.toLowerCase() === 'set-cookie') {
      const lines = String(value).split(/[\n\x1f]/).filter(sendable);
      if (lines.length) out.push([name, lines]);
    } else if (sendable(String(value))) out.push([name, value]);
  }
  return out;
}

// An error the route's handler raised (node:http's handler, or Express's
// through errorHandler()).
class HandlerError extends Error {
  constructor(error) { super(String(error && error.message)); this.error = error; }
}

// What a client is told of a refused request: idem's own words for 22023 (a
// key its policy refuses...), never PostgreSQL's own error text.
const INVALID_DETAIL = {
  '22003': 'a number in the request body is outside the range of canonical JSON (an IEEE 754 double); send it as a string',
  '22P05': 'the request body must not contain \\u0000',
  '22P02': 'the request body must be JSON',
};
const invalidDetail = (error) => (error.sqlstate === '22023' ? error.message
  : INVALID_DETAIL[error.sqlstate] ?? 'the request is not valid');

// The request's JSON value.  What PostgreSQL or canonical JSON would refuse,
// or read as another request, is 400 invalid-request here, as in every stack
// (idem 1.13): a byte order mark, bytes that are not UTF-8, a number beyond
// an IEEE 754 double (1e400), a \u0000.
export function parseBody(raw) {
  if (!raw.length) return null;
  if (raw.length >= 3 && raw[0] === 0xef && raw[1] === 0xbb && raw[2] === 0xbf) {
    throw new Problem(400, 'invalid-request', 'the request body must not start with a byte order mark');
  }
  let text;
  try { text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(raw); } catch {
    throw new Problem(400, 'invalid-request', 'the request body is not valid UTF-8');
  }
  let body;
  try { body = JSON.parse(text); } catch {
    throw new Problem(400, 'body-not-json', 'the request body must be JSON');
  }
  return checkedValue(body);
}

// A parsed JSON value, refused (400 invalid-request) where PostgreSQL or
// canonical JSON would refuse it: a number beyond a double, a \u0000.
function checkedValue(body) {
  const stack = [body];
  while (stack.length) {
    const v = stack.pop();
    if (typeof v === 'number' && !Number.isFinite(v)) throw new Problem(400, 'invalid-request', INVALID_DETAIL['22003']);
    if (typeof v === 'string' && v.includes('\u0000')) throw new Problem(400, 'invalid-request', INVALID_DETAIL['22P05']);
    if (v && typeof v === 'object') {
      if (Array.isArray(v)) stack.push(...v);
      else for (const [k, x] of Object.entries(v)) stack.push(k, x);
    }
  }
  return body;
}

export function problemOf(error, settings) {
  if (error instanceof Problem) return error;
  if (error instanceof HandlerError) {
    // of the handler's own errors, a read-only server and a serialization failure have answers of their own
    const t = translate(error.error);
    if (t instanceof ReadOnly || t instanceof SerializationFailure) return problemOf(t, settings);
    // with its stack: the file and line that threw
    settings.log(`idem-pg: the handler failed: ${error.error && (error.error.stack || error.error.message)}`);
    return new Problem(500, 'internal', 'the request could not be completed');
  }
  if (error instanceof KeyReused) {
    return new Problem(settings.conflictStatus, error.problemType,
      'this idempotency key was used with a different request; send a new key for a new request');
  }
  if (error instanceof KeyExpired) {
    return new Problem(error.httpStatus, error.problemType,
      'this idempotency key expired and its request is not executed again; send a new key for a new request');
  }
  if (error instanceof InFlight) {
    return new Problem(error.httpStatus, error.problemType, 'the first request with this key is still being processed; retry later',
      { 'retry-after': String(settings.inFlightRetryAfter) });
  }
  if (error instanceof ReadOnly) {
    return new Problem(error.httpStatus, error.problemType, 'the service cannot take writes now; retry later',
      { 'retry-after': String(settings.readOnlyRetryAfter) });
  }
  if (error instanceof Forbidden) return new Problem(error.httpStatus, error.problemType, 'this request is not allowed for this owner or operation');
  if (error instanceof InvalidRequest) return new Problem(error.httpStatus, error.problemType, invalidDetail(error));
  if (error instanceof SerializationFailure) {
    return new Problem(error.httpStatus, error.problemType, 'the request raced another one; retry it', { 'retry-after': '0' });
  }
  if (error instanceof Misconfigured) {
    // a missing grant is logged once per process (notGranted)
    if (error.sqlstate !== '42501') settings.log(`idem-pg: the database is not set up for idem: ${error.sqlstate} ${error.message}`);
    return new Problem(500, 'internal', 'the request could not be completed');
  }
  settings.log(`idem-pg: request failed: ${error instanceof IdemError ? `${error.sqlstate} ${error.message}`
    : error && (error.stack || error.message)}`);
  return new Problem(500, 'internal', 'the request could not be completed');
}

const httpDate = (d) => (d instanceof Date && Number.isFinite(d.getTime()) ? d.toUTCString() : null);

function finished(expires, replayed, status, headers, body) {
  const out = [...headers, ['idempotent-replayed', replayed ? 'true' : 'false']];
  const date = httpDate(expires);
  if (date) out.push(['idempotency-expires', date]);
  return { status, headers: out, body };
}

export const replayOf = (o) => finished(o.expiresAt, true, o.httpStatus ?? 200, replayedHeaders(o.headers),
  Buffer.from(o.body ?? '', 'utf8'));

// A 5xx of the handler: nothing stored, its status and Retry-After kept, its body not.
function failed(answer, settings) {
  const status = answer.status >= 500 && answer.status <= 599 ? answer.status : 500;
  const retry = answer.headers['retry-after'] !== undefined ? { 'retry-after': String(answer.headers['retry-after']) } : {};
  return new Problem(status, 'internal', 'the request could not be completed; nothing was done: retry it', retry)
    .answer(settings);
}

function readBody(req, limit) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (c) => {
      size += c.length;
      if (size > limit) {
        // keep reading, and drop, what the client still sends: closing with
        // unread data would reset the connection before it reads the 413
        // (RFC 9112, 9.6)
        req.removeAllListeners('data');
        req.resume();
        reject(new Problem(413, 'body-too-large', `the request body is over ${limit} bytes`));
      } else chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

// The request's JSON value, read here, or taken from the body parser that
// read the stream before this middleware (express.json(), express.text(),
// express.raw()): the raw bytes where the application kept them
// (express.json({ verify: (req, res, buf) => { req.rawBody = buf; } })),
// else what the parser made of them.  A stream already read with nothing
// kept is a 500 at once, with a log line naming the cause: never a wait for
// an 'end' that came before (issue 37).
async function bodyOf(req, settings) {
  const consumed = req._body === true || req.readableEnded === true;
  if (!consumed) return parseBody(await readBody(req, settings.maxBodyBytes));
  if (Buffer.isBuffer(req.rawBody)) return parseBody(req.rawBody);
  if (Buffer.isBuffer(req.body)) return parseBody(req.body);
  if (typeof req.body === 'string') return parseBody(Buffer.from(req.body, 'utf8'));
  if (req.body !== undefined) return checkedValue(req.body);
  settings.log('idem-pg: the request body was read before the idempotency middleware and not kept: '
    + 'put the middleware first, or keep the raw bytes with express.json({ verify: (req, res, buf) => { req.rawBody = buf; } })');
  throw new Problem(500, 'internal', 'the request could not be completed');
}

// Hold what the handler writes until the transaction has committed.
function capture(res) {
  const chunks = [];
  const original = { writeHead: res.writeHead, write: res.write, end: res.end };
  let done;
  const ended = new Promise((resolve) => { done = resolve; });
  const add = (chunk, enc) => {
    if (chunk !== undefined && chunk !== null && typeof chunk !== 'function') {
      chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, typeof enc === 'string' ? enc : 'utf8'));
    }
  };
  res.writeHead = function writeHead(status, reason, headers) {
    res.statusCode = status;
    const h = typeof reason === 'object' ? reason : headers;
    if (h) for (const [k, v] of Object.entries(h)) res.setHeader(k, v);
    return res;
  };
  res.write = function write(chunk, enc, cb) {
    add(chunk, enc);
    (typeof enc === 'function' ? enc : cb)?.();
    return true;
  };
  res.end = function end(chunk, enc, cb) {
    add(chunk, enc);
    done();
    (typeof chunk === 'function' ? chunk : typeof enc === 'function' ? enc : cb)?.();
    return res;
  };
  return {
    ended,
    restore() { Object.assign(res, original); },
    answer() { return { status: res.statusCode, headers: res.getHeaders(), body: Buffer.concat(chunks) }; },
  };
}

function send(res, answer) {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  for (const [name, value] of answer.headers) res.setHeader(name, value);
  res.setHeader('content-length', answer.body.length);
  res.statusCode = answer.status;
  res.end(answer.body);
}

function requestOf(route, body, params) {
  if (!route.request) return body;
  if (typeof route.request === 'function') return route.request(body, params);
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    throw new Problem(400, 'invalid-request', 'the body must be a JSON object');
  }
  return Object.fromEntries(route.request.map((f) => [f, body[f] ?? null]));
}

async function execute(settings, route, p, req, res, next) {
  const client = await settings.pool.connect();
  let cap = null;
  try {
    await client.query('BEGIN');
    const scope = { owner: p.owner, operation: route.operation, key: p.key, request: p.request,
      ttl: settings.ttlSeconds };
    const trace = tracing.traceparent();
    // the transaction's emits and submits carry the request's trace
    if (trace !== null) await client.query(tracing.SET_TRACE, [trace]);
    const o = await begin(client, scope);
    if (o.replayed) {
      await client.query('COMMIT');
      return { answer: replayOf(o), outcome: o };
    }
    req.idem = { client, owner: p.owner, operation: route.operation, key: p.key, request: p.request,
      params: req.params ?? {}, resourceId: null };
    cap = capture(res);
    const nextError = new Promise((resolve) => {
      Promise.resolve(next()).catch((e) => resolve(e));
    });
    const error = await Promise.race([cap.ended.then(() => req.idem.error ?? null), nextError]);
    cap.restore();
    if (error) throw new HandlerError(error);
    const app = cap.answer();
    if (app.status < 200 || app.status > 499) throw new Discard(failed(app, settings));
    if (app.body.length) {
      try { JSON.parse(app.body.toString('utf8')); } catch {
        settings.log(`idem-pg: the handler of operation ${route.operation} answered a body that is not JSON: not stored`);
        throw new Problem(500, 'internal', 'the request could not be completed');
      }
    }
    // the answer as stored (redacted): the fast layer caches these bytes
    const stored = await finishStored(client, { ...scope, status: app.status,
      body: app.body.length ? new RawJson(app.body) : null,
      resourceId: req.idem.resourceId, headers: storedHeaders(app.headers, settings) });
    await client.query('COMMIT');
    const headers = Object.entries(app.headers);
    return { answer: finished(stored.expiresAt, false, app.status, headers, app.body), outcome: stored };
  } catch (e) {
    if (cap) cap.restore();
    await client.query('ROLLBACK').catch(() => {});
    if (e instanceof Forbidden) {
      const { granted, role } = await appGrants(client);
      if (!granted) throw notGranted(role, settings);
    }
    throw e;
  } finally {
    client.release();
  }
}

// A 42501 where the role lacks idem's grants: the server's setup, a 500,
// logged once per process (not the owner binding's 403).
let missingGrantLogged = false;
function notGranted(role, settings) {
  const message = `role ${role} may not call idem's functions: a superuser runs SELECT idem_grant('${role}', 'app')`;
  if (!missingGrantLogged) {
    missingGrantLogged = true;
    settings.log(`idem-pg: ${message}`);
  }
  return new Misconfigured(message, '42501');
}

class Discard extends Error {
  constructor(answer) { super('discarded'); this.answer = answer; }
}

// the problems whose outcome is not "error": the key reused, or in flight after the wait
const OUTCOME_OF_PROBLEM = [['"urn:idem:error:key-reused"', 'conflict'], ['"urn:idem:error:in-flight"', 'waited']];

// The answer, with the request's outcome on its span: executed, replayed, conflict, waited or error.
function respond(span, res, answer) {
  if (span) {
    const replayed = answer.headers.some(([k, v]) => k.toLowerCase() === 'idempotent-replayed' && v === 'true');
    const head = Buffer.isBuffer(answer.body) ? answer.body.subarray(0, 200).toString('latin1') : String(answer.body ?? '').slice(0, 200);
    const problem = OUTCOME_OF_PROBLEM.find(([slug]) => head.includes(slug));
    tracing.setOutcome(span, replayed ? 'replayed' : problem ? problem[1] : answer.status < 500 ? 'executed' : 'error', answer.status);
  }
  return send(res, answer);
}

function handle(settings, declared, req, res, next) {
  if (!tracing.enabled()) return handleIn(null, settings, declared, req, res, next);
  return tracing.inSpan('idem.request', {}, (span) => handleIn(span, settings, declared, req, res, next));
}

async function handleIn(span, settings, declared, req, res, next) {
  let p = null;
  try {
    // the operation: a name, or a function of the request (null: not idempotent)
    const operation = typeof declared.operation === 'function' ? await declared.operation(req) : declared.operation;
    if (operation === null || operation === undefined) return next();
    const route = { ...declared, operation };
    if (span) span.setAttribute('idem.operation', operation);
    const key = parseKey(req.headers['idempotency-key']);
    if (key === null) {
      if (route.keyRequired !== false) throw new Problem(400, 'key-missing', 'this request needs an Idempotency-Key header');
      return next();
    }
    const length = Number(req.headers['content-length']);
    if (length > settings.maxBodyBytes) {
      req.resume();     // drain it, as above
      throw new Problem(413, 'body-too-large', `the request body is over ${settings.maxBodyBytes} bytes`);
    }
    const body = await bodyOf(req, settings);
    req.body = body;
    req._body = true;                      // body-parser: already read
    const owner = await settings.owner(req);
    if (owner === null || owner === undefined) throw new Problem(401, 'no-owner', 'the request has no authenticated owner');
    p = { key, owner, body, request: requestOf(route, body, req.params ?? {}), route };
    if (settings.fast) {
      const hit = await settings.fast.before(p, settings);
      if (hit) return respond(span, res, hit);
    }
    const { answer, outcome } = await execute(settings, route, p, req, res, next);
    if (settings.fast) await settings.fast.after(p, answer, outcome, settings);
    return respond(span, res, answer);
  } catch (e) {
    if (e instanceof Discard) return respond(span, res, e.answer);
    const answer = problemOf(e, settings).answer(settings);
    if (e instanceof Problem && e.status === 413) answer.headers.push(['connection', 'close']);
    return respond(span, res, answer);
  } finally {
    if (settings.fast && p) await settings.fast.release(p);
  }
}

// createIdempotency(settings): settings.pool (a pg Pool) and settings.owner
// (req => owner id, or null) are required; the rest as in CONTRACT.md.
export function createIdempotency(options) {
  const settings = { ...DEFAULTS, ...options };
  if (!settings.pool || typeof settings.owner !== 'function') throw new TypeError('idem-pg: pool and owner are required');
  if (![409, 422].includes(settings.conflictStatus)) throw new TypeError('idem-pg: conflictStatus must be 409 or 422');
  if (settings.errorsUrl != null && !/^https?:\/\/[^/\s]+/.test(settings.errorsUrl)) {
    throw new TypeError('idem-pg: errorsUrl must be an absolute http(s) URL (or null: no Link)');
  }
  return {
    settings,
    // Express: app.post(path, idem.route(operation, {request, keyRequired}), handler)
    route(operation, routeOptions = {}) {
      const route = { operation, ...routeOptions };
      return (req, res, next) => { handle(settings, route, req, res, next); };
    },
    // node:http: http.createServer(idem.handler(operation, {request, keyRequired}, (req, res) => ...))
    // Express: app.use(idem.errorHandler()) after the routes: a handler's
    // error then reaches the middleware (a read-only server's is a 503)
    errorHandler() {
      return (err, req, res, next) => {
        if (!req.idem || req.idem.error !== undefined) return next(err);
        req.idem.error = err;
        res.statusCode = 500;
        return res.end();
      };
    },
    handler(operation, routeOptions, fn) {
      const route = { operation, ...routeOptions };
      return (req, res) => handle(settings, route, req, res, () => fn(req, res));
    },
    // server.on('clientError', idem.clientError()): a request Node's HTTP
    // parser refuses (a header with a control character, an Idempotency-Key
    // among them) is answered as the contract answers a bad request, 400
    // problem+json, instead of an empty 400; nothing of the request is
    // echoed
    clientError() {
      return (err, socket) => {
        if (!socket.writable || err.code === 'ECONNRESET') {
          socket.destroy();
          return;
        }
        const answer = new Problem(400, 'invalid-request', 'the request could not be parsed: a header or the request line is malformed')
          .answer(settings);
        const head = [`HTTP/1.1 ${answer.status} Bad Request`, ...answer.headers.map(([n, v]) => `${n}: ${v}`),
          `content-length: ${answer.body.length}`, 'connection: close', '', ''].join('\r\n');
        socket.end(Buffer.concat([Buffer.from(head, 'latin1'), answer.body]));
      };
    },
  };
}
