// idem-pg/kafka: a consumer of what the Python relay (python3 -m
// idem_pg.relay --broker kafka://...) publishes to Apache Kafka, through
// idem's inbox, with kafkajs (the optional peer dependency); the same
// protocol as idem_pg.kafka.KafkaConsumer: Python and Node members of one
// consumer group work together (docs/messaging.md, "Kafka").
//
//   import { Kafka } from 'kafkajs';
//   import { KafkaConsumer } from 'idem-pg/kafka';
//   const kafka = new Kafka({ clientId: 'billing-2', brokers: ['127.0.0.1:9092'] });
//   const c = new KafkaConsumer({ pg: client, kafka, topic: 'orders', consumer: 'billing', name: 'billing-2' });
//   await c.run(async (client, message) => { await client.query('INSERT INTO invoice ...', [...]); });
//
// Each message's effect and idem_consume commit in one transaction; the
// partition's offset is committed after it, at the oldest message not yet
// finished.  A message that fails is set aside (its failure counted in
// PostgreSQL) and tried again with backoff while the partition goes on;
// its key's later messages wait behind it, in order.  Past the limit it
// goes to <topic>.dead with the reason in its headers; of a 'block' topic
// its key's later messages follow it there.
import { Delivery, Inbox } from './consumer.js';

// The 32-bit murmur2 of Kafka's Java client (Utils.murmur2), signed.
export function murmur2(data) {
  const buf = Buffer.isBuffer(data) ? data : Buffer.from(String(data), 'utf8');
  const m = 0x5bd1e995;
  const length = buf.length;
  let h = (0x9747b28c ^ length) >>> 0;
  const whole = length - (length % 4);
  for (let i = 0; i < whole; i += 4) {
    let k = buf.readUInt32LE(i);
    k = Math.imul(k, m);
    k ^= k >>> 24;
    k = Math.imul(k, m);
    h = Math.imul(h, m) ^ k;
  }
  switch (length % 4) {
    case 3: h ^= buf[whole + 2] << 16; // falls through
    case 2: h ^= buf[whole + 1] << 8; // falls through
    case 1: h ^= buf[whole]; h = Math.imul(h, m); break;
    default: break;
  }
  h ^= h >>> 13;
  h = Math.imul(h, m);
  h ^= h >>> 15;
  return h | 0;
}

// The partition Kafka's Java client (and the Python relay) gives a key.
export function partitionFor(key, partitions) {
  return (murmur2(key) & 0x7fffffff) % partitions;
}

// A partition assigned to this member: its unfinished offsets, the keys
// waiting behind a failed message.
class Part {
  constructor() {
    this.unfinished = new Set();
    this.next = -1n;
    this.committed = -1n;
    this.held = new Map();
    this.waiting = 0;
    this.paused = false;
    this.chain = Promise.resolve();
  }

  floor() {
    let low = null;
    for (const o of this.unfinished) if (low === null || o < low) low = o;
    return low === null ? this.next : low;
  }
}

export class KafkaConsumer {
  constructor({ pg, kafka, topic, consumer, name, partitions = 8, prefix = '', ownerOf = null, maxAttempts = null,
    retryBaseMs = 100, retryMaxMs = 30000, sessionTimeout = 6, maxHeld = 1000 }) {
    this.kafka = kafka;
    this.topic = `${prefix}${topic}`;
    this.deadTopic = `${prefix}${topic}.dead`;
    this.consumer = consumer;
    this.name = name;
    this.partitions = partitions;
    this.sessionTimeoutMs = Math.round(sessionTimeout * 1000);
    this.maxHeld = maxHeld;
    this.inbox = new Inbox(pg, consumer, topic, ownerOf, { maxAttempts, retryBaseMs, retryMaxMs });
    this.parts = new Map();
    this.retries = [];          // { due, partition, hold }
    this.stopping = false;
    this.deadLettered = 0;
  }

  stop() { this.stopping = true; }

  // fn alone on its partition (a batch, a retry)
  serial(part, fn) {
    const run = part.chain.then(fn);
    part.chain = run.catch(() => {});
    return run;
  }

  async ensureTopics() {
    const admin = this.kafka.admin();
    await admin.connect();
    try {
      const have = new Set(await admin.listTopics());
      const topics = [this.topic, this.deadTopic].filter((t) => !have.has(t))
        .map((t) => ({ topic: t, numPartitions: this.partitions }));
      if (topics.length) await admin.createTopics({ topics, waitForLeaders: true });
    } finally {
      await admin.disconnect();
    }
  }

  fields(p, m) {
    const fields = {};
    for (const [k, v] of Object.entries(m.headers || {})) fields[k] = Array.isArray(v) ? v[v.length - 1] : v;
    fields.payload = m.value === null ? undefined : m.value;
    fields.key = m.key;
    fields.id = fields.id ?? `kafka:${this.topic}:${p}:${m.offset}`;
    return fields;
  }

