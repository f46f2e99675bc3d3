#!/usr/bin/python3
"""Dead letters through a real broker (test/brokers/run.sh starts the
server, the broker, the venv and the Node library; docs/dead-letters.md).

For each consumer library (Python, Node), two topics, one per on_dead
('block', 'skip'), each relayed by ``python3 -m idem_pg.relay`` with a
broker that refuses large messages (Redis: proto-max-bulk-len 1 MB;
RabbitMQ: max_message_size 1 MB) and consumed by that library's consumer:

- an oversized outbox message: the relay nacks it as permanent (a dead
  letter in idem_outbox_dead); every other key goes on; the key's next
  message waits ('block') or is delivered ('skip');
- a message whose handler always raises, and one whose payload is not JSON
  (written to the broker directly): dead-lettered after max_attempts
  (counted in PostgreSQL), into the broker's dead letters (RabbitMQ: a
  policy's dead-letter exchange; Redis: the consumer's dead stream); their
  keys' later messages are set aside ('block') or applied ('skip');
- every other key's messages applied exactly once, in order;
- redrive (python3 -m idem_pg.redrive, idem_outbox_discard): the held keys
  then go on, in order;
- the broker stopped for longer than the relay's lease: nothing is
  dead-lettered, everything emitted meanwhile arrives.

Kafka (KIND kafka): the dead letters go to the topic ``<topic>.dead``;
the broker refuses messages over 1 MB (the relays' producers may send 4 MB,
so that the refusal is the broker's, in the delivery report).

    dead_letters.py redis|rabbitmq|kafka BROKER_URL RESTART_COMMAND...

Prints one "ok - ..." / "not ok - ..." line per check.
"""
import json
import os
import signal
import subprocess
import sys
import time

import psycopg

from children import started

KIND, URL = sys.argv[1], sys.argv[2]
RESTART = sys.argv[3:]
PY = os.environ.get("PY", sys.executable)
DSN = os.environ.get("PIPELINE_DSN", "dbname=idem_brokers")
WAIT = float(os.environ.get("IDEM_WAIT") or os.environ.get("PG_TEST_TIMEOUT_DEFAULT") or 180)
TMP = os.environ.get("IDEM_TMP", "/tmp")
NODE_APP = os.environ.get("NODE_APP")
PARTITIONS = 2
ATTEMPTS = 3
RUN = "dl%s%d" % (KIND[0], os.getpid())
KEYS = ["k%d" % i for i in range(8)]
BIG = "x" * (1024 * 1024 + 100)        # larger than either broker takes


def check(what, ok, detail=""):
    print(("ok - %s: dead letters: %s" % (KIND, what)) if ok else
          ("not ok - %s: dead letters: %s (%s)" % (KIND, what, detail)))
    sys.stdout.flush()


def db():
    return psycopg.connect(DSN, autocommit=True)


def scalar(sql, *args):
    with db() as c:
        return c.execute(sql, args).fetchone()[0]


PY_CONSUMER = r"""
import sys, signal
from idem_pg.consumer import consumer_of
dsn, topic, url, consumer, prefix = sys.argv[1:6]
def apply(conn, m):
    if m.payload.get('poison') and not conn.execute("SELECT EXISTS (SELECT FROM dl_poison_ok WHERE topic = %s)",
                                                    (topic,)).fetchone()[0]:
        raise ValueError('the handler refuses poison %s' % m.payload['seq'])
    conn.execute("INSERT INTO dl_effect (topic, key, seq, message_id) VALUES (%s, %s, %s, %s)",
                 (topic, m.key, m.payload['seq'], m.message_id))
kw = {'lease': 2.0} if url.startswith('redis') else {}
c = consumer_of(url, dsn, topic, consumer, consumer + '-1', partitions=2, prefix=prefix,
                retry_base_ms=20, retry_max_ms=100, **kw)
signal.signal(signal.SIGTERM, c.stop)
c.run(apply)
"""

