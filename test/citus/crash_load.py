"""A worker node stopped mid-load (test/citus/run.sh starts this, then
stops worker 1 with -m immediate and starts it again).

8 threads call idem_create_order through the coordinator for 10 s, each on
random keys of 400 (owners 1-12, on both workers), reconnecting after any
error.  Then every key, and 50 the load never sent, is called once more
until it answers.  Prints one
"ok - ..." or "not ok - ..." line per check: every key answered, every
answer a key ever got is the same order, each key has exactly one order, and
calls failed during the stop (so the stop was mid-load).

    python3 crash_load.py COORDINATOR_PORT TAG
"""
import random
import sys
import threading
import time

import psycopg

port, tag = int(sys.argv[1]), sys.argv[2]
conninfo = f"host=127.0.0.1 port={port} user=postgres dbname=idem connect_timeout=5"
keys = [(1 + i % 12, f"citus-crash-{tag}-{i:05d}") for i in range(400)]
# keys the load never sends: they execute afterwards
fresh = [(1 + i % 12, f"citus-crash-{tag}-{i:05d}") for i in range(400, 450)]
answers = {}
lock = threading.Lock()
errors = 0
calls = 0
stop_at = time.monotonic() + 10

CALL = "SELECT order_id, replayed FROM idem_create_order(%s, %s, 42, 1)"


def record(key, order_id):
    with lock:
        answers.setdefault(key, set()).add(order_id)


def load(seed):
    global errors, calls
    rnd = random.Random(seed)
    conn = None
    while time.monotonic() < stop_at:
        owner, key = rnd.choice(keys)
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(conninfo, autocommit=True)
            order_id, _ = conn.execute(CALL, (owner, key)).fetchone()
            record(key, order_id)
            with lock:
                calls += 1
        except psycopg.Error:
            with lock:
                errors += 1
            if conn is not None:
                conn.close()
            conn = None
            time.sleep(0.05)
    if conn is not None:
        conn.close()


threads = [threading.Thread(target=load, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()

# afterwards: every key once more, until it answers
final = {}
deadline = time.monotonic() + 60
conn = psycopg.connect(conninfo, autocommit=True)
replayed_after = executed_after = 0
for owner, key in keys + fresh:
    while time.monotonic() < deadline:
        try:
            order_id, replayed = conn.execute(CALL, (owner, key)).fetchone()
            final[key] = order_id
            record(key, order_id)
            if replayed:
                replayed_after += 1
            else:
                executed_after += 1
            break
        except psycopg.Error:
            conn.close()
            time.sleep(0.2)
            conn = psycopg.connect(conninfo, autocommit=True)

orders = dict(conn.execute(
    "SELECT r.idempotency_key, count(o.id) FROM idem_internal.idempotency_record r"
    " LEFT JOIN idem_internal.purchase_order o ON o.owner_id = r.owner_id AND o.id = r.resource_id"
    " WHERE r.idempotency_key LIKE %s GROUP BY 1", (f"citus-crash-{tag}-%",)).fetchall())
per_owner = conn.execute(
    "SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id BETWEEN 1 AND 12 AND sku_id = 42").fetchone()[0]
conn.close()


def check(name, expected, actual):
    if expected == actual:
        print(f"ok - {name}")
    else:
        print(f"not ok - {name} (expected {expected}, got {actual})")


print(f"# {calls} calls answered during the load, {errors} failed while worker 1 was down; "
      f"afterwards {replayed_after} keys replayed, {executed_after} executed")
check("worker stop mid-load: calls failed while the worker was down, and the load went on", True,
      errors > 0 and calls > 0)
check("worker stop mid-load: afterwards every key answers (replays or executes)", len(keys) + len(fresh), len(final))
check("worker stop mid-load: afterwards the keys never sent execute, the others replay", (400, 50),
      (replayed_after, executed_after))
check("worker stop mid-load: every answer a key ever got is the same order (none executed twice)",
      0, sum(1 for ids in answers.values() if len(ids) != 1))
check("worker stop mid-load: each key has exactly one order, the one its record points to",
      len(keys) + len(fresh), sum(1 for k, n in orders.items() if n == 1))
check("worker stop mid-load: no order beyond one per key", len(keys) + len(fresh), per_owner)
