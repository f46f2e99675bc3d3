#!/usr/bin/python3
"""A worker of test/chaos/tasks.sh, killed with kill -9 at random points.

  task_worker.py NAME

Leases batches of CHAOS tasks with bind_session (and a lease of a minute,
so that only the end of a killed worker's session can hand its tasks out
again within seconds), logging each lease in the lease's own statement.
Each task is an external call (a few milliseconds of sleep), then either a
retryable failure (1 in 10; logged with idem_fail, in one transaction) or
its business row and idem_complete, in one transaction.  A stale token
(IK004) rolls the business row back.
"""
import os
import random
import sys
import time

import psycopg

LEASE = ("INSERT INTO chaos_lease (task_id, attempt, token, worker)"
         " SELECT task_id, attempt, token, %s"
         " FROM idem_lease('CHAOS', %s, '1 minute', 20, bind_session => true)"
         " RETURNING task_id, attempt, token, (SELECT task_request FROM idem_internal.idempotency_record"
         "                                     WHERE id = task_id)")


def main():
    name = sys.argv[1]
    rng = random.Random()
    conn = psycopg.connect(dbname=os.environ["CHAOS_DB"], autocommit=True)
    idle = 0
    while True:
        rows = conn.execute(LEASE, (name, name)).fetchall()
        if not rows:
            idle += 1
            time.sleep(0.02)
            continue
        idle = 0
        for task_id, attempt, token, request in rows:
            time.sleep(rng.random() * 0.004)  # the external call
            try:
                with conn.transaction():
                    if rng.random() < 0.1:
                        conn.execute("INSERT INTO chaos_fail (task_id, attempt) VALUES (%s, %s)",
                                     (task_id, attempt))
                        conn.execute("SELECT idem_fail(%s, %s, '{\"carrier\": \"timeout\"}')",
                                     (task_id, token))
                    else:
                        conn.execute("INSERT INTO chaos_effect (task_id, n, worker) VALUES (%s, %s, %s)",
                                     (task_id, request["n"], name))
                        conn.execute("SELECT idem_complete(%s, %s, 201, %s::json, %s)",
                                     (task_id, token, '{"n": %d}' % request["n"], request["n"]))
            except psycopg.Error as e:
                if e.sqlstate != "IK004":
                    raise
                conn.execute("INSERT INTO chaos_stale (task_id, attempt, worker) VALUES (%s, %s, %s)",
                             (task_id, attempt, name))


if __name__ == "__main__":
    main()
