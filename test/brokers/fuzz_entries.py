#!/usr/bin/python3
"""Malformed entries between good ones, through a real broker, for each
consumer library (Python, Node): 200 entries idem could not store or a
handler could not apply -- an id over 512 characters, empty, missing, with
a NUL, a newline or another control character, not UTF-8; a key over 256
characters, with a NUL, not UTF-8; a payload that is not JSON, binary,
missing or over 300 KB; headers that are not JSON -- written to the broker
directly between 80 good entries of 8 keys.  Every good entry is applied
exactly once, in its key's order; every malformed one is among the
consumer's dead letters (the topic dead-letters at the first failure and
skips: 'skip'); the consumer neither exits nor spins.

Kafka: the key is the Kafka key, the payload the value, the other fields
headers; "missing" is a null value.

    fuzz_entries.py redis|rabbitmq|kafka BROKER_URL

Prints one "ok - ..." / "not ok - ..." line per check.
"""
import json
import os
import random
import subprocess
import sys
import time
import zlib

import dead_letters as dl

KIND, URL = dl.KIND, dl.URL
RUN = "fz%s%d" % (KIND[0], os.getpid())
GOOD_KEYS = ["g%d" % i for i in range(8)]
GOOD_PER_KEY = 10
MALFORMED = 200


def check(what, ok, detail=""):
    print(("ok - %s: malformed entries: %s" % (KIND, what)) if ok else
          ("not ok - %s: malformed entries: %s (%s)" % (KIND, what, detail)))
    sys.stdout.flush()


def malformed(n, rnd):
    """The n-th malformed entry: (fields without payload, payload or None); bytes where not UTF-8."""
    i = "%s-%d" % (RUN, n)
    key = "bad-key-%d" % (n % 5)
    payload = json.dumps({"key": key, "seq": n})
    cases = [
        lambda: ({"id": "m" * 600, "key": key}, payload),
        lambda: ({"id": "nul\x00" + i, "key": key}, payload),
        lambda: ({"id": b"\xff\xfe" + i.encode(), "key": key}, payload),
        lambda: ({"key": key}, "not json " + i),                  # no id, and not JSON
        lambda: ({"id": "line\n" + i, "key": key}, payload),
        lambda: ({"id": "", "key": key}, payload),
        lambda: ({"id": "long-key-" + i, "key": "k" * 300}, payload),
        lambda: ({"id": "nul-key-" + i, "key": "k\x00" + i}, payload),
        lambda: ({"id": "bin-key-" + i, "key": b"\xc3\x28" + i.encode()}, payload),
        lambda: ({"id": "not-json-" + i, "key": key}, "{not json " + i),
        lambda: ({"id": "binary-" + i, "key": key}, bytes(rnd.getrandbits(8) for _ in range(64)) + b"\xff"),
        lambda: ({"id": "no-payload-" + i, "key": key}, None),
        lambda: ({"id": "huge-" + i, "key": key}, "x" * (300 * 1024)),
        lambda: ({"id": "del\x7f\x85" + i, "key": key}, payload),
        lambda: ({"id": "headers-" + i, "key": key, "headers": "{not json"}, payload),
    ]
    return cases[n % len(cases)]()


def raw(value):
    return value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")


def part(key):
    return 0 if key is None else zlib.crc32(raw(key)) % dl.PARTITIONS


def inject(prefix, topic, entries):
    """The entries, in order, each into its key's partition."""
    if KIND == "kafka":
        dl.kafka_produce(prefix + topic, [
            ([(k, raw(v)) for k, v in fields.items() if k != "key"],
             None if fields.get("key") is None else raw(fields["key"]), None if payload is None else raw(payload))
            for fields, payload in entries])
        return
    if KIND == "redis":
        import redis
        r = redis.Redis.from_url(URL)
        for fields, payload in entries:
            f = dict(fields)
            if payload is not None:
                f["payload"] = payload
            r.xadd("%s%s.%d" % (prefix, topic, part(fields.get("key"))), {k: raw(v) for k, v in f.items()})
        r.close()
        return
    import pika
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    ch = conn.channel()
    ch.confirm_delivery()
    for fields, payload in entries:
        body = b"" if payload is None else raw(payload)
        ch.basic_publish("", "%s%s.%d" % (prefix, topic, part(fields.get("key"))), body,
                         pika.BasicProperties(delivery_mode=2, headers=dict(fields)), mandatory=True)
    conn.close()


def dead_count(prefix, topic):
    """How many entries are among the broker's dead letters of this consumer."""
    consumer = "c-" + topic
    if KIND == "kafka":
        return len([m for m in dl.kafka_read(prefix + topic + ".dead")
                    if dict(m.headers()).get("idem_consumer") == consumer.encode()])
    if KIND == "redis":
        import redis
        r = redis.Redis.from_url(URL)
        n = sum(r.xlen("%s%s.%d:dead:%s" % (prefix, topic, p, consumer)) for p in range(dl.PARTITIONS))
        r.close()
        return n
    import pika
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    n = conn.channel().queue_declare("%s%s.dead" % (prefix, topic), durable=True, passive=True).method.message_count
    conn.close()
    return n


def unfinished(prefix, topic):
    """Entries delivered and not yet acknowledged, or not yet delivered (-1:
    the consumer has not set its stream or queue up yet)."""
    try:
        return _unfinished(prefix, topic)
    except Exception:       # noqa: BLE001 - no consumer group yet
        return -1