NODE_CONSUMER = r"""
import pg from 'pg';
import { RedisConsumer, RabbitConsumer } from 'idem-pg/consumer';
import { kafkaOf } from './kafka-of.mjs';
const [url, topic, consumer, prefix] = process.argv.slice(2);
const client = new pg.Client({ database: 'idem_brokers' });
await client.connect();
const apply = async (db, m) => {
  const { rows: [ok] } = await db.query('SELECT EXISTS (SELECT FROM dl_poison_ok WHERE topic = $1) AS ok', [topic]);
  if (m.payload.poison && !ok.ok) throw new TypeError(`the handler refuses poison ${m.payload.seq}`);
  await db.query('INSERT INTO dl_effect (topic, key, seq, message_id) VALUES ($1, $2, $3, $4)',
    [topic, m.key, m.payload.seq, m.messageId]);
};
const common = { pg: client, topic, consumer, name: `${consumer}-1`, partitions: 2, prefix, retryBaseMs: 20, retryMaxMs: 100 };
let c;
if (url.startsWith('redis')) {
  const { createClient } = await import('redis');
  const redis = createClient({ url });
  redis.on('error', () => {});
  await redis.connect();
  c = new RedisConsumer({ ...common, redis, lease: 2 });
} else if (url.startsWith('kafka')) {
  const { KafkaConsumer } = await import('idem-pg/kafka');
  c = new KafkaConsumer({ ...common, kafka: await kafkaOf(url, `${consumer}-1`) });
} else {
  const amqp = (await import('amqplib')).default;
  c = new RabbitConsumer({ ...common, amqp, url });
}
process.on('SIGTERM', () => c.stop());
await c.run(apply);
process.exit(0);
"""


def start_relay(topic, prefix):
    log = open(os.path.join(TMP, "relay-%s-%s.log" % (RUN, topic)), "a")
    return started(subprocess.Popen(
        [PY, "-m", "idem_pg.relay", "--dsn", DSN, "--topic", topic, "--broker", URL, "--partitions", str(PARTITIONS),
         "--prefix", prefix, "--lease", "2", "--poll", "0.2", "--backoff-max", "1", "--trim-interval", "0"],
        stdout=log, stderr=subprocess.STDOUT))


def start_consumer(lang, topic, prefix):
    log = open(os.path.join(TMP, "consumer-%s-%s.log" % (RUN, topic)), "a")
    consumer = "c-" + topic
    if lang == "node":
        from pipeline import node_script
        script = node_script("dead-letter-consumer.mjs", NODE_CONSUMER)
        return started(subprocess.Popen(["node", script, URL, topic, consumer, prefix],
                                        stdout=log, stderr=subprocess.STDOUT, cwd=NODE_APP))
    return started(subprocess.Popen([PY, "-c", PY_CONSUMER, DSN, topic, URL, consumer, prefix],
                                    stdout=log, stderr=subprocess.STDOUT))


def emit(topic, key, seq, extra=None):
    payload = dict(extra or {}, key=key, seq=seq)
    with db() as c:
        c.execute("SELECT public.idem_outbox_emit(%s::pg_catalog.text, %s::pg_catalog.jsonb, %s::pg_catalog.text)",
                  (topic, json.dumps(payload), key))


def partition(key):
    import zlib
    return zlib.crc32(key.encode()) % PARTITIONS


def kafka_url():
    """The brokers of the kafka:// URL, for confluent-kafka (its query's settings too)."""
    from idem_pg.kafka import config_of
    return config_of(URL)


def kafka_produce(topic, entries):
    """Kafka: (headers, key, value) entries produced in order, each awaited."""
    from confluent_kafka import Producer
    p = Producer(dict(kafka_url(), **{"enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random"}))
    errors = []
    for headers, key, value in entries:
        p.produce(topic, value=value, key=key, headers=headers,
                  on_delivery=lambda err, _m: errors.append(err) if err else None)
    if p.flush(WAIT) or errors:
        raise RuntimeError("not delivered: %s" % errors)