  async arrived(p, m, handler) {
    const part = this.parts.get(p);
    if (!part) return;
    const offset = BigInt(m.offset);
    part.unfinished.add(offset);
    if (offset + 1n > part.next) part.next = offset + 1n;
    const hold = m.key !== null ? m.key.toString('base64') : `offset:${m.offset}`;
    part.waiting += 1;
    if (part.held.has(hold)) {
      part.held.get(hold).push(m);      // behind its key's failed message, in order
      return;
    }
    part.held.set(hold, [m]);
    await this.drain(p, part, hold, handler, false);
  }

  // The key's waiting messages in order, until one fails (set aside, its retry due).
  async drain(p, part, hold, handler, again) {
    const queue = part.held.get(hold);
    while (queue.length) {
      const m = queue[0];
      const r = await this.inbox.attempt(this.fields(p, m), p, again, handler);
      if (r.outcome === 'retry') {
        this.retries.push({ due: Date.now() + r.delayMs, partition: p, hold, part });
        return;
      }
      if (r.outcome === 'dead' || r.outcome === 'set_aside') await this.deadLetter(p, m, r.why);
      queue.shift();
      part.waiting -= 1;
      part.unfinished.delete(BigInt(m.offset));
      again = false;
    }
    part.held.delete(hold);
  }

  async deadLetter(p, m, why) {
    await this.producer.send({
      topic: this.deadTopic,
      acks: -1,
      messages: [{
        key: m.key,
        value: m.value,
        headers: { ...(m.headers || {}), idem_dead_reason: why, idem_consumer: this.consumer, idem_source: `${this.topic}:${p}:${m.offset}` },
      }],
    });
    this.deadLettered += 1;
  }

  async commit(p, part) {
    const floor = part.floor();
    if (floor <= part.committed) return;
    try {
      await this.member.commitOffsets([{ topic: this.topic, partition: p, offset: String(floor) }]);
      part.committed = floor;
    } catch (e) {
      // a rebalance under way: the next owner starts lower
      console.error(`idem-pg/kafka: ${this.name}: committing offsets: ${e.message}`);
    }
  }

  // Pause a partition whose waiting messages pass maxHeld; resume it below half.
  flow(p, part) {
    if (!part.paused && part.waiting > this.maxHeld) {
      this.member.pause([{ topic: this.topic, partitions: [p] }]);
      part.paused = true;
    } else if (part.paused && part.waiting <= this.maxHeld / 2) {
      this.member.resume([{ topic: this.topic, partitions: [p] }]);
      part.paused = false;
    }
  }

  async retryDue(handler) {
    const now = Date.now();
    const due = this.retries.filter((r) => r.due <= now);
    if (!due.length) return;
    this.retries = this.retries.filter((r) => r.due > now);
    for (const r of due) {
      // gone since (a rebalance): its next owner reads it again
      if (this.parts.get(r.partition) !== r.part || !r.part.held.has(r.hold)) continue;
      await this.serial(r.part, async () => {
        await this.drain(r.partition, r.part, r.hold, handler, true);
        await this.commit(r.partition, r.part);
        this.flow(r.partition, r.part);
      });
    }
  }

  async run(handler) {
    await this.ensureTopics();
    this.producer = this.kafka.producer({ idempotent: true, maxInFlightRequests: 1, allowAutoTopicCreation: false });
    await this.producer.connect();
    // the assignor named as Java's and librdkafka's 'roundrobin': Node, Python
    // and Java members of one group agree on it
    const { PartitionAssigners } = await import('kafkajs');
    this.member = this.kafka.consumer({
      groupId: this.consumer, sessionTimeout: this.sessionTimeoutMs, heartbeatInterval: Math.round(this.sessionTimeoutMs / 3),
      allowAutoTopicCreation: false,
      partitionAssigners: [(config) => ({ ...PartitionAssigners.roundRobin(config), name: 'roundrobin' })],
    });
    const { GROUP_JOIN, CRASH } = this.member.events;
    // a new assignment: every partition starts again from its committed offset
    this.member.on(GROUP_JOIN, ({ payload }) => {
      this.parts = new Map((payload.memberAssignment[this.topic] || []).map((p) => [p, new Part()]));
      this.retries = [];
    });
    let crashed = null;
    this.member.on(CRASH, ({ payload }) => { if (!payload.restart) crashed = payload.error; });
    await this.member.connect();
    await this.member.subscribe({ topic: this.topic, fromBeginning: true });
    await this.member.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      eachBatch: async ({ batch, resolveOffset, heartbeat, isRunning, isStale }) => {
        const p = batch.partition;
        const part = this.parts.get(p);
        if (!part) return;
        await this.serial(part, async () => {
          for (const m of batch.messages) {
            if (!isRunning() || isStale() || this.parts.get(p) !== part) break;
            await this.arrived(p, m, handler);
            resolveOffset(m.offset);
            await heartbeat();
          }
          await this.commit(p, part);
          this.flow(p, part);
        });
      },
    });
    while (!this.stopping && crashed === null) {
      await this.retryDue(handler);
      await new Promise((r) => setTimeout(r, 50));
    }
    for (const [p, part] of this.parts) await this.serial(part, () => this.commit(p, part));
    await this.member.disconnect();         // leaves the group: its partitions move at once
    await this.producer.disconnect();
    if (crashed) throw crashed;
  }
}

export { Delivery };
