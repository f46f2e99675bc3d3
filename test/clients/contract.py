#!/usr/bin/python3
"""The HTTP contract (clients/CONTRACT.md) checked over real HTTP against an
example service built on a client library (examples/).

  contract.py NAME URL OWNER_BASE                   the article's tests, the mapping, the headers
  contract.py NAME URL OWNER_BASE --variant         an instance with IDEM_CONFLICT_STATUS=422 on a read-only session
  contract.py NAME URL OWNER_BASE --fast PLAIN_URL REDIS_PORT
                                                    the fast layer under a Redis that stops, restarts, is
                                                    flushed and pauses; hot-key replays with and without it
  contract.py NAME URL OWNER_BASE --quick           the article's tests and 20 concurrent requests only

The database is reached through the libpq variables.  Prints one "ok - ..."
or "not ok - ..." line per check.
"""
import datetime
import email.utils
import hashlib
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
PROBLEM_FIELDS = {"type", "title", "status", "detail"}
# the errors URL the variant instance is started with (IDEM_ERRORS_URL)
ERRORS_URL = "https://docs.example.org/idem/http-errors" if "--variant" in sys.argv else None
# how long a wait for progress may take (test/lib.sh's IDEM_WAIT)
WAIT = float(os.environ.get("IDEM_WAIT") or os.environ.get("PG_TEST_TIMEOUT_DEFAULT") or 180)
failures = 0


def check(what, ok, detail=""):
    global failures
    if ok:
        print("ok - %s: %s" % (NAME, what))
    else:
        failures += 1
        print("not ok - %s: %s (%s)" % (NAME, what, str(detail or last_answer[0])[:600]))
    sys.stdout.flush()


def key(tag):
    return ("%s-%s-%s" % (NAME, tag, RUN)).replace("_", "-").ljust(24, "0")


def post(path, body, idem_key=None, owner=None, raw=None, port=None, headers=None):
    """One request; returns (status, headers as a dict of lists, body text)."""
    conn = http.client.HTTPConnection(HOST, port or PORT, timeout=30)
    h = {"Content-Type": "application/json"}
    if idem_key is not None:
        h["Idempotency-Key"] = idem_key
    if owner is not None:
        h["X-Owner-Id"] = str(owner)
    h.update(headers or {})
    try:
        conn.request("POST", path, raw if raw is not None else json.dumps(body), h)
    except (BrokenPipeError, ConnectionResetError):
        # the server answered (a 413 for a body over its limit) and closed
        # before the client had sent it all: its answer is still to be read
        pass
    r = conn.getresponse()
    text = r.read().decode("utf-8", "replace")
    out = {}
    for k, v in r.getheaders():
        out.setdefault(k.lower(), []).append(v)
    conn.close()
    return r.status, out, text


def raw_post(path, header_lines, body=b"{}"):
    """A request sent byte for byte (http.client refuses a header with a
    control character): (status, headers as a dict of lists, body text)."""
    import socket
    req = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
           % (HOST.encode(), PORT) + b"".join(h + b"\r\n" for h in header_lines)
           + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    with socket.create_connection((HOST, PORT), timeout=30) as sock:
        sock.sendall(req)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    if "chunked" in headers.get("transfer-encoding", [""])[0]:
        out, buf = b"", rest
        while buf:
            size, _, buf = buf.partition(b"\r\n")
            n = int(size or b"0", 16)
            if n == 0:
                break
            out, buf = out + buf[:n], buf[n + 2:]
        rest = out
    return status, headers, rest.decode("utf-8", "replace")


def one(headers, name):
    values = headers.get(name, [])
    return values[0] if len(values) == 1 else (None if not values else values)


def order(k, owner, sku=1001, qty=2, port=None):
    return post("/api/orders", {"skuId": sku, "quantity": qty}, k, owner, port=port)


def debit(account, amount, k, owner):
    return post("/api/accounts/%d/debit" % account, {"amount": amount}, k, owner)


