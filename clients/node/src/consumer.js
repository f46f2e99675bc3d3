// idem-pg/consumer: consumers of what the Python library's relay
// (python3 -m idem_pg.relay) publishes, through idem's inbox
// (docs/messaging.md, "Through a broker").  The same protocol as
// idem_pg.consumer: Python and Node consumers of one group work together.
//
//   import { RedisConsumer } from 'idem-pg/consumer';
//   const c = new RedisConsumer({ pg: client, redis, topic: 'orders', consumer: 'billing', name: 'billing-2' });
//   await c.run(async (client, message) => { await client.query('INSERT INTO invoice ...', [...]); });
//
// For each delivery: BEGIN, idem_consume(consumer, id), the effect only the
// first time, COMMIT, then the broker's ack.  Per-key order: one active
// consumer per partition (a lease in Redis per stream; RabbitMQ's
// single-active-consumer queues with prefetch 1).
//
// A message that cannot be applied (a payload that is not JSON, a handler
// that throws) is tried again with backoff (retryBaseMs doubling to
// retryMaxMs); each failure is counted in PostgreSQL (idem_consume_failed,
// outside the effect's transaction: the count survives restarts).  Past
// maxAttempts (default: the topic's max_deliveries, else
// idem.outbox_max_deliveries) it is a dead letter: RabbitMQ rejects it
// without requeue (to the queue's dead-letter exchange, set by a policy);
// Redis adds it to <stream>:dead:<consumer>; the consumer goes on.  Of a
// topic whose on_dead is 'block' (the default) the key's later messages are
// set aside behind it until redriven (python3 -m idem_pg.redrive); with
// 'skip' they are applied.  docs/dead-letters.md.  Test hook:
// IDEM_PG_CONSUMER_CRASH_BEFORE_ACK=N exits after the N-th commit, before
// its ack.
import { createHash } from 'node:crypto';
import { consume } from './api.js';
import { statement } from './schema.js';
import * as tracing from './tracing.js';

const RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
// new entries of a stream, read only while the reader holds its lease: a
// consumer whose lease lapsed cannot take entries its successor would miss
const READ = "if redis.call('get', KEYS[1]) == ARGV[1] then "
  + "return redis.call('xreadgroup', 'GROUP', ARGV[2], ARGV[1], 'COUNT', ARGV[3], 'STREAMS', KEYS[2], '>') "
  + 'else return false end';
const RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";

// What idem stores of a message id (1 to 512 characters) and a key (up to
// 256), printable (no C0, DEL or C1 control character: idem_consume's rule).
const ID_MAX = 512;
const KEY_MAX = 256;
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
const strict = new TextDecoder('utf-8', { fatal: true });

// A message id or key as idem stores it: the value itself, or, when idem
// cannot store it (empty, too long, a control character, not UTF-8),
// sha256:<hex of its raw bytes>, one stand-in for every redelivery of the
// entry, in idem_consume_check and idem_consume_failed alike (such an entry
// is a dead letter, never applied).  null stays null (no key).
export function standIn(value, limit) {
  if (value === null || value === undefined) return null;
  const raw = Buffer.isBuffer(value) ? value : Buffer.from(String(value), 'utf8');
  let text = null;
  try { text = strict.decode(raw); } catch { text = null; }
  if (text === null || text.length === 0 || [...text].length > limit || CONTROL.test(text)) {
    return `sha256:${createHash('sha256').update(raw).digest('hex')}`;
  }
  return text;
}

// A field as text: a Buffer (Redis, amqplib) must be valid UTF-8.
const textOf = (v) => (Buffer.isBuffer(v) ? strict.decode(v) : v);

