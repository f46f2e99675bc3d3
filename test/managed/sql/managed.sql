-- The SQL edition (managed/idem.sql) as its callers meet it: an
-- application role granted the "app" kind, a publisher, a role bound to
-- its owners.  The installer's own checks are test/managed/run.sh's.
\set SHOW_CONTEXT never
\set VERBOSITY default
SET client_min_messages = warning;
CREATE ROLE managed_app LOGIN;
CREATE ROLE managed_pub LOGIN;
CREATE ROLE managed_other NOLOGIN;
GRANT managed_other TO managed_app;
SET ROLE idem_owner;
SELECT * FROM idem.idem_grant('managed_app', 'app');
SELECT count(*) FROM idem.idem_grant('managed_other', 'app');
SELECT * FROM idem.idem_grant('managed_pub', 'publisher');
SELECT * FROM idem.idem_grant('managed_app', 'worker');
SELECT * FROM idem.idem_grant('managed_app', 'nobody');
RESET ROLE;

-- canonical text and fingerprints: RFC 8785's numbers, UTF-16 member order
SELECT idem.idem_canonical_json('{"b": [1e21, 1e-7, 1e23, 5e-324, 0.1, -0.0, 100, 1.5e300, 123456789012345678], "a": {"\u00e9": 1, "z": "x\"\n\u0001"}}');
SELECT idem.idem_canonical_json('{"\ud83d\ude00": 1, "\ufb33": 2, "\uffff": 3, "a": 4}');
SELECT idem.idem_request_hash('{"amount": 10, "currency": "EUR"}') = idem.idem_request_hash('{"currency":"EUR","amount":1e1}') AS same_request;
SELECT idem.idem_canonical_json('{"n": 1e400}');

\c - managed_app
SET client_min_messages = warning;
-- the article's order: a double click replays, another request is IK001
SELECT * FROM idem.idem_create_order(7, 'order-key-000000000001', 42, 3);
SELECT * FROM idem.idem_create_order(7, 'order-key-000000000001', 42, 3);
SELECT * FROM idem.idem_create_order(7, 'order-key-000000000001', 42, 4);
SELECT * FROM idem.idem_create_order(7, 'short', 42, 3);
SELECT * FROM idem.idem_create_order(7, 'order-key-000000000002', 42, 101);
-- the generic API
BEGIN;
SELECT replayed, http_status, body FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000001', '{"amount": 10}');
SELECT replayed, http_status, body, headers, resource_id, header_list
  FROM idem.idem_finish_stored(7, 'PAY', 'pay-key-00000000000001', 201, '{"paid": 10}', 55, NULL,
                               '[["Set-Cookie", "a=1"], ["set-cookie", "b=2"]]');
COMMIT;
SELECT replayed, http_status, body, headers, resource_id FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000001', '{"amount": 1e1}');
SELECT replayed FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000001', '{"amount": 11}');
-- a 4xx is a finished result too; a 5xx is refused (roll back instead)
BEGIN;
SELECT replayed FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000002', '{"amount": 10}');
SELECT idem.idem_finish(7, 'PAY', 'pay-key-00000000000002', 500, '{}');
ROLLBACK;
BEGIN;
SELECT replayed FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000002', '{"amount": 10}');
SELECT idem.idem_finish(7, 'PAY', 'pay-key-00000000000002', 422, '{"error": "no funds"}');
COMMIT;
SELECT replayed, http_status, body FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000002', '{"amount": 10}');
-- IK002 for the transaction's own unfinished claim; IK003 without a claim
BEGIN;
SELECT replayed FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000003', '{"amount": 10}');
SELECT replayed FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000003', '{"amount": 10}');
ROLLBACK;
SELECT idem.idem_finish(7, 'PAY', 'pay-key-00000000000004', 200, '{}');
-- IK005: a claim left unfinished fails the COMMIT, run as the caller
BEGIN;
SELECT replayed FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000005', '{"amount": 10}');
COMMIT;
-- outside a transaction block, a claim is unfinished at its own COMMIT
SELECT replayed FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000005', '{"amount": 10}');
-- a savepoint rolled back takes its claim with it
BEGIN;
SAVEPOINT s;
SELECT replayed FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000006', '{"amount": 10}');
ROLLBACK TO SAVEPOINT s;
COMMIT;
-- SET CONSTRAINTS ALL IMMEDIATE: every later claim fails at its own insert
BEGIN;
SET CONSTRAINTS ALL IMMEDIATE;
SELECT replayed FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000007', '{"amount": 10}');
ROLLBACK;

