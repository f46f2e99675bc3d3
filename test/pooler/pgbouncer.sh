#!/usr/bin/env bash
# idem behind PgBouncer in transaction pooling (issue 27): PgBouncer
# (Debian's 1.18) on loopback in front of a throwaway server, pool_mode =
# transaction, 10 server connections per role, 50 pgbench clients, no
# server-side prepared statement on the client side (pgbench -M extended:
# unnamed statements only; 1.18 does not carry named ones across
# transactions).  Through it: the article's seven tests (idem_create_order
# and idem_run), the generic API (idem_begin/idem_finish), the outbox and the
# inbox (per-key order, redeliveries deduplicated), long flows (leases,
# heartbeats, completes, takeovers, stale tokens); what needs a server
# session: a bind_session lease binds the pooled server session, not the
# client; idem.allowed_owners and idem.allowed_operations bind a role in
# every pooled session and the role cannot change them.  The Python
# library's HTTP contract behind PgBouncer is the clients_python stage's.
#
# Prints one "ok - ..." or "not ok - ..." line per check.
#
#   bash test/pooler/pgbouncer.sh        (test/run_all.sh runs it)
source "$(dirname "$0")/../lib.sh"

CLIENTS=50
POOL=10

ensure_packages
ensure_service_packages pgbouncer
[ -n "${IDEM_PG_ORIGIN:-}" ] || build_install	# run alone: a build of its own

port=$(free_port)
start_server "listen_addresses = '127.0.0.1'" "port = $port" "idem.cleanup_interval = 0" "max_connections = 100"
export PGHOST=127.0.0.1 PGPORT=$port
DB=idem_pool
direct() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -At -d "$DB" "$@"; }
"$PG_BINDIR/createdb" "$DB"
direct >/dev/null <<'SQL'
CREATE EXTENSION idem;
CREATE ROLE pool_app LOGIN;
CREATE ROLE pool_bound LOGIN;
SELECT count(*) FROM idem_grant('pool_app', 'app');
SELECT count(*) FROM idem_grant('pool_app', 'worker');
SELECT count(*) FROM idem_grant('pool_app', 'publisher');
SELECT count(*) FROM idem_grant('pool_app', 'consumer');
SELECT count(*) FROM idem_grant('pool_bound', 'app');
ALTER ROLE pool_app SET idem.allowed_owners = '1-9999';
ALTER ROLE pool_bound SET idem.allowed_owners = '7';
ALTER ROLE pool_bound SET idem.allowed_operations = 'CREATE_ORDER';
CREATE TABLE pool_ledger (id bigserial PRIMARY KEY, owner_id bigint, amount int);
CREATE FUNCTION pool_pay(request jsonb) RETURNS idem_result LANGUAGE plpgsql AS $$
DECLARE id bigint;
BEGIN
    INSERT INTO pool_ledger (owner_id, amount)
    VALUES ((request->>'owner')::bigint, (request->>'amount')::int) RETURNING pool_ledger.id INTO id;
    RETURN ROW(201, json_build_object('entry', id), NULL, id)::idem_result;
END $$;
CREATE TABLE pool_round (round_key text, order_id bigint, replayed boolean);
CREATE TABLE pool_effect (k int, client int);
CREATE TABLE pool_counter (client int PRIMARY KEY, n int NOT NULL DEFAULT 0);
INSERT INTO pool_counter SELECT generate_series(0, 49);	-- pgbench's client ids
CREATE TABLE pool_delivered (id bigserial PRIMARY KEY, client int, n int, message_id bigint);
CREATE TABLE pool_task_effect (task_id bigint, token bigint);
GRANT EXECUTE ON FUNCTION pool_pay(jsonb) TO pool_app;
GRANT SELECT, INSERT, UPDATE ON pool_ledger, pool_round, pool_effect, pool_counter, pool_delivered, pool_task_effect TO pool_app;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO pool_app;
SQL

