#!/usr/bin/env bash
# The idem demo: sets up everything (packages, build, install, a throwaway
# server with idem preloaded), then replays the article's scenarios against
# it and prints what happened.
#
#   bash test/demo.sh
source "$(dirname "$0")/lib.sh"
# from a copy of the tree, as the test command: nothing is built in the checkout
run_in_copy test/demo.sh "$@"

ensure_packages
build_install
start_server

DB=idem_demo
"$PG_BINDIR/createdb" "$DB"
sql() { "$PG_BINDIR/psql" -X -q -d "$DB" -v ON_ERROR_STOP=0 -P footer=off "$@"; }
say() { printf '\n## %s\n' "$*"; }
# Run SQL from stdin in one session, going on past errors.
sql_script() { "$PG_BINDIR/psql" -X -q -d "$DB" -P footer=off -v ON_ERROR_STOP=0 || true; }

sql -c "CREATE EXTENSION idem"

say "1. Double click: the same request twice in a row"
sql -c "SELECT * FROM idem_create_order(42, '01JZ6Q4X7M9K8P2A6T3B5C1D0E', 1001, 2)" \
    -c "SELECT * FROM idem_create_order(42, '01JZ6Q4X7M9K8P2A6T3B5C1D0E', 1001, 2)" \
    -c "SELECT count(*) AS orders_for_this_key FROM idem_internal.purchase_order WHERE owner_id = 42"
echo "-> one order; the second call replayed the first response (replayed = t)."

say "2. Gateway retry: the first attempt failed, so nothing of it remains"
sql -c "BEGIN" \
    -c "SELECT * FROM idem_create_order(42, '01JZ6Q4X7M9K8P2A6T3B5C1D0F', 1002, 1)" \
    -c "ROLLBACK" \
    -c "SELECT count(*) AS records_after_rollback FROM idem_internal.idempotency_record WHERE idempotency_key = '01JZ6Q4X7M9K8P2A6T3B5C1D0F'" \
    -c "SELECT * FROM idem_create_order(42, '01JZ6Q4X7M9K8P2A6T3B5C1D0F', 1002, 1)" \
    -c "SELECT * FROM idem_create_order(42, '01JZ6Q4X7M9K8P2A6T3B5C1D0F', 1002, 1)"
echo "-> the rolled-back attempt left no claim; the retry executed, the next retry replayed."

say "3. Twenty concurrent callers with one key"
cat >"$IDEM_TMP/demo.pgbench" <<'PGB'
SELECT order_id, replayed FROM idem_create_order(43, '01JZ6Q4X7M9K8P2A6T3B5C1D10', 1003, 5) \gset
INSERT INTO demo_log VALUES (:order_id, :replayed);
PGB
sql -c "CREATE TABLE demo_log (order_id bigint, replayed boolean)"
"$PG_BINDIR/pgbench" -n -M prepared -c 20 -j 2 -t 1 -f "$IDEM_TMP/demo.pgbench" "$DB" 2>&1 |
	grep -E 'number of (clients|transactions actually processed|failed)'
sql -c "SELECT count(*) AS callers, count(DISTINCT order_id) AS distinct_order_ids,
               count(*) FILTER (WHERE NOT replayed) AS executed,
               count(*) FILTER (WHERE replayed) AS replayed FROM demo_log" \
    -c "SELECT count(*) AS orders FROM idem_internal.purchase_order WHERE owner_id = 43"
echo "-> 20 callers, 1 order: one executed, 19 replayed it (those that came while it ran waited on the key first)."

say "4. The same key reused for a different request"
sql_script <<'SQL'
SELECT * FROM idem_create_order(42, '01JZ6Q4X7M9K8P2A6T3B5C1D0E', 1001, 3);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SQL
echo "-> SQLSTATE IK001: refused, never silently replayed (HTTP 409, or 422)."

say "5. A duplicate while the original is still in flight"
gate_close sql
"$PG_BINDIR/psql" -X -q -d "$DB" -c "BEGIN" \
	-c "SELECT order_no FROM idem_create_order(44, '01JZ6Q4X7M9K8P2A6T3B5C1D11', 1004, 1)" \
	-c "SELECT $(gate_lock)" -c "COMMIT" >/dev/null &