-- nothing of idem's is the caller's to read or run directly
SELECT count(*) FROM idem.idempotency_record;
SELECT idem.idem_sql_claim(7, 'PAY', 'pay-key-00000000000008', 'x', NULL, false);
SELECT idem.idem_bind('managed_app', '1-1000', NULL);
SELECT * FROM idem.idem_set_policy('PAY', ttl => interval '1 hour');
-- look-alikes on the caller's path and in pg_temp run nothing
CREATE FUNCTION pg_temp.sha256(bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT 'planted'::bytea $$;
CREATE FUNCTION pg_temp.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT 'epoch'::timestamptz $$;
SET search_path = pg_temp, public, pg_catalog;
SELECT replayed, http_status FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000001', '{"amount": 10}');
SELECT idem.idem_request_hash('{"a": 1}') = pg_catalog.encode(pg_catalog.sha256('{"a":1}'::bytea), 'hex') AS plain_sha256;
RESET search_path;

-- the outbox: commit order per key; READ COMMITTED only for keyed emits
BEGIN;
SELECT idem.idem_outbox_emit('orders', '{"n": 1}', 'order-1') > 0 AS emitted;
SELECT idem.idem_outbox_emit('orders', '{"n": 2}', 'order-1') > 0 AS emitted;
SELECT idem.idem_outbox_emit('orders', '{"n": 3}') > 0 AS emitted;
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT idem.idem_outbox_emit('orders', '{"n": 4}', 'order-1');
ROLLBACK;
SELECT idem.idem_outbox_fetch('orders');
\c - managed_pub
-- the key's head and the keyless message; its second waits for the first
SELECT msg_key, payload, attempt FROM idem.idem_outbox_fetch('orders', 10, interval '1 minute');
\c - postgres
SELECT msg_key, payload, ready, commit_seq > 0 AS ordered FROM idem.idem_outbox ORDER BY commit_seq;
SELECT message_id AS first_id FROM idem.idem_outbox WHERE payload = '{"n": 1}' \gset
\c - managed_pub
SELECT idem.idem_outbox_ack(ARRAY[:first_id]::bigint[]);
SELECT idem.idem_outbox_ack(ARRAY[:first_id]::bigint[]);
SELECT msg_key, payload, attempt FROM idem.idem_outbox_fetch('orders', 10, interval '1 minute');
\c - postgres
SELECT msg_key, payload, ready FROM idem.idem_outbox ORDER BY commit_seq;
\c - managed_app
-- the caller's trace context: into the headers, the emit's own winning; 22023 when malformed
BEGIN;
SET LOCAL idem.trace_context = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SELECT idem.idem_outbox_emit('traced', '{"n": 1}') > 0 AS emitted;
SELECT idem.idem_outbox_emit('traced', '{"n": 2}', NULL,
                             '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "a": 1}') > 0 AS emitted;
SET LOCAL idem.trace_context = 'nonsense';
SELECT idem.idem_outbox_emit('traced', '{"n": 3}');
ROLLBACK;
BEGIN;
SET LOCAL idem.trace_context = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SELECT idem.idem_outbox_emit('traced', '{"n": 1}') > 0 AS emitted;
SELECT idem.idem_outbox_emit('traced', '{"n": 2}', NULL,
                             '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "a": 1}') > 0 AS emitted;
COMMIT;
\c - postgres
SELECT payload, headers FROM idem.idem_outbox WHERE topic = 'traced' ORDER BY message_id;
DELETE FROM idem.idem_outbox WHERE topic = 'traced';

-- the binding: session_user's owners, which SET ROLE does not change
SET ROLE idem_owner;
SELECT idem.idem_bind('managed_app', '7,100-199', 'PAY,CREATE_ORDER');
RESET ROLE;
\c - managed_app
SELECT * FROM idem.idem_create_order(150, 'order-key-000000000003', 42, 1);
SELECT * FROM idem.idem_create_order(8, 'order-key-000000000003', 42, 1);
BEGIN;
SELECT replayed FROM idem.idem_begin(7, 'SHIP', 'ship-key-00000000000001', '{}');
ROLLBACK;
SET ROLE managed_other;
SELECT * FROM idem.idem_create_order(8, 'order-key-000000000003', 42, 1);
RESET ROLE;
SELECT idem.idem_outbox_emit('orders', '{}', NULL, NULL, 9);
-- the C edition's order of checks: NULLs, the binding, the key, the request
SELECT * FROM idem.idem_create_order(8, 'short', 42, 1);
SELECT * FROM idem.idem_create_order(8, 'order-key-000000000004', 42, 0);
SELECT * FROM idem.idem_create_order(8, 'order-key-000000000004', NULL, 1);
SELECT * FROM idem.idem_create_order(7, 'short', 42, 1);
SELECT * FROM idem.idem_begin(8, 'PAY', 'short', '{}');
SELECT * FROM idem.idem_begin(7, 'SHIP', 'short', '{}');
SELECT * FROM idem.idem_begin(8, 'PAY', 'pay-key-00000000000001', NULL);
SELECT * FROM idem.idem_begin(7, 'PAY', 'pay-key-00000000000001', '{}', interval '-1 day');
SELECT * FROM idem.idem_finish(8, 'PAY', 'short', 200, '{}');
\c - postgres
SET ROLE idem_owner;
SELECT idem.idem_bind('managed_app', NULL, NULL);

-- per-operation ttl and IK007 retention, and the cleanup
SELECT operation, ttl, audit_ttl, reuse_after_expiry
  FROM idem.idem_set_policy('SHORT', ttl => interval '10 milliseconds', audit_ttl => interval '1 hour', reuse_after_expiry => 'refuse');
SELECT * FROM idem.idem_set_policy('SHORT', max_attempts => 3);
RESET ROLE;
\c - managed_app
BEGIN;
SELECT replayed, expires_at - now() AS ttl FROM idem.idem_begin(7, 'SHORT', 'short-key-000000000001', '{}');
SELECT idem.idem_finish(7, 'SHORT', 'short-key-000000000001', 200, '{}');
COMMIT;
SELECT pg_sleep(0.05);
\set VERBOSITY terse
BEGIN;
SELECT replayed FROM idem.idem_begin(7, 'SHORT', 'short-key-000000000001', '{}');
ROLLBACK;
\c - postgres
SELECT idem.idem_cleanup_expired();
SELECT operation, idempotency_key, status, audit_until > now() AS in_audit FROM idem.idem_history;
\c - managed_app
\set VERBOSITY terse
BEGIN;
SELECT replayed FROM idem.idem_begin(7, 'SHORT', 'short-key-000000000001', '{}');
ROLLBACK;
\c - postgres
SET ROLE idem_owner;
SELECT operation, reuse_after_expiry FROM idem.idem_set_policy('SHORT', reuse_after_expiry => 'execute');
RESET ROLE;
\c - managed_app
BEGIN;
SELECT replayed FROM idem.idem_begin(7, 'SHORT', 'short-key-000000000001', '{}');
ROLLBACK;
\c - postgres
SET client_min_messages = warning;
DROP OWNED BY managed_app, managed_pub, managed_other;
DROP ROLE managed_app, managed_pub, managed_other;
