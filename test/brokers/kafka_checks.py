#!/usr/bin/python3
"""What only Kafka needs, through a real broker (test/brokers/kafka.sh
starts the server, the broker, the venv and the Node library):

- every language places a key on the same partition: the relay's
  librdkafka (``murmur2_random``), ``idem_pg.kafka.partition_for``, and in
  Node kafkajs's default partitioner and ``idem-pg/kafka``'s partitionFor;
- a relay killed (kill -9) after the broker confirmed its batch and before
  the outbox's acknowledgement: the batch is pushed again (duplicates in
  the topic), and every message is applied exactly once;
- a poison message does not hold its partition up: a good key chosen (by
  murmur2) to share the poison key's partition is applied while the poison
  waits for its next attempt, for each consumer library; the poison key's
  next message waits behind it until it is dead ('skip'), then is applied;
- a topic name Kafka refuses: the relay nacks its messages as permanent;
- a consumer stopped by SIGTERM leaves its group (no member left behind
  for the session timeout).

    kafka_checks.py kafka BROKER_URL

Prints one "ok - ..." / "not ok - ..." line per check and "# ..." figures.
"""
import json
import os
import signal
import subprocess
import sys
import time

import dead_letters as dl
from children import started
from idem_pg.kafka import config_of, ensure_topic, partition_for

URL = sys.argv[2]
RUN = "kc%d" % os.getpid()
assert dl.KIND == "kafka", "kafka_checks.py kafka BROKER_URL"
PY, DSN, WAIT, TMP, NODE_APP = dl.PY, dl.DSN, dl.WAIT, dl.TMP, dl.NODE_APP


def check(what, ok, detail=""):
    print(("ok - kafka: %s" % what) if ok else ("not ok - kafka: %s (%s)" % (what, detail)))
    sys.stdout.flush()


def relay(topic, partitions, env=None, tag=""):
    log = open(os.path.join(TMP, "relay-%s-%s%s.log" % (RUN, topic, tag)), "a")
    return started(subprocess.Popen(
        [PY, "-m", "idem_pg.relay", "--dsn", DSN, "--topic", topic, "--broker", URL, "--partitions", str(partitions),
         "--lease", "2", "--poll", "0.2", "--backoff-max", "1"],
        env=dict(os.environ, **(env or {})), stdout=log, stderr=subprocess.STDOUT))


def emit_many(topic, rows):
    with dl.db() as c, c.transaction():
        for key, payload in rows:
            c.execute("SELECT public.idem_outbox_emit(%s::pg_catalog.text, %s::pg_catalog.jsonb, %s::pg_catalog.text)",
                      (topic, json.dumps(payload), key))