# PgBouncer: one pool of POOL server connections per role, on loopback
W=$IDEM_TMP/pgbouncer
mkdir -p "$W"
BPORT=$(free_port)
printf '"postgres" ""\n"pool_app" ""\n"pool_bound" ""\n' >"$W/users.txt"
cat >"$W/pgbouncer.ini" <<INI
[databases]
$DB = host=127.0.0.1 port=$PGPORT dbname=$DB
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $BPORT
unix_socket_dir =
auth_type = trust
auth_file = $W/users.txt
pool_mode = transaction
default_pool_size = $POOL
max_client_conn = 200
ignore_startup_parameters = extra_float_digits, options
logfile = $W/pgbouncer.log
pidfile = $W/pgbouncer.pid
INI
chown -R postgres: "$W"
bouncer_pid=
bouncer_start() {
	runuser -u postgres -- pgbouncer "$W/pgbouncer.ini" >/dev/null 2>&1 &
	bouncer_pid=$!
	until_ok "$PG_BINDIR/psql" -X -q -h 127.0.0.1 -p "$BPORT" -U postgres -d "$DB" -c 'SELECT 1'
}
bouncer_stop() {
	[ -n "$bouncer_pid" ] || return 0
	kill "$bouncer_pid" 2>/dev/null || true
	wait "$bouncer_pid" 2>/dev/null || true
	bouncer_pid=
}
at_exit bouncer_stop
if ! bouncer_start; then
	echo "not ok - pgbouncer: PgBouncer starts in transaction pooling"
	exit 0
fi
echo "ok - pgbouncer: PgBouncer $(pgbouncer --version | awk 'NR == 1 {print $2}') in pool_mode = transaction, $POOL server connections per role"

# through the pooler, as ROLE (pool_app unless given)
pooled() {	# pooled [-U ROLE] psql-args...
	local role=pool_app
	[ "${1:-}" = -U ] && { role=$2; shift 2; }
	"$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -At -h 127.0.0.1 -p "$BPORT" -U "$role" -d "$DB" "$@"
}
sqlstate() {	# sqlstate [-U ROLE] SQL: the SQLSTATE the statement fails with through the pooler
	local role=pool_app
	[ "$1" = -U ] && { role=$2; shift 2; }
	"$PG_BINDIR/psql" -X -q -At -h 127.0.0.1 -p "$BPORT" -U "$role" -d "$DB" \
		-v VERBOSITY=sqlstate -c "\\set VERBOSITY sqlstate" -c "$1" 2>&1 >/dev/null | sed -n 's/^ERROR:  //p' | head -1
}
bench() {	# bench NAME pgbench-args...: through the pooler as pool_app; prints the failures
	local name=$1 out
	shift
	out=$("$PG_BINDIR/pgbench" -n -M extended -h 127.0.0.1 -p "$BPORT" -U pool_app "$@" "$DB" 2>&1) ||
		{ log "pgbench $name failed:"; echo "$out" | grep -m3 -i "error" >&2; echo failed; return; }
	echo "$out" | sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p'
}
server_conns() {	# the server connections of pool_app's pool, now
	direct -c "SELECT count(*) FROM pg_stat_activity WHERE usename = 'pool_app' AND datname = '$DB'"
}

# ---- the article's seven tests, through the pooler ----
first=$(pooled -c "SELECT order_id, order_no, status, http_status, replayed FROM idem_create_order(1, 'pool-order-000001', 5, 2)")
second=$(pooled -c "SELECT order_id, order_no, status, http_status, replayed FROM idem_create_order(1, 'pool-order-000001', 5, 2)")
check "1. create_order: twice in a row through the pooler, one order" 1 \
	"$(direct -c "SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id = 1")"
check "6. create_order: the replay returns the first answer" "${first%|f}|t" "$second"
check "3. create_order: the key with another request is IK001" IK001 \
	"$(sqlstate "SELECT * FROM idem_create_order(1, 'pool-order-000001', 5, 3)")"