def kafka_read(topic):
    """Kafka: every message of the topic, from its start to its end now."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer(dict(kafka_url(), **{"group.id": "reader-%d" % os.getpid(), "enable.auto.commit": False}))
    try:
        meta = c.list_topics(topic, timeout=WAIT).topics[topic]
        out = []
        for p in meta.partitions:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=WAIT)
            if high <= low:
                continue
            c.assign([TopicPartition(topic, p, low)])
            while True:
                m = c.poll(WAIT)
                if m is None:
                    raise RuntimeError("no answer reading %s" % topic)
                if m.error() is None:
                    out.append(m)
                    if m.offset() + 1 >= high:
                        break
        return out
    finally:
        c.close()


def inject(prefix, topic, message_id, key, payload):
    """A message written to the broker directly (a payload no outbox would hold)."""
    fields = {"id": message_id, "key": key, "payload": payload, "attempt": "1"}
    if KIND == "kafka":
        kafka_produce(prefix + topic, [([("id", message_id.encode()), ("attempt", b"1")], key.encode(),
                                        payload.encode())])
        return
    name = "%s%s.%d" % (prefix, topic, partition(key))
    if KIND == "redis":
        import redis
        r = redis.Redis.from_url(URL)
        r.xadd(name, fields)
        r.close()
    else:
        import pika
        conn = pika.BlockingConnection(pika.URLParameters(URL))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", name, payload.encode(), pika.BasicProperties(
            delivery_mode=2, message_id=message_id, headers={k: v for k, v in fields.items() if k != "payload"}),
            mandatory=True)
        conn.close()


def rabbitmqctl(*args):
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run(["bash", "-c", 'source "$0/rabbitmq.sh"; as_rabbit /usr/lib/rabbitmq/bin/rabbitmqctl -q "$@"',
                    here] + list(args), check=True, stdout=subprocess.DEVNULL)


def declare_dead_queue(prefix, topic):
    """RabbitMQ: a policy sends what the partitions' queues reject to <prefix><topic>.dead."""
    import pika
    dead = "%s%s.dead" % (prefix, topic)
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    conn.channel().queue_declare(dead, durable=True)
    conn.close()
    pattern = "^%s\\.[0-9]+$" % (prefix + topic).replace(".", "\\.")
    rabbitmqctl("set_policy", "--apply-to", "queues", "dead-" + prefix + topic, pattern,
                json.dumps({"dead-letter-exchange": "", "dead-letter-routing-key": dead}))


def broker_dead(prefix, topic):
    """The message ids in the broker's dead letters of this consumer."""
    consumer = "c-" + topic
    if KIND == "kafka":
        # each with its reason in a header
        return sorted(dict(m.headers())["id"].decode() for m in kafka_read(prefix + topic + ".dead")
                      if dict(m.headers()).get("idem_consumer") == consumer.encode()
                      and dict(m.headers()).get("idem_dead_reason"))
    if KIND == "redis":
        import redis
        r = redis.Redis.from_url(URL, decode_responses=True)
        ids = [f.get("id") for p in range(PARTITIONS)
               for _, f in r.xrange("%s%s.%d:dead:%s" % (prefix, topic, p, consumer))]
        r.close()
        return sorted(ids)
    import pika
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    ch = conn.channel()
    ids = []
    while True:
        method, props, _ = ch.basic_get("%s%s.dead" % (prefix, topic), auto_ack=False)
        if method is None:
            break
        ids.append(props.message_id)
    conn.close()            # unacknowledged: back in the queue
    return sorted(ids)


def wait_for(what, cond):
    cap = time.monotonic() + WAIT
    while time.monotonic() < cap:
        if cond():
            return True
        time.sleep(0.2)
    return False


def effects(topic, key):
    with db() as c:
        return [r[0] for r in c.execute("SELECT seq FROM dl_effect WHERE topic = %s AND key = %s ORDER BY id",
                                        (topic, key))]


def failures(topic):
    """The consumer's failure rows by key, in the order they failed: 'dead after N', 'set aside' or 'trying'."""
    out = {}
    with db() as c:
        for key, state in c.execute(
                "SELECT msg_key, CASE WHEN behind IS NOT NULL THEN 'set aside' WHEN dead_at IS NOT NULL"
                " THEN 'dead after ' || attempts ELSE 'trying' END FROM idem_internal.idem_inbox_failure"
                " WHERE consumer = %s ORDER BY first_failed_at, message_id", ("c-" + topic,)).fetchall():
            out.setdefault(key, []).append(state)
    return out


def scenario(lang):
    """Both topics of one consumer library; returns the processes to stop."""
    procs = []
    for mode in ("block", "skip"):
        topic = "%s.%s.%s" % (RUN, lang, mode)
        prefix = topic + "."
        with db() as c:
            c.execute("SELECT public.idem_outbox_set_topic(%s::pg_catalog.text, %s::pg_catalog.int4, %s::pg_catalog.text)",
                      (topic, ATTEMPTS, mode))
        if KIND == "rabbitmq":
            declare_dead_queue(prefix, topic)
        procs.append(start_consumer(lang, topic, prefix))
        # the poison and the raw message first, each key's later messages behind
        emit(topic, "big", 1, {"blob": BIG})
        emit(topic, "big", 2)
        emit(topic, "poison", 1, {"poison": True})
        for seq in (2, 3):
            emit(topic, "poison", seq)
        for seq in range(1, 6):
            for k in KEYS:
                emit(topic, k, seq)
        procs.append(start_relay(topic, prefix))
    return procs