def _unfinished(prefix, topic):
    consumer = "c-" + topic
    if KIND == "kafka":
        # the group's lag: each partition's end less its committed offset
        from confluent_kafka import Consumer, TopicPartition
        c = Consumer(dict(dl.kafka_url(), **{"group.id": consumer, "enable.auto.commit": False}))
        try:
            name = prefix + topic
            tps = [TopicPartition(name, p) for p in c.list_topics(name, timeout=dl.WAIT).topics[name].partitions]
            n = 0
            for tp in c.committed(tps, timeout=dl.WAIT):
                low, high = c.get_watermark_offsets(tp, timeout=dl.WAIT)
                n += high - (tp.offset if tp.offset >= 0 else low)
            return n
        finally:
            c.close()
    if KIND == "redis":
        import redis
        r = redis.Redis.from_url(URL)
        n = 0
        for p in range(dl.PARTITIONS):
            stream = "%s%s.%d" % (prefix, topic, p)
            n += r.xpending(stream, consumer)["pending"]
            info = [g for g in r.xinfo_groups(stream) if g["name"] in (consumer, consumer.encode())]
            n += info[0].get("lag") or 0 if info else 0
        r.close()
        return n
    import pika
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    ch = conn.channel()
    n = 0
    for p in range(dl.PARTITIONS):
        n += ch.queue_declare("%s%s.%d" % (prefix, topic, p), durable=True, passive=True).method.message_count
    conn.close()
    return n


def fuzz(lang):
    topic = "%s.%s" % (RUN, lang)
    prefix = "%s-" % RUN
    with dl.db() as c:
        # dead at the first failure; a dead letter holds nothing back
        c.execute("SELECT public.idem_outbox_set_topic(%s::pg_catalog.text, 1, 'skip'::pg_catalog.text)", (topic,))
    if KIND == "kafka":
        from idem_pg.kafka import ensure_topic
        ensure_topic(dl.kafka_url(), prefix + topic, dl.PARTITIONS)
    if KIND == "rabbitmq":
        from idem_pg.relay import declare_rabbit_queue
        import pika
        conn = pika.BlockingConnection(pika.URLParameters(URL))
        for p in range(dl.PARTITIONS):
            declare_rabbit_queue(conn.channel(), "%s%s.%d" % (prefix, topic, p))
        conn.close()
        dl.declare_dead_queue(prefix, topic)
    consumer = dl.start_consumer(lang, topic, prefix)
    rnd = random.Random(7)
    good = [({"id": "%s-good-%s-%d" % (RUN, k, s), "key": k}, json.dumps({"key": k, "seq": s}))
            for s in range(1, GOOD_PER_KEY + 1) for k in GOOD_KEYS]
    bad = [malformed(n, rnd) for n in range(MALFORMED)]
    entries = []
    while good or bad:        # good entries keep their order; malformed ones fall between them
        if bad and (not good or rnd.random() < len(bad) / (len(bad) + len(good))):
            entries.append(bad.pop(0))
        else:
            entries.append(good.pop(0))
    inject(prefix, topic, entries)
    done = dl.wait_for("the entries", lambda: consumer.poll() is not None or (
        dead_count(prefix, topic) >= MALFORMED and unfinished(prefix, topic) == 0))
    with dl.db() as c:
        applied = {k: [r[0] for r in c.execute("SELECT seq FROM dl_effect WHERE topic = %s AND key = %s ORDER BY id",
                                               (topic, k))] for k in GOOD_KEYS}
    want = list(range(1, GOOD_PER_KEY + 1))
    check("%s: every good entry applied once, in its key's order (%d keys x %d)" % (lang, len(GOOD_KEYS), GOOD_PER_KEY),
          done and all(applied[k] == want for k in GOOD_KEYS),
          {k: v for k, v in applied.items() if v != want})
    dead = dead_count(prefix, topic)
    check("%s: every malformed entry is among the dead letters (%d)" % (lang, MALFORMED), dead == MALFORMED, dead)
    check("%s: the consumer is still running, and nothing is left unacknowledged" % lang,
          consumer.poll() is None and unfinished(prefix, topic) == 0,
          "exited %s, %d left" % (consumer.poll(), unfinished(prefix, topic)))
    stand_ins = dl.scalar("SELECT count(*) FROM idem_internal.idem_inbox_failure WHERE consumer = %s"
                          " AND (message_id LIKE 'sha256:%%' OR msg_key LIKE 'sha256:%%')", "c-" + topic)
    check("%s: ids and keys idem cannot store are recorded as sha256:<hex> stand-ins (%d)" % (lang, stand_ins),
          stand_ins > 0, stand_ins)
    consumer.terminate()
    try:
        consumer.wait(timeout=dl.WAIT)
    except subprocess.TimeoutExpired:
        consumer.kill()


def main():
    with dl.db() as c:
        c.execute("CREATE TABLE IF NOT EXISTS dl_effect (id bigserial PRIMARY KEY, topic text, key text, seq int,"
                  " message_id text)")
        c.execute("CREATE TABLE IF NOT EXISTS dl_poison_ok (topic text)")
    for lang in ["py"] + (["node"] if dl.NODE_APP else []):
        fuzz(lang)


if __name__ == "__main__":
    main()
