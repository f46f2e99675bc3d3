#!/usr/bin/python3
"""HTTP checks of an example service (examples/), by real requests.

  http_checks.py NAME URL OWNER_BASE                    the article's seven tests and the mapping
  http_checks.py NAME URL OWNER_BASE --variant          a read-only instance with IDEM_CONFLICT_STATUS=422
  http_checks.py NAME URL OWNER_BASE --redis PLAIN_URL REDIS_PORT
                                                        the fast layer under a Redis that stops,
                                                        restarts, is flushed and answers slowly

The database is reached through the libpq variables (PGHOST, PGPORT,
PGDATABASE).  Prints one "ok - ..." or "not ok - ..." line per check.
"""
import http.client
import json
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time
import urllib.parse

import psycopg

NAME, URL, OWNER_BASE = sys.argv[1], sys.argv[2], int(sys.argv[3])
HOST, PORT = urllib.parse.urlsplit(URL).hostname, urllib.parse.urlsplit(URL).port
RUN = os.environ.get("IDEM_RUN") or "%06d" % random.randrange(10 ** 6)
failures = 0


def check(what, ok, detail=""):
    global failures
    if ok:
        print("ok - %s: %s" % (NAME, what))
    else:
        failures += 1
        print("not ok - %s: %s (%s)" % (NAME, what, detail))
    sys.stdout.flush()


def key(tag):
    return ("%s-%s-%s" % (NAME, tag, RUN)).ljust(24, "0")


def post(path, body, idem_key=None, owner=None, raw=None, port=None):
    """One request; returns (status, headers, body text)."""
    conn = http.client.HTTPConnection(HOST, port or PORT, timeout=30)
    headers = {"Content-Type": "application/json"}
    if idem_key is not None:
        headers["Idempotency-Key"] = idem_key
    if owner is not None:
        headers["X-Owner-Id"] = str(owner)
    conn.request("POST", path, raw if raw is not None else json.dumps(body), headers)
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, text


def order(k, owner, sku=1001, qty=2, port=None):
    return post("/api/orders", {"skuId": sku, "quantity": qty}, k, owner, port=port)


def db():
    return psycopg.connect(autocommit=True)


def scalar(sql, *params):
    with db() as c:
        return c.execute(sql, params).fetchone()[0]


def plain_error(status, text):
    """An error body: one JSON object with one "error" string, no trace."""
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    return (isinstance(doc, dict) and list(doc) == ["error"] and isinstance(doc["error"], str)
            and "Traceback" not in text and "Exception" not in text and " at " not in doc["error"])


