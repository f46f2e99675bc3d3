#!/usr/bin/python3
"""Load for test/bench/clients_bench.sh: PROCS client processes, each on one
keep-alive connection, POST for SECONDS to URL; prints requests per second.

  clients_load.py URL MODE SECONDS PROCS OWNER
  MODE: bare    POST /bare/orders (the handler without idem)
        fresh   POST /api/orders with a new Idempotency-Key each time
        replay  POST /api/orders with one key (made first): replays
"""
import http.client
import json
import multiprocessing
import sys
import time
import urllib.parse
import uuid

URL, MODE, SECONDS, PROCS, OWNER = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
HOST, PORT = urllib.parse.urlsplit(URL).hostname, urllib.parse.urlsplit(URL).port
BODY = json.dumps({"skuId": 4000, "quantity": 1})


def worker(n, start, out, replay_key):
    conn = http.client.HTTPConnection(HOST, PORT, timeout=30)
    path = "/bare/orders" if MODE == "bare" else "/api/orders"
    headers = {"Content-Type": "application/json", "X-Owner-Id": OWNER}
    while time.time() < start:
        time.sleep(0.001)
    end, done, bad = start + SECONDS, 0, 0
    while time.time() < end:
        if MODE != "bare":
            headers["Idempotency-Key"] = replay_key or "bench-" + uuid.uuid4().hex
        conn.request("POST", path, BODY, headers)
        r = conn.getresponse()
        r.read()
        done += r.status == 201
        bad += r.status != 201
    out.put((done, bad))


if __name__ == "__main__":
    key = None
    if MODE == "replay":
        key = "bench-replay-" + uuid.uuid4().hex
        c = http.client.HTTPConnection(HOST, PORT, timeout=30)
        c.request("POST", "/api/orders", BODY, {"Content-Type": "application/json", "X-Owner-Id": OWNER,
                                                 "Idempotency-Key": key})
        c.getresponse().read()
    q = multiprocessing.Queue()
    start = time.time() + 0.5
    ps = [multiprocessing.Process(target=worker, args=(i, start, q, key)) for i in range(PROCS)]
    for p in ps:
        p.start()
    results = [q.get() for _ in ps]
    for p in ps:
        p.join()
    ok = sum(r[0] for r in results)
    bad = sum(r[1] for r in results)
    if bad:
        print("errors %d" % bad, file=sys.stderr)
    print("%.0f" % (ok / SECONDS))
