"""Differential harness: the SQL edition against the C edition.

Sequences of calls generated from a printed seed, each a list of steps of
two sessions (as the isolation specs interleave them), run on two servers:
one with the C edition preloaded, one where idem's library is neither
preloaded nor installed and the SQL edition (managed/idem.sql) answers.
Every answer and SQLSTATE is compared after normalisation: ids renumbered
by first appearance, timestamps as the TTL they fall under (or "past"),
message ids by first appearance, a fetch's messages grouped by key (each
key's in order).  A step that blocks is left waiting until
the other session's step that releases it (pg_blocking_pids), as the
isolation tester does; expiries come from TTLs of 500 ms and a wait until
the records' own expiry has passed, never from a fixed sleep.

A difference is allowed only where docs/managed.md's table of differences
lists its tag.  Prints "ok - ..." / "not ok - ..." lines.

    python3 differential.py C_DSN SQL_DSN [COUNT] [SEED]
"""
from __future__ import annotations

import os
import random
import re
import sys
import threading
import time
from decimal import Decimal

import psycopg

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "managed.md")
TTLS = (0.5, 600, 3600, 86400)          # seconds: what expires_at falls under
OPS = ("PAY", "SHIP")
REQUESTS = ('{"amount": 10}', '{"amount": 10.0, "note": null}', '{"amount": 11}')
CAP = float(os.environ.get("PG_TEST_TIMEOUT_DEFAULT", "180"))


def allowed_tags():
    """The harness tags of docs/managed.md's table of differences."""
    with open(DOCS, encoding="utf-8") as f:
        return set(re.findall(r"`harness:([a-z0-9-]+)`", f.read()))


# ---------------------------------------------------------------- sequences

