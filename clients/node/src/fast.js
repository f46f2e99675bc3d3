// The fast layer (the article's section 11): Redis in front of the
// database for hot keys.  It never decides: a cached answer is used only
// when its request fingerprint is this request's; an in-flight marker
// answers a duplicate "processing" at once and is released only by its
// holder (compare-and-delete) or expires; every Redis error, timeout or
// miss falls through to PostgreSQL, which alone decides.
//
//   import { createClient } from 'redis';                  // the optional peer dependency
//   const redis = createClient({ url, disableOfflineQueue: true });
//   redis.on('error', () => {});  await redis.connect();
//   createIdempotency({ pool, owner, fast: new FastLayer(redis) });
import { createHash, randomBytes } from 'node:crypto';
import { Problem, replayedHeaders } from './http.js';

const RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

// JSON with sorted members: equal texts are equal requests (the database's
// fingerprint, RFC 8785, still decides; this one only finds cache entries).
function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(',')}}`;
  }
  return JSON.stringify(v ?? null);
}

export class FastLayer {
  constructor(client, { maxCacheSeconds = 300, markerMs = 2000, timeoutMs = 50, prefix = 'idem' } = {}) {
    Object.assign(this, { client, maxCacheSeconds, markerMs, timeoutMs, prefix });
  }

  // a Redis call bounded by timeoutMs; undefined on any error or timeout
  async call(fn) {
    let timer;
    try {
      return await Promise.race([fn(), new Promise((resolve) => { timer = setTimeout(resolve, this.timeoutMs); })]);
    } catch {
      return undefined;
    } finally {
      clearTimeout(timer);
    }
  }

  name(p) {
    const digest = createHash('sha256').update(p.key).digest('hex').slice(0, 32);   // never the raw key
    return `${this.prefix}:${p.owner}:${p.route.operation}:${digest}`;
  }

  async before(p, settings) {
    p.fingerprint = createHash('sha256').update(canonical(p.request)).digest('hex');
    const name = this.name(p);
    const raw = await this.call(() => this.client.get(name));
    if (typeof raw === 'string') {
      const entry = JSON.parse(raw);
      if (entry.fp === p.fingerprint) {
        const headers = [...replayedHeaders(entry.headers), ['idempotent-replayed', 'true'], ['x-idem-cache', 'hit']];
        if (entry.expires) headers.push(['idempotency-expires', entry.expires]);
        return { status: entry.status, headers, body: Buffer.from(entry.body, 'utf8') };
      }
    }
    const marker = `${randomBytes(8).toString('hex')}:${p.fingerprint}`;
    const set = await this.call(() => this.client.set(`${name}:flight`, marker, { NX: true, PX: this.markerMs }));
    if (set === 'OK') {
      p.marker = marker;
      return null;
    }
    if (set === undefined) return null;                     // Redis unavailable: the database decides
    const held = await this.call(() => this.client.get(`${name}:flight`));
    if (typeof held === 'string' && held.split(':')[1] === p.fingerprint) {
      throw new Problem(409, 'in-flight', 'the first request with this key is still being processed; retry later',
        { 'retry-after': String(settings.inFlightRetryAfter), 'x-idem-cache': 'in-flight' });
    }
    return null;
  }

  // cache the answer as the record holds it -- a replay's, or what
  // idem_finish_stored returned for a first execution that committed: the
  // bytes the database stored, after its redact policy, never the
  // handler's own -- no longer than the record lives
  async after(p, answer, outcome) {
    if (!outcome || !(outcome.expiresAt instanceof Date) || !(outcome.httpStatus >= 200 && outcome.httpStatus <= 499)) return;
    const seconds = Math.min(this.maxCacheSeconds, Math.floor((outcome.expiresAt.getTime() - Date.now()) / 1000));
    if (!(seconds > 0)) return;
    const entry = { fp: p.fingerprint, status: outcome.httpStatus, body: outcome.body ?? '', headers: outcome.headers ?? {},
      expires: outcome.expiresAt.toUTCString() };
    await this.call(() => this.client.set(this.name(p), JSON.stringify(entry), { EX: seconds }));
  }

  async release(p) {
    if (!p.marker) return;
    await this.call(() => this.client.eval(RELEASE, { keys: [`${this.name(p)}:flight`], arguments: [p.marker] }));
  }
}
