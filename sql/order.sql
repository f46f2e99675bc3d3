--
-- idem_create_order: the article's serial tests, every bad input, expiry
--
\set SHOW_CONTEXT never
SET idem.ttl = '24h';

-- 1. Same key and same request twice: one order; the second call replays.
SELECT * FROM idem_create_order(1, 'double-click-0000001', 1001, 2);
SELECT * FROM idem_create_order(1, 'double-click-0000001', 1001, 2);
SELECT count(*) AS orders FROM idem_internal.purchase_order WHERE owner_id = 1;

-- 6. The replay is the stored snapshot: same status and body as the first call.
SELECT owner_id, operation, idempotency_key, status, http_status,
       response_json, resource_id, expires_at - created_at AS ttl
FROM idem_internal.idempotency_record WHERE owner_id = 1;
SELECT o.id, o.order_no, o.sku_id, o.quantity, o.status
FROM idem_internal.purchase_order o WHERE owner_id = 1;
-- The fingerprint is idem_request_hash of {"sku": sku, "qty": qty}.
SELECT request_hash = idem_request_hash('{"sku": 1001, "qty": 2}') AS fingerprint_matches
FROM idem_internal.idempotency_record WHERE owner_id = 1;

-- 3. Same key, different request: IK001, nothing written.
SELECT * FROM idem_create_order(1, 'double-click-0000001', 1001, 3);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, 'double-click-0000001', 1002, 2);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS orders FROM idem_internal.purchase_order WHERE owner_id = 1;
SELECT count(*) AS records, min(request_hash) = idem_request_hash('{"qty":2,"sku":1001}') AS unchanged
FROM idem_internal.idempotency_record WHERE owner_id = 1;

-- 4. The first transaction fails: nothing of it remains, the retry executes.
BEGIN;
SELECT replayed FROM idem_create_order(2, 'gateway-retry-000001', 7, 1);
SELECT 1 / 0;	-- the caller's transaction fails after the call
ROLLBACK;
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE owner_id = 2;
SELECT count(*) AS orders FROM idem_internal.purchase_order WHERE owner_id = 2;
SELECT replayed FROM idem_create_order(2, 'gateway-retry-000001', 7, 1);
SELECT replayed FROM idem_create_order(2, 'gateway-retry-000001', 7, 1);
SELECT count(*) AS orders FROM idem_internal.purchase_order WHERE owner_id = 2;

