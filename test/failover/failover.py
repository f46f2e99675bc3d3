"""idem across a Patroni failover: the driver of test/failover/patroni.sh.

etcd, and two PostgreSQL nodes under Patroni (idem preloaded), all on
loopback ports of their own under FO_DIR.  Three rounds; in each, 20
clients run through a multi-host connection string (target_session_attrs =
read-write) while the primary fails, and retry every request whose answer
they did not get, with the same key:

  1. synchronous replication (synchronous_mode), the primary's postmaster
     killed with kill -9;
  2. synchronous, the primary's Patroni stopped;
  3. asynchronous, the postmaster killed.

The clients: 10 create orders (idem_create_order), 4 make generic calls
(idem_begin, a business row, idem_finish in one transaction), 4 emit (an
idempotent request whose transaction writes a row and emits one message
keyed by an account, in each account's order), 2 relays lease outbox
messages, append them to an in-memory broker and acknowledge them, and one
consumer applies the broker's messages with idem_consume; task workers
lease and complete tasks.  Prints one "ok - ..." or "not ok - ..." line
per check.
"""
import json
import os
import signal
import sys
import subprocess
import threading
import time
import urllib.request

import psycopg

FO = os.environ["FO_DIR"]
BIN = os.environ["PG_BINDIR"]
DB = "idem_fo"
LOAD_BEFORE = 4.0       # seconds of load before the failure
LOAD_AFTER = 4.0        # and after the new primary answers
# how long a wait for progress may take before it is a failure: the test
# run's cap (PG_TEST_TIMEOUT_DEFAULT, 180 s unless set); each wait ends as
# soon as its condition holds
TIMEOUT = float(os.environ.get("IDEM_WAIT") or os.environ.get("PG_TEST_TIMEOUT_DEFAULT") or 180)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ports import free_port  # noqa: E402  the run's one port allocator


def check(name, ok, detail=""):
    print(("ok - " if ok else "not ok - ") + name + ("" if ok else f" ({detail})"), flush=True)
    return ok


def log(msg):
    print("==> " + msg, file=sys.stderr, flush=True)


ETCD_CLIENT, ETCD_PEER = free_port(), free_port()
NODES = {}
for name in ("node1", "node2"):
    NODES[name] = {"pg": free_port(), "rest": free_port(), "dir": f"{FO}/{name}", "proc": None}
MULTI = ("host=127.0.0.1,127.0.0.1 port={},{} dbname={} user=postgres "
         "target_session_attrs=read-write connect_timeout=2").format(
             NODES["node1"]["pg"], NODES["node2"]["pg"], DB)


def node_dsn(name, db=DB):
    return f"host=127.0.0.1 port={NODES[name]['pg']} dbname={db} user=postgres connect_timeout=2"