// A message as the broker delivered it (its id and key as idem stores them).
export class Delivery {
  constructor(fields, partition, redelivered) {
    this.messageId = fields.idemMessageId ?? standIn(fields.id, ID_MAX);
    this.key = fields.idemKey !== undefined ? fields.idemKey : standIn(fields.key, KEY_MAX);
    this.payload = JSON.parse(textOf(fields.payload));
    this.headers = fields.headers ? JSON.parse(textOf(fields.headers)) : null;
    this.partition = partition;
    this.redelivered = redelivered;
    this.publishedMs = fields.published_ms ? Number(textOf(fields.published_ms)) : null;
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const CHECK = 'SELECT verdict, blocked_by FROM @idem@.idem_consume_check($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text, $4::pg_catalog.int8)';
const FAILED = 'SELECT attempts, dead FROM @idem@.idem_consume_failed($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text, $4::pg_catalog.text, $5::pg_catalog.text, $6::pg_catalog.int4,'
  + ' $7::pg_catalog.int8)';

// Whether an error is the database connection's (the message comes again,
// no attempt counted) rather than the message's.
function connectionLost(e) {
  return /^08/.test(e.code || '') || ['ECONNRESET', 'ECONNREFUSED', 'EPIPE'].includes(e.code)
    || /Connection terminated|not queryable|Client has encountered a connection error/.test(e.message || '');
}

// The transaction of one delivery: idem_consume_check, idem_consume, the
// effect, COMMIT; failures counted apart and tried again with backoff.
export class Inbox {
  constructor(pg, consumer, topic, ownerOf, { maxAttempts = null, retryBaseMs = 100, retryMaxMs = 30000 } = {}) {
    if (maxAttempts != null && maxAttempts < 1) throw new RangeError('maxAttempts must be at least 1, or null for the topic\'s max_deliveries');
    this.pg = pg;
    this.consumer = consumer;
    this.topic = topic;
    this.ownerOf = ownerOf;
    this.maxAttempts = maxAttempts;
    this.retryBaseMs = retryBaseMs;
    this.retryMaxMs = retryMaxMs;
    this.applied = 0;
    this.duplicates = 0;
    this.crashAt = Number(process.env.IDEM_PG_CONSUMER_CRASH_BEFORE_ACK || 0);
    this.committed = 0;
    this.queue = Promise.resolve();
  }

  // fn alone on the client: amqplib hands several queues' messages at once,
  // and two transactions must never share the one pg client
  async exclusive(fn) {
    const before = this.queue;
    let release;
    this.queue = new Promise((r) => { release = r; });
    await before;
    try {
      return await fn();
    } finally {
      release();
    }
  }

  // Apply a delivery once, trying again after failures: resolves to
  // { outcome: 'applied' | 'duplicate' } once committed (ack next), or to
  // { outcome: 'dead' | 'set_aside', why } when it is to be dead-lettered.
  async take(entry, partition, redelivered, handler, pause = sleep) {
    for (;;) {
      const r = await this.attempt(entry, partition, redelivered, handler);
      if (r.outcome !== 'retry') return r;
      await pause(r.delayMs);
    }
  }

  // One try of a delivery: { outcome: 'applied' | 'duplicate' } once
  // committed, { outcome: 'dead' | 'set_aside', why } to dead-letter it, or
  // { outcome: 'retry', why, delayMs }: it failed, the failure is counted in
  // PostgreSQL, and it is to be tried again after that backoff.
  async attempt(entry, partition, redelivered, handler) {
    const messageId = standIn(entry.id ?? Buffer.alloc(0), ID_MAX);
    const key = standIn(entry.key, KEY_MAX);
    const fields = { ...entry, idemMessageId: messageId, idemKey: key };
    // an id or key idem cannot store: the entry is not what a relay sends,
    // and is not applied under a stand-in: a dead letter at once
    const malformed = messageId.startsWith('sha256:') || (key !== null && key.startsWith('sha256:'));
    let failure;
    if (malformed) {
      failure = new RangeError('the entry\'s id or key cannot be stored by idem: a stand-in replaces it');
    } else {
      try {
        return await this.exclusive(() => this.once(fields, partition, redelivered, handler));
      } catch (e) {
        if (!e.idemMessageFailure) throw e;
        failure = e.cause;
      }
    }
    const reason = `${failure && failure.name ? failure.name : 'Error'}: ${failure && failure.message}`
      .replaceAll('\u0000', '\\0').slice(0, 1000);
    console.error(`idem-pg/consumer: ${this.consumer}: message ${messageId} (key ${key}) failed: ${failure && failure.stack && !malformed ? failure.stack : reason}`);
    let owner = null;
    try { owner = this.ownerOf ? this.ownerOf(new Delivery(fields, partition, redelivered)) : null; } catch { owner = null; }
    const failed = await statement(this.pg, FAILED);
    let r;
    try {
      ({ rows: [r] } = await this.exclusive(() => this.pg.query(failed, [this.consumer, messageId, reason, key,
        this.topic, malformed ? 1 : this.maxAttempts, owner == null ? null : String(owner)])));
    } catch (e) {
      if (connectionLost(e)) throw e;
      // an entry whose failure cannot be recorded is a dead letter at once
      console.error(`idem-pg/consumer: ${this.consumer}: message ${messageId}: its failure cannot be recorded (${e.message}): a dead letter`);
      return { outcome: 'dead', why: `its failure could not be recorded: ${e.message}` };
    }
    if (r.dead) {
      console.error(`idem-pg/consumer: ${this.consumer}: message ${messageId} is a dead letter after ${r.attempts} attempts: ${reason}`);
      return { outcome: 'dead', why: `after ${r.attempts} attempts: ${reason}` };
    }
    return { outcome: 'retry', why: reason, delayMs: Math.min(this.retryMaxMs, this.retryBaseMs * 2 ** (r.attempts - 1)) };
  }

  async once(fields, partition, redelivered, handler) {
    const fail = (cause) => Object.assign(new Error('the message failed'), { idemMessageFailure: true, cause });
    let delivery;
    let owner;
    try {
      delivery = new Delivery(fields, partition, redelivered);
      owner = this.ownerOf ? this.ownerOf(delivery) : null;
    } catch (e) {
      throw fail(e);
    }
    // the span resumes the emitter's trace (the relay's traceparent header, or the message's headers)
    const parent = tracing.parentOf(fields.traceparent ?? (delivery.headers && delivery.headers.traceparent));
    const r = await tracing.inSpan('idem.consume', { kind: 'consumer', parent,
      attributes: { 'idem.consumer': this.consumer, 'messaging.destination.name': this.topic } }, async (span) => {
      const done = await this.transaction(delivery, owner, handler, fail);
      tracing.setOutcome(span, done.outcome);
      return done;
    });
    if (r.outcome !== 'applied' && r.outcome !== 'duplicate') return r;
    if (r.outcome === 'applied') this.applied += 1; else this.duplicates += 1;
    this.committed += 1;
    if (this.crashAt && this.committed === this.crashAt) {
      console.error(`idem-pg/consumer: IDEM_PG_CONSUMER_CRASH_BEFORE_ACK=${this.crashAt}: exiting after the commit, before the ack`);
      process.exit(70);
    }
    return r;
  }

  // The delivery's transaction: { outcome: 'applied' | 'duplicate' | 'dead' | 'set_aside', why }.
  async transaction(delivery, owner, handler, fail) {
    let first;
    await this.pg.query('BEGIN');
    try {
      const trace = tracing.traceparent();
      // the handler's emits and submits go on with this trace
      if (trace !== null) await this.pg.query(tracing.SET_TRACE, [trace]);
      const { rows: [c] } = await this.pg.query(await statement(this.pg, CHECK), [this.consumer, delivery.messageId, delivery.key,
        owner == null ? null : String(owner)]);
      if (c.verdict !== 'apply') {
        await this.pg.query('COMMIT');
        return { outcome: c.verdict, why: c.blocked_by ? `behind the dead letter ${c.blocked_by} of its key` : 'a dead letter' };
      }
      first = await consume(this.pg, { consumer: this.consumer, messageId: delivery.messageId, owner });
      if (first) await handler(this.pg, delivery);
      await this.pg.query('COMMIT');
    } catch (e) {
      await this.pg.query('ROLLBACK').catch(() => {});
      if (connectionLost(e)) throw e;
      throw fail(e);
    }
    return { outcome: first ? 'applied' : 'duplicate' };
  }
}

// A consumer group member on the streams <prefix><topic>.<p>, holding each
// stream it reads with a lease.  redis: a connected node-redis v4 client.
export class RedisConsumer {
  constructor({ pg, redis, topic, consumer, name, partitions = 8, prefix = '', lease = 5, block = 0.5, ownerOf = null,
    maxAttempts = null, retryBaseMs = 100, retryMaxMs = 30000 }) {
    this.redis = redis;
    this.consumer = consumer;
    this.name = name;
    this.partitions = partitions;
    this.leaseMs = Math.round(lease * 1000);
    this.blockMs = Math.round(block * 1000);
    this.streams = Array.from({ length: partitions }, (_, p) => `${prefix}${topic}.${p}`);
    this.inbox = new Inbox(pg, consumer, topic, ownerOf, { maxAttempts, retryBaseMs, retryMaxMs });
    this.held = new Map();      // partition -> its leftovers handled
    this.stopping = false;
    this.ready = false;
  }

  stop() { this.stopping = true; }

  lock(p) { return `${this.streams[p]}:lease:${this.consumer}`; }

  async setup() {
    if (this.raw === undefined) {
      // entries read as Buffers (node-redis 4's commandOptions): a field that
      // is not UTF-8 is the entry's failure, never the reader's
      try {
        const { commandOptions } = await import('redis');
        this.raw = typeof commandOptions === 'function' ? commandOptions({ returnBuffers: true }) : null;
      } catch {
        this.raw = null;
      }
    }
    for (const s of this.streams) {
      try {
        await this.redis.xGroupCreate(s, this.consumer, '0', { MKSTREAM: true });
      } catch (e) {
        if (!String(e.message).includes('BUSYGROUP')) throw e;
      }
    }
    this.ready = true;
  }

  // Renew the lease of a stream held; false (and let go of it) if it lapsed.
  async renew(p) {
    if (await this.redis.eval(RENEW, { keys: [this.lock(p)], arguments: [this.name, String(this.leaseMs)] })) return true;
    this.held.delete(p);
    return false;
  }

  async hold() {
    for (let p = 0; p < this.partitions; p++) {
      if (this.held.has(p)) {
        await this.renew(p);
      } else if (await this.redis.set(this.lock(p), this.name, { NX: true, PX: this.leaseMs })) {
        this.held.set(p, false);
      }
    }
  }

  // One entry, under a lease renewed for it (a slow batch cannot outlive the
  // lease); false, with nothing done, if the lease had lapsed.
  // A dead letter (or a message set aside behind one) goes to the dead
  // stream <stream>:dead:<consumer>, then is acknowledged.
  async take(p, entry, redelivered, handler) {
    if (!await this.renew(p)) return false;
    const fields = { id: `redis:${entry.id}` };
    for (const [name, value] of Object.entries(entry.message)) fields[name] = value;
    let r;
    try {
      r = await this.inbox.take(fields, p, redelivered, handler, (ms) => this.pause(p, ms));
    } catch (e) {
      if (e.idemLeaseLost) return false;
      throw e;
    }
    if (r.outcome === 'dead' || r.outcome === 'set_aside') {
      await this.redis.xAdd(this.deadStream(p), '*',
        { ...fields, idem_dead_reason: r.why, idem_consumer: this.consumer, idem_stream_entry: entry.id });
    }
    await this.redis.xAck(this.streams[p], this.consumer, entry.id);
    return true;
  }

  deadStream(p) { return `${this.streams[p]}:dead:${this.consumer}`; }

  // Wait before trying a message again, keeping the stream's lease.
  async pause(p, ms) {
    const end = Date.now() + ms;
    for (let left = ms; left > 0; left = end - Date.now()) {
      await sleep(Math.min(left, this.leaseMs / 3));
      if (!await this.renew(p)) throw Object.assign(new Error('the stream\'s lease lapsed'), { idemLeaseLost: true });
    }
  }

  // A stream just taken: what its previous holder left unacknowledged, first, in order.
  async leftovers(p, handler) {
    const stream = this.streams[p];
    let start = '0-0';
    do {
      const r = await this.redis.xAutoClaim(stream, this.consumer, this.name, 0, start, { COUNT: 100 });
      start = r.nextId;
    } while (start !== '0-0');
    for (;;) {
      const args = [this.consumer, this.name, [{ key: stream, id: '0' }], { COUNT: 100 }];
      const r = await (this.raw ? this.redis.xReadGroup(this.raw, ...args) : this.redis.xReadGroup(...args));
      const entries = r && r.length ? r[0].messages : [];
      if (!entries.length) break;
      for (const entry of entries) {
        if (!await this.take(p, { id: String(entry.id), message: entry.message }, true, handler)) return;
      }
    }
    this.held.set(p, true);
  }

  async runOnce(handler) {
    await this.hold();
    for (const [p, done] of [...this.held]) if (!done) await this.leftovers(p, handler);
    if (!this.held.size) {
      await new Promise((r) => setTimeout(r, this.blockMs));
      return 0;
    }
    let n = 0;
    for (const p of [...this.held.keys()]) {
      const args = [READ, { keys: [this.lock(p), this.streams[p]], arguments: [this.name, this.consumer, '50'] }];
      const reply = await (this.raw ? this.redis.eval(this.raw, ...args) : this.redis.eval(...args));
      for (const [id, flat] of (reply ? reply[0][1] : [])) {
        const message = {};
        for (let i = 0; i < flat.length; i += 2) message[String(flat[i])] = flat[i + 1];
        // lost: its next holder claims the rest
        if (!this.held.has(p) || !await this.take(p, { id: String(id), message }, false, handler)) break;
        n += 1;
      }
    }
    if (n === 0) await new Promise((r) => setTimeout(r, this.blockMs / 5));
    return n;
  }

  async run(handler) {
    while (!this.stopping) {
      try {
        if (!this.ready) await this.setup();
        await this.runOnce(handler);
      } catch (e) {
        console.error(`idem-pg/consumer: ${e.message}; again`);
        this.held.clear();
        this.ready = false;
        await new Promise((r) => setTimeout(r, 300));
      }
    }
    for (const p of this.held.keys()) {
      await this.redis.eval(RELEASE, { keys: [this.lock(p)], arguments: [this.name] }).catch(() => {});
    }
  }
}

// A consumer of the single-active-consumer queues <prefix><topic>.<p>, one
// message at a time, acknowledged after its commit.  amqp: amqplib's module
// (the optional peer dependency); url: amqp://user:pass@host:port/vhost.
export class RabbitConsumer {
  constructor({ pg, amqp, url, topic, consumer, name, partitions = 8, prefix = '', ownerOf = null,
    maxAttempts = null, retryBaseMs = 100, retryMaxMs = 30000 }) {
    this.amqp = amqp;
    this.url = url;
    this.name = name;
    this.queues = Array.from({ length: partitions }, (_, p) => `${prefix}${topic}.${p}`);
    this.inbox = new Inbox(pg, consumer, topic, ownerOf, { maxAttempts, retryBaseMs, retryMaxMs });
    this.stopping = false;
  }

  stop() { this.stopping = true; }

  async run(handler) {
    while (!this.stopping) {
      let connection;
      try {
        connection = await this.amqp.connect(this.url);
        const closed = new Promise((resolve) => { connection.on('close', resolve); connection.on('error', () => {}); });
        const channel = await connection.createChannel();
        await channel.prefetch(1);
        for (const [p, q] of this.queues.entries()) {
          await channel.assertQueue(q, { durable: true, arguments: { 'x-single-active-consumer': true } });
          await channel.consume(q, async (msg) => {
            if (msg === null) return;       // the queue was deleted
            const fields = { ...(msg.properties.headers || {}), payload: msg.content };
            fields.id = fields.id ?? msg.properties.messageId ?? `amqp:${msg.fields.deliveryTag}`;
            try {
              const r = await this.inbox.take(fields, p, msg.fields.redelivered, handler);
              // a dead letter: to the queue's dead-letter exchange (a policy's; without one RabbitMQ drops it)
              if (r.outcome === 'dead' || r.outcome === 'set_aside') channel.nack(msg, false, false);
              else channel.ack(msg);
            } catch (e) {
              console.error(`idem-pg/consumer: ${e.message}; the message comes again`);
              connection.close().catch(() => {});
            }
          }, { noAck: false, consumerTag: `${this.name}-${p}` });
        }
        while (!this.stopping) {
          const tick = new Promise((r) => setTimeout(r, 500, 'tick'));
          if (await Promise.race([closed, tick]) !== 'tick') break;
        }
        await connection.close().catch(() => {});
      } catch (e) {
        console.error(`idem-pg/consumer: ${e.message}; reconnecting`);
        if (connection) await connection.close().catch(() => {});
        await new Promise((r) => setTimeout(r, 500));
      }
    }
  }
}