def expect(lang, procs):
    for mode in ("block", "skip"):
        topic = "%s.%s.%s" % (RUN, lang, mode)
        prefix = topic + "."
        # the raw message: its queue or stream exists once the consumer runs
        wait_for("the consumer's queues", lambda: effects(topic, "k0"))
        inject(prefix, topic, "raw-1", "raw", "not JSON {")
        inject(prefix, topic, "raw-2", "raw", json.dumps({"key": "raw", "seq": 2}))
        dead = "dead after %d" % ATTEMPTS
        want = ({"poison": [dead, "set aside", "set aside"], "raw": [dead, "set aside"]} if mode == "block"
                else {"poison": [dead], "raw": [dead]})
        done = wait_for("the poison dead-lettered, the rest applied", lambda: (
            all(effects(topic, k) == [1, 2, 3, 4, 5] for k in KEYS) and failures(topic) == want
            and scalar("SELECT count(*) FROM idem_internal.idem_outbox_dead WHERE topic = %s", topic) == 1
            and (mode == "block" or (effects(topic, "poison") == [2, 3] and effects(topic, "raw") == [2]
                                     and effects(topic, "big") == [2]))))
        f = failures(topic)
        tag = "%s consumer, on_dead '%s'" % (lang, mode)
        check("%s: every other key's messages applied exactly once, in order" % tag, done and all(
            effects(topic, k) == [1, 2, 3, 4, 5] for k in KEYS), {k: effects(topic, k) for k in KEYS})
        dead_row = db().execute("SELECT msg_key, permanent, last_reason FROM idem_internal.idem_outbox_dead"
                                " WHERE topic = %s", (topic,)).fetchall()
        check("%s: the oversized message is nacked as permanent by the relay (a dead letter: %s)" % (
            tag, dead_row[0][2] if dead_row else None),
            len(dead_row) == 1 and dead_row[0][0] == "big" and dead_row[0][1], dead_row)
        if mode == "block":
            check("%s: its key's next message waits in the outbox" % tag, effects(topic, "big") == [] and scalar(
                "SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = %s AND msg_key = 'big'", topic) == 2,
                effects(topic, "big"))
        else:
            check("%s: its key's next message is delivered" % tag, effects(topic, "big") == [2], effects(topic, "big"))
        check("%s: the raising handler's and the undecodable message are dead after %d attempts (counted in PostgreSQL)"
              % (tag, ATTEMPTS), f.get("poison", [None])[0] == dead and f.get("raw", [None])[0] == dead, f)
        if mode == "block":
            check("%s: their keys' later messages are set aside, not applied" % tag,
                  f == want and effects(topic, "poison") == [] and effects(topic, "raw") == [], f)
        else:
            check("%s: their keys' later messages are applied" % tag,
                  effects(topic, "poison") == [2, 3] and effects(topic, "raw") == [2], f)
        held = sum(len(v) for v in want.values())
        in_broker = broker_dead(prefix, topic)
        check("%s: the broker's dead letters hold exactly those (%s)" % (
            tag, {"redis": "a dead stream", "kafka": "the topic <topic>.dead, the reason in headers"}.get(
                KIND, "a policy's dead-letter queue")),
            len(in_broker) == held and "raw-1" in in_broker, (in_broker, held))
    # redrive the 'block' topic: the handler now takes the poison; the raw one is discarded
    topic = "%s.%s.block" % (RUN, lang)
    prefix = topic + "."
    with db() as c:
        c.execute("INSERT INTO dl_poison_ok VALUES (%s)", (topic,))     # this topic's handler takes the poison now
        big1 = c.execute("SELECT message_id FROM idem_internal.idem_outbox_dead WHERE topic = %s", (topic,)).fetchone()[0]
        c.execute("SELECT public.idem_outbox_discard(ARRAY[%s::pg_catalog.int8])", (big1,))
    base = [PY, "-m", "idem_pg.redrive", "--dsn", DSN, "--broker", URL, "--topic", topic, "--consumer", "c-" + topic,
            "--partitions", str(PARTITIONS), "--prefix", prefix]
    reason = "raw-1 is garbage (%s, %s)" % (lang, URL.split(":", 1)[0])
    r1 = subprocess.run(base + ["--discard", "--reason", reason, "raw-1"], capture_output=True, text=True)
    r2 = subprocess.run(base, capture_output=True, text=True)
    ok = wait_for("the redriven messages applied", lambda: effects(topic, "poison") == [1, 2, 3]
                  and effects(topic, "raw") == [2] and effects(topic, "big") == [2])
    check("%s consumer, on_dead 'block': after idem_pg.redrive (--discard --reason ... raw-1, audited, then the rest) and"
          " idem_outbox_discard, the held keys go on in order" % lang, ok and r1.returncode == 0 and r2.returncode == 0
          and wait_for("no failure row left", lambda: not failures(topic))
          and scalar("SELECT count(*) FROM public.idem_operator_actions WHERE action = 'discard' AND reason = %s",
                     reason) == 1,
          (effects(topic, "poison"), effects(topic, "raw"), effects(topic, "big"), failures(topic), r1.stderr[-300:],
           r2.stderr[-300:]))
    return procs