def article_tests():
    o = OWNER_BASE
    # 1. one key, the same request twice in a row: one effect
    k1 = key("t1")
    s1, h1, b1 = order(k1, o + 1)
    s2, h2, b2 = order(k1, o + 1)
    check("test 1: the same request twice gives one order",
          scalar("SELECT count(*) FROM purchase_order WHERE owner_id = %s", o + 1) == 1)
    check("test 1: 201 first, then 201 with Idempotent-Replayed: true",
          (s1, s2, "idempotent-replayed" in h1, h2.get("idempotent-replayed")) == (201, 201, False, "true"),
          "%s %s %s" % (s1, s2, h2))
    # 6. a replay returns the first status and body, byte for byte
    check("test 6: the replay's body is the first one's, byte for byte", b1 == b2, "%r / %r" % (b1, b2))
    check("test 6: the replay keeps the Location header", h1.get("location") == h2.get("location"))

    # 2. one key, 20 concurrent callers: one effect, the same answer for all
    k2 = key("t2")
    results = [None] * 20
    barrier = threading.Barrier(20)

    def caller(i):
        barrier.wait()
        try:
            results[i] = order(k2, o + 2, 1002, 1)
        except OSError as e:
            results[i] = (0, {}, repr(e))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check("test 2: 20 concurrent identical POSTs make one order",
          scalar("SELECT count(*) FROM purchase_order WHERE owner_id = %s", o + 2) == 1)
    check("test 2: 20 responses 201 with 20 identical bodies",
          {r[0] for r in results} == {201} and len({r[2] for r in results}) == 1,
          str({(r[0], r[2]) for r in results}))
    check("test 2: 19 of them with Idempotent-Replayed: true",
          sum(r[1].get("idempotent-replayed") == "true" for r in results) == 19,
          str(sum(r[1].get("idempotent-replayed") == "true" for r in results)))

    # 3. one key, a different request: 409 Conflict, nothing written
    s, h, b = order(k1, o + 1, 1001, 3)
    check("test 3: the key reused with a different request is 409", s == 409 and plain_error(s, b), "%s %s" % (s, b))
    check("test 3: and writes nothing", scalar("SELECT count(*) FROM purchase_order WHERE owner_id = %s", o + 1) == 1)

    # 4. the first attempt fails: the retry with the same key succeeds
    account = o + 4
    k4 = key("t4")
    s, h, b = post("/api/accounts/%d/debit" % account, {"amount": 30}, k4, o + 4)
    check("test 4: a failing first attempt answers 500 without a stack trace",
          s == 500 and plain_error(s, b) and json.loads(b)["error"] == "internal error", "%s %s" % (s, b))
    with db() as c:
        c.execute("INSERT INTO account VALUES (%s, 100)", (account,))
    s, h, b = post("/api/accounts/%d/debit" % account, {"amount": 30}, k4, o + 4)
    check("test 4: the retry with the same key debits (201)", s == 201 and "idempotent-replayed" not in h, "%s %s" % (s, b))
    s2, h2, b2 = post("/api/accounts/%d/debit" % account, {"amount": 30}, k4, o + 4)
    check("test 4: and a repeat replays it with its headers",
          (s2, b2, h2.get("location"), h2.get("idempotent-replayed")) == (201, b, h.get("location"), "true"),
          "%s %s %s" % (s2, b2, h2))
    check("test 4: one debit, the balance down by 30 once",
          scalar("SELECT count(*)::text || '/' || (SELECT balance FROM account WHERE id = %s)::int"
                 " FROM debit WHERE account_id = %s", account, account) == "1/70")
    # a deterministic failure is stored and replayed: status and body
    k6 = key("t6")
    s, h, b = post("/api/accounts/%d/debit" % account, {"amount": 500}, k6, o + 4)
    s2, h2, b2 = post("/api/accounts/%d/debit" % account, {"amount": 500}, k6, o + 4)
    check("test 6: a 422 (insufficient funds) is replayed with its body",
          (s, s2, b == b2, h2.get("idempotent-replayed")) == (422, 422, True, "true"), "%s %s %s %s" % (s, s2, b, b2))

    # 7. different owners with one key do not meet
    k7 = key("t7")
    s, h, b = order(k7, o + 7)
    s2, h2, b2 = order(k7, o + 8)
    check("test 7: two owners with one key get two orders",
          s == s2 == 201 and json.loads(b)["orderId"] != json.loads(b2)["orderId"]
          and "idempotent-replayed" not in h2, "%s %s" % (b, b2))

    # the mapping of bad input: 400, nothing written
    before = scalar("SELECT count(*) FROM purchase_order WHERE owner_id = %s", o + 9)
    answers = [
        order(None, o + 9),                                   # no key
        order("short", o + 9),                                # malformed key
        order("bad key with spaces 0000", o + 9),             # malformed key
        post("/api/orders", None, key("t8"), o + 9, raw="{not json"),
        post("/api/orders", {"skuId": "x", "quantity": 1}, key("t8"), o + 9),
        post("/api/orders", {"skuId": 1, "quantity": 1}, key("t8"), None),  # no owner
        order(key("t9"), o + 9, 1001, 0),                     # quantity out of range (22023)
    ]
    check("a missing or malformed key, body or owner is 400 with a plain error",
          all(a[0] == 400 and plain_error(*a[:1], a[2]) for a in answers), str([(a[0], a[2]) for a in answers]))
    check("and nothing is written for them",
          scalar("SELECT count(*) FROM purchase_order WHERE owner_id = %s", o + 9) == before)

    # an original in flight (held by another transaction): 409 with Retry-After
    k10 = key("t10")
    with db() as holder:
        holder.autocommit = False
        holder.execute("SELECT idem_create_order(%s, %s, 1001, 2)", (o + 10, k10))
        t0 = time.monotonic()
        s, h, b = order(k10, o + 10)
        waited = time.monotonic() - t0
        holder.rollback()
    check("an original in flight past idem.wait_timeout is 409 with Retry-After: 1",
          s == 409 and h.get("retry-after") == "1" and plain_error(s, b), "%s %s %s" % (s, h, b))
    check("after waiting idem.wait_timeout (1 s here)", 0.8 < waited < 10, "%.2f s" % waited)
    s, h, b = order(k10, o + 10)
    check("the retry after the original rolled back executes (201)", s == 201 and "idempotent-replayed" not in h)


