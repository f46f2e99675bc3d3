#!/usr/bin/python3
"""A payment worker of test/chaos/payments.sh, built on idem_pg.TaskWorker.

  payment_worker.py NAME reconcile|control|mark

Leases PAY tasks with bind_session and charges the provider
(payment_provider.py) for each.  A charge the provider does not answer in
time is an attempt of unknown outcome: in reconcile mode (the operation's
policy says uncertain => 'reconcile') the worker reports it with
fail_unknown and first reconciles what is marked: it looks the key up at
the provider, completes with the charge found, or, finding none, says the
attempt had no effect (not_charged).  In control mode it is a worker as
idem 1.15 allowed: a timeout is a retryable failure, and it never
reconciles.  The worker kills itself with SIGKILL (kill -9) at random
points: before the charge, and between the provider's answer and
idem_complete; the harness starts another.  In mark mode it reports
unknown outcomes but never reconciles (an operator acts on them).
"""
import json
import os
import random
import signal
import socket
import sys
import time
import urllib.error
import urllib.request

import psycopg

import idem_pg

NAME, MODE = sys.argv[1], sys.argv[2]
PROVIDER = "http://127.0.0.1:%s" % os.environ["PROVIDER_PORT"]
KILL = float(os.environ.get("KILL_RATE", "0.02"))
rng = random.Random()


def call(path, body=None, timeout=5.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(PROVIDER + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def die_maybe(point):
    if rng.random() < KILL:
        with open(os.environ["KILL_LOG"], "a") as f:
            f.write("%s %s\n" % (NAME, point))
        os.kill(os.getpid(), signal.SIGKILL)


def reconcile(conn, worker):
    done = 0
    for task in worker.lease_reconcile(conn, batch=10):
        done += 1
        found = call("/lookup?key=" + task.key)["charges"]
        try:
            if found:
                with conn.transaction():
                    conn.execute("INSERT INTO payment (task_id, charge, worker) VALUES (%s, %s, %s)",
                                 (task.task_id, found[0], NAME))
                    task.complete(conn, 201, {"charge": found[0]})
            else:
                task.not_charged(conn)
        except idem_pg.StaleToken:
            pass
    return done


def charge(conn, worker):
    done = 0
    for task in worker.lease(conn, batch=10):
        done += 1
        die_maybe("before")
        try:
            answer = call("/charge", {"key": task.key, "amount": task.request["amount"]}, timeout=0.25)
        except (socket.timeout, TimeoutError, urllib.error.URLError):
            try:
                if MODE in ("reconcile", "mark"):
                    task.fail_unknown(conn, {"provider": "timeout"})
                else:
                    task.fail(conn, {"provider": "timeout"}, retryable=True)
            except idem_pg.StaleToken:
                pass
            continue
        die_maybe("after")
        try:
            with conn.transaction():
                conn.execute("INSERT INTO payment (task_id, charge, worker) VALUES (%s, %s, %s)",
                             (task.task_id, answer["charge"], NAME))
                task.complete(conn, 201, answer)
        except idem_pg.StaleToken:
            pass
    return done


def main():
    conn = psycopg.connect(dbname=os.environ["PAY_DB"], autocommit=True)
    worker = idem_pg.TaskWorker("PAY", NAME, lease=60, bind_session=True)
    while True:
        done = reconcile(conn, worker) if MODE == "reconcile" else 0
        done += charge(conn, worker)
        if not done:
            time.sleep(0.02)


main()