def start_etcd():
    os.makedirs(f"{FO}/etcd", exist_ok=True)
    os.chown(f"{FO}/etcd", *postgres_ids())
    subprocess.Popen(
        ["etcd", "--name", "idem-failover", "--data-dir", f"{FO}/etcd",
         "--listen-client-urls", f"http://127.0.0.1:{ETCD_CLIENT}",
         "--advertise-client-urls", f"http://127.0.0.1:{ETCD_CLIENT}",
         "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PEER}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PEER}",
         "--initial-cluster", f"idem-failover=http://127.0.0.1:{ETCD_PEER}"],
        user="postgres", stdout=open(f"{FO}/etcd.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.time() + TIMEOUT
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{ETCD_CLIENT}/health", timeout=1).read()
            return True
        except Exception:
            time.sleep(0.2)
    return False


def postgres_ids():
    import pwd
    p = pwd.getpwnam("postgres")
    return p.pw_uid, p.pw_gid


def write_config(name):
    n = NODES[name]
    os.makedirs(n["dir"], exist_ok=True)
    os.chown(n["dir"], *postgres_ids())
    conf = f"""scope: idem-failover
name: {name}
restapi:
  listen: 127.0.0.1:{n['rest']}
  connect_address: 127.0.0.1:{n['rest']}
etcd3:
  hosts: 127.0.0.1:{ETCD_CLIENT}
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    maximum_lag_on_failover: 16777216
    master_start_timeout: 0
    primary_start_timeout: 0
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      remove_data_directory_on_rewind_failure: true
      remove_data_directory_on_diverged_timelines: true
      parameters:
        shared_preload_libraries: idem
        wal_level: replica
        hot_standby: 'on'
        wal_log_hints: 'on'
        max_wal_senders: 5
        max_replication_slots: 5
        max_connections: 100
        idem.cleanup_interval: 1
        fsync: 'off'
  initdb:
  - encoding: UTF8
  - locale: C.UTF-8
  pg_hba:
  - local all all trust
  - host replication postgres 127.0.0.1/32 trust
  - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{n['pg']}
  connect_address: 127.0.0.1:{n['pg']}
  data_dir: {n['dir']}/data
  bin_dir: {BIN}
  pgpass: {n['dir']}/pgpass
  basebackup:
  - checkpoint: fast
  authentication:
    replication:
      username: postgres
    superuser:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: {n['dir']}
"""
    path = f"{n['dir']}/patroni.yml"
    with open(path, "w") as f:
        f.write(conf)
    os.chown(path, *postgres_ids())
    return path


def start_patroni(name):
    n = NODES[name]
    n["proc"] = subprocess.Popen(["patroni", f"{n['dir']}/patroni.yml"], user="postgres",
                                 stdout=open(f"{n['dir']}/patroni.log", "a"), stderr=subprocess.STDOUT)


def rest(name, path="patroni"):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{NODES[name]['rest']}/{path}", timeout=1) as r:
            return json.loads(r.read())
    except Exception:
        return None


def patch_config(name, body):
    req = urllib.request.Request(f"http://127.0.0.1:{NODES[name]['rest']}/config",
                                 data=json.dumps(body).encode(), method="PATCH",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()


def role_of(name):
    try:
        with psycopg.connect(node_dsn(name, "postgres"), autocommit=True) as c:
            return "primary" if not c.execute("SELECT pg_is_in_recovery()").fetchone()[0] else "replica"
    except Exception:
        return None


def lsn_int(text):
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def switch_point(dsn):
    """Where the server's newest timeline branched off: the last line of its
    newest history file ("parent TLI, LSN, reason")."""
    name = one("SELECT max(name) FROM pg_ls_waldir() WHERE name LIKE '%.history'", None, dsn)
    text = one("SELECT pg_read_file('pg_wal/' || %s)", (name,), dsn)
    return lsn_int([ln for ln in text.splitlines() if ln.strip()][-1].split()[1])


def wait_for(pred, timeout=TIMEOUT):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    return None


def primary():
    return next((n for n in NODES if role_of(n) == "primary"), None)


def streaming(replica, sync):
    """The replica streams from the primary (and is its synchronous standby if sync)."""
    p = primary()
    if p is None or p == replica or role_of(replica) != "replica":
        return False
    try:
        with psycopg.connect(node_dsn(p, "postgres"), autocommit=True) as c:
            rows = c.execute("SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'").fetchall()
    except Exception:
        return False
    return any(r[0] == "sync" for r in rows) if sync else bool(rows)


# ---------------------------------------------------------------------------
# the load
# ---------------------------------------------------------------------------
class Client(threading.Thread):
    """One client: its own connection through the multi-host string, a
    request retried with its key until it is answered."""

    def __init__(self, kind, idx, run):
        super().__init__(daemon=True)
        self.kind, self.idx, self.run_ = kind, idx, run
        self.conn = None
        self.n = 0
        self.acked = []         # (key, answer, time, port of the server that answered)
        self.retries = 0
        self.retried = []       # keys sent again after a failure

    def connect(self):
        while not self.run_.stop.is_set():
            try:
                self.conn = psycopg.connect(MULTI, autocommit=True, prepare_threshold=None)
                return True
            except Exception:
                time.sleep(0.1)
        return False

    def call(self, fn):
        """fn(conn) until it answers; the same request each time."""
        first = True
        while not self.run_.stop.is_set() or not first:
            if self.conn is None and not self.connect():
                return None
            try:
                ans = fn(self.conn)
                self.port = self.conn.info.port
                return ans
            except (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction,
                    psycopg.errors.AdminShutdown, psycopg.errors.CannotConnectNow) as e:
                self.retries += 1
                first = False
                try:
                    self.conn.close()
                except Exception:
                    pass
                self.conn = None
                time.sleep(0.05)
                if self.run_.stop.is_set() and time.time() > self.run_.hard_stop:
                    return None
        return None

    def run(self):
        while not self.run_.stop.is_set():
            self.n += 1
            key = f"fo-{self.run_.tag}-{self.kind}-{self.idx:02d}-{self.n:07d}"
            if self.kind == "order":
                ans = self.call(lambda c: c.execute(
                    "SELECT order_id, order_no, replayed FROM idem_create_order(%s, %s, 1, 1)",
                    (self.idx + 1, key)).fetchone())
            elif self.kind == "generic":
                ans = self.call(lambda c: self.generic(c, key))
            else:
                ans = self.call(lambda c: self.emit(c, key))
            if ans is not None:
                self.acked.append((key, ans, time.time(), self.port))
            if self.retries > len(self.retried):
                self.retried.append(key)

    def generic(self, c, key):
        with c.transaction():
            rep = c.execute("SELECT replayed, body FROM idem_begin(%s, 'FO_GENERIC', %s, %s)",
                            (100 + self.idx, key, json.dumps({"k": key}))).fetchone()
            if rep[0]:
                return ("replayed", rep[1]["row"])
            row = c.execute("INSERT INTO fo_generic (k) VALUES (%s) RETURNING id", (key,)).fetchone()[0]
            c.execute("SELECT idem_finish(%s, 'FO_GENERIC', %s, 201, %s)",
                      (100 + self.idx, key, json.dumps({"row": row})))
        return ("executed", row)

    def emit(self, c, key):
        # this client's account and its next number: the request names both,
        # so a retry of a committed one replays and the number is not reused
        account = self.idx
        seq = self.run_.emit_seq.setdefault(self.idx, 1)
        req = {"account": account, "n": seq}
        with c.transaction():
            rep = c.execute("SELECT replayed, body FROM idem_begin(%s, 'FO_EMIT', %s, %s)",
                            (200 + self.idx, key, json.dumps(req))).fetchone()
            if not rep[0]:
                mid = c.execute("SELECT idem_outbox_emit('fo', %s, %s)",
                                (json.dumps(req), f"account-{account}")).fetchone()[0]
                c.execute("SELECT idem_finish(%s, 'FO_EMIT', %s, 202, %s)",
                          (200 + self.idx, key, json.dumps({"message": mid, "n": seq})))
                body = {"message": mid, "n": seq}
            else:
                body = rep[1]
        self.run_.emit_seq[self.idx] = seq + 1
        return (account, body["n"], body["message"])


class TaskWorker(threading.Thread):
    """Leases one task at a time (3 s), completes it in its own transaction."""

    def __init__(self, run, idx):
        super().__init__(daemon=True)
        self.run_, self.idx = run, idx
        self.kind = "task"
        # (task_id, token, time, port, LSN) completed, the answer received:
        # the server that answered, and its WAL insert position just after
        # the completion committed (None if it was gone by then)
        self.acked = []
        self.retries = 0

    def run(self):
        conn = None
        while not self.run_.stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(MULTI, autocommit=True, prepare_threshold=None)
                row = conn.execute("SELECT task_id, token FROM idem_lease(%s, %s, interval '3 seconds')",
                                   (f"FO_LOAD_{self.run_.tag}", f"load-worker-{self.idx}")).fetchone()
                if row is None:
                    time.sleep(0.05)
                    continue
                conn.execute("SELECT idem_complete(%s, %s, 200, '{}')", row)
                port, lsn = conn.info.port, None
                try:
                    lsn = lsn_int(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
                finally:
                    self.acked.append((row[0], row[1], time.time(), port, lsn))
            except psycopg.Error as e:
                if not isinstance(e, psycopg.OperationalError) and e.sqlstate != "IK004":
                    log(f"task worker: {e!r}")
                if isinstance(e, psycopg.OperationalError):
                    self.retries += 1
                    conn = None
                time.sleep(0.05)


class Relay(threading.Thread):
    """Leases messages, appends them to the broker (a list), acknowledges."""

    def __init__(self, run, idx):
        super().__init__(daemon=True)
        self.run_, self.idx = run, idx
        self.batches = 0

    def run(self):
        conn = None
        while not self.run_.relays_stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(MULTI, autocommit=True, prepare_threshold=None)
                rows = conn.execute("SELECT message_id, msg_key, payload FROM idem_outbox_fetch('fo', 50, interval '1 second')").fetchall()
                with self.run_.lock:
                    for r in rows:
                        self.run_.broker.append((r[0], r[1], r[2], time.time()))
                if rows:
                    self.batches += 1
                    # relay 0 loses every 10th acknowledgement, as a relay
                    # killed between the broker's confirm and its ack: those
                    # messages come back when their lease lapses
                    if not (self.idx == 0 and self.batches % 10 == 0):
                        conn.execute("SELECT idem_outbox_ack(%s)", ([r[0] for r in rows],))
                else:
                    time.sleep(0.05)
            except Exception:
                conn = None
                time.sleep(0.1)


class Consumer(threading.Thread):
    """Applies the broker's messages in order: idem_consume and the effect in one transaction."""

    def __init__(self, run):
        super().__init__(daemon=True)
        self.run_ = run
        self.offset = 0

    def run(self):
        conn = None
        while not self.run_.consumer_stop.is_set() or self.offset < len(self.run_.broker):
            if self.offset >= len(self.run_.broker):
                time.sleep(0.02)
                continue
            mid, key, payload, _ = self.run_.broker[self.offset]
            try:
                if conn is None:
                    conn = psycopg.connect(MULTI, autocommit=True, prepare_threshold=None)
                with conn.transaction():
                    if conn.execute("SELECT idem_consume('fo-consumer', %s)", (str(mid),)).fetchone()[0]:
                        conn.execute("INSERT INTO fo_effect (account, n, message_id) VALUES (%s, %s, %s)",
                                     (payload["account"], payload["n"], mid))
                self.offset += 1
            except Exception as e:
                if not isinstance(e, psycopg.OperationalError):
                    log(f"consumer: {e!r}")
                conn = None
                time.sleep(0.1)


class Run:
    def __init__(self, tag):
        self.tag = tag
        self.stop = threading.Event()
        self.relays_stop = threading.Event()
        self.consumer_stop = threading.Event()
        self.hard_stop = 0
        self.lock = threading.Lock()
        self.broker = []
        self.emit_seq = {}
        self.clients = ([Client("order", i, self) for i in range(8)] +
                        [Client("generic", i, self) for i in range(4)] +
                        [Client("emit", i, self) for i in range(4)])
        self.workers = [TaskWorker(self, i) for i in range(2)]
        self.relays = [Relay(self, i) for i in range(2)]
        self.consumer = Consumer(self)

    def start(self):
        for t in self.clients + self.workers + self.relays + [self.consumer]:
            t.start()

    def finish(self):
        self.hard_stop = time.time() + TIMEOUT
        self.stop.set()
        for t in self.clients + self.workers:
            t.join(TIMEOUT)

        # the relays drain what was emitted (however long that takes, up to
        # the cap), then the consumer what they sent
        def drained():
            try:
                with psycopg.connect(MULTI, autocommit=True) as c:
                    return c.execute("SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = 'fo'").fetchone()[0] == 0
            except Exception:
                return False
        if not wait_for(drained):
            log(f"{self.tag}: the outbox still held messages after {TIMEOUT:.0f} s")
        self.relays_stop.set()
        for t in self.relays:
            t.join(TIMEOUT)
        self.consumer_stop.set()
        self.consumer.join(TIMEOUT)


def q(sql, args=None, dsn=MULTI):
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(sql, args).fetchall()


def one(sql, args=None, dsn=MULTI):
    return q(sql, args, dsn)[0][0]


# ---------------------------------------------------------------------------
# the rounds
# ---------------------------------------------------------------------------
def kill_postmaster(name):
    with open(f"{NODES[name]['dir']}/data/postmaster.pid") as f:
        os.kill(int(f.readline()), signal.SIGKILL)


def stop_patroni(name):
    NODES[name]["proc"].send_signal(signal.SIGTERM)
    NODES[name]["proc"].wait(30)


def round_(number, sync, failure):
    label = f"round {number} ({'synchronous' if sync else 'asynchronous'}, {failure})"
    old = primary()
    other = next(n for n in NODES if n != old)
    if not check(f"{label}: {other} streams from {old}{' as its synchronous standby' if sync else ''}",
                 wait_for(lambda: streaming(other, sync)), "no replica"):
        return
    check(f"{label}: before the failure the replica {other} runs no cleanup",
          one("SELECT count(*) FROM idem_cleanup_status()", None, node_dsn(other)) == 0)
    run = Run(f"r{number}")
    run.old_port, run.new_port = NODES[old]["pg"], NODES[other]["pg"]
    # leases held on the old primary when it fails: one bound to its session
    # (60 s), one plain (3 s); their tokens, a cut-off worker's
    q("SELECT idem_submit(900, 'FO_TASK', %s, '{}')", (f"fo-task-{number}-bound-000001",))
    q("SELECT idem_submit(900, 'FO_TASK', %s, '{}')", (f"fo-task-{number}-plain-000001",))
    cut_off = psycopg.connect(node_dsn(old), autocommit=True)
    bound = cut_off.execute("SELECT task_id, token FROM idem_lease('FO_TASK', 'cut-off-bound', interval '60 seconds', 1, true)").fetchone()
    plain = cut_off.execute("SELECT task_id, token FROM idem_lease('FO_TASK', 'cut-off-plain', interval '3 seconds', 1)").fetchone()
    if sync:
        # the leases are on the standby too
        wait_for(lambda: streaming(other, sync))
    q("SELECT count(*) FROM (SELECT idem_submit(901, %s, 'fo-load-task-' || lpad(g::text, 6, '0'), '{}') FROM generate_series(1, 3000) g) s",
      (f"FO_LOAD_r{number}",))
    run.start()
    time.sleep(LOAD_BEFORE)
    t_fail = time.time()
    if failure == "kill -9 of the postmaster":
        kill_postmaster(old)
    else:
        stop_patroni(old)
    new = wait_for(lambda: other if role_of(other) == "primary" else None)
    t_new = time.time()
    if not check(f"{label}: Patroni promotes {other}", new == other, f"primary now {primary()}"):
        run.finish()
        return
    time.sleep(LOAD_AFTER)
    run.finish()
    calls = sum(len(c.acked) for c in run.clients + run.workers)
    retried = sum(c.retries for c in run.clients)
    log(f"{label}: {calls} calls answered, {retried} retried, primary back after {t_new - t_fail:.1f} s")
    run.figures = (calls, retried, t_new - t_fail)
    if failure != "kill -9 of the postmaster":
        start_patroni(old)     # it rejoins as a replica for the next round

    orders = [(c, a) for c in run.clients if c.kind == "order" for a in c.acked]
    generics = [(c, a) for c in run.clients if c.kind == "generic" for a in c.acked]
    emits = [(c, a) for c in run.clients if c.kind == "emit" for a in c.acked]

    stored = {r[0]: r for r in q("""SELECT r.idempotency_key, r.resource_id, o.id FROM idem_internal.idempotency_record r
                                   LEFT JOIN idem_internal.purchase_order o ON o.owner_id = r.owner_id AND o.id = r.resource_id
                                   WHERE r.operation = 'CREATE_ORDER' AND r.idempotency_key LIKE %s""", (f"fo-r{number}-%",))}
    missing = [a[0] for _, a in orders if a[0] not in stored]
    wrong = [a[0] for _, a in orders if a[0] in stored and stored[a[0]][1] != a[1][0]]
    if sync:
        check(f"{label}: every acknowledged order ({len(orders)}) has its record and its order on the new primary",
              not missing and not wrong, f"missing {missing[:3]}, other id {wrong[:3]}")
    else:
        lost = len(missing)
        check(f"{label}: an acknowledged order the new primary lacks lost its record and its order together, none has another id ({lost} lost)",
              not wrong and one("""SELECT count(*) FROM idem_internal.idempotency_record r WHERE r.operation = 'CREATE_ORDER'
                                   AND r.idempotency_key = ANY(%s)""", ([k for k in missing],)) == 0, f"other id {wrong[:3]}")
        run.lost = lost
    check(f"{label}: no order without its record, no record without its order",
          one("""SELECT count(*) FROM idem_internal.idempotency_record r FULL JOIN idem_internal.purchase_order o
                   ON o.owner_id = r.owner_id AND o.id = r.resource_id
                 WHERE (r.operation = 'CREATE_ORDER' OR r.id IS NULL) AND (r.id IS NULL OR o.id IS NULL)""") == 0)
    check(f"{label}: each key has exactly one order (the retries included)",
          one("SELECT count(*) - count(DISTINCT (owner_id, order_no)) FROM idem_internal.purchase_order") == 0 and
          len({a[1][0] for _, a in orders}) == len({a[0] for _, a in orders}))
    retried = [k for c in run.clients if c.kind == "order" for k in c.retried]
    counts = dict(q("""SELECT r.idempotency_key, count(o.id) FROM idem_internal.idempotency_record r
                        JOIN idem_internal.purchase_order o ON o.owner_id = r.owner_id AND o.id = r.resource_id
                       WHERE r.idempotency_key = ANY(%s) GROUP BY 1""", (retried or [''],)))
    check(f"{label}: each of the {len(retried)} retried order keys has {'exactly one order' if sync else 'at most one order'}",
          retried and all(counts.get(k, 0) == 1 for k in retried) if sync else all(counts.get(k, 0) <= 1 for k in retried),
          {k: counts.get(k, 0) for k in retried[:5]})
    replays = [a for _, a in orders[-20:]]
    ok = all(one("SELECT order_id FROM idem_create_order(%s, %s, 1, 1)", (int(a[0].split('-')[3]) + 1, a[0])) == a[1][0]
             for a in replays if a[0] in stored)
    check(f"{label}: acknowledged keys replay on the new primary with their first answer", ok)
    gen_rows = dict(q("SELECT k, count(*) FROM fo_generic WHERE k LIKE %s GROUP BY k", (f"fo-r{number}-%",)))
    check(f"{label}: each generic call's row exists once ({len(generics)} acknowledged)",
          all(v == 1 for v in gen_rows.values()) and
          (not sync or all(gen_rows.get(a[0]) == 1 for _, a in generics)),
          f"{sum(1 for v in gen_rows.values() if v != 1)} keys twice")

    # the task workers' completions
    done = [(t, tok) for w in run.workers for t, tok, *_ in w.acked]
    when = {}
    for w in run.workers:
        for t, tok, _, port, lsn in w.acked:
            when.setdefault(t, []).append((port, tok, lsn))
    succeeded = dict(q("SELECT id, task_token FROM idem_internal.idempotency_record WHERE operation = %s AND status = 'SUCCEEDED'",
                       (f"FO_LOAD_r{number}",)))
    if sync:
        check(f"{label}: every task completion acknowledged to a worker ({len(done)}) is on the new primary, by its token",
              done and all(succeeded.get(t) == tok for t, tok in done), f"{sum(1 for t, tok in done if succeeded.get(t) != tok)} missing")
    twice = {t: sorted(v) for t, v in when.items() if len(v) > 1}
    if sync:
        check(f"{label}: no task completed twice (each by one token)", not twice, twice)
    else:
        # a completion the old primary acknowledged but never replicated is
        # lost with the task's result: the task runs again on the new one.
        # By commit order, not by clocks: the first completion was answered
        # by the old primary and committed past the point where the new
        # primary's timeline branched off (the WAL position read after it
        # is beyond that point, or the server was gone before it could be
        # read); the second was answered by the new primary, and is the one
        # that holds.
        branch = switch_point(node_dsn(other))

        def lost_then_redone(t, v):
            first = [e for e in v if e[0] == run.old_port]
            second = [e for e in v if e[0] == run.new_port]
            return (len(v) == 2 and len(first) == 1 and len(second) == 1 and
                    (first[0][2] is None or first[0][2] > branch) and succeeded.get(t) == second[0][1])
        check(f"{label}: a task completed twice only after its first completion was lost ({len(twice)} such)",
              all(lost_then_redone(t, v) for t, v in twice.items()), (twice, f"branch {branch:X}"))

    # tasks: the leases held on the old primary, and the cut-off worker
    def lease_all():
        return {r[0]: r[1] for r in q("SELECT task_id, token FROM idem_lease('FO_TASK', 'new-primary-worker', interval '30 seconds', 10, false)")}
    got = lease_all()
    if sync:
        check(f"{label}: a bound lease of the old primary is free on the new one at once (its session is gone)",
              bound[0] in got and got[bound[0]] > bound[1], f"leased {got}, bound {bound}")
    deadline = time.time() + TIMEOUT
    while plain[0] not in got and time.time() < deadline:
        time.sleep(0.3)
        got.update(lease_all())
    check(f"{label}: the old primary's leases are taken over on the new one, with higher fencing tokens",
          bound[0] in got and plain[0] in got and got[bound[0]] > max(bound[1], plain[1]) and got[plain[0]] > max(bound[1], plain[1]),
          f"leased {got}, old {bound} {plain}")
    stale = []
    for task, token in (bound, plain):
        try:
            with psycopg.connect(MULTI, autocommit=True) as c:
                c.execute("SELECT idem_complete(%s, %s, 200, '{}')", (task, token))
            stale.append("completed")
        except psycopg.Error as e:
            stale.append(e.sqlstate)
    check(f"{label}: the cut-off worker's tokens are refused on the new primary (IK004)", stale == ["IK004", "IK004"], stale)
    try:
        cut_off.close()
    except Exception:
        pass

    # the outbox and the inbox
    effects = q("SELECT account, n, message_id FROM fo_effect WHERE message_id = ANY(%s) ORDER BY id",
                ([a[1][2] for _, a in emits] or [0],))
    by_account = {}
    for acc, n, _ in effects:
        by_account.setdefault(acc, []).append(n)
    in_order = all(v == sorted(v) and len(v) == len(set(v)) for v in by_account.values())
    if sync:
        delivered = {m for _, _, m in effects}
        undelivered = [a for _, a in emits if a[1][2] not in delivered]
        check(f"{label}: every acknowledged emit ({len(emits)}) was delivered and applied once, each account in order",
              not undelivered and in_order and len(effects) == len(emits), f"{len(undelivered)} undelivered")
    else:
        check(f"{label}: the messages that survived were applied once each, each account in order", in_order)
    with run.lock:
        dups = len(run.broker) - len({b[0] for b in run.broker})
    check(f"{label}: the broker carried redeliveries ({dups}) and the inbox dropped each (every message applied once)",
          dups > 0 and len({m for _, _, m in effects}) == len(effects), f"{dups} redelivered")
    log(f"{label}: {len(run.broker)} messages through the broker, {dups} redelivered")
    return run, t_fail


def no_reuse(label, run, t_fail):
    """After an asynchronous failover no value is handed out again."""
    # by the server that answered, not by clocks
    before_orders = [a[1][0] for c in run.clients if c.kind == "order" for a in c.acked if a[3] == run.old_port]
    after_orders = [a[1][0] for c in run.clients if c.kind == "order" for a in c.acked if a[3] == run.new_port and not a[1][2]]
    check(f"{label}: every order id drawn after the failover is past every one acknowledged before",
          before_orders and after_orders and min(after_orders) > max(before_orders),
          f"{len(before_orders)} before, {len(after_orders)} after")
    seen = {}
    clash = 0
    for mid, key, payload, _ in run.broker:
        if mid in seen and seen[mid] != (key, json.dumps(payload, sort_keys=True)):
            clash += 1
        seen.setdefault(mid, (key, json.dumps(payload, sort_keys=True)))
    check(f"{label}: no message id was handed to two different messages (an inbox would drop the second)",
          clash == 0, f"{clash} ids reused")
    with psycopg.connect(MULTI, autocommit=True) as c:
        c.execute("CHECKPOINT")     # pg_control then holds the new primary's timeline
    mark = one("SELECT last_value FROM idem_internal.idem_timeline_seq")
    check(f"{label}: idem_internal.idem_timeline_seq records the new primary's timeline ({mark})",
          mark == one("SELECT timeline_id FROM pg_control_checkpoint()"), mark)


def main():
    if not start_etcd():
        check("etcd starts", False, "see etcd.log")
        return
    for name in NODES:
        write_config(name)
    start_patroni("node1")
    if not check("Patroni bootstraps node1 as the primary", wait_for(lambda: role_of("node1") == "primary"), "see patroni.log"):
        return
    with psycopg.connect(node_dsn("node1", "postgres"), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {DB}")
    with psycopg.connect(node_dsn("node1"), autocommit=True) as c:
        c.execute("CREATE EXTENSION idem")
        c.execute("CREATE TABLE fo_generic (id bigserial PRIMARY KEY, k text NOT NULL)")
        c.execute("CREATE TABLE fo_effect (id bigserial PRIMARY KEY, account int, n int, message_id bigint)")
    start_patroni("node2")

    figures = []
    r1 = round_(1, True, "kill -9 of the postmaster")
    if r1:
        figures.append(("synchronous, kill -9 of the postmaster",) + r1[0].figures)
        # the cleanup worker runs on the new primary, never on the standby
        p = primary()
        check("after the failover the cleanup worker runs on the new primary",
              wait_for(lambda: one("SELECT count(*) FROM idem_cleanup_status() WHERE last_run_finished > now() - interval '10 seconds'", None, node_dsn(p)) > 0),
              "no recent round")
        rep = wait_for(lambda: next((n for n in NODES if role_of(n) == "replica"), None))
        check("the old primary rejoins as a replica, and no cleanup runs there",
              rep is not None and one("SELECT count(*) FROM idem_cleanup_status()", None, node_dsn(rep)) == 0)
        # the notifier wakes a listener on the new primary
        heard = []
        with psycopg.connect(node_dsn(p), autocommit=True) as lc:
            lc.add_notify_handler(lambda n: heard.append(n.payload))
            lc.execute("LISTEN idem_outbox")
            lc.execute("LISTEN idem_tasks")
            with psycopg.connect(node_dsn(p), autocommit=True) as ec:
                ec.execute("SELECT idem_outbox_emit('fo-wake', '{}')")
                ec.execute("SELECT idem_submit(902, 'FO_WAKE', 'fo-wake-task-000001', '{}')")
            deadline = time.time() + TIMEOUT
            while time.time() < deadline:
                if "fo-wake" in heard and "FO_WAKE" in heard:
                    break
                time.sleep(0.1)
                lc.execute("SELECT 1")
        check("the notifier wakes publishers (idem_internal.idem_outbox) and task workers (idem_tasks) on the new primary",
              "fo-wake" in heard and "FO_WAKE" in heard, heard)
    r2 = round_(2, True, "its Patroni stopped")
    if r2:
        figures.append(("synchronous, Patroni stopped",) + r2[0].figures)
    try:
        patch_config(primary(), {"synchronous_mode": False})
    except Exception as e:
        check("synchronous_mode off", False, e)
    r3 = round_(3, False, "kill -9 of the postmaster")
    if r3:
        figures.append(("asynchronous, kill -9 of the postmaster",) + r3[0].figures)
        no_reuse("round 3 (asynchronous)", r3[0], r3[1])
    for f in figures:
        log("figures: {}: {} calls answered, {} retried, new primary after {:.1f} s".format(*f))


if __name__ == "__main__":
    main()