def variant_tests():
    """An instance with IDEM_CONFLICT_STATUS=422 on a read-only database session."""
    o = OWNER_BASE
    k1 = key("t1")
    s, h, b = order(k1, o + 1, 1001, 2)
    check("read-only: a replay still answers (201, replayed)", s == 201 and h.get("idempotent-replayed") == "true",
          "%s %s" % (s, b))
    s, h, b = order(k1, o + 1, 1001, 3)
    check("IDEM_CONFLICT_STATUS=422: a reused key is 422", s == 422 and plain_error(s, b), "%s %s" % (s, b))
    s, h, b = order(key("ro"), o + 11)
    check("a new key on a read-only database is 503 with Retry-After",
          s == 503 and "retry-after" in h and plain_error(s, b), "%s %s %s" % (s, h, b))


def final_answer(k, owner, sku, qty, port=None):
    """Send until the answer is final: a 409 with Retry-After means
    "processing", and the client comes back."""
    for _ in range(400):
        s, h, b = order(k, owner, sku, qty, port=port)
        if s == 409 and "retry-after" in h:
            time.sleep(0.02)
            continue
        return s, h, b
    return s, h, b


def duplicate_heavy_run(owner, port, keys, chaos=None):
    """20 clients each send every key twice, in their own random order."""
    answers = {}
    lock = threading.Lock()
    hits = [0]

    def client(c):
        rng = random.Random(c)
        work = [i for i in range(keys)] * 2
        rng.shuffle(work)
        for i in work:
            try:
                s, h, b = final_answer("redis-%s-%04d" % (RUN, i), owner, 2000 + i, 1 + i % 3, port)
            except OSError as e:
                s, h, b = 0, {}, repr(e)
            with lock:
                answers.setdefault(i, []).append((s, b))
                hits[0] += h.get("x-idem-cache") == "hit"

    threads = [threading.Thread(target=client, args=(c,)) for c in range(20)]
    for t in threads:
        t.start()
    if chaos:
        chaos()
    for t in threads:
        t.join()
    return answers, hits[0]


def orders_of(owner):
    with db() as c:
        rows = c.execute("SELECT o.id, o.sku_id, o.quantity FROM purchase_order o WHERE o.owner_id = %s",
                         (owner,)).fetchall()
    return rows


def hammer(port, k, owner, seconds, out):
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    body = json.dumps({"skuId": 3000, "quantity": 1})
    headers = {"Content-Type": "application/json", "Idempotency-Key": k, "X-Owner-Id": str(owner)}
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn.request("POST", "/api/orders", body, headers)
        r = conn.getresponse()
        r.read()
        n += r.status == 201
    out.put(n)


