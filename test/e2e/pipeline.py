#!/usr/bin/python3
"""One process of the outbox -> broker -> inbox pipeline that
test/e2e/outbox_inbox.sh runs and kills (kill -9) at random points.

  producer P N   N idempotent requests through idem_run, keys drawn with
                 duplicates; each new request debits an account, records an
                 order and emits one message keyed by its account
  publisher      leases outbox messages, appends them to the broker log (a
                 table standing in for Kafka), then acknowledges them
  consumer P     reads partition P of the broker log after its committed
                 offset; for each entry, in one transaction, idem_consume and
                 the effect; commits its offset afterwards

Every step commits on its own, so a kill between two of them leaves work
to be redone: a message pushed but not acknowledged is pushed again, an
entry consumed but not past the offset is delivered again.  idem_consume
makes the effect happen once; per-key order is checked by the effect.

With E2E_CRASH_DIR set, the first publisher and the first consumer to reach
that window exit there (os._exit, as a kill -9 would leave it) once each, so
that a pushed message is pushed again and a consumed entry delivered again
whatever the random kills hit.
"""
import os
import random
import sys
import time

import psycopg

TOPIC = "e2e"
ACCOUNTS = 50
PARTITIONS = 2


def connect():
    return psycopg.connect(dbname=os.environ.get("E2E_DB", "idem_e2e"), autocommit=True)


def crash_once(kind):
    """Exit here the first time any process of this kind gets here (E2E_CRASH_DIR)."""
    folder = os.environ.get("E2E_CRASH_DIR")
    if not folder:
        return
    try:
        os.close(os.open(os.path.join(folder, "crashed-" + kind), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os._exit(3)


def request_of(j):
    """The request of logical key j: the same body whoever sends it."""
    return {"account": j % ACCOUNTS, "amount": j % 7 + 1, "j": j}


def producer(p, n, nproducers):
    rng = random.Random(1000 + p)
    conn = connect()
    issued = []
    for i in range(n):
        if issued and rng.random() < 0.3:
            # a retry of one of ours, or of a key another producer may be sending now
            j = rng.choice(issued) if rng.random() < 0.7 else rng.randrange(max(issued) + nproducers)
        else:
            j = i * nproducers + p
            issued.append(j)
        key = "e2e-key-%012d" % j
        for attempt in range(50):
            try:
                conn.execute(
                    "SELECT replayed FROM idem_run(1, 'E2E_ORDER', %s, %s::jsonb, 'e2e_handler(jsonb)')",
                    (key, psycopg.types.json.Jsonb(request_of(j))))
                break
            except psycopg.Error as e:
                if e.sqlstate != "IK002":  # still in flight elsewhere: retry
                    raise
                time.sleep(0.01 * (attempt + 1))
        else:
            sys.exit("producer %d: key %s stayed in flight" % (p, key))


def publisher():
    conn = connect()
    while True:
        rows = conn.execute(
            "SELECT message_id, msg_key, payload FROM idem_outbox_fetch(%s, 50, '2 seconds')",
            (TOPIC,)).fetchall()
        if not rows:
            time.sleep(0.02)
            continue
        with conn.transaction():
            # one writer at a time: offsets commit in their order
            conn.execute("LOCK TABLE e2e_broker IN EXCLUSIVE MODE")
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO e2e_broker (partition, message_id, msg_key, payload)"
                    " VALUES (%s, %s, %s, %s)",
                    [((payload["account"] % PARTITIONS), mid, key, psycopg.types.json.Jsonb(payload))
                     for mid, key, payload in rows])
        # a kill here: pushed, not acknowledged -> pushed again after the lease
        crash_once("publisher")
        time.sleep(random.random() * 0.1)
        conn.execute("SELECT idem_outbox_ack(%s)", ([r[0] for r in rows],))


def consumer(part):
    conn = connect()
    while True:
        offset = conn.execute(
            "SELECT committed FROM e2e_offsets WHERE partition = %s", (part,)).fetchone()[0]
        entries = conn.execute(
            "SELECT log_offset, message_id, payload FROM e2e_broker"
            " WHERE partition = %s AND log_offset > %s ORDER BY log_offset LIMIT 50",
            (part, offset)).fetchall()
        if not entries:
            time.sleep(0.02)
            continue
        for log_offset, message_id, payload in entries:
            with conn.transaction():
                first = conn.execute("SELECT idem_consume('e2e-consumer', %s)",
                                     (str(message_id),)).fetchone()[0]
                if first:
                    conn.execute(
                        "INSERT INTO e2e_effect (message_id, account, seq) VALUES (%s, %s, %s)",
                        (message_id, payload["account"], payload["seq"]))
                    cur = conn.execute(
                        "UPDATE e2e_state SET last_seq = %s WHERE account = %s AND last_seq = %s",
                        (payload["seq"], payload["account"], payload["seq"] - 1))
                    if cur.rowcount != 1:
                        conn.execute(
                            "INSERT INTO e2e_violation (message_id, account, seq) VALUES (%s, %s, %s)",
                            (message_id, payload["account"], payload["seq"]))
            if not first:
                conn.execute("UPDATE e2e_offsets SET redeliveries = redeliveries + 1"
                             " WHERE partition = %s", (part,))
            # a kill here: consumed, offset not committed -> delivered again
            crash_once("consumer")
            if random.random() < 0.2:
                conn.execute("UPDATE e2e_offsets SET committed = %s WHERE partition = %s",
                             (log_offset, part))
        conn.execute("UPDATE e2e_offsets SET committed = %s WHERE partition = %s",
                     (entries[-1][0], part))


def main():
    role = sys.argv[1]
    if role == "producer":
        producer(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    elif role == "publisher":
        publisher()
    elif role == "consumer":
        consumer(int(sys.argv[2]))
    else:
        sys.exit("unknown role " + role)


if __name__ == "__main__":
    main()
