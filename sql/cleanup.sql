--
-- idem_cleanup_expired: batches, limits, bad input; never an unexpired row
--
\set SHOW_CONTEXT never
TRUNCATE idem_internal.idempotency_record;

-- 2500 expired records and 10 live ones
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
SELECT 100, 'CREATE_ORDER', 'expired-' || lpad(i::text, 12, '0'), repeat('0', 64), 'SUCCEEDED',
       now() - (i || ' seconds')::interval
FROM generate_series(1, 2500) i;
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
SELECT 100, 'CREATE_ORDER', 'live-' || lpad(i::text, 15, '0'), repeat('0', 64), 'SUCCEEDED',
       now() + interval '1 hour'
FROM generate_series(1, 10) i;

-- one batch of 1000, oldest expiry first
SELECT idem_cleanup_expired(1000, 1) AS deleted;
SELECT count(*) AS expired_left, min(idempotency_key) AS youngest_left,
       max(idempotency_key) AS oldest_left
FROM idem_internal.idempotency_record WHERE expires_at < now();
-- two more batches of 300 at most
SELECT idem_cleanup_expired(300, 2) AS deleted;
-- the rest, in default batches
SELECT idem_cleanup_expired() AS deleted;
SELECT idem_cleanup_expired() AS deleted_when_nothing_expired;
SELECT count(*) FILTER (WHERE expires_at < now()) AS expired,
       count(*) FILTER (WHERE expires_at >= now()) AS live
FROM idem_internal.idempotency_record;

-- a record that expired is cleaned up even after its key was used again:
-- the renewed record is live, and stays
SELECT replayed FROM idem_create_order(101, 'cleanup-renewal-0001', 1, 1);
UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 minute' WHERE owner_id = 101;
SELECT replayed FROM idem_create_order(101, 'cleanup-renewal-0001', 1, 1);
SELECT idem_cleanup_expired() AS deleted;
SELECT count(*) AS renewed_record_kept FROM idem_internal.idempotency_record WHERE owner_id = 101;

-- bad input: 22004 for NULL batch_size, 22023 below 1; nothing deleted
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
VALUES (102, 'CREATE_ORDER', 'must-survive-bad-call', repeat('0', 64), 'SUCCEEDED', now() - interval '1 day');
SELECT idem_cleanup_expired(NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_cleanup_expired(0);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_cleanup_expired(-1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_cleanup_expired(10, 0);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS still_there FROM idem_internal.idempotency_record WHERE owner_id = 102;
SELECT idem_cleanup_expired(1, NULL) AS deleted;
