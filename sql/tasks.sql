--
-- Long flows: idem_submit, idem_lease, idem_heartbeat, idem_complete,
-- idem_fail; every status transition, fencing (IK004), the backoff
-- schedule, idem.max_attempts, takeover of a lapsed lease, argument checks,
-- grants, statistics.
--
\set SHOW_CONTEXT never
SET idem.ttl = '24h';
SELECT idem_stats_reset();
-- ids and tokens this test can show, whatever ran before it
SELECT setval('idem_internal.idempotency_record_id_seq', 500000, false) IS NOT NULL AS ids_set,
       setval('idem_internal.idem_task_token_seq', 1, false) IS NOT NULL AS tokens_set;

CREATE TABLE shipment (id bigserial PRIMARY KEY, task_id bigint NOT NULL UNIQUE, carrier text);

-- A new key: PROCESSING, 202, a task due now; the record commits at once.
SELECT * FROM idem_submit(1, 'SHIP', 'task-key-000000000001', '{"order": 1, "carrier": "dhl"}',
                          '{"priority": "high"}');
SELECT status, http_status, task_attempts, task_token, task_lease_expires_at,
       task_due_at <= now() AS due, expires_at = 'infinity' AS never_expires,
       task_request, task_payload
FROM idem_internal.idempotency_record WHERE idempotency_key = 'task-key-000000000001';
-- a repeat reports the current state; nothing is written, no second task
SELECT * FROM idem_submit(1, 'SHIP', 'task-key-000000000001', '{"carrier": "dhl", "order": 1.0}');
SELECT count(*) AS records, max(xmin::text) = min(xmin::text) AS untouched
FROM idem_internal.idempotency_record WHERE idempotency_key = 'task-key-000000000001';
-- a different request under the key
SELECT * FROM idem_submit(1, 'SHIP', 'task-key-000000000001', '{"order": 2}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- a synchronous call of the key while its task runs: in flight
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'SHIP', 'task-key-000000000001', '{"order": 1, "carrier": "dhl"}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- The lease: attempt 1, a token, the request and payload.
SELECT task_id > 0 AS has_id, owner, key, request, payload, attempt, token > 0 AS has_token,
       lease_expires_at > now() + interval '50 seconds' AS leased_for_a_minute
FROM idem_lease('SHIP', 'worker-a', '1 minute');
SELECT task_id AS t1, token AS tok1 FROM idem_internal.idempotency_record r, LATERAL (SELECT r.id AS task_id, r.task_token AS token) x
WHERE idempotency_key = 'task-key-000000000001' \gset
-- leased: nobody else gets it
SELECT count(*) AS leased_again FROM idem_lease('SHIP', 'worker-b');
SELECT status, task_attempts, task_worker, task_due_at < task_lease_expires_at AS due_time_kept
FROM idem_internal.idempotency_record WHERE id = :t1;
SELECT replayed, status, http_status, body FROM idem_submit(1, 'SHIP', 'task-key-000000000001', '{"order": 1, "carrier": "dhl"}');

-- Heartbeats extend the lease: by the interval it was granted, or by extend.
SELECT idem_heartbeat(:t1, :tok1) > now() + interval '50 seconds' AS extended_a_minute;
SELECT idem_heartbeat(:t1, :tok1, '2 hours') > now() + interval '1 hour' AS extended_two_hours;
SELECT idem_heartbeat(:t1, :tok1, '0 seconds');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_heartbeat(:t1, :tok1 + 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_heartbeat(:t1 + 1000000, :tok1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- Complete with the business write, in one transaction: SUCCEEDED.
BEGIN;
INSERT INTO shipment (task_id, carrier) VALUES (:t1, 'dhl') RETURNING id AS shipment_id \gset
SELECT idem_complete(:t1, :tok1, 201, '{"shipment":  7}', :shipment_id, '{"Location": "/shipments/7"}');
COMMIT;
SELECT status, http_status, response_body, task_due_at, task_lease_expires_at,
       expires_at - updated_at AS kept_for
FROM idem_internal.idempotency_record WHERE id = :t1;
-- a repeat replays the stored result
SELECT replayed, status, http_status, body, headers, resource_id = :shipment_id AS resource, task_id = :t1 AS same_task
FROM idem_submit(1, 'SHIP', 'task-key-000000000001', '{"order": 1, "carrier": "dhl"}');
-- the finished task's token is stale for every call
SELECT idem_complete(:t1, :tok1, 201, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_fail(:t1, :tok1, '{"e": 1}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_heartbeat(:t1, :tok1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- A 4xx result is final and replayed; a 5xx or 1xx is refused (22023).
SELECT task_id AS t2 FROM idem_submit(2, 'SHIP', 'task-key-000000000002', '{"order": 2}', NULL, '1 hour') \gset
SELECT token AS tok2 FROM idem_lease('SHIP', 'worker-a') \gset
SELECT idem_complete(:t2, :tok2, 503, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_complete(:t2, :tok2, 100, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_complete(:t2, :tok2, 200, '{}', NULL, '["not an object"]');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_complete(:t2, :tok2, NULL, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_complete(:t2, :tok2, 409, '{"error": "address unknown"}');
-- kept for idem.failure_ttl (10 minutes), whatever the submit's ttl
SELECT status, http_status, expires_at - updated_at AS kept_for FROM idem_internal.idempotency_record WHERE id = :t2;
SELECT replayed, status, http_status, body FROM idem_submit(2, 'SHIP', 'task-key-000000000002', '{"order": 2}');
-- a success keeps the submit's ttl
SELECT task_id AS t3 FROM idem_submit(3, 'SHIP', 'task-key-000000000003', '{"order": 3}', NULL, '1 hour') \gset
SELECT idem_complete(task_id, token, 200, '{}') FROM idem_lease('SHIP', 'worker-a');
SELECT status, expires_at - updated_at AS kept_for FROM idem_internal.idempotency_record WHERE id = :t3;

-- A stale worker's business write rolls back with its IK004.
SELECT task_id AS t4 FROM idem_submit(4, 'SHIP', 'task-key-000000000004', '{"order": 4}') \gset
SELECT token AS old_token FROM idem_lease('SHIP', 'worker-slow', '10 milliseconds') \gset
SELECT pg_sleep(0.05);
-- lapsed: another worker takes it over, with attempt 2 and a greater token
SELECT attempt, token > :old_token AS greater_token FROM idem_lease('SHIP', 'worker-fast');
SELECT task_token AS new_token FROM idem_internal.idempotency_record WHERE id = :t4 \gset
BEGIN;
INSERT INTO shipment (task_id, carrier) VALUES (:t4, 'slow');
SELECT idem_complete(:t4, :old_token, 201, '{"by": "slow"}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
COMMIT;
SELECT count(*) AS slow_shipments FROM shipment WHERE carrier = 'slow';
SELECT idem_complete(:t4, :new_token, 201, '{"by": "fast"}');
SELECT status, task_attempts, task_worker, response_body FROM idem_internal.idempotency_record WHERE id = :t4;

-- Retryable failures: FAILED_RETRYABLE with a backoff, then leased again.
SET idem.retry_base = '1ms';
SET idem.retry_max = '5ms';
SELECT task_id AS t5 FROM idem_submit(5, 'SHIP', 'task-key-000000000005', '{"order": 5}') \gset
SELECT token AS tok5 FROM idem_lease('SHIP', 'worker-a') \gset
SELECT idem_fail(:t5, :tok5, '{"carrier": "timeout"}');
SELECT status, task_lease_expires_at, task_last_error, task_due_at - updated_at <= interval '1 millisecond' AS backoff_within_base
FROM idem_internal.idempotency_record WHERE id = :t5;
-- the failed lease's token is stale now
SELECT idem_complete(:t5, :tok5, 200, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, status, http_status, body::text LIKE '{"status": "FAILED_RETRYABLE", "task_id": %}' AS accepted_body
FROM idem_submit(5, 'SHIP', 'task-key-000000000005', '{"order": 5}');
SELECT pg_sleep(0.01);
SELECT attempt, token > :tok5 AS greater_token FROM idem_lease('SHIP', 'worker-b');
SELECT status FROM idem_internal.idempotency_record WHERE id = :t5;

-- idem.max_attempts: the last attempt's failure is final, HTTP 500 with
-- the caller's error as the body, and nothing else.
SET idem.max_attempts = 3;
SELECT idem_fail(id, task_token, '{"carrier": "timeout", "attempt": 2}') FROM idem_internal.idempotency_record WHERE id = :t5;
SELECT pg_sleep(0.01);
SELECT attempt, idem_fail(task_id, token, '{"carrier": "timeout", "attempt": 3}') FROM idem_lease('SHIP', 'worker-c');
SELECT status, http_status, response_body, task_due_at, task_attempts FROM idem_internal.idempotency_record WHERE id = :t5;
SELECT replayed, status, http_status, body FROM idem_submit(5, 'SHIP', 'task-key-000000000005', '{"order": 5}');
RESET idem.max_attempts;
-- retryable => false is final at once
SELECT (idem_submit(6, 'SHIP', 'task-key-000000000006', '{"order": 6}')).task_id IS NOT NULL AS submitted;
SELECT idem_fail(task_id, token, '"card declined"', false) FROM idem_lease('SHIP', 'worker-a');
SELECT status, http_status, response_body FROM idem_internal.idempotency_record WHERE idempotency_key = 'task-key-000000000006';

-- The backoff schedule: attempt n waits a uniform time up to
-- retry_base * 2^(n-1), capped at retry_max (full jitter).  200 tasks
-- failing at attempts 1 to 6, with base 10 ms and cap 200 ms: every wait
-- within [0, bound], and their mean near bound / 2.
SET idem.retry_base = '10ms';
SET idem.retry_max = '200ms';
SELECT count(*) AS submitted FROM generate_series(1, 200) g,
    LATERAL idem_submit(g, 'BACKOFF', 'backoff-key-' || lpad(g::text, 8, '0'), '{}');
CREATE TEMP TABLE waits (attempt int, wait_ms float8, bound_ms float8);
DO $$
DECLARE
    n int;
BEGIN
    FOR n IN 1..6 LOOP
        -- make every task due now (as its backoff would, later)
        UPDATE idem_internal.idempotency_record SET task_due_at = now() - interval '1 second'
        WHERE operation = 'BACKOFF';
        PERFORM idem_fail(task_id, token, '{}') FROM idem_lease('BACKOFF', 'w', '1 minute', 1000);
        INSERT INTO waits
        SELECT task_attempts, extract(epoch FROM task_due_at - updated_at) * 1000,
               least(10 * 2 ^ (task_attempts - 1), 200)
        FROM idem_internal.idempotency_record WHERE operation = 'BACKOFF';
    END LOOP;
END $$;
SELECT attempt, bound_ms, count(*) AS tasks,
       min(wait_ms) >= 0 AND max(wait_ms) <= bound_ms AS within_bounds,
       avg(wait_ms) BETWEEN 0.35 * bound_ms AND 0.65 * bound_ms AS mean_near_half,
       count(DISTINCT wait_ms) > 150 AS jittered
FROM waits GROUP BY attempt, bound_ms ORDER BY attempt;
RESET idem.retry_base;
RESET idem.retry_max;

-- Leases hand out the oldest due first, in batches, never a task twice.
SELECT count(*) FROM generate_series(1, 5) g,
    LATERAL idem_submit(g, 'BATCH', 'batch-key-' || lpad(g::text, 10, '0'), jsonb_build_object('n', g));
SELECT array_agg(request->>'n' ORDER BY task_id) AS first_three FROM idem_lease('BATCH', 'w', '1 minute', 3);
SELECT array_agg(request->>'n' ORDER BY task_id) AS the_rest FROM idem_lease('BATCH', 'w', '1 minute', 3);
SELECT count(*) AS none_left FROM idem_lease('BATCH', 'w', '1 minute', 3);
-- a lease in a rolled-back transaction hands nothing out
SELECT (idem_submit(9, 'BATCH', 'batch-key-0000000009', '{}')).task_id IS NOT NULL AS submitted;
BEGIN;
SELECT count(*) AS leased FROM idem_lease('BATCH', 'w');
ROLLBACK;
SELECT attempt FROM idem_lease('BATCH', 'w');

-- bind_session: the lease is the session's as well; while it lives, the
-- lease holds (the TAP test ends the session).
SELECT (idem_submit(10, 'BOUND', 'bound-key-0000000010', '{}')).task_id IS NOT NULL AS submitted;
SELECT attempt FROM idem_lease('BOUND', 'w', '1 minute', 1, bind_session => true);
SELECT task_session IS NOT NULL AS bound FROM idem_internal.idempotency_record WHERE operation = 'BOUND';
SELECT count(*) AS leased_again FROM idem_lease('BOUND', 'w2');
-- a heartbeat keeps the binding, a retryable failure drops it
SELECT idem_heartbeat(id, task_token) > now() AS extended FROM idem_internal.idempotency_record WHERE operation = 'BOUND';
SELECT task_session IS NOT NULL AS still_bound FROM idem_internal.idempotency_record WHERE operation = 'BOUND';
SELECT idem_fail(id, task_token, '{}') FROM idem_internal.idempotency_record WHERE operation = 'BOUND';
SELECT task_session IS NULL AS unbound FROM idem_internal.idempotency_record WHERE operation = 'BOUND';

-- Unfinished tasks never expire: the cleanup leaves them.
SELECT count(*) AS unfinished_before FROM idem_internal.idempotency_record WHERE task_due_at IS NOT NULL;
SELECT idem_cleanup_expired() >= 0 AS cleaned;
SELECT count(*) AS unfinished_after FROM idem_internal.idempotency_record WHERE task_due_at IS NOT NULL;

-- A submit of a key finished synchronously replays it, with no task id; a
-- submit of a key this transaction claimed is in flight.
BEGIN;
SELECT replayed FROM idem_begin(11, 'SHIP', 'task-key-000000000011', '{}');
SELECT * FROM idem_submit(11, 'SHIP', 'task-key-000000000011', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT replayed FROM idem_begin(11, 'SHIP', 'task-key-000000000011', '{}');
SELECT idem_finish(11, 'SHIP', 'task-key-000000000011', 200, '{"sync": true}');
COMMIT;
SELECT replayed, status, http_status, body, task_id FROM idem_submit(11, 'SHIP', 'task-key-000000000011', '{}');
-- idem_complete on a record that is no task
SELECT idem_complete(id, 1, 200, '{}') FROM idem_internal.idempotency_record WHERE idempotency_key = 'task-key-000000000011';
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- Argument checks.
SELECT * FROM idem_submit(1, 'SHIP', 'short', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_submit(1, 'bad op!', 'task-key-000000000099', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_submit(1, 'SHIP', 'task-key-000000000099', NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_submit(NULL, 'SHIP', 'task-key-000000000099', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_submit(1, 'SHIP', 'task-key-000000000099', '{}', NULL, '-1 hour');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_lease('SHIP', 'w', '1 minute', 0);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_lease('SHIP', 'w', '1 minute', 1001);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_lease('SHIP', 'w', '0 seconds');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_lease('SHIP', 'w', '-5 seconds');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_lease('SHIP', '');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_lease('SHIP', repeat('w', 65));
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_lease('SHIP', E'w\n1');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_lease('SHIP', NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_lease('no such op!', 'w');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_fail(1, 1, NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_heartbeat(NULL, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- 64 printable characters, any script, are a worker name
SELECT count(*) AS none_due FROM idem_lease('SHIP', repeat('é', 64));

-- Statistics: leases, takeovers, stale tokens, retries, final failures.
SELECT operation, calls, executed, replayed, conflicts, in_flight, leases, takeovers,
       stale_tokens, retries, failed_final
FROM idem_stats WHERE datname = current_database() AND operation IN ('SHIP', 'BATCH', 'BACKOFF') ORDER BY operation;

-- A finished task keeps nothing of its request and payload (1.10): the
-- worker needs them no more; the fingerprint stays for the replays.
SELECT status, count(*) AS finished_tasks,
       count(*) FILTER (WHERE task_request IS NOT NULL OR task_payload IS NOT NULL) AS keeping_request,
       count(*) FILTER (WHERE request_hash IS NULL) AS without_fingerprint
FROM idem_internal.idempotency_record WHERE task_attempts IS NOT NULL AND status IN ('SUCCEEDED', 'FAILED_FINAL')
GROUP BY status ORDER BY status;

-- Nobody but the administrator's grantees may call them.
SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_may
FROM pg_proc p WHERE p.proname IN ('idem_submit', 'idem_lease', 'idem_heartbeat', 'idem_complete', 'idem_fail')
ORDER BY 1;
SELECT has_sequence_privilege('public', 'idem_internal.idem_task_token_seq', 'USAGE') AS public_may_draw_tokens;

DROP TABLE shipment;
DELETE FROM idem_internal.idempotency_record;