first=$(pooled -c "SELECT http_status, body, resource_id, replayed FROM idem_run(1, 'PAY', 'pool-pay-0000001', '{\"owner\": 1, \"amount\": 10}', 'pool_pay(jsonb)')")
second=$(pooled -c "SELECT http_status, body, resource_id, replayed FROM idem_run(1, 'PAY', 'pool-pay-0000001', '{\"owner\": 1, \"amount\": 10}', 'pool_pay(jsonb)')")
check "1. idem_run: twice in a row, one ledger entry" 1 "$(direct -c "SELECT count(*) FROM pool_ledger WHERE owner_id = 1")"
check "6. idem_run: the replay returns the same status, body and resource" "${first%|f}|t" "$second"
check "3. idem_run: the key with another request is IK001" IK001 \
	"$(sqlstate "SELECT * FROM idem_run(1, 'PAY', 'pool-pay-0000001', '{\"owner\": 1, \"amount\": 11}', 'pool_pay(jsonb)')")"
pooled -c "BEGIN" -c "SELECT * FROM idem_create_order(2, 'pool-order-000002', 5, 1)" -c "ROLLBACK" >/dev/null
pooled -c "BEGIN" -c "SELECT * FROM idem_run(2, 'PAY', 'pool-pay-0000002', '{\"owner\": 2, \"amount\": 3}', 'pool_pay(jsonb)')" -c "ROLLBACK" >/dev/null
check "4. a first attempt rolled back: the retries execute, one order and one entry" "f f 1 1" \
	"$(pooled -c "SELECT replayed FROM idem_create_order(2, 'pool-order-000002', 5, 1)") $(pooled -c "SELECT replayed FROM idem_run(2, 'PAY', 'pool-pay-0000002', '{\"owner\": 2, \"amount\": 3}', 'pool_pay(jsonb)')") $(direct -c "SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id = 2") $(direct -c "SELECT count(*) FROM pool_ledger WHERE owner_id = 2")"
check "5. no cache in front: a duplicate record written around idem fails on the unique index (23505)" 23505 \
	"$(sqlstate -U postgres "INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
	             VALUES (2, 'CREATE_ORDER', 'pool-order-000002', repeat('0', 64), 'PROCESSING', now() + interval '1 day')")"
for o in 3 4; do
	pooled -c "SELECT * FROM idem_create_order($o, 'pool-shared-key-01', 7, 1)" >/dev/null
done
check "7. two owners, one key: two orders, both executed" "2 2" \
	"$(direct -c "SELECT count(*), count(DISTINCT resource_id) FROM idem_internal.idempotency_record WHERE idempotency_key = 'pool-shared-key-01'" | tr '|' ' ')"

# 2. $CLIENTS clients on one key at once, 10 rounds, over $POOL server connections
cat >"$W/same_key.pgbench" <<'PGB'
SELECT order_id, replayed FROM idem_create_order(5, :key, 1001, 1) \gset
INSERT INTO pool_round (round_key, order_id, replayed) VALUES (:key, :order_id, :replayed);
PGB
# the most server connections pool_app has while the rounds run, sampled
( max=0; while :; do c=$(server_conns 2>/dev/null) || break; [ "${c:-0}" -gt "$max" ] && max=$c && echo "$max" >"$W/max_conns"; sleep 0.05; done ) &
sampler=$!
fails=0
for round in $(seq 1 10); do
	n=$(bench "round $round" -c "$CLIENTS" -j 2 -t 1 -D key="$(printf 'pool-round-%06d' "$round")" -f "$W/same_key.pgbench")
	[ "$n" = 0 ] || fails=$((fails + 1))
done
check "2. load: 10 rounds of $CLIENTS clients on one key each through $POOL server connections, no failed transaction" 0 "$fails"
check "2. load: one order per round, every caller the same order, one executed and $((CLIENTS - 1)) replayed" "10 10" \
	"$(direct -c "SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id = 5") $(direct -c "SELECT count(*) FROM (SELECT round_key FROM pool_round GROUP BY round_key
	          HAVING count(*) = $CLIENTS AND count(DISTINCT order_id) = 1 AND count(*) FILTER (WHERE NOT replayed) = 1) s")"
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true
check "2. load: the $CLIENTS clients shared $POOL server connections (most seen at once: $(cat "$W/max_conns" 2>/dev/null))" yes \
	"$(c=$(cat "$W/max_conns" 2>/dev/null || echo 0); [ "$c" -ge 2 ] && [ "$c" -le "$POOL" ] && echo yes || echo "$c")"