def broker_down(procs):
    """The broker stopped for longer than the relays' lease: nothing dead-lettered."""
    topic = "%s.py.skip" % RUN
    before = scalar("SELECT count(*) FROM idem_internal.idem_outbox_dead")
    failed_before = scalar("SELECT count(*) FROM idem_internal.idem_inbox_failure")
    # the restart command touches the flag once the broker is down, then keeps it down 6 s (run.sh)
    flag = os.path.join(os.environ.get("TMPDIR", "/tmp"), "broker-down-%s-%d" % (RUN, os.getpid()))
    if os.path.exists(flag):
        os.unlink(flag)
    restart = subprocess.Popen(RESTART, env=dict(os.environ, IDEM_BROKER_DOWN_FLAG=flag))
    wait_for("the broker stopped", lambda: os.path.exists(flag))
    for seq in range(6, 9):
        emit(topic, "k0", seq)
    # as a relay that took the key's head and went silent would: a lease of 1 s, never acked (the
    # relay's own fetches, if it makes any while the broker is down, lapse as well)
    scalar("SELECT count(*) FROM public.idem_outbox_fetch(%s::pg_catalog.text, 100, '1 second'::pg_catalog.interval)", topic)
    lapses = 0
    while restart.poll() is None:   # idem_health() meanwhile: the leases that lapsed
        lapses = max(lapses, scalar("SELECT outbox_lease_lapses FROM public.idem_health()"))
        time.sleep(0.2)
    for seq in range(9, 12):
        emit(topic, "k0", seq)
    ok = wait_for("delivered after the restart", lambda: effects(topic, "k0") == list(range(1, 12)))
    check("the broker down for longer than the lease: every message arrives, in order", ok and restart.returncode == 0,
          (restart.returncode, effects(topic, "k0")))
    check("idem_health() showed the lapsed leases meanwhile (at most %d at once)" % lapses, lapses > 0, lapses)
    check("and nothing is dead-lettered (outbox or consumers)",
          scalar("SELECT count(*) FROM idem_internal.idem_outbox_dead") == before
          and scalar("SELECT count(*) FROM idem_internal.idem_inbox_failure") == failed_before,
          (before, failed_before))


def redis_oom():
    """Redis full (maxmemory reached, noeviction): its OOM error replies may pass,
    so the relay never nacks; once Redis has room again the message arrives."""
    import redis
    topic = "%s.py.skip" % RUN
    r = redis.Redis.from_url(URL)
    log = os.path.join(TMP, "relay-%s-%s.log" % (RUN, topic))
    seen = open(log).read().count("not taken by the broker")
    r.config_set("maxmemory", "1")
    try:
        emit(topic, "k1", 6)
        refused = wait_for("the relay refused by OOM", lambda: open(log).read().count("not taken by the broker") > seen)
        nacks = scalar("SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = %s AND nacks IS NOT NULL", topic)
    finally:
        r.config_set("maxmemory", "0")
        r.close()
    ok = wait_for("delivered once Redis has room", lambda: effects(topic, "k1") == [1, 2, 3, 4, 5, 6])
    check("Redis out of memory (OOM replies): the relay backs off and nacks nothing; the message arrives once"
          " Redis has room", refused and nacks == 0 and ok, (refused, nacks, effects(topic, "k1")))


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # the children go too (atexit)
    with db() as c:
        c.execute("DROP TABLE IF EXISTS dl_effect, dl_poison_ok")
        c.execute("CREATE TABLE dl_effect (id bigserial PRIMARY KEY, topic text, key text, seq int, message_id text)")
        c.execute("CREATE TABLE dl_poison_ok (topic text)")      # topics whose handler takes the poison
    langs = ["py"] + (["node"] if NODE_APP else [])
    procs = []
    for lang in langs:
        procs += scenario(lang)
    for lang in langs:
        expect(lang, procs)
    if KIND == "redis":
        redis_oom()
    broker_down(procs)
    health = db().execute("SELECT outbox_dead, outbox_lease_lapses, inbox_dead FROM public.idem_health()").fetchone()
    print("# %s: idem_health(): outbox_dead %d, outbox_lease_lapses %d, inbox_dead %d" % ((KIND,) + tuple(health)))
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