-- 4b. The business insert itself fails (its order_no is taken): the claim
-- goes with it, and the same key succeeds on retry.  (The blocker takes the
-- next id itself; the call takes the one after.)
INSERT INTO idem_internal.purchase_order (order_no, owner_id, sku_id, quantity, status)
SELECT 'ORD-' || lpad((last_value + 2)::text, 12, '0'), 0, 0, 1, 'BLOCKER'
FROM idem_internal.purchase_order_id_seq;
SELECT * FROM idem_create_order(2, 'insert-fails-0000001', 8, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE idempotency_key = 'insert-fails-0000001';
SELECT replayed, order_no <> '' AS has_order_no FROM idem_create_order(2, 'insert-fails-0000001', 8, 1);
SELECT replayed FROM idem_create_order(2, 'insert-fails-0000001', 8, 1);

-- 7. Different owners using the same key do not affect each other.
SELECT owner_id, count(*) FROM (
    SELECT 3 AS owner_id, * FROM idem_create_order(3, 'shared-key-000000001', 1, 1)
    UNION ALL
    SELECT 4, * FROM idem_create_order(4, 'shared-key-000000001', 2, 5)
) s WHERE NOT replayed GROUP BY owner_id ORDER BY owner_id;
SELECT owner_id, sku_id, quantity FROM idem_internal.purchase_order WHERE owner_id IN (3, 4) ORDER BY owner_id;

-- A repeat inside the transaction that executed replays its own, uncommitted order.
BEGIN;
SELECT order_no, replayed FROM idem_create_order(5, 'same-transaction-001', 1, 1);
SELECT order_no, replayed FROM idem_create_order(5, 'same-transaction-001', 1, 1);
COMMIT;
SELECT count(*) AS orders FROM idem_internal.purchase_order WHERE owner_id = 5;

-- REPEATABLE READ callers run the protocol as well, serially.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT replayed FROM idem_create_order(5, 'repeatable-read-0001', 1, 1);
SELECT replayed FROM idem_create_order(5, 'repeatable-read-0001', 1, 1);
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT replayed FROM idem_create_order(5, 'repeatable-read-0001', 1, 1);
COMMIT;

-- A committed record still PROCESSING (a long flow's) is reported in flight.
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
VALUES (6, 'CREATE_ORDER', 'left-processing-0001', idem_request_hash('{"sku":1,"qty":1}'),
        'PROCESSING', now() + interval '1 hour');
SELECT * FROM idem_create_order(6, 'left-processing-0001', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- ... and a different request on it is still a conflict, not "processing".
SELECT * FROM idem_create_order(6, 'left-processing-0001', 2, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- An application maps the outcomes to HTTP; here in PL/pgSQL, whose
-- exception blocks are subtransactions around the call.
CREATE FUNCTION http_create_order(owner bigint, key text, sku bigint, qty integer)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM idem_create_order(owner, key, sku, qty);
    RETURN r.http_status || CASE WHEN r.replayed THEN ' (replayed) ' ELSE ' ' END || r.order_no;
EXCEPTION
    WHEN SQLSTATE 'IK001' THEN RETURN '409 key reused with another request';
    WHEN SQLSTATE 'IK002' THEN RETURN '409 still processing, Retry-After: 1';
    WHEN SQLSTATE '22004' OR SQLSTATE '22023' THEN RETURN '400 ' || SQLERRM;
END $$;
SELECT http_create_order(9, 'http-mapping-000001', 1, 1) AS first,
       http_create_order(9, 'http-mapping-000001', 1, 1) AS retry,
       http_create_order(9, 'http-mapping-000001', 1, 2) AS reused,
       http_create_order(6, 'left-processing-0001', 1, 1) AS processing,
       http_create_order(9, 'too-short', 1, 1) AS bad_key;
SELECT count(*) AS orders FROM idem_internal.purchase_order WHERE owner_id = 9;
DROP FUNCTION http_create_order;

--
-- Bad input: SQLSTATE, a message to act on, and nothing written.
--
CREATE TEMP TABLE counts AS
SELECT (SELECT count(*) FROM idem_internal.idempotency_record) AS records,
       (SELECT count(*) FROM idem_internal.purchase_order) AS orders;

-- NULL in each position: 22004
SELECT * FROM idem_create_order(NULL, 'null-argument-000001', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, NULL, 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, 'null-argument-000001', NULL, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, 'null-argument-000001', 1, NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- Keys outside ^[A-Za-z0-9_-]{16,128}$: 22023
SELECT * FROM idem_create_order(1, repeat('a', 15), 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, repeat('a', 129), 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, '', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, 'has a space 0000000', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, E'has-newline\n00000000', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, 'non-ascii-é-00000000', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, 'semicolon;000000000', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, repeat('é', 20), 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- qty outside 1..100: 22023
SELECT * FROM idem_create_order(1, 'bad-quantity-0000001', 1, 0);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, 'bad-quantity-0000001', 1, 101);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, 'bad-quantity-0000001', 1, -5);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- sku beyond what a JSON number holds exactly: 22023
SELECT * FROM idem_create_order(1, 'bad-sku-000000000001', 9007199254740992, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE

SELECT (SELECT count(*) FROM idem_internal.idempotency_record) = records AS no_record_written,
       (SELECT count(*) FROM idem_internal.purchase_order) = orders AS no_order_written
FROM counts;

-- The bounds themselves are accepted: 16 and 128 characters, every allowed
-- character, qty 1 and 100, the largest exact sku.
SELECT replayed FROM idem_create_order(1, repeat('k', 16), 1, 1);
SELECT replayed FROM idem_create_order(1, repeat('K', 128), 1, 100);
SELECT replayed FROM idem_create_order(1, 'AZaz09_-AZaz09_-', 9007199254740991, 1);
SELECT replayed FROM idem_create_order(1, 'AZaz09_-AZaz09_-', 9007199254740991, 1);

--
-- Expiry: a record whose expires_at has passed, deleted or not, no longer
-- holds its key; the request executes anew, even with another body.
--
SELECT order_no AS first_order FROM idem_create_order(7, 'expiring-key-0000001', 1, 1) \gset
UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 second'
WHERE owner_id = 7;
SELECT order_no <> :'first_order' AS new_order, replayed
FROM idem_create_order(7, 'expiring-key-0000001', 2, 2);
SELECT count(*) AS records, min(request_hash) = idem_request_hash('{"sku":2,"qty":2}') AS new_fingerprint,
       min(expires_at) > now() AS live_again
FROM idem_internal.idempotency_record WHERE owner_id = 7;
SELECT count(*) AS orders FROM idem_internal.purchase_order WHERE owner_id = 7;

-- idem.ttl sets the lifetime of new records; here it runs out for real.
SET idem.ttl = 1;
SELECT replayed FROM idem_create_order(8, 'short-lived-00000001', 1, 1);
SELECT replayed FROM idem_create_order(8, 'short-lived-00000001', 1, 1);
SELECT pg_sleep(1.2);
SELECT replayed FROM idem_create_order(8, 'short-lived-00000001', 1, 1);
SELECT count(*) AS orders FROM idem_internal.purchase_order WHERE owner_id = 8;
RESET idem.ttl;

-- GUCs
SHOW idem.wait_timeout;
SHOW idem.ttl;
SET idem.wait_timeout = '250ms';
SHOW idem.wait_timeout;
-- out of range: 22023 (the message's wording changed in PostgreSQL 17)
\set VERBOSITY sqlstate
SET idem.wait_timeout = -1;
SET idem.ttl = 0;
\set VERBOSITY default
SET idem.no_such_setting = 1;
RESET idem.wait_timeout;

-- A replay writes nothing, so it runs in a read-only transaction; a call
-- that must execute fails there (25006) and writes nothing.
SELECT order_id, replayed FROM idem_create_order(90, 'read-only-key-00001', 1, 1);
BEGIN TRANSACTION READ ONLY;
SELECT order_id, replayed FROM idem_create_order(90, 'read-only-key-00001', 1, 1);
SELECT order_id, replayed FROM idem_create_order(90, 'read-only-key-00002', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT count(*) AS records_for_key_2 FROM idem_internal.idempotency_record WHERE owner_id = 90 AND idempotency_key = 'read-only-key-00002';