def scalar(sql, *params):
    with psycopg.connect(autocommit=True) as c:
        return c.execute(sql, params).fetchone()[0]


def orders_of(owner):
    return scalar("SELECT count(*) FROM shop_order WHERE owner_id = %s", owner)


last_answer = [None]


def problem(answer, status, slug, middleware=True):
    """An RFC 9457 problem: its content type, its fields, its type URI,
    the Link to the error's documentation, nothing internal; from the
    middleware (not a server's parser), Idempotent-Replayed: false."""
    last_answer[0] = answer
    s, h, b = answer
    if middleware and one(h, "idempotent-replayed") != "false":
        return False
    try:
        doc = json.loads(b)
    except ValueError:
        return False
    link = one(h, "link")
    # a Link only where the service names its documentation: the absolute
    # URL it was given (the variant instance), never a page it does not serve
    link_ok = (link is None if not ERRORS_URL else
               link == '<%s#%s>; rel="describedby"' % (ERRORS_URL, slug))
    return (s == status and one(h, "content-type") == "application/problem+json"
            and isinstance(doc, dict) and set(doc) == PROBLEM_FIELDS and doc["status"] == status
            and doc["type"] == "urn:idem:error:" + slug and isinstance(doc["title"], str)
            and isinstance(doc["detail"], str) and link_ok
            and not any(w in b for w in ("Traceback", "Exception", "ERROR:", "psycopg", "at org.", "node_modules",
                                         "idempotency_record", "SQLSTATE", "escape sequence", "invalid input syntax",
                                         "JSON data", "Token ")))


