#!/usr/bin/python3
"""The outbox -> relay -> broker -> consumer pipeline through a real broker
(test/brokers/run.sh starts the server, the broker and the venv).

10,000 business transactions on 1,000 keys (10 % rolled back), each
emitting one message keyed by its business key, from 4 producers; two
relays (``python3 -m idem_pg.relay``) publish to the broker; two consumers
(``idem_pg.consumer``) apply each message's effect through idem's inbox.
Meanwhile a relay is killed (kill -9) twice, the broker is restarted once,
and one consumer exits between a commit and its broker ack
(IDEM_PG_CONSUMER_CRASH_BEFORE_ACK, the helper's test hook).  Then every
committed business row has exactly one effect, no rolled-back one has any,
and each key's effects happened in commit order.

    pipeline.py redis|rabbitmq|kafka BROKER_URL RESTART_COMMAND...

Prints one "ok - ..." / "not ok - ..." line per check and "# ..." figures.
"""
import os
import random
import signal
import statistics
import subprocess
import sys
import time

import psycopg

from children import started

PRODUCE = len(sys.argv) > 2 and sys.argv[1] == "--produce"
KIND, URL = ("producer", "") if PRODUCE else (sys.argv[1], sys.argv[2])
RESTART = sys.argv[3:]
PY = os.environ.get("PY", sys.executable)
DSN = os.environ.get("PIPELINE_DSN", "dbname=idem_brokers")
# how long a wait on progress may take: the test run's cap (PG_TEST_TIMEOUT_DEFAULT, 180 s)
WAIT = float(os.environ.get("IDEM_WAIT") or os.environ.get("PG_TEST_TIMEOUT_DEFAULT") or 180)
TXNS, KEYS, PRODUCERS, PARTITIONS = 10_000, 1_000, 4, 8
RUN = "%s%d" % (KIND[0], os.getpid())
TOPIC = "orders"
PREFIX = RUN + "."
CONSUMER = "billing-" + RUN


def check(what, ok, detail=""):
    if ok:
        print("ok - %s: %s" % (KIND, what))
    else:
        print("not ok - %s: %s (%s)" % (KIND, what, detail))
    sys.stdout.flush()


def db():
    return psycopg.connect(DSN, autocommit=True)


def setup():
    with db() as c:
        c.execute("DROP TABLE IF EXISTS biz, effect")
        c.execute("CREATE TABLE biz (key text, seq int, emitted_ms bigint, PRIMARY KEY (key, seq))")
        c.execute("CREATE TABLE effect (id bigserial PRIMARY KEY, key text, seq int, message_id text,"
                  " relay_lag_ms bigint, consumer_name text)")


