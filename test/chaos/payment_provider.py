#!/usr/bin/python3
"""The payment provider of test/chaos/payments.sh: not idempotent.

  payment_provider.py PORT JOURNAL SEED [LATE_RATE]

POST /charge {"key", "amount"} charges every time it is called (a new
charge id each call, keyed by the merchant's reference, the idempotency
key) and answers 201 {"charge": id}; one call in five (LATE_RATE, seeded) answers only
after a second, so that the worker's client, which waits a quarter of one,
has given up: the charge happened, the worker cannot know.  GET
/lookup?key=K answers {"charges": [ids]}, what a provider's search by
reference gives.  Every call is a line of JOURNAL (JSON: at, kind, key,
charge, late), written before it is answered; GET /journal returns them all.
"""
import json
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PORT, JOURNAL, SEED = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
LATE_RATE = float(sys.argv[4]) if len(sys.argv) > 4 else 0.2
LATE = 1.0
lock = threading.Lock()
rng = random.Random(SEED)
charges = {}
events = []
journal = open(JOURNAL, "a", buffering=1)


def record(kind, key, charge=None, late=False):
    event = {"at": time.time(), "kind": kind, "key": key, "charge": charge, "late": late}
    events.append(event)
    journal.write(json.dumps(event) + "\n")


class Provider(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with lock:
            charge = "ch_%d" % (len(events) + 1)
            charges.setdefault(body["key"], []).append(charge)
            late = rng.random() < LATE_RATE
            record("charge", body["key"], charge, late)
        if late:
            time.sleep(LATE)
        try:
            self.answer(201, {"charge": charge})
        except OSError:
            pass    # the client gave up

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/journal":
            with lock:
                self.answer(200, list(events))
            return
        key = parse_qs(url.query)["key"][0]
        with lock:
            found = list(charges.get(key, []))
            record("lookup", key)
        self.answer(200, {"charges": found})

    def log_message(self, *args):
        pass


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", PORT), Provider).serve_forever()