class Gen:
    """One sequence's steps: (session, kind, args).  It keeps what each
    session's open transaction wrote, so that a duplicate of the other's
    is either refused at once (a wait of 0) or left waiting until the other
    ends (collect).  Policies are set while no transaction is open (the C
    edition's sessions read a change from their next transaction, the SQL
    edition's from their next statement); messages are acknowledged outside
    transactions and keyed ones emitted outside REPEATABLE READ ones (the
    SQL edition refuses both there: docs/managed.md).  The cleanup runs in
    a transaction of its own, as pg_cron runs it: what it deletes, no
    sequence can know (the isolation specs cover its races)."""

    def __init__(self, rng: random.Random, n: int):
        self.rng = rng
        self.n = n
        self.owner = 1000 * n
        self.open = {1: None, 2: None}        # the open transaction's isolation
        self.claims = {1: [], 2: []}          # scopes claimed, unfinished
        self.touched = {1: set(), 2: set()}   # scopes the open transaction wrote
        self.used = []                        # (scope, request) claimed before
        self.steps = []

    def key(self):
        return "key-%02d-%012d" % (self.rng.choice((0, 0, 1, 2)), self.n)

    def op(self):
        return "%s_%d" % (self.rng.choice(OPS + OPS[:1]), self.n)

    def request(self):
        return self.rng.choice(REQUESTS[:1] * 4 + REQUESTS)

    def add(self, s, kind, *args):
        self.steps.append((s, kind, args))

    def order(self, s):
        r = self.rng
        scope = (self.owner + r.randrange(2), "CREATE_ORDER", self.key())
        if scope in self.touched[3 - s]:
            return
        self.add(s, "order", scope[0], scope[2], r.choice((5, 6)), r.choice((1, 2)))
        if self.open[s]:
            self.touched[s].add(scope)

    def claim(self, s):
        r = self.rng
        other = 3 - s
        if not self.open[s]:
            self.open[s] = r.choice(("read committed", "read committed", "repeatable read"))
            self.add(s, "begin_tx", self.open[s])
        scope = (self.owner + r.choice((0, 0, 0, 1)), self.op(), self.key())
        busy = scope in self.touched[other]
        wait = 0 if busy and r.random() < 0.5 else None
        req = self.request()
        self.used.append((scope, req))
        self.add(s, "begin", *scope, req, r.choice((None, None, "500 milliseconds", "1 hour")), wait)
        self.claims[s].append(scope)
        self.touched[s].add(scope)
        if busy and wait is None:
            self.end(other)
            self.add(s, "collect")

    def step(self):
        r = self.rng
        s = r.choice((1, 2))
        roll = r.random()
        rc = self.open[s] != "repeatable read"
        if roll < 0.14:
            self.order(s)
        elif roll < 0.38:
            self.claim(s)
        elif roll < 0.54 and self.claims[s]:
            scope = r.choice(self.claims[s])
            self.add(s, r.choice(("finish", "finish_stored")), *scope, r.choice((200, 201, 201, 409, 422, 500)))
            if r.random() < 0.95:
                self.claims[s].remove(scope)
        elif roll < 0.64 and self.open[s]:
            if self.claims[s] and r.random() < 0.7:
                scope = self.claims[s].pop()
                self.add(s, "finish", *scope, r.choice((200, 201, 422)))
            self.end(s)
        elif roll < 0.72:
            self.add(s, "emit", "t%d" % self.n, r.choice((None, "a", "b")) if rc else None, r.randrange(100))
        elif roll < 0.79 and not self.open[s]:
            self.add(s, "fetch_ack", "t%d" % self.n, r.random() < 0.7)
        elif roll < 0.84 and not self.open[1] and not self.open[2]:
            self.add(s, "policy", self.op(), r.choice(("500 milliseconds", "1 hour", None)), r.choice(("refuse", "execute")))
        elif roll < 0.88 and not self.open[1] and not self.open[2]:
            self.add(s, "expire")
            if self.used and not self.open[s]:
                # a retry after the expiry, in a transaction of its own
                scope, req = r.choice(self.used)
                if scope not in self.touched[3 - s]:
                    self.add(s, "begin", *scope, req, None, 0)
        elif roll < 0.91 and not self.open[s]:
            self.add(s, "cleanup")
        elif roll < 0.95:
            self.add(s, "finish", self.owner, self.op(), self.key(), 200)
        elif not self.open[s] or r.random() < 0.2:
            self.add(s, "bad", r.randrange(6))

    def end(self, s):
        if self.open[s]:
            self.add(s, self.rng.choice(("commit", "commit", "rollback")))
            self.open[s] = None
            self.claims[s] = []
            self.touched[s] = set()

    def retention(self):
        """A key of an operation that refuses reuse, executed, expired and
        sent again (IK007), or executed again (reuse 'execute')."""
        r = self.rng
        op, scope_key = self.op(), self.key()
        self.add(1, "policy", op, "500 milliseconds", r.choice(("refuse", "refuse", "execute")))
        self.add(1, "begin_tx", "read committed")
        self.add(1, "begin", self.owner, op, scope_key, REQUESTS[0], None, None)
        self.add(1, "finish", self.owner, op, scope_key, r.choice((201, 422)))
        self.add(1, "commit")
        self.add(2, "expire")
        if r.random() < 0.5:
            self.add(2, "cleanup")
        self.add(2, "begin_tx", "read committed")
        self.add(2, "begin", self.owner, op, scope_key, r.choice(REQUESTS[:2]), None, None)
        self.add(2, "rollback")

    def build(self, length):
        if self.rng.random() < 0.15:
            self.retention()
        for _ in range(length):
            self.step()
        for s in (1, 2):
            self.end(s)
        self.add(1, "records", self.owner)
        return self.steps


# ---------------------------------------------------------------- running

def q(v):
    """An SQL literal."""
    if v is None:
        return "NULL"
    if isinstance(v, int):
        return str(v)
    return "'" + str(v).replace("'", "''") + "'"