original=$!
gate_waited sql		# the original claimed its key and is held open
start=$(date +%s%N)
sql_script <<'SQL'
SET idem.wait_timeout = '1s';
SELECT * FROM idem_create_order(44, '01JZ6Q4X7M9K8P2A6T3B5C1D11', 1004, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SQL
echo "-> SQLSTATE IK002 after waiting $(( ($(date +%s%N) - start) / 1000000 )) ms (idem.wait_timeout = 1s): answer 409 with Retry-After."
gate_open sql
wait "$original"
sql -c "SELECT * FROM idem_create_order(44, '01JZ6Q4X7M9K8P2A6T3B5C1D11', 1004, 1)"
echo "-> once the original committed, the retry replayed it."

say "6. An expired key starts afresh"
sql -c "UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 second' WHERE owner_id = 42 AND idempotency_key = '01JZ6Q4X7M9K8P2A6T3B5C1D0E'" \
    -c "SELECT * FROM idem_create_order(42, '01JZ6Q4X7M9K8P2A6T3B5C1D0E', 1001, 3)"
echo "-> the record had expired: the request executed as new (replayed = f)."

say "7. Batch cleanup of expired records"
sql -c "UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 second' WHERE owner_id = 43" \
    -c "SELECT idem_cleanup_expired(batch_size => 1000) AS deleted" \
    -c "SELECT owner_id, idempotency_key, status, http_status, response_json FROM idem_internal.idempotency_record ORDER BY id"

say "8. The background cleanup worker"
sql -c "UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 second' WHERE owner_id = 44" \
    -c "SELECT count(*) AS expired_now FROM idem_internal.idempotency_record WHERE expires_at < now()"
echo "-> the server started with idem.cleanup_interval = 60s; pace it at one round a second:"
sql -c "ALTER SYSTEM SET idem.cleanup_interval = '1s'" -c "SELECT pg_reload_conf()" >/dev/null
until_sql 0 sql -At -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()"
sql -c "SELECT count(*) AS expired_now FROM idem_internal.idempotency_record WHERE expires_at < now()" \
    -c "SELECT datname, last_run_deleted, total_deleted, runs, last_error FROM idem_cleanup_status()"
echo "-> the worker deleted it by itself; idem_cleanup_status() shows what it did."

say "9. Any operation: an account debited exactly once (idem_begin / idem_finish, idem_run)"
sql_script <<'SQL'
CREATE TABLE account (id bigint PRIMARY KEY, balance numeric NOT NULL);
INSERT INTO account VALUES (7, 1000);
BEGIN;
SELECT * FROM idem_begin(42, 'DEBIT', '01JZ6Q4X7M9K8P2A6T3B5C1D20', '{"account": 7, "amount": 100}');
UPDATE account SET balance = balance - 100 WHERE id = 7;
SELECT idem_finish(42, 'DEBIT', '01JZ6Q4X7M9K8P2A6T3B5C1D20', 201, '{"debited": 100,  "account": 7}');
COMMIT;
SELECT * FROM idem_begin(42, 'DEBIT', '01JZ6Q4X7M9K8P2A6T3B5C1D20', '{"amount": 100, "account": 7}');
CREATE FUNCTION debit_handler(request jsonb) RETURNS idem_result LANGUAGE plpgsql AS $$
BEGIN
    UPDATE public.account SET balance = balance - (request->>'amount')::numeric
    WHERE id = (request->>'account')::bigint AND balance >= (request->>'amount')::numeric;
    IF NOT FOUND THEN
        RETURN ROW(422, '{"error": "insufficient funds"}', NULL, NULL)::idem_result;
    END IF;
    RETURN ROW(201, json_build_object('debited', request->'amount'), '{"Location": "/accounts/7"}', NULL)::idem_result;
END $$;
SELECT * FROM idem_run(42, 'DEBIT', '01JZ6Q4X7M9K8P2A6T3B5C1D21', '{"account": 7, "amount": 100}', 'debit_handler(jsonb)');
SELECT * FROM idem_run(42, 'DEBIT', '01JZ6Q4X7M9K8P2A6T3B5C1D21', '{"account": 7, "amount": 100}', 'debit_handler(jsonb)');
SELECT * FROM idem_run(42, 'DEBIT', '01JZ6Q4X7M9K8P2A6T3B5C1D22', '{"account": 7, "amount": 5000}', 'debit_handler(jsonb)');
SELECT balance FROM account WHERE id = 7;
BEGIN;
SELECT replayed FROM idem_begin(42, 'DEBIT', '01JZ6Q4X7M9K8P2A6T3B5C1D23', '{"account": 7, "amount": 100}');
UPDATE account SET balance = balance - 100 WHERE id = 7;
COMMIT;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT balance FROM account WHERE id = 7;
SQL
echo "-> each key debited once; the replays returned the stored body byte for byte (and headers);"
echo "   a 4xx result (insufficient funds) is stored and replayed too; a claim without idem_finish"
echo "   cannot commit (IK005), so its debit rolled back."

say "10. Outbox and inbox: an order event delivered and applied exactly once"
sql_script <<'SQL'
CREATE FUNCTION ship_handler(request jsonb) RETURNS idem_result LANGUAGE plpgsql AS $$
BEGIN
    -- the event is written in the transaction of the business work
    PERFORM idem_outbox_emit('orders', request, 'customer-' || (request->>'customer'));
    RETURN ROW(202, '{"accepted": true}', NULL, NULL)::idem_result;
END $$;
SELECT replayed FROM idem_run(42, 'SHIP', '01JZ6Q4X7M9K8P2A6T3B5C1D30', '{"customer": 9, "order": 1}', 'ship_handler(jsonb)');
SELECT replayed FROM idem_run(42, 'SHIP', '01JZ6Q4X7M9K8P2A6T3B5C1D30', '{"customer": 9, "order": 1}', 'ship_handler(jsonb)');
BEGIN;
SELECT idem_outbox_emit('orders', '{"customer": 9, "order": 2}', 'customer-9') AS rolled_back_message;
ROLLBACK;
SELECT message_id, msg_key, payload, attempt FROM idem_outbox_fetch('orders', 10);
-- the consumer's transaction, twice: the broker redelivered the message
BEGIN;
SELECT idem_consume('billing', 'orders/0/1') AS first_delivery;
COMMIT;
BEGIN;
SELECT idem_consume('billing', 'orders/0/1') AS redelivery;
COMMIT;
SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_internal.idem_outbox)) AS acknowledged;
SQL
echo "-> the replayed request emitted nothing and the rolled-back one left no message: one message"
echo "   for one order; the redelivered message is recognised (false) and not applied twice."