def producer(p):
    """Keys k with k % PRODUCERS == p, one transaction each, in order per key."""
    rng = random.Random(p)
    seq = {}
    with db() as c:
        for i in range(TXNS // PRODUCERS):
            k = "key-%04d" % (rng.randrange(KEYS // PRODUCERS) * PRODUCERS + p)
            n = seq.get(k, 0) + 1
            rollback = rng.random() < 0.10
            with c.cursor() as cur:
                try:
                    with c.transaction() as tx:
                        cur.execute("INSERT INTO biz VALUES (%s, %s, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)",
                                    (k, n))
                        cur.execute("SELECT public.idem_outbox_emit(%s::pg_catalog.text, jsonb_build_object('key', %s::text,"
                                    " 'seq', %s::int, 'emitted_ms', (extract(epoch FROM clock_timestamp()) * 1000)::bigint),"
                                    " %s::pg_catalog.text)",
                                    (TOPIC, k, n, k))
                        if rollback:
                            raise psycopg.Rollback(tx)
                except psycopg.Rollback:
                    pass
            if not rollback:
                seq[k] = n


CONSUMER_CODE = r"""
import os, sys, signal, time
import psycopg
from idem_pg.consumer import consumer_of
dsn, topic, url, consumer, name, prefix = sys.argv[1:7]
def apply(conn, m):
    lag = m.published_ms - m.payload['emitted_ms'] if m.published_ms else None
    conn.execute("INSERT INTO effect (key, seq, message_id, relay_lag_ms, consumer_name) VALUES (%s, %s, %s, %s, %s)",
                 (m.payload['key'], m.payload['seq'], m.message_id, lag, name))
kw = {'lease': 2.0} if url.startswith('redis') else {}
c = consumer_of(url, dsn, topic, consumer, name, partitions=int(sys.argv[7]), prefix=prefix, **kw)
signal.signal(signal.SIGTERM, c.stop)
c.run(apply)
"""


# the Node library's consumer (idem-pg/consumer), when the stage installed it
NODE_CONSUMER = r"""
import pg from 'pg';
import { RedisConsumer, RabbitConsumer } from 'idem-pg/consumer';
import { kafkaOf } from './kafka-of.mjs';
const [url, consumer, name, prefix, partitions, topic] = process.argv.slice(2);
const client = new pg.Client({ database: 'idem_brokers' });
await client.connect();
const apply = async (db, m) => {
  const lag = m.publishedMs ? m.publishedMs - m.payload.emitted_ms : null;
  await db.query('INSERT INTO effect (key, seq, message_id, relay_lag_ms, consumer_name) VALUES ($1, $2, $3, $4, $5)',
    [m.payload.key, m.payload.seq, m.messageId, lag, name]);
};
let c;
if (url.startsWith('redis')) {
  const { createClient } = await import('redis');
  const redis = createClient({ url });
  redis.on('error', () => {});
  await redis.connect();
  c = new RedisConsumer({ pg: client, redis, topic, consumer, name, partitions: Number(partitions), prefix, lease: 2 });
} else if (url.startsWith('kafka')) {
  const { KafkaConsumer } = await import('idem-pg/kafka');
  c = new KafkaConsumer({ pg: client, kafka: await kafkaOf(url, name), topic, consumer, name, partitions: Number(partitions), prefix });
} else {
  const amqp = (await import('amqplib')).default;
  c = new RabbitConsumer({ pg: client, amqp, url, topic, consumer, name, partitions: Number(partitions), prefix });
}
process.on('SIGTERM', () => c.stop());
await c.run(apply);
process.exit(0);
"""

# kafkajs for a kafka:// URL (its query string is for librdkafka: not kafkajs's)
KAFKA_OF = r"""
export async function kafkaOf(url, clientId) {
  const { Kafka, logLevel } = await import('kafkajs');
  return new Kafka({ clientId, brokers: new URL(url).host.split(','), logLevel: logLevel.ERROR });
}
"""


def node_script(name, code):
    """A script in the Node app's directory (with kafka-of.mjs beside it)."""
    node_app = os.environ["NODE_APP"]
    with open(os.path.join(node_app, "kafka-of.mjs"), "w") as f:
        f.write(KAFKA_OF)
    script = os.path.join(node_app, name)
    with open(script, "w") as f:
        f.write(code)
    return script


def start_relay(tag):
    log = open(os.path.join(os.environ.get("IDEM_TMP", "/tmp"), "relay-%s-%s.log" % (RUN, tag)), "a")
    return started(subprocess.Popen([PY, "-m", "idem_pg.relay", "--dsn", DSN, "--topic", TOPIC, "--broker", URL,
                             "--partitions", str(PARTITIONS), "--prefix", PREFIX, "--lease", "2", "--poll", "0.2",
                             "--trim-interval", "0.5", "--progress-interval", "2"],
                            stdout=log, stderr=subprocess.STDOUT))


def start_consumer(name, crash_at=None):
    env = dict(os.environ)
    env.pop("IDEM_PG_CONSUMER_CRASH_BEFORE_ACK", None)
    if crash_at:
        env["IDEM_PG_CONSUMER_CRASH_BEFORE_ACK"] = str(crash_at)
    log = open(os.path.join(os.environ.get("IDEM_TMP", "/tmp"), "consumer-%s-%s.log" % (RUN, name)), "a")
    node_app = os.environ.get("NODE_APP")
    if name == "c2" and node_app:       # one Python and one Node consumer in one group
        script = node_script("broker-consumer.mjs", NODE_CONSUMER)
        return started(subprocess.Popen(["node", script, URL, CONSUMER, name, PREFIX, str(PARTITIONS), TOPIC],
                                        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=node_app))
    return started(subprocess.Popen([PY, "-c", CONSUMER_CODE, DSN, TOPIC, URL, CONSUMER, name, PREFIX, str(PARTITIONS)],
                                    env=env, stdout=log, stderr=subprocess.STDOUT))


def scalar(sql, *args):
    with db() as c:
        return c.execute(sql, args).fetchone()[0]


def main():
    setup()
    relays = {"a": start_relay("a"), "b": start_relay("b")}
    producers = [started(subprocess.Popen([PY, __file__, "--produce", str(p)])) for p in range(PRODUCERS)]
    # c1 first, alone until it applies messages: it holds every partition,
    # so its test hook (exit after its 300th commit, before that ack) fires;
    # c2 then takes the partitions over
    consumers = {"c1": start_consumer("c1", crash_at=300)}
    first = time.monotonic() + WAIT
    while time.monotonic() < first:
        if scalar("SELECT count(*) FROM effect") > 0:
            break
        time.sleep(0.1)
    consumers["c2"] = start_consumer("c2")
    events = {"relay kills": 0, "broker restarts": 0, "consumer crashes": 0}
    plan = [(0.25, "kill a"), (0.5, "restart broker"), (0.75, "kill b")]
    t0 = time.monotonic()
    deadline = t0 + max(150, WAIT)     # a wait on progress, capped
    while time.monotonic() < deadline:
        written = scalar("SELECT count(*) FROM biz")
        done = all(p.poll() is not None for p in producers)
        effects = scalar("SELECT count(*) FROM effect")
        while plan and (effects >= plan[0][0] * TXNS * 0.9 or done):
            _, action = plan.pop(0)
            if action.startswith("kill"):
                tag = action[-1]
                relays[tag].send_signal(signal.SIGKILL)
                relays[tag].wait()
                relays[tag] = start_relay(tag)
                events["relay kills"] += 1
            else:
                subprocess.run(RESTART, check=True)
                events["broker restarts"] += 1
        for name, proc in list(consumers.items()):
            if proc.poll() is not None:         # the crash hook's exit: start it again, without the hook
                # c1 comes back only once c2 took over (c2 may still be starting when c1 exits)
                if name == "c1" and not (done and effects >= written) and not scalar(
                        "SELECT count(*) FROM effect WHERE consumer_name = 'c2'"):
                    continue
                events["consumer crashes"] += 1 if proc.returncode == 70 else 0
                consumers[name] = start_consumer(name)
        if done and not plan and effects >= written:
            break
        time.sleep(0.2)
    elapsed = time.monotonic() - t0
    trimmed_to = None
    if KIND == "redis":
        # the relays trim the streams to what the group has acknowledged:
        # once every message is applied, at most one entry a stream is left
        import redis
        r = redis.Redis.from_url(URL)
        streams = ["%s%s.%d" % (PREFIX, TOPIC, p) for p in range(PARTITIONS)]
        cap = time.monotonic() + WAIT
        while time.monotonic() < cap:
            trimmed_to = sum(r.xlen(n) for n in streams)
            if trimmed_to <= PARTITIONS:
                break
            time.sleep(0.2)
    for proc in list(relays.values()) + list(consumers.values()):
        proc.send_signal(signal.SIGTERM)
    stopped = []
    for proc in list(relays.values()) + list(consumers.values()):
        try:
            stopped.append(proc.wait(timeout=WAIT))
        except subprocess.TimeoutExpired:
            proc.kill()
            stopped.append("still running")

    committed = scalar("SELECT count(*) FROM biz")
    check("%d of %d business transactions committed (%d rolled back), on %d keys" % (
        committed, TXNS, TXNS - committed, scalar("SELECT count(DISTINCT key) FROM biz")),
        TXNS * 0.85 < committed < TXNS * 0.95, committed)
    check("the run had its faults: 2 relay kills, 1 broker restart, 1 consumer exit between commit and ack",
          events == {"relay kills": 2, "broker restarts": 1, "consumer crashes": 1}, events)
    check("every committed business row has exactly one effect", scalar(
        "SELECT count(*) FROM (SELECT b.key, b.seq, count(e.id) AS n FROM biz b LEFT JOIN effect e USING (key, seq)"
        " GROUP BY b.key, b.seq) s WHERE n <> 1") == 0,
        scalar("SELECT count(*) FROM biz b WHERE NOT EXISTS (SELECT FROM effect e WHERE (e.key, e.seq) = (b.key, b.seq))"))
    check("no rolled-back transaction has an effect", scalar(
        "SELECT count(*) FROM effect e WHERE NOT EXISTS (SELECT FROM biz b WHERE (b.key, b.seq) = (e.key, e.seq))") == 0)
    check("each key's effects happened in commit order", scalar(
        "SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY key ORDER BY id) AS prev FROM effect) s"
        " WHERE prev IS NOT NULL AND seq <> prev + 1") == 0)
    dups = scalar("SELECT coalesce(sum(inbox_duplicates), 0) FROM idem_stats WHERE datname = current_database()"
                  " AND kind = 'consumer' AND operation = %s", CONSUMER)
    check("redeliveries were recognised by the inbox (the consumer's crash, the killed relays)", dups >= 1, dups)
    if os.environ.get("NODE_APP"):
        by = dict(db().execute("SELECT consumer_name, count(*) FROM effect GROUP BY 1").fetchall())
        check("the Python consumer (until its crash) and then the Node consumer (idem-pg/consumer) applied them, in one group",
              by.get("c1", 0) >= 300 and by.get("c2", 0) > 0, by)
    check("SIGTERM stops the two relays and the two consumers, each with status 0",
          stopped == [0, 0, 0, 0], stopped)
    if KIND == "redis":
        check("the relays trim the Redis streams to what the consumer group acknowledged (%s entries left in %d streams)"
              % (trimmed_to, PARTITIONS), trimmed_to is not None and trimmed_to <= PARTITIONS, trimmed_to)
    relay_logs = "".join(open(os.path.join(os.environ.get("IDEM_TMP", "/tmp"), "relay-%s-%s.log" % (RUN, tag))).read()
                         for tag in ("a", "b"))
    check("the relays log their progress at INFO (fetched, confirmed, trimmed, the longest wait, the backlog)",
          "INFO idem_pg.relay: topic %s: in the last" % TOPIC in relay_logs
          and "unacknowledged messages (all topics), the oldest" in relay_logs, relay_logs[-400:])
    pika_info = [line for line in relay_logs.splitlines() if " pika" in line and " INFO " in line]
    check("and the broker library's chatter stays below WARNING (no pika INFO line)", not pika_info, pika_info[:3])
    check("the outbox holds no unacknowledged message", scalar(
        "SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = %s AND acked_at IS NULL", TOPIC) == 0)
    lags = [r[0] for r in db().execute("SELECT relay_lag_ms FROM effect WHERE relay_lag_ms IS NOT NULL ORDER BY 1")]
    if lags:
        p50, p99 = lags[len(lags) // 2], lags[min(len(lags) - 1, int(len(lags) * 0.99))]
        print("# %s: %d messages in %.1f s end to end; relay lag (commit -> published) p50 %d ms, p99 %d ms; %d redeliveries dropped"
              % (KIND, committed, elapsed, p50, p99, dups))


if __name__ == "__main__":
    if PRODUCE:
        producer(int(sys.argv[2]))
    else:
        main()