class Edition:
    """A server with one edition: two sessions, the SQL of each step."""

    def __init__(self, name, dsn):
        self.name = name
        self.sessions = {s: psycopg.connect(dsn, autocommit=True) for s in (1, 2)}
        self.pids = {s: c.info.backend_pid for s, c in self.sessions.items()}
        self.monitor = psycopg.connect(dsn, autocommit=True)
        self.pending = {}                      # session -> (thread, box)
        self.wait_setting = "idem.wait_timeout" if name == "c" else "idem_sql.wait_timeout"
        self.ttl_setting = "idem.ttl" if name == "c" else "idem_sql.ttl"

    def close(self):
        for c in self.sessions.values():
            c.close()
        self.monitor.close()

    def run_sql(self, s, sql):
        """Rows (a list of tuples) or ('error', SQLSTATE, context)."""
        try:
            cur = self.sessions[s].execute(sql)
            return cur.fetchall() if cur.description else []
        except psycopg.Error as e:
            diag = e.diag
            return ("error", diag.sqlstate, diag.context or "")

    def blocked(self, s):
        cur = self.monitor.execute("SELECT pg_catalog.cardinality(pg_catalog.pg_blocking_pids(%s))", (self.pids[s],))
        return cur.fetchone()[0] > 0

    def start(self, s, sql, may_wait=False):
        """Run sql in session s; if it may wait and does, leave it waiting
        (None).  Any other statement runs to its end."""
        box = {}

        def work():
            box["r"] = self.run_sql(s, sql)
        t = threading.Thread(target=work)
        t.start()
        deadline = time.monotonic() + CAP
        while may_wait and t.is_alive() and time.monotonic() < deadline:
            t.join(0.002)
            if t.is_alive() and self.blocked(s):
                self.pending[s] = (t, box)
                return None
        t.join(CAP)
        return box.get("r", ("error", "timeout", ""))

    def collect(self, s):
        if s not in self.pending:
            return ("harness", "did not wait")
        t, box = self.pending.pop(s)
        t.join(CAP)
        return box.get("r", ("error", "timeout", ""))


def outcome_sql(call):
    return ("SELECT o.replayed, o.http_status, o.body::text, o.headers::text, o.resource_id, "
            "EXTRACT(epoch FROM o.expires_at - pg_catalog.now()), o.header_list::text FROM %s o" % call)


def step_sql(ed, kind, args):
    """The statements of one step on edition ed."""
    if kind == "order":
        owner, key, sku, qty = args
        return ["SELECT * FROM idem.idem_create_order(%d, %s, %d, %d)" % (owner, q(key), sku, qty)]
    if kind == "begin_tx":
        return ["BEGIN ISOLATION LEVEL %s" % args[0].upper()]
    if kind in ("commit", "rollback"):
        return [kind.upper()]
    if kind == "begin":
        owner, op, key, req, ttl, wait = args
        pre = ["SET LOCAL %s = %s" % (ed.wait_setting, q(str(wait) if wait is not None else "600000"))]
        call = "idem.idem_begin(%d, %s, %s, %s::jsonb, %s::interval)" % (owner, q(op), q(key), q(req), q(ttl))
        return pre + [outcome_sql(call)]
    if kind in ("finish", "finish_stored"):
        owner, op, key, status = args
        body = q('{"status": %d, "ok": true}' % status)
        if kind == "finish":
            return ["SELECT idem.idem_finish(%d, %s, %s, %d, %s::json)" % (owner, q(op), q(key), status, body)]
        return [outcome_sql("idem.idem_finish_stored(%d, %s, %s, %d, %s::json, 7, NULL, %s::json)"
                            % (owner, q(op), q(key), status, body, q('[["Set-Cookie","a=1"],["set-cookie","b=2"]]')))]
    if kind == "emit":
        topic, key, n = args
        return ["SELECT idem.idem_outbox_emit(%s, %s::jsonb, %s)" % (q(topic), q('{"n": %d}' % n), q(key))]
    if kind == "fetch_ack":
        return ["fetch_ack"]
    if kind == "policy":
        op, ttl, reuse = args
        return ["SELECT p.operation, p.ttl, p.audit_ttl, p.reuse_after_expiry FROM idem.idem_set_policy(%s, ttl => %s::interval, "
                "audit_ttl => interval '1 hour', reuse_after_expiry => %s) p" % (q(op), q(ttl), q(reuse))]
    if kind == "cleanup":
        return ["SELECT 1 FROM idem.idem_cleanup_expired()"]
    if kind == "expire":
        return ["expire"]
    if kind == "records":
        table = "idem_internal.idempotency_record" if ed.name == "c" else "idem.idempotency_record"
        return ["SELECT r.owner_id, r.operation, r.idempotency_key, r.status, r.http_status FROM %s r "
                "WHERE r.owner_id BETWEEN %d AND %d ORDER BY 1, 2, 3" % (table, args[0], args[0] + 999)]
    if kind == "bad":
        return [[
            "SELECT * FROM idem.idem_begin(1, 'PAY', 'short', '{}')",
            "SELECT * FROM idem.idem_begin(1, 'PAY', 'key-000000000000000', NULL)",
            "SELECT * FROM idem.idem_begin(1, 'P Y', 'key-0000000000000000', '{}')",
            "SELECT * FROM idem.idem_create_order(1, 'key-0000000000000000', 1, 101)",
            "SELECT idem.idem_canonical_json('{\"b\": 1e400}')",
            "SELECT * FROM idem.idem_begin(1, 'PAY', 'key-0000000000000000', '{}', interval '-1 second')",
        ][args[0]]]
    raise ValueError(kind)