def replays_per_second(port, owner, seconds=3, procs=4):
    k = "hot-%s-%d".ljust(24, "0") % (RUN, port)
    order(k, owner, 3000, 1, port=port)
    q = multiprocessing.Queue()
    ps = [multiprocessing.Process(target=hammer, args=(port, k, owner, seconds, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    total = sum(q.get() for _ in ps)
    for p in ps:
        p.join()
    return total / seconds


def redis_tests(plain_url, redis_port):
    plain_port = urllib.parse.urlsplit(plain_url).port
    keys = 60

    def cli(*args):
        return subprocess.run(["redis-cli", "-p", str(redis_port)] + list(args),
                              capture_output=True, text=True, timeout=10)

    events = []

    def chaos():
        time.sleep(0.4)
        cli("shutdown", "nosave")
        events.append("stopped")
        time.sleep(0.6)
        subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no", "--daemonize", "yes"],
                         stdout=subprocess.DEVNULL)
        events.append("restarted")
        time.sleep(0.4)
        cli("flushall")
        events.append("flushed")
        time.sleep(0.3)
        cli("client", "pause", "700")
        events.append("paused 700 ms")

    # the same workload without Redis (another owner), then with it
    plain, _ = duplicate_heavy_run(OWNER_BASE + 1, plain_port, keys)
    fast, hits = duplicate_heavy_run(OWNER_BASE + 2, PORT, keys, chaos)
    print("# fast layer: Redis %s during the run; %d answers from the cache" % (", ".join(events), hits))

    def consistent(answers, owner):
        rows = {sku - 2000: (oid, qty) for oid, sku, qty in orders_of(owner)}
        bad = []
        for i in range(keys):
            finals = {a for a in answers[i]}
            if len(finals) != 1:
                bad.append((i, "answers differ", finals))
                continue
            s, b = finals.pop()
            doc = json.loads(b)
            if s != 201 or i not in rows or doc.get("orderId") != rows[i][0] or rows[i][1] != 1 + i % 3:
                bad.append((i, s, b))
        return len(rows) == keys and not bad, bad

    ok_plain, bad_plain = consistent(plain, OWNER_BASE + 1)
    ok_fast, bad_fast = consistent(fast, OWNER_BASE + 2)
    check("without Redis: one order per key, every caller of a key the same answer (201, its order)",
          ok_plain, str(bad_plain[:3]))
    check("with Redis stopped, restarted, flushed and paused mid-run: the same",
          ok_fast, str(bad_fast[:3]))
    check("the orders are the same in both runs (one per key, same sku and quantity)",
          sorted((s, q) for _, s, q in orders_of(OWNER_BASE + 1)) == sorted((s, q) for _, s, q in orders_of(OWNER_BASE + 2)))
    check("the fast layer did answer from the cache", hits > 0, str(hits))
    # an in-flight key: a duplicate is told "processing" at once by the fast
    # layer, while the original waits for the database
    k = key("flight")
    with db() as holder:
        holder.autocommit = False
        holder.execute("SELECT idem_create_order(%s, %s, 1001, 2)", (OWNER_BASE + 6, k))
        first = []
        t = threading.Thread(target=lambda: first.append(order(k, OWNER_BASE + 6)))
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        s, h, b = order(k, OWNER_BASE + 6)
        quick = time.monotonic() - t0
        t.join()
        holder.rollback()
    check("an in-flight duplicate is answered 409 Retry-After by the fast layer, at once",
          (s, h.get("retry-after"), h.get("x-idem-cache")) == (409, "1", "in-flight") and quick < 0.3,
          "%s %s %.3f s" % (s, h, quick))
    check("while the original waited for the database (IK002 after idem.wait_timeout)",
          first and first[0][0] == 409 and "x-idem-cache" not in first[0][1], str(first))
    s, h, b = order(k, OWNER_BASE + 6)
    check("and the retry, the original gone, executes", s == 201, "%s %s" % (s, b))
    # a cached key with another request: the database decides (IK001 -> 409)
    s, h, b = order("redis-%s-%04d" % (RUN, 0), OWNER_BASE + 2, 9999, 1)
    check("a cached key sent with a different request goes to the database: 409", s == 409 and plain_error(s, b),
          "%s %s" % (s, b))
    # the article's test 5: the fast layer unavailable, the database decides
    cli("shutdown", "nosave")
    s, h, b = order("redis-%s-%04d" % (RUN, 1), OWNER_BASE + 2, 2001, 2)
    s2, h2, b2 = order(key("t5"), OWNER_BASE + 3)
    check("test 5: with Redis down, a repeat replays and a new key executes (from the database)",
          (s, h.get("idempotent-replayed"), "x-idem-cache" in h, s2) == (201, "true", False, 201),
          "%s %s / %s" % (s, h, s2))
    subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                      "--save", "", "--appendonly", "no", "--daemonize", "yes"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    with_redis = replays_per_second(PORT, OWNER_BASE + 4)
    without = replays_per_second(plain_port, OWNER_BASE + 5)
    print("# hot-key replays, 4 client processes for 3 s: %.0f/s with Redis, %.0f/s without (%.2f x)"
          % (with_redis, without, with_redis / max(without, 1)))


if __name__ == "__main__":
    mode = sys.argv[4] if len(sys.argv) > 4 else ""
    if mode == "--variant":
        variant_tests()
    elif mode == "--redis":
        redis_tests(sys.argv[5], int(sys.argv[6]))
    else:
        article_tests()
    sys.exit(1 if failures else 0)