# ---- the generic API: idem_begin + the business write + idem_finish in one transaction ----
cat >"$W/generic.pgbench" <<'PGB'
\set k random(1, 300)
BEGIN;
SELECT replayed FROM idem_begin(6, 'POOL_GENERIC', 'pool-generic-' || lpad(CAST(:k AS text), 6, '0'), jsonb_build_object('k', CAST(:k AS int))) \gset
\if :replayed
\else
INSERT INTO pool_effect (k, client) VALUES (CAST(:k AS int), CAST(:client_id AS int));
SELECT idem_finish(6, 'POOL_GENERIC', 'pool-generic-' || lpad(CAST(:k AS text), 6, '0'), 201, json_build_object('k', CAST(:k AS int)));
\endif
COMMIT;
PGB
check "generic API: $CLIENTS clients, 2,000 calls over 300 keys, no failed transaction" 0 \
	"$(bench generic -c "$CLIENTS" -j 2 -t 40 -f "$W/generic.pgbench")"
check "generic API: each key executed once (one effect, one finished record, its body)" "0 0" \
	"$(direct -c "SELECT (SELECT count(*) - count(DISTINCT k) FROM pool_effect),
	                     (SELECT count(*) FROM pool_effect e WHERE NOT EXISTS (SELECT 1 FROM idem_internal.idempotency_record r
	                         WHERE r.owner_id = 6 AND r.idempotency_key = 'pool-generic-' || lpad(e.k::text, 6, '0') AND r.status = 'SUCCEEDED'
	                           AND r.response_body->>'k' = e.k::text))" | tr '|' ' ')"
check "generic API: a replay through the pooler returns the finished answer" "t|201" \
	"$(k=$(direct -c "SELECT min(k) FROM pool_effect"); pooled -c "SELECT replayed, http_status FROM idem_begin(6, 'POOL_GENERIC', 'pool-generic-' || lpad('$k', 6, '0'), jsonb_build_object('k', $k))")"

# ---- the outbox and the inbox: each of 50 keys gets 20 messages in order
# (a client's own key, 10 % of its transactions rolled back); 10 relays
# fetch, consume (idem_consume with the effect) and acknowledge, a fifth of
# the acknowledgements skipped, so those messages come back when their
# 1-second lease lapses and the inbox drops them ----
cat >"$W/emit.pgbench" <<'PGB'
BEGIN;
UPDATE pool_counter SET n = n + 1 WHERE client = CAST(:client_id AS int) RETURNING n \gset
SELECT idem_outbox_emit('pool', jsonb_build_object('client', CAST(:client_id AS int), 'n', CAST(:n AS int)), 'client-' || CAST(:client_id AS text)) > 0 AS emitted \gset
\set undo random(1, 10)
\if :undo = 1
ROLLBACK;
\else
COMMIT;
\endif
PGB
emit_fails=$(bench emit -c "$CLIENTS" -j 2 -t 24 -f "$W/emit.pgbench")
cat >"$W/relay.pgbench" <<'PGB'
BEGIN;
WITH f AS (SELECT * FROM idem_outbox_fetch('pool', 20, interval '1 second')),
     e AS (INSERT INTO pool_delivered (client, n, message_id)
           SELECT (f.payload->>'client')::int, (f.payload->>'n')::int, f.message_id FROM f
            WHERE idem_consume('pool-consumer', f.message_id::text) RETURNING 1)