class Normal:
    """Renumber ids by first appearance; timestamps as their TTL class."""

    def __init__(self):
        self.ids = {}

    def id(self, kind, v):
        if v is None:
            return None
        return "%s#%d" % (kind, self.ids.setdefault((kind, v), len([k for k in self.ids if k[0] == kind]) + 1))

    def value(self, v):
        if isinstance(v, Decimal):
            if v < 0:
                return "past"
            return "ttl<=%s" % next((t for t in TTLS if float(v) <= t + 0.001), "more")
        return v


def normalise(norm: Normal, ed, kind, result):
    if result is None:
        return "blocked"
    if isinstance(result, tuple) and result and result[0] == "harness":
        return result
    if isinstance(result, tuple) and result and result[0] == "error":
        code, context = result[1], result[2]
        if ed.name == "sql" and code == "55P03" and "idem_sql_claim" in context:
            return ("error", "IK002", "harness:ik002-as-55p03")
        return ("error", code)
    rows = []
    for row in result:
        row = list(row)
        if kind == "order":
            row[0] = norm.id("order", row[0])
            row[1] = None if row[1] is None else "ORD-" + str(row[0])
        elif kind in ("begin", "finish_stored"):
            row[4] = norm.id("resource", row[4])
        elif kind == "emit":
            row[0] = norm.id("message", row[0])
        elif kind == "fetch_ack" and row[0] != "acked":
            row[0] = norm.id("message", row[0])
        rows.append(tuple(norm.value(v) for v in row))
    if kind == "fetch_ack":
        # each key's messages in order; the order across keys is neither
        # edition's promise (the C edition sequences a transaction's keys
        # in hash order, the SQL edition in emit order)
        messages = sorted((r for r in rows if r[0] != "acked"), key=lambda r: (r[1] is not None, r[1] or ""))
        rows = messages + [r for r in rows if r[0] == "acked"]
    return rows


def run_step(ed, norm, s, kind, args):
    if kind == "collect":
        return normalise(norm, ed, "begin", ed.collect(s))
    if s in ed.pending:
        return ("harness", "session still waiting")
    out = None
    for sql in step_sql(ed, kind, args):
        if sql == "fetch_ack":
            rows = ed.run_sql(s, "SELECT f.message_id, f.msg_key, f.payload::text, f.attempt FROM idem.idem_outbox_fetch(%s, 10, interval '1 hour') f" % q(args[0]))
            if not isinstance(rows, tuple) and rows and args[1]:
                acked = ed.run_sql(s, "SELECT idem.idem_outbox_ack(ARRAY[%s]::bigint[])" % ",".join(str(r[0]) for r in rows))
                rows = rows + ([("acked",) + tuple(acked[0])] if not isinstance(acked, tuple) else [acked])
            out = rows
        elif sql == "expire":
            # until the records expiring soonest (short TTLs) have expired;
            # no transaction is open (Gen)
            table = "idem_internal.idempotency_record" if ed.name == "c" else "idem.idempotency_record"
            deadline = time.monotonic() + CAP
            while time.monotonic() < deadline:
                r = ed.run_sql(s, "SELECT pg_catalog.count(*) FROM %s WHERE expires_at >= pg_catalog.clock_timestamp() "
                                  "AND expires_at < pg_catalog.clock_timestamp() + interval '2 seconds'" % table)
                if isinstance(r, tuple) or r[0][0] == 0:
                    break
                time.sleep(0.05)
            out = []
        else:
            # a claim the other session's transaction holds waits for it
            out = ed.start(s, sql, kind == "begin" and args[5] is None)
            if out is None or isinstance(out, tuple):
                break
    return normalise(norm, ed, kind, out)