def stop(*procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    return [p.wait(timeout=WAIT) for p in procs]


NODE_PARTITIONS = r"""
import { Partitioners } from 'kafkajs';
import { partitionFor } from 'idem-pg/kafka';
const [n, ...keys] = process.argv.slice(2);
const meta = Array.from({ length: Number(n) }, (_, i) => ({ partitionId: i, leader: 0 }));
const kafkajs = Partitioners.DefaultPartitioner();
console.log(JSON.stringify(keys.map((key) => [kafkajs({ topic: 't', partitionMetadata: meta, message: { key } }),
  partitionFor(key, Number(n))])));
"""


def placement():
    """500 keys over 8 partitions: where the relay put them, and what each language computes."""
    topic = RUN + ".placement"
    keys = ["customer-%d" % i for i in range(500)]
    emit_many(topic, [(k, {"key": k}) for k in keys])
    r = relay(topic, 8)
    ok = dl.wait_for("relayed", lambda: dl.scalar(
        "SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = %s", topic) == 0)
    stop(r)
    placed = {m.key().decode(): m.partition() for m in dl.kafka_read(topic)} if ok else {}
    python = {k: partition_for(k, 8) for k in keys}
    check("the relay places each of 500 keys on the partition of the Java client's murmur2 (idem_pg.kafka.partition_for)"
          " over 8 partitions", placed == python, len([k for k in keys if placed.get(k) != python[k]]))
    if NODE_APP:
        from pipeline import node_script
        out = subprocess.run(["node", node_script("partitions.mjs", NODE_PARTITIONS), "8"] + keys, cwd=NODE_APP,
                             capture_output=True, text=True)
        node = json.loads(out.stdout) if out.returncode == 0 else []
        check("and so do kafkajs's default partitioner and idem-pg/kafka's partitionFor, key by key",
              node == [[python[k], python[k]] for k in keys], out.stderr[-300:])


PY_CONSUMER = r"""
import sys, signal
from idem_pg.kafka import KafkaConsumer
dsn, topic, url, consumer, base = sys.argv[1:6]
def apply(conn, m):
    if m.payload.get('poison'):
        raise ValueError('the handler refuses poison %s' % m.payload['seq'])
    conn.execute("INSERT INTO dl_effect (topic, key, seq, message_id) VALUES (%s, %s, %s, %s)",
                 (topic, m.key, m.payload['seq'], m.message_id))
c = KafkaConsumer(dsn, topic, url, consumer, consumer + '-1', partitions=2, max_attempts=4,
                  retry_base_ms=float(base), retry_max_ms=float(base) * 4)
signal.signal(signal.SIGTERM, c.stop)
c.run(apply)
"""

NODE_CONSUMER = r"""
import pg from 'pg';
import { KafkaConsumer } from 'idem-pg/kafka';
import { kafkaOf } from './kafka-of.mjs';
const [url, topic, consumer, base] = process.argv.slice(2);
const client = new pg.Client({ database: 'idem_brokers' });
await client.connect();
const c = new KafkaConsumer({ pg: client, kafka: await kafkaOf(url, `${consumer}-1`), topic, consumer,
  name: `${consumer}-1`, partitions: 2, maxAttempts: 4, retryBaseMs: Number(base), retryMaxMs: Number(base) * 4 });
process.on('SIGTERM', () => c.stop());
await c.run(async (db, m) => {
  if (m.payload.poison) throw new TypeError(`the handler refuses poison ${m.payload.seq}`);
  await db.query('INSERT INTO dl_effect (topic, key, seq, message_id) VALUES ($1, $2, $3, $4)',
    [topic, m.key, m.payload.seq, m.messageId]);
});
process.exit(0);
"""


def consumer(lang, topic, name, base_ms):
    log = open(os.path.join(TMP, "consumer-%s-%s.log" % (RUN, topic)), "a")
    if lang == "node":
        from pipeline import node_script
        return started(subprocess.Popen(["node", node_script("kafka-consumer.mjs", NODE_CONSUMER), URL, topic, name,
                                         str(base_ms)], stdout=log, stderr=subprocess.STDOUT, cwd=NODE_APP))
    return started(subprocess.Popen([PY, "-c", PY_CONSUMER, DSN, topic, URL, name, str(base_ms)],
                                    stdout=log, stderr=subprocess.STDOUT))


def poison_partition(lang):
    """A poison on a 'skip' topic, tried 4 times 1.5 s, 3 s, 6 s apart; a good key on its partition meanwhile."""
    topic = "%s.%s.poison" % (RUN, lang)
    with dl.db() as c:
        c.execute("SELECT public.idem_outbox_set_topic(%s::pg_catalog.text, 4, 'skip'::pg_catalog.text)", (topic,))
    ensure_topic(config_of(URL), topic, 2)
    good = next("good-%d" % i for i in range(100) if partition_for("good-%d" % i, 2) == partition_for("poison", 2))
    c = consumer(lang, topic, "c-" + topic, 1500)
    r = relay(topic, 2)
    emit_many(topic, [("poison", {"seq": 1, "poison": True}), ("poison", {"seq": 2})])
    dl.wait_for("the poison's first failure", lambda: dl.failures(topic).get("poison") == ["trying"])
    t0 = time.monotonic()
    emit_many(topic, [(good, {"seq": s}) for s in range(1, 21)])
    applied = dl.wait_for("the good key applied", lambda: dl.effects(topic, good) == list(range(1, 21)))
    delay = time.monotonic() - t0
    waiting = dl.failures(topic).get("poison")
    held = dl.effects(topic, "poison")
    check("%s consumer: a good key on the poison's partition (%s, by murmur2) is applied, 20 messages in %.1f s,"
          " while the poison waits for its next attempt (its retries 1.5, 3 and 6 s apart: the partition is not held)"
          % (lang, good, delay), applied and waiting == ["trying"] and held == [], (waiting, held))
    dead = dl.wait_for("the poison dead, its key's next applied", lambda: dl.effects(topic, "poison") == [2])
    check("%s consumer: the poison key's next message waited behind it, and is applied once the poison is dead"
          " after 4 attempts ('skip')" % lang, dead and dl.failures(topic).get("poison") == ["dead after 4"],
          (dl.effects(topic, "poison"), dl.failures(topic)))
    stop(r, c)


def relay_killed():
    """kill -9 between the broker's confirms and the outbox's ack: pushed twice, applied once."""
    topic = RUN + ".killed"
    keys = ["k%d" % i for i in range(20)]
    emit_many(topic, [(k, {"seq": s}) for s in range(1, 6) for k in keys])
    c = consumer("py", topic, "c-" + topic, 50)
    paused = relay(topic, 2, {"IDEM_PG_RELAY_PAUSE_BEFORE_ACK": "2"}, "-paused")
    log = os.path.join(TMP, "relay-%s-%s-paused.log" % (RUN, topic))
    at_pause = dl.wait_for("the relay paused before its ack",
                           lambda: "paused before the outbox's ack" in open(log).read())
    paused.send_signal(signal.SIGKILL)
    paused.wait()
    r = relay(topic, 2)
    done = dl.wait_for("every message applied", lambda: all(dl.effects(topic, k) == [1, 2, 3, 4, 5] for k in keys))
    ids = [dict(m.headers())["id"] for m in dl.kafka_read(topic)]
    check("a relay killed (kill -9) after the broker's confirms, before the outbox's ack: its batch is pushed again"
          " (%d messages in the topic for %d emitted)" % (len(ids), len(set(ids))),
          at_pause and len(ids) > len(set(ids)) == 100, (at_pause, len(ids), len(set(ids))))
    check("and each of the 100 is applied exactly once, in its key's order",
          done and dl.scalar("SELECT count(*) FROM dl_effect WHERE topic = %s", topic) == 100,
          {k: dl.effects(topic, k) for k in keys[:3]})
    # the consumer leaves its group on SIGTERM: no member left for the session's 6 s
    stopped = stop(r, c)
    from confluent_kafka.admin import AdminClient
    admin = AdminClient(config_of(URL))     # kept while its future runs
    group = admin.describe_consumer_groups(["c-" + topic], request_timeout=WAIT)["c-" + topic].result(WAIT)
    check("a consumer stopped by SIGTERM exits with 0 and leaves its group at once (%d members left)"
          % len(group.members), stopped == [0, 0] and not group.members, (stopped, group.state))


def invalid_topic():
    topic = RUN + ":invalid"    # idem takes ":" in a topic, Kafka does not
    emit_many(topic, [("k", {"seq": 1})])
    r = relay(topic, 1)
    dead = dl.wait_for("nacked", lambda: dl.scalar(
        "SELECT count(*) FROM idem_internal.idem_outbox_dead WHERE topic = %s AND permanent", topic) == 1)
    reason = dl.scalar("SELECT last_reason FROM idem_internal.idem_outbox_dead WHERE topic = %s", topic)
    check("a topic name Kafka refuses: the relay nacks its message as permanent (%s)" % reason, dead, reason)
    stop(r)


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with dl.db() as c:
        c.execute("CREATE TABLE IF NOT EXISTS dl_effect (id bigserial PRIMARY KEY, topic text, key text, seq int,"
                  " message_id text)")
    placement()
    relay_killed()
    for lang in ["py"] + (["node"] if NODE_APP else []):
        poison_partition(lang)
    invalid_topic()


if __name__ == "__main__":
    main()