SELECT coalesce(array_agg(f.message_id), '{}') AS ids, (SELECT count(*) FROM e) AS applied FROM f \gset
\set lost random(1, 5)
\if :lost > 1
SELECT idem_outbox_ack(CAST(:ids AS bigint[])) AS acked \gset
\endif
COMMIT;
PGB
relay_fails=0
deadline=$((SECONDS + IDEM_WAIT))
while [ "$SECONDS" -lt "$deadline" ]; do
	[ "$(direct -c "SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = 'pool'")" = 0 ] && break
	n=$(bench relay -c 10 -j 2 -T 1 --random-seed=26 -f "$W/relay.pgbench")
	[ "$n" = 0 ] || relay_fails=$((relay_fails + 1))
	sleep 0.5
done
emitted=$(direct -c "SELECT sum(n) FROM pool_counter")
check "outbox: $CLIENTS emitting clients and 10 relays through the pooler, no failed transaction" "0 0" "$emit_fails $relay_fails"
check "outbox: every committed message delivered and acknowledged, none rolled back" "0 $emitted" \
	"$(direct -c "SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = 'pool'") $(direct -c "SELECT count(*) FROM pool_delivered")"
check "inbox: the redeliveries of unacknowledged messages were dropped (each message applied once)" "yes 0" \
	"$(direct -c "SELECT CASE WHEN inbox_duplicates > 0 THEN 'yes' ELSE 'none: ' || inbox_duplicates END FROM idem_stats
	              WHERE datname = current_database() AND kind = 'consumer' AND operation = 'pool-consumer'") $(direct -c "SELECT count(*) - count(DISTINCT message_id) FROM pool_delivered")"
check "outbox: each key's messages applied in commit order (1, 2, 3, ... with no gap)" 0 \
	"$(direct -c "SELECT count(*) FROM (SELECT client, array_agg(n ORDER BY id) AS got, max(n) AS last FROM pool_delivered GROUP BY client) s
	              WHERE got <> ARRAY(SELECT generate_series(1, s.last))")"

# ---- long flows: leases, heartbeats, completes, takeovers ----
direct -c "SELECT count(*) FROM (SELECT idem_submit(8, 'POOL_TASK', 'pool-task-' || lpad(g::text, 6, '0'), jsonb_build_object('g', g))
                                   FROM generate_series(1, 300) g) s" >/dev/null
cat >"$W/worker.pgbench" <<'PGB'
SELECT coalesce(max(task_id), 0) AS task_id, coalesce(max(token), 0) AS token FROM idem_lease('POOL_TASK', 'pool-worker-' || CAST(:client_id AS text), interval '30 seconds') \gset
\if :task_id > 0
SELECT idem_heartbeat(CAST(:task_id AS bigint), CAST(:token AS bigint)) IS NOT NULL AS beat \gset
BEGIN;
INSERT INTO pool_task_effect (task_id, token) VALUES (CAST(:task_id AS bigint), CAST(:token AS bigint));
SELECT idem_complete(CAST(:task_id AS bigint), CAST(:token AS bigint), 200, json_build_object('done', CAST(:task_id AS bigint)));
COMMIT;
\endif
PGB
worker_fails=0
for _ in $(seq 1 10); do
	[ "$(direct -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'POOL_TASK' AND status = 'PROCESSING'")" = 0 ] && break
	n=$(bench worker -c 20 -j 2 -t 16 -f "$W/worker.pgbench")
	[ "$n" = 0 ] || worker_fails=$((worker_fails + 1))
done
check "tasks: 20 workers leasing, heartbeating and completing in separate transactions through the pooler, no failed transaction" 0 "$worker_fails"
check "tasks: every task completed once, by the token that leased it" "300 300 0" \
	"$(direct -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'POOL_TASK' AND status = 'SUCCEEDED'") $(direct -c "SELECT count(DISTINCT task_id) FROM pool_task_effect") $(direct -c "SELECT count(*) FROM pool_task_effect e JOIN idem_internal.idempotency_record r ON r.id = e.task_id WHERE r.task_token <> e.token")"