def run_sequence(eds, steps):
    """Each edition runs the whole sequence in a thread of its own."""
    got = {}

    def run(ed):
        norm = Normal()
        got[ed.name] = [run_step(ed, norm, s, kind, args) for s, kind, args in steps]
    threads = [threading.Thread(target=run, args=(ed,)) for ed in eds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [(s, kind, args, {ed.name: got[ed.name][i] for ed in eds})
            for i, (s, kind, args) in enumerate(steps)]


def differs(a, b, allowed):
    if a == b:
        return False
    # the SQL edition's IK002 after a wait is 55P03, as the libraries map it
    if isinstance(b, tuple) and len(b) == 3 and b[2].split(":")[1] in allowed and a == b[:2]:
        return False
    return True


def reset(ed):
    """A transaction a failed sequence left open ends."""
    for s, c in ed.sessions.items():
        if s in ed.pending:
            ed.collect(s)
        c.execute("ROLLBACK") if c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE else None


def main():
    c_dsn, sql_dsn = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else int(time.time())
    expect_differences = os.environ.get("IDEM_DIFF_EXPECT") == "differences"
    allowed = allowed_tags()
    print("# seed %d, %d sequences; allowed differences: %s" % (seed, count, ", ".join(sorted(allowed)) or "none"))
    eds = [Edition("c", c_dsn), Edition("sql", sql_dsn)]
    for ed in eds:
        ed.run_sql(1, "SET idem.ttl = 86400" if ed.name == "c" else "SET idem_sql.ttl = 86400")
    rng = random.Random(seed)
    seen = {}
    bad = 0
    steps_run = 0
    start = time.monotonic()
    for n in range(1, count + 1):
        steps = Gen(rng, n).build(rng.randrange(8, 20))
        trace = run_sequence(eds, steps)
        steps_run += len(trace)
        for _, kind, _, got in trace:
            c = got["c"]
            what = (c[1] if isinstance(c, tuple) and c[0] == "error" else "waited" if c == "blocked"
                    else "replayed" if kind in ("begin", "order") and c and c[0][-1 if kind == "order" else 0] is True
                    else None)
            if what:
                seen[what] = seen.get(what, 0) + 1
        diff = [t for t in trace if differs(t[3]["c"], t[3]["sql"], allowed)]
        if diff or os.environ.get("IDEM_DIFF_SHOW") == str(n):
            bad += 1 if diff else 0
            if bad <= 3 and not expect_differences:
                print("# sequence %d (seed %d) differs:" % (n, seed))
                for s, kind, args, got in trace:
                    mark = "!!" if (s, kind, args, got) in diff else "  "
                    print("# %s s%d %s%r\n#      c:   %r\n#      sql: %r" % (mark, s, kind, args, got["c"], got["sql"]))
            for ed in eds:
                reset(ed)
    took = time.monotonic() - start
    for ed in eds:
        ed.close()
    print("# %d sequences, %d steps in %.1f s: %d differ" % (count, steps_run, took, bad))
    print("# the C edition's outcomes: " + ", ".join("%s %d" % kv for kv in sorted(seen.items())))
    if expect_differences:
        ok = bad > 0
        print("%s - the spoiled SQL edition (%s) differs from the C edition in %d of %d sequences (seed %d)"
              % ("ok" if ok else "not ok", os.environ.get("IDEM_DIFF_SPOIL", "?"), bad, count, seed))
    else:
        print("%s - %d sequences (seed %d): the SQL edition answers as the C edition, but for docs/managed.md's differences"
              % ("ok" if bad == 0 else "not ok", count, seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
