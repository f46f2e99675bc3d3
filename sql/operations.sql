--
-- idem.allowed_operations: a role bound by a superuser to its operations
-- acts for those only (42501 otherwise), in idem_create_order
-- (CREATE_ORDER), idem_begin, idem_finish, idem_run, idem_submit and the
-- task calls; the by-id task calls check the task's operation.  Tokens
-- fence; the operation list authorises.  Topics and consumers are not
-- operations.
--
\set SHOW_CONTEXT never
\set su :USER
-- the setting's syntax
SET idem.allowed_operations = 'SHIP, PAY:card ,a.b-c';
SHOW idem.allowed_operations;
SET idem.allowed_operations = 'SHIP,,PAY';
SET idem.allowed_operations = 'SHIP,';
SET idem.allowed_operations = 'SHIP PAY';
SET idem.allowed_operations = 'bad/name';
SELECT set_config('idem.allowed_operations', repeat('x', 65), false);
RESET idem.allowed_operations;

CREATE ROLE regress_idem_shipper LOGIN;
GRANT EXECUTE ON FUNCTION idem_create_order(bigint, text, bigint, integer),
    idem_begin(bigint, text, text, jsonb, interval),
    idem_finish(bigint, text, text, integer, json, bigint, jsonb, json),
    idem_run(bigint, text, text, jsonb, regprocedure, interval),
    idem_submit(bigint, text, text, jsonb, jsonb, interval),
    idem_lease(text, text, interval, integer, boolean),
    idem_heartbeat(bigint, bigint, interval),
    idem_complete(bigint, bigint, integer, json, bigint, jsonb, json),
    idem_fail(bigint, bigint, jsonb, boolean),
    idem_outbox_emit(text, jsonb, text, jsonb, bigint),
    idem_consume(text, text, interval, bigint)
    TO regress_idem_shipper;
CREATE FUNCTION ops_handler(request jsonb) RETURNS idem_result
LANGUAGE sql AS $$ SELECT ROW(200, '{}', NULL, NULL)::idem_result $$;
ALTER ROLE regress_idem_shipper SET idem.allowed_operations = 'SHIP';
-- a task of another operation, leased by its own worker
SELECT task_id AS refund_task FROM idem_submit(5, 'REFUND', 'ops-refund-key-00001', '{}') \gset
SELECT token AS refund_token FROM idem_lease('REFUND', 'refund-worker') \gset

\c - regress_idem_shipper
SHOW idem.allowed_operations;
-- its operation: every call works
SELECT replayed FROM idem_submit(5, 'SHIP', 'ops-ship-key-0000001', '{}');
SELECT count(*) AS leased FROM (SELECT idem_complete(task_id, token, 200, '{}') FROM idem_lease('SHIP', 'ship-worker')) s;
SELECT replayed FROM idem_run(5, 'SHIP', 'ops-ship-key-0000002', '{}', 'ops_handler(jsonb)');
BEGIN;
SELECT replayed FROM idem_begin(5, 'SHIP', 'ops-ship-key-0000003', '{}');
SELECT idem_finish(5, 'SHIP', 'ops-ship-key-0000003', 200, '{}');
COMMIT;
-- topics and consumers are not operations
SELECT idem_outbox_emit('REFUND', '{}') > 0 AS emitted;
SELECT idem_consume('REFUND', 'ops-message-1');
-- another operation: refused by every call, before anything is written
SELECT * FROM idem_create_order(5, 'ops-order-key-000001', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(5, 'REFUND', 'ops-refund-key-00002', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_finish(5, 'REFUND', 'ops-refund-key-00002', 200, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(5, 'REFUND', 'ops-refund-key-00003', '{}', 'ops_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_submit(5, 'REFUND', 'ops-refund-key-00004', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_lease('REFUND', 'ship-worker');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- the other operation's task, with its current token: still refused
SELECT idem_heartbeat(:refund_task, :refund_token);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_complete(:refund_task, :refund_token, 200, '{"stolen": true}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_fail(:refund_task, :refund_token, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- no way out: SET, set_config, RESET
SET idem.allowed_operations = '';
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT set_config('idem.allowed_operations', 'REFUND', false);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET idem.allowed_operations;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SHOW idem.allowed_operations;

\c - :su
SELECT operation, status, count(*) FROM idem_internal.idempotency_record WHERE owner_id = 5
GROUP BY operation, status ORDER BY operation, status;
SELECT count(*) AS orders_for_5 FROM idem_internal.purchase_order WHERE owner_id = 5;
-- CREATE_ORDER is the order demo's operation
ALTER ROLE regress_idem_shipper SET idem.allowed_operations = 'SHIP, CREATE_ORDER';
\c - regress_idem_shipper
SELECT replayed FROM idem_create_order(5, 'ops-order-key-000001', 1, 1);
\c - :su
DELETE FROM idem_internal.idempotency_record WHERE owner_id = 5;
DELETE FROM idem_internal.purchase_order WHERE owner_id = 5;
DELETE FROM idem_internal.idem_outbox WHERE topic = 'REFUND';
DELETE FROM idem_internal.idem_inbox WHERE consumer = 'REFUND';
DROP FUNCTION ops_handler(jsonb);
DROP OWNED BY regress_idem_shipper;
DROP ROLE regress_idem_shipper;