direct -c "SELECT count(*) FROM (SELECT idem_submit(8, 'POOL_TAKEOVER', 'pool-takeover-0001', '{}')) s" >/dev/null
old=$(pooled -c "SELECT task_id || ' ' || token FROM idem_lease('POOL_TAKEOVER', 'pool-slow', interval '1 second')")
sleep 1.2
new=$(pooled -c "SELECT task_id || ' ' || token FROM idem_lease('POOL_TAKEOVER', 'pool-fast', interval '30 seconds')")
check "takeover: a lapsed lease is taken over through the pooler, the fencing token goes up" yes \
	"$([ "${new%% *}" = "${old%% *}" ] && [ "${new##* }" -gt "${old##* }" ] && echo yes || echo "old '$old' new '$new'")"
check "takeover: the cut-off worker's complete is refused (IK004), the new holder's goes through" "IK004 SUCCEEDED" \
	"$(sqlstate "SELECT idem_complete(${old%% *}, ${old##* }, 200, '{}')") $(pooled -c "SELECT idem_complete(${new%% *}, ${new##* }, 200, '{}')" >/dev/null; direct -c "SELECT status FROM idem_internal.idempotency_record WHERE id = ${new%% *}")"

# ---- what needs a server session: bind_session binds the pooled server
# session; the client's exit does not end it, the pooler's does ----
direct -c "SELECT count(*) FROM (SELECT idem_submit(8, 'POOL_BOUND', 'pool-bound-task-0001', '{}')) s" >/dev/null
bound=$(pooled -c "SELECT task_id FROM idem_lease('POOL_BOUND', 'pool-bound-worker', interval '60 seconds', 1, true)")
check "bind_session through the pooler: the lease is bound (task_session set)" t \
	"$(direct -c "SELECT task_session IS NOT NULL FROM idem_internal.idempotency_record WHERE id = $bound")"
check "bind_session through the pooler: the client has gone, the pooled server session holds the lease" 0 \
	"$(direct -c "SELECT count(*) FROM idem_lease('POOL_BOUND', 'pool-other-worker', interval '60 seconds')")"
bouncer_stop
until_sql 0 direct -c "SELECT count(*) FROM pg_stat_activity WHERE usename = 'pool_app'" || true
check "bind_session through the pooler: once PgBouncer closes its server sessions the lease is free at once (60 s lease)" "$bound" \
	"$(direct -c "SELECT task_id FROM idem_lease('POOL_BOUND', 'pool-other-worker', interval '60 seconds')")"
bouncer_start || echo "not ok - pgbouncer: PgBouncer restarts"

# ---- idem.allowed_owners and idem.allowed_operations per role, in every pooled session ----
check "a bound role through the pooler acts for its owner" f \
	"$(pooled -U pool_bound -c "SELECT replayed FROM idem_create_order(7, 'pool-bound-order-1', 1, 1)")"
fails=0
for i in $(seq 1 12); do	# more calls than the role's pool has server connections
	[ "$(sqlstate -U pool_bound "SELECT * FROM idem_create_order(8, 'pool-bound-order-$i', 1, 1)")" = 42501 ] || fails=$((fails + 1))
done
check "a bound role through the pooler: another owner is 42501 in every pooled session (12 calls)" 0 "$fails"
check "a bound role: an operation outside idem.allowed_operations is 42501" 42501 \
	"$(sqlstate -U pool_bound "SELECT * FROM idem_begin(7, 'PAY', 'pool-bound-pay-01', '{}')")"
check "a bound role cannot change its binding: SET, SET LOCAL and set_config are refused (42501)" "42501 42501 42501" \
	"$(sqlstate -U pool_bound "SET idem.allowed_owners = ''") $(sqlstate -U pool_bound "BEGIN; SET LOCAL idem.allowed_owners = '8'; SELECT 1") $(sqlstate -U pool_bound "SELECT set_config('idem.allowed_operations', '', false)")"
check "the binding is the role's: pool_app, through the same pooler, acts for owner 8" f \
	"$(pooled -c "SELECT replayed FROM idem_create_order(8, 'pool-app-order-8', 1, 1)")"
check "nothing was written for the refused calls" "0 0" \
	"$(direct -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'pool-bound-order-%' AND owner_id = 8") $(direct -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE idempotency_key = 'pool-bound-pay-01'")"