say "11. A long flow: committed as PROCESSING, leased to a worker, taken over, completed once"
sql_script <<'SQL'
-- the request: 202 and a task, committed at once; a repeat reports the state
SELECT replayed, status, http_status, task_id FROM idem_submit(42, 'REFUND', '01JZ6Q4X7M9K8P2A6T3B5C1D40', '{"order": 1, "amount": 30}');
SELECT replayed, status, http_status, task_id FROM idem_submit(42, 'REFUND', '01JZ6Q4X7M9K8P2A6T3B5C1D40', '{"amount": 30, "order": 1}');
-- worker A leases it for 100 ms and stalls on the payment provider
CREATE TEMP TABLE lease_a AS SELECT task_id, token, attempt FROM idem_lease('REFUND', 'worker-a', '100 milliseconds');
SELECT attempt FROM lease_a;
SELECT pg_sleep(0.2);
-- its lease lapsed: worker B takes the task over, with a greater token
CREATE TEMP TABLE lease_b AS SELECT task_id, token, attempt FROM idem_lease('REFUND', 'worker-b');
SELECT b.attempt, b.token > a.token AS greater_token FROM lease_a a, lease_b b;
-- B's first try fails transiently: retried after a backoff
SELECT idem_fail(task_id, token, '{"provider": "timeout"}') FROM lease_b;
SELECT replayed, status, http_status FROM idem_submit(42, 'REFUND', '01JZ6Q4X7M9K8P2A6T3B5C1D40', '{"order": 1, "amount": 30}');
SELECT pg_sleep(1.1);
CREATE TEMP TABLE lease_c AS SELECT task_id, token, attempt FROM idem_lease('REFUND', 'worker-b');
SELECT attempt FROM lease_c;
SELECT idem_complete(task_id, token, 201, '{"refund": "R-1"}') FROM lease_c;
-- worker A wakes up and tries to complete with its stale token: IK004
\set VERBOSITY terse
SELECT idem_complete(task_id, token, 201, '{"refund": "R-by-A"}') FROM lease_a;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT replayed, status, http_status, body FROM idem_submit(42, 'REFUND', '01JZ6Q4X7M9K8P2A6T3B5C1D40', '{"order": 1, "amount": 30}');
SQL
echo "-> one task for the key; worker A's lease lapsed and B took over (attempt 2, a greater token);"
echo "   a transient failure was retried after its backoff (attempt 3); A's late complete was fenced"
echo "   off (IK004); the client's repeat gets 202 while it runs and the stored 201 once it is done."

say "Fingerprints: RFC 8785 canonical JSON, then SHA-256"
sql -c "SELECT idem_canonical_json('{\"sku\": 1001, \"qty\": 2.0}') AS canonical,
               idem_request_hash('{\"qty\":2,\"sku\":1001}') = idem_request_hash('{\"sku\": 1001, \"qty\": 2.0}') AS same_hash"
echo
echo "Demo done; the server is stopped and removed."