def expires_ok(h, seconds=86400, slack=120):
    value = one(h, "idempotency-expires")
    if not isinstance(value, str):
        return False
    at = email.utils.parsedate_to_datetime(value)
    delta = (at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    return value.endswith(" GMT") and seconds - slack < delta <= seconds + 1


def at_once(n, request):
    """n threads send request() at the same moment; their answers (a
    connection error as status 0)."""
    results = [None] * n
    barrier = threading.Barrier(n)

    def caller(i):
        barrier.wait()
        try:
            results[i] = request()
        except OSError as e:
            results[i] = (0, {}, repr(e))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def article_tests():
    o = OWNER_BASE
    # 1. one key, the same request twice in a row: one effect
    k1 = key("t1")
    first = order(k1, o + 1)
    again = order(k1, o + 1)
    s1, h1, b1 = first
    s2, h2, b2 = again
    check("test 1: the same request twice gives one order", orders_of(o + 1) == 1, orders_of(o + 1))
    check("test 1: 201 with Idempotent-Replayed: false, then 201 with Idempotent-Replayed: true",
          (s1, one(h1, "idempotent-replayed"), s2, one(h2, "idempotent-replayed")) == (201, "false", 201, "true"),
          (s1, h1, s2, h2))
    # 6. a replay returns the first status and body, byte for byte, and the stored headers
    check("test 6: the replay's body is the first one's, byte for byte", b1 == b2, "%r / %r" % (b1, b2))
    check("the replay has the stored headers (Location, Content-Type)",
          one(h1, "location") is not None and one(h1, "location") == one(h2, "location")
          and one(h1, "content-type") == one(h2, "content-type"), (h1, h2))
    check("Set-Cookie is sent the first time and not replayed",
          "set-cookie" in h1 and "set-cookie" not in h2, (h1.get("set-cookie"), h2.get("set-cookie")))
    check("Idempotency-Expires: an HTTP-date a day ahead (idem.ttl), the same on the replay",
          expires_ok(h1) and one(h1, "idempotency-expires") == one(h2, "idempotency-expires"),
          (h1.get("idempotency-expires"), h2.get("idempotency-expires")))
    check("one Date and one Content-Length on the replay, its own",
          len(h2.get("date", [])) <= 1 and one(h2, "content-length") == str(len(b2.encode())), h2)
    # the order route fingerprints skuId and quantity only: another field does not make another request
    s4, h4, b4 = post("/api/orders", {"skuId": 1001, "quantity": 2, "note": "leave at the door"}, k1, o + 1)
    check("a field the route does not fingerprint (note) leaves the request the same: a replay",
          (s4, b4, one(h4, "idempotent-replayed")) == (201, b1, "true"), (s4, b4, h4))
    # the quoted sf-string form and the bare form are the same key
    s3, h3, b3 = order('"%s"' % k1, o + 1)
    check("the key as an RFC 8941 sf-string (quoted) is the same key as the bare form",
          (s3, b3, one(h3, "idempotent-replayed")) == (201, b1, "true"), (s3, b3, h3))
    kq = key("quoted")
    s4, h4, b4 = order('"%s"' % kq, o + 3)
    s5, h5, b5 = order(kq, o + 3)
    check("a first request with a quoted key replays to the bare form",
          (s4, s5, b4 == b5, one(h5, "idempotent-replayed")) == (201, 201, True, "true"), (s4, s5, b4, b5))

    # 2. one key, 20 concurrent callers: one effect, the same answer for all
    k2 = key("t2")
    results = at_once(20, lambda: order(k2, o + 2, 1002, 1))
    check("test 2: 20 concurrent identical POSTs make one order", orders_of(o + 2) == 1, orders_of(o + 2))
    check("test 2: 20 responses 201 with 20 identical bodies",
          {r[0] for r in results} == {201} and len({r[2] for r in results}) == 1,
          str({(r[0], r[2]) for r in results}))
    check("test 2: one Idempotent-Replayed: false, 19 true",
          sorted(str(one(r[1], "idempotent-replayed")) for r in results) == ["false"] + ["true"] * 19,
          [one(r[1], "idempotent-replayed") for r in results])

    # 3. one key, a different request: 409 Conflict, nothing written
    answer = order(k1, o + 1, 1001, 3)
    check("test 3: the key reused with a different request is 409 key-reused (problem+json)",
          problem(answer, 409, "key-reused"), answer)
    check("test 3: and writes nothing", orders_of(o + 1) == 1, orders_of(o + 1))

    # 4. the first attempt fails: the retry with the same key succeeds
    account = o + 4
    k4 = key("t4")
    answer = debit(account, 30, k4, o + 4)
    check("test 4: a failing first attempt (no such account yet) is 500 internal, nothing internal in it",
          problem(answer, 500, "internal"), answer)
    with psycopg.connect(autocommit=True) as c:
        c.execute("INSERT INTO account VALUES (%s, 100)", (account,))
    s, h, b = debit(account, 30, k4, o + 4)
    check("test 4: the retry with the same key debits (201, not replayed)",
          (s, one(h, "idempotent-replayed")) == (201, "false"), (s, b))
    s2, h2, b2 = debit(account, 30, k4, o + 4)
    check("test 4: and a repeat replays it with its Location",
          (s2, b2, one(h2, "location"), one(h2, "idempotent-replayed")) == (201, b, one(h, "location"), "true"),
          (s2, b2, h2))
    check("test 4: one debit, the balance down by 30 once",
          scalar("SELECT count(*)::text || '/' || (SELECT balance FROM account WHERE id = %s)::int"
                 " FROM debit WHERE account_id = %s", account, account) == "1/70")
    check("the route's request includes the path: the same key and body on another account is 409",
          problem(debit(account + 1, 30, k4, o + 4), 409, "key-reused"))
    # a deterministic failure is stored and replayed: status and body; it expires after idem.failure_ttl
    k6 = key("t6")
    s, h, b = debit(account, 500, k6, o + 4)
    s2, h2, b2 = debit(account, 500, k6, o + 4)
    check("test 6: a 422 (insufficient funds) is replayed with its body",
          (s, s2, b == b2, one(h, "idempotent-replayed"), one(h2, "idempotent-replayed"))
          == (422, 422, True, "false", "true"), (s, s2, b, b2))
    check("a 4xx's Idempotency-Expires is idem.failure_ttl (10 minutes) ahead, on the first answer and the replay",
          expires_ok(h, 600) and one(h, "idempotency-expires") == one(h2, "idempotency-expires"),
          (h.get("idempotency-expires"), h2.get("idempotency-expires")))

    # 7. different owners with one key do not meet
    k7 = key("t7")
    s, h, b = order(k7, o + 7)
    s2, h2, b2 = order(k7, o + 8)
    check("test 7: two owners with one key get two orders",
          s == s2 == 201 and json.loads(b)["orderId"] != json.loads(b2)["orderId"]
          and one(h2, "idempotent-replayed") == "false", (b, b2))


def mapping_tests():
    o = OWNER_BASE
    before = orders_of(o + 9)
    cases = [
        ("no key: 400 key-missing", order(None, o + 9), 400, "key-missing"),
        ("a key too short: 400 key-malformed", order("short", o + 9), 400, "key-malformed"),
        ("a key with spaces: 400 key-malformed", order("bad key with spaces 0000", o + 9), 400, "key-malformed"),
        ("a quoted key left open: 400 key-malformed", order('"%s' % key("open"), o + 9), 400, "key-malformed"),
        ("a body that is not JSON: 400 body-not-json",
         post("/api/orders", None, key("t8"), o + 9, raw="{not json"), 400, "body-not-json"),
        # JSON that PostgreSQL or canonical JSON refuses, or would read as
        # another request: 400 invalid-request in every stack (1.13)
        ("a number beyond an IEEE 754 double (1e400): 400 invalid-request",
         post("/api/orders", None, key("t8"), o + 9, raw='{"skuId": 1e400, "quantity": 1}'), 400, "invalid-request"),
        ("a body with a byte order mark: 400 invalid-request",
         post("/api/orders", None, key("t8"), o + 9, raw=b'\xef\xbb\xbf{"skuId": 1, "quantity": 1}'), 400,
         "invalid-request"),
        ("a body that is not UTF-8: 400 invalid-request",
         post("/api/orders", None, key("t8"), o + 9, raw=b'{"skuId": 1, "quantity": 1, "note": "\xff\xfe"}'), 400,
         "invalid-request"),
        ("a \\u0000 in the body: 400 invalid-request",
         post("/api/orders", None, key("t8"), o + 9, raw='{"skuId": 1, "quantity": 1, "note": "a\\u0000b"}'), 400,
         "invalid-request"),
        ("no owner: 401 no-owner", post("/api/orders", {"skuId": 1, "quantity": 1}, key("t8"), None), 401, "no-owner"),
        ("a body over 1 MiB: 413 body-too-large",
         post("/api/orders", None, key("t8"), o + 9, raw='{"pad": "%s"}' % ("x" * (1024 * 1024 + 16))),
         413, "body-too-large"),
        ("an owner the service's role may not act for (idem.allowed_owners): 403 forbidden",
         order(key("t8"), 5000000), 403, "forbidden"),
    ]
    for what, answer, status, slug in cases:
        check(what, problem(answer, status, slug), answer)
    # a key with a control character: refused by some servers' HTTP parsers
    # before the middleware runs, by the middleware in others; problem+json
    # either way, and nothing of the header echoed (1.13)
    ctl_key = ("%s-ctl-\x01-%s" % (NAME, RUN)).encode()
    ctl = raw_post("/api/orders", [b"Idempotency-Key: " + ctl_key, b"X-Owner-Id: %d" % (o + 9)],
                   b'{"skuId": 1, "quantity": 1}')
    check("a key with a control character: 400 problem+json (key-malformed, or invalid-request from the server's parser), nothing echoed",
          (problem(ctl, 400, "key-malformed") or problem(ctl, 400, "invalid-request", middleware=False))
          and ("-ctl-" not in ctl[2]), ctl)
    check("none of them wrote anything (no order, no record)",
          orders_of(o + 9) == before and scalar("SELECT count(*) FROM idem_internal.idempotency_record WHERE idempotency_key = %s",
                                                key("t8")) == 0)
    # the handler's own 4xx is stored and replayed
    s, h, b = order(key("t9"), o + 9, 1001, 0)
    s2, h2, b2 = order(key("t9"), o + 9, 1001, 0)
    check("the handler's 400 (quantity 0) is stored and replayed, no order",
          (s, s2, b == b2, one(h2, "idempotent-replayed"), orders_of(o + 9)) == (400, 400, True, "true", before),
          (s, s2, b, b2))
    # an original in flight (held by another transaction): 409 with Retry-After
    k10 = key("t10")
    with psycopg.connect() as holder:
        holder.execute("SELECT public.idem_begin(%s::pg_catalog.int8, 'CREATE_ORDER'::pg_catalog.text, %s::pg_catalog.text,"
                       " '{\"skuId\": 1001, \"quantity\": 2}'::pg_catalog.jsonb)",
                       (o + 10, k10))
        t0 = time.monotonic()
        answer = order(k10, o + 10)
        waited = time.monotonic() - t0
        holder.rollback()
    check("an original in flight past idem.wait_timeout is 409 in-flight with Retry-After: 1",
          problem(answer, 409, "in-flight") and one(answer[1], "retry-after") == "1", answer)
    check("after waiting idem.wait_timeout (1 s here)", 0.8 < waited < 10, "%.2f s" % waited)
    s, h, b = order(k10, o + 10)
    check("the retry after the original rolled back executes (201)", (s, one(h, "idempotent-replayed")) == (201, "false"))
    # a key whose record expired, of an operation that refuses reuse
    # (reuse_after_expiry 'refuse', 1.11): 422 key-expired, not a second order
    k11 = key("t11")
    scalar("SELECT operation FROM public.idem_set_policy('CREATE_ORDER'::pg_catalog.text,"
           " audit_ttl => '30 days'::pg_catalog.interval, reuse_after_expiry => 'refuse'::pg_catalog.text)")
    try:
        s, h, b = order(k11, o + 11)
        scalar("UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 minute' "
               "WHERE idempotency_key = %s RETURNING 1", k11)
        answer = order(k11, o + 11)
        check("an expired key its operation refuses is 422 key-expired (IK007), no second order",
              s == 201 and problem(answer, 422, "key-expired") and orders_of(o + 11) == 1, answer)
    finally:
        scalar("SELECT public.idem_drop_policy('CREATE_ORDER'::pg_catalog.text)")


def variant_tests():
    """An instance with IDEM_CONFLICT_STATUS=422 on a read-only database session."""
    o = OWNER_BASE
    s, h, b = order(key("t1"), o + 1, 1001, 2)
    check("read-only: a replay still answers (201, replayed)", (s, one(h, "idempotent-replayed")) == (201, "true"),
          (s, b))
    check("IDEM_CONFLICT_STATUS=422: a reused key is 422 key-reused", problem(order(key("t1"), o + 1, 1001, 3), 422,
                                                                                "key-reused"))
    answer = order(key("ro"), o + 11)
    check("a new key on a read-only database is 503 read-only with Retry-After",
          problem(answer, 503, "read-only") and one(answer[1], "retry-after") is not None, answer)


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
                s, h, b = final_answer("fast-%s-%s-%04d" % (NAME, RUN, i), owner, 2000 + i, 1 + i % 3, port)
            except OSError as e:
                s, h, b = 0, {}, repr(e)
            with lock:
                answers.setdefault(i, []).append((s, b))
                hits[0] += one(h, "x-idem-cache") == "hit"

    threads = [threading.Thread(target=client, args=(c,)) for c in range(20)]
    for t in threads:
        t.start()
    if chaos:
        chaos()
    for t in threads:
        t.join()
    return answers, hits[0]


def order_rows(owner):
    with psycopg.connect(autocommit=True) as c:
        return c.execute("SELECT id, sku_id, quantity FROM shop_order WHERE owner_id = %s", (owner,)).fetchall()


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


def replays_per_second(port, owner, seconds=2, procs=4):
    k = ("hot-%s-%d" % (RUN, port)).ljust(24, "0")
    order(k, owner, 3000, 1, port=port)
    q = multiprocessing.Queue()
    ps = [multiprocessing.Process(target=hammer, args=(port, k, owner, seconds, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    total = sum(q.get() for _ in ps)
    for p in ps:
        p.join()
    return total / seconds


def fast_tests(plain_url, redis_port):
    plain_port = urllib.parse.urlsplit(plain_url).port
    keys = 40

    def cli(*args):
        return subprocess.run(["redis-cli", "-p", str(redis_port)] + list(args),
                              capture_output=True, text=True, timeout=10)

    def start_redis():
        subprocess.run(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--daemonize", "yes"], stdout=subprocess.DEVNULL, check=True)
        for _ in range(50):
            if cli("ping").stdout.strip() == "PONG":
                return
            time.sleep(0.05)

    events = []

    def chaos():
        time.sleep(0.4)
        cli("shutdown", "nosave")
        events.append("stopped")
        time.sleep(0.6)
        start_redis()
        events.append("restarted")
        time.sleep(0.4)
        cli("flushall")
        events.append("flushed")
        time.sleep(0.3)
        cli("client", "pause", "700")
        events.append("paused 700 ms")

    plain, _ = duplicate_heavy_run(OWNER_BASE + 1, plain_port, keys)
    fast, hits = duplicate_heavy_run(OWNER_BASE + 2, PORT, keys, chaos)
    print("# %s fast layer: Redis %s during the run; %d answers from the cache" % (NAME, ", ".join(events), hits))
    # the pause may outlast the run: the next checks need a Redis that answers
    while cli("ping").stdout.strip() != "PONG":
        time.sleep(0.05)

    def consistent(answers, owner):
        rows = {sku - 2000: (oid, qty) for oid, sku, qty in order_rows(owner)}
        bad = []
        for i in range(keys):
            finals = set(answers[i])
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
    check("without Redis: one order per key, every caller of a key the same answer", ok_plain, bad_plain[:3])
    check("with Redis stopped, restarted, flushed and paused mid-run: the same", ok_fast, bad_fast[:3])
    check("the fast layer did answer from the cache", hits > 0, hits)
    # 20 concurrent identical requests through the fast layer: one order; each
    # of the others a replay of it or a 409 in-flight with Retry-After
    k20 = key("fast20")
    results = at_once(20, lambda: order(k20, OWNER_BASE + 7, 1003, 1))
    fresh = [r for r in results if r[0] == 201 and one(r[1], "idempotent-replayed") == "false"]
    others = [r for r in results if r not in fresh]
    check("with the fast layer, 20 concurrent identical POSTs make one order, answered once as executed",
          orders_of(OWNER_BASE + 7) == 1 and len(fresh) == 1, (orders_of(OWNER_BASE + 7), len(fresh)))
    check("and each of the other 19 is a replay of it or a 409 in-flight with Retry-After",
          all((r[0] == 201 and one(r[1], "idempotent-replayed") == "true" and r[2] == fresh[0][2])
              or (problem(r, 409, "in-flight") and one(r[1], "retry-after") is not None) for r in others),
          [(r[0], r[2][:80]) for r in others])
    print("# %s: of the 19 duplicates, %d replays, %d 409 in-flight" % (
        NAME, sum(r[0] == 201 for r in others), sum(r[0] == 409 for r in others)))
    # an in-flight key: a duplicate is told "processing" at once by the fast layer
    k = key("flight")
    with psycopg.connect() as holder:
        holder.execute("SELECT public.idem_begin(%s::pg_catalog.int8, 'CREATE_ORDER'::pg_catalog.text, %s::pg_catalog.text,"
                       " '{\"skuId\": 1001, \"quantity\": 2}'::pg_catalog.jsonb)",
                       (OWNER_BASE + 6, k))
        first = []
        t = threading.Thread(target=lambda: first.append(order(k, OWNER_BASE + 6)))
        t.start()
        # the first request waits in the database behind the holder (its
        # in-flight marker is set before it goes there)
        cap = time.monotonic() + WAIT
        while time.monotonic() < cap and not scalar(
                "SELECT count(*) > 0 FROM pg_catalog.pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND query LIKE '%%idem_begin%%' AND pid <> pg_catalog.pg_backend_pid()"):
            time.sleep(0.02)
        t0 = time.monotonic()
        answer = order(k, OWNER_BASE + 6)
        quick = time.monotonic() - t0
        t.join()
        holder.rollback()
    check("an in-flight duplicate is answered 409 in-flight by the fast layer (x-idem-cache), not the database",
          problem(answer, 409, "in-flight") and one(answer[1], "x-idem-cache") == "in-flight",
          (answer, quick))
    check("while the original waited for the database (IK002 after idem.wait_timeout)",
          first and problem(first[0], 409, "in-flight") and "x-idem-cache" not in first[0][1], first)
    s, h, b = order(k, OWNER_BASE + 6)
    check("the holder released its marker: the retry executes", s == 201, (s, b))
    marker = "idem:%d:CREATE_ORDER:%s:flight" % (OWNER_BASE + 6, hashlib.sha256(k.encode()).hexdigest()[:32])
    left = cli("exists", marker).stdout.strip()
    check("the in-flight marker is gone (released by its holder, compare-and-delete)", left == "0", left)
    check("a cached key sent with a different request goes to the database: 409 key-reused",
          problem(order("fast-%s-%s-%04d" % (NAME, RUN, 0), OWNER_BASE + 2, 9999, 1), 409, "key-reused"))
    # redaction reaches the cache: with a redact policy on the operation, the
    # first caller gets the handler's answer; Redis keeps exactly the bytes
    # the database stored (read raw), and the cache's replay is the database's
    scalar("SELECT count(*) FROM public.idem_set_policy('CREATE_ORDER'::pg_catalog.text,"
           " redact => ARRAY['/status', '/Location']::pg_catalog.text[])")
    try:
        kr, owner_r = key("redact"), OWNER_BASE + 8
        s1, h1, b1 = order(kr, owner_r)
        entry_name = "idem:%d:CREATE_ORDER:%s" % (owner_r, hashlib.sha256(kr.encode()).hexdigest()[:32])
        raw = None
        for _ in range(100):        # the cache is written after the answer is sent, at most
            raw = cli("get", entry_name).stdout.strip()
            if raw:
                break
            time.sleep(0.05)
        stored_body, stored_headers = json.loads(scalar(
            "SELECT json_build_array(response_body, response_headers)::text FROM idem_internal.idempotency_record"
            " WHERE owner_id = %s AND idempotency_key = %s", owner_r, kr))
        entry = json.loads(raw) if raw else {}
        check("redact: the first caller gets the handler's whole answer",
              s1 == 201 and json.loads(b1).get("status") == "CREATED" and one(h1, "location"), (s1, h1, b1))
        check("redact: Redis holds exactly the body and headers the database stored, not the handler's",
              entry.get("body") is not None and json.loads(entry["body"]) == stored_body
              and "status" not in json.loads(entry["body"]) and entry.get("headers") == (stored_headers or {})
              and "location" not in {k.lower() for k in entry.get("headers", {})}, (raw, stored_body, stored_headers))
        s2, h2, b2 = order(kr, owner_r)
        check("redact: the cache's replay is the database's stored answer",
              s2 == 201 and one(h2, "x-idem-cache") == "hit" and json.loads(b2) == stored_body
              and one(h2, "location") is None, (s2, h2, b2))
    finally:
        scalar("SELECT count(*) FROM (SELECT public.idem_drop_policy('CREATE_ORDER'::pg_catalog.text)) d")
    # the article's test 5: the fast layer unavailable, the database decides
    cli("shutdown", "nosave")
    s, h, b = order("fast-%s-%s-%04d" % (NAME, RUN, 1), OWNER_BASE + 2, 2001, 2)
    s2, h2, b2 = order(key("t5"), OWNER_BASE + 3)
    check("test 5: with Redis down, a repeat replays and a new key executes (from the database)",
          (s, one(h, "idempotent-replayed"), "x-idem-cache" in h, s2) == (201, "true", False, 201), (s, h, s2))
    start_redis()
    with_redis = replays_per_second(PORT, OWNER_BASE + 4)
    without = replays_per_second(plain_port, OWNER_BASE + 5)
    print("# %s hot-key replays, 4 client processes for 2 s: %.0f/s with Redis, %.0f/s without (%.2f x)"
          % (NAME, with_redis, without, with_redis / max(without, 1)))


# The same bodies through every stack (issue 39): POST /api/orders's request
# is its skuId and quantity as sent (clients/CONTRACT.md), never a
# deserialised object.  Bodies of one group are one request: other key
# orders, unknown fields, 1.0, 2e0, 0.2e1, 2.000; the groups differ.
FINGERPRINT_BODIES = [
    ("a", '{"skuId": 1001, "quantity": 2}'),
    ("a", '{"quantity": 2, "skuId": 1001}'),
    ("a", '{"skuId": 1001.0, "quantity": 2e0, "gift": "wrap"}'),
    ("a", '{"gift": {"note": "x", "skuId": 7}, "quantity": 0.2e1, "skuId": 1001}'),
    ("b", '{"skuId": 1e2, "quantity": 2}'),
    ("b", '{"skuId": 100, "quantity": 2.000}'),
    ("c", '{"skuId": 1001, "quantity": 3}'),
]


def fingerprint_tests():
    """Each body's stored request_hash is idem_request_hash of its skuId
    and quantity as PostgreSQL reads the raw body; written to
    $IDEM_FINGERPRINTS/NAME.json for fingerprints.py to compare stacks."""
    owner = OWNER_BASE + 20
    stored = {}
    for i, (group, raw) in enumerate(FINGERPRINT_BODIES):
        k = key("fp%d" % i)
        answer = post("/api/orders", None, k, owner, raw=raw)
        got = scalar("SELECT max(request_hash) FROM idem_internal.idempotency_record"
                     " WHERE owner_id = %s AND idempotency_key = %s", owner, k)
        want = scalar("SELECT public.idem_request_hash(jsonb_build_object('skuId', b -> 'skuId', 'quantity', b -> 'quantity'))"
                      " FROM (SELECT %s::jsonb) AS t (b)", raw)
        check("fingerprint: %s is stored (%d) with idem_request_hash of its skuId and quantity" % (raw, answer[0]),
              got == want, (answer, got, want))
        stored[raw] = got
    by_group = {}
    for group, raw in FINGERPRINT_BODIES:
        by_group.setdefault(group, set()).add(stored[raw])
    check("fingerprint: key order, unknown fields and number forms (1.0, 2e0, 0.2e1, 2.000) do not change it",
          all(len(h) == 1 for h in by_group.values()), by_group)
    check("fingerprint: other values do (1001, 100; quantity 2, 3)",
          len(set().union(*by_group.values())) == len(by_group), by_group)
    out = os.environ.get("IDEM_FINGERPRINTS")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, NAME + ".json"), "w") as f:
            json.dump(stored, f, indent=1, sort_keys=True)


def main():
    mode = sys.argv[4] if len(sys.argv) > 4 else ""
    if mode == "--variant":
        variant_tests()
    elif mode == "--fast":
        fast_tests(sys.argv[5], int(sys.argv[6]))
    elif mode == "--quick":
        article_tests()
    else:
        article_tests()
        mapping_tests()
        fingerprint_tests()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - a check that could not run is a failure, not silence
        import traceback
        traceback.print_exc()
        check("the checks ran to their end", False, repr(e))
    sys.exit(1 if failures else 0)
