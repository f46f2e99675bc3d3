-- Uncertain outcomes (1.16): for an operation with uncertain => 'reconcile',
-- an attempt that ends without a known outcome marks its task; only
-- idem_lease_reconcile hands it out, with the attempts so far.  Every ended
-- attempt is kept in idem_task_attempt, redacted, for the record's life.
SELECT operation, uncertain, reconcile_within, max_attempts
FROM idem_set_policy('CHARGE', uncertain => 'reconcile', max_attempts => 1,
                     retry_base => '1 hour', retry_max => '1 hour', redact => ARRAY['/card']);
-- bad values: 22023, nothing written
SELECT idem_set_policy('CHARGE', uncertain => 'maybe');
SELECT idem_set_policy('CHARGE', reconcile_within => '0 seconds');
SELECT idem_set_policy('CHARGE', reconcile_within => '-1 hour');
SELECT uncertain, reconcile_within FROM idem_policies WHERE operation = 'CHARGE';

CREATE FUNCTION lapse(k text) RETURNS void LANGUAGE sql AS $$
    UPDATE idem_internal.idempotency_record SET task_lease_expires_at = now() - interval '1 second'
    WHERE idempotency_key = k
$$;
CREATE FUNCTION marks(k text) RETURNS TABLE (status text, due boolean, leased boolean, uncertain boolean,
                                             reconcile_due boolean, attempts integer, reconciles integer,
                                             lapses integer, last_error jsonb)
LANGUAGE sql AS $$
    SELECT status, task_due_at IS NOT NULL, task_lease_expires_at IS NOT NULL,
           task_uncertain_since IS NOT NULL, task_reconcile_at <= now(), task_attempts,
           task_reconciles, task_lapses, task_last_error
    FROM idem_internal.idempotency_record WHERE idempotency_key = k
$$;

-- 1. the worker's own "unknown": the task is marked, PROCESSING
SELECT replayed, status FROM idem_submit(41, 'CHARGE', 'charge-key-000000001', '{"amount": 500}');
SELECT task_id AS t1, token AS k1 FROM idem_lease('CHARGE', 'w1') \gset
SELECT idem_fail_unknown(:t1, :k1, '{"provider": "timeout", "card": "4242"}') AS status;
SELECT * FROM marks('charge-key-000000001');
-- an older worker, unpacking idem_lease's columns by position, never gets it
SELECT count(*) AS old_worker_gets FROM idem_lease('CHARGE', 'old-worker', '1 minute', 1000);
SELECT count(*) AS old_worker_gets FROM (SELECT (idem_lease('CHARGE', 'old-worker')).*) l;
-- nor a hand-written SQL worker that reads the due time
SELECT count(*) AS due_by_hand FROM idem_internal.idempotency_record
WHERE operation = 'CHARGE' AND task_due_at <= now();
-- the stale holder is fenced
\set VERBOSITY sqlstate
SELECT idem_complete(:t1, :k1, 200, '{"late": true}');
\set VERBOSITY default
-- the client's repeat: 202, a problem saying the outcome is being reconciled
SELECT replayed, status, http_status, body::jsonb - 'task_id' AS body
FROM idem_submit(41, 'CHARGE', 'charge-key-000000001', '{"amount": 500}');
-- a synchronous call of the key: IK002, as for any unfinished task
SELECT idem_begin(41, 'CHARGE', 'charge-key-000000001', '{"amount": 500}');

-- the reconciling worker gets it, with the attempts so far (redacted)
SELECT task_id = :t1 AS same_task, attempt, token > :k1 AS newer_token,
       uncertain_since IS NOT NULL AS uncertain,
       jsonb_path_query_array(attempts, '$[*].outcome') AS outcomes,
       attempts -> 0 -> 'error' AS first_error, attempts -> 0 ->> 'worker' AS first_worker
FROM idem_lease_reconcile('CHARGE', 'rw1') \gset r_
\echo :r_same_task :r_attempt :r_newer_token :r_uncertain :r_outcomes :r_first_error :r_first_worker
SELECT task_id AS t1, token AS rk1 FROM idem_task_attempts WHERE task_id = :t1 AND outcome IS NULL \gset
-- nobody else gets it while that lease holds
SELECT count(*) AS second_reconciler_gets FROM idem_lease_reconcile('CHARGE', 'rw2');
-- the provider says the charge happened: the task succeeds with its answer
SELECT idem_complete(:t1, :rk1, 201, '{"charge": "ch_1"}', resource_id => 7);
SELECT replayed, status, http_status, body FROM idem_submit(41, 'CHARGE', 'charge-key-000000001', '{"amount": 500}');
SELECT * FROM marks('charge-key-000000001');
SELECT attempt, reconcile, worker, outcome, http_status, error, ended_at >= started_at AS ordered
FROM idem_task_attempts WHERE task_id = :t1 ORDER BY token;

-- 2. a lapsed lease (a worker killed after the provider answered): marked,
-- not ended FAILED_FINAL though max_attempts is 1
SELECT replayed FROM idem_submit(41, 'CHARGE', 'charge-key-000000002', '{"amount": 700}');
SELECT task_id AS t2 FROM idem_lease('CHARGE', 'w1', '1 minute') \gset
SELECT lapse('charge-key-000000002');
SELECT count(*) AS plain_gets FROM idem_lease('CHARGE', 'w2');
SELECT * FROM marks('charge-key-000000002');
-- the provider has no such charge: "did not happen", retryable, due again
SELECT max_attempts FROM idem_set_policy('CHARGE', max_attempts => 3);
SELECT task_id, token AS rk2 FROM idem_lease_reconcile('CHARGE', 'rw1') \gset
SELECT idem_fail(:t2, :rk2, '{"lookup": "no charge"}', retryable => true) AS status;
SELECT * FROM marks('charge-key-000000002');
UPDATE idem_internal.idempotency_record SET task_due_at = now() WHERE idempotency_key = 'charge-key-000000002';
SELECT attempt FROM idem_lease('CHARGE', 'w3') \gset
\echo attempt :attempt
SELECT outcome, reconcile, attempt FROM idem_task_attempts WHERE task_id = :t2 ORDER BY token;

-- 3. a lookup that cannot tell: still uncertain, reconciled again after a backoff
SELECT replayed FROM idem_submit(41, 'CHARGE', 'charge-key-000000003', '{"amount": 900}');
SELECT idem_fail_unknown(task_id, token, '{"provider": "timeout"}') FROM idem_lease('CHARGE', 'w1');
SELECT idem_fail_unknown(task_id, token, '{"lookup": "timeout"}') FROM idem_lease_reconcile('CHARGE', 'rw1');
SELECT * FROM marks('charge-key-000000003');
SELECT count(*) AS before_backoff FROM idem_lease_reconcile('CHARGE', 'rw1');
-- a lapsed reconcile lease is taken over by the next reconciler
UPDATE idem_internal.idempotency_record SET task_reconcile_at = now() WHERE idempotency_key = 'charge-key-000000003';
SELECT count(*) FROM idem_lease_reconcile('CHARGE', 'rw1', '1 minute');
SELECT lapse('charge-key-000000003');
SELECT attempt, jsonb_path_query_array(attempts, '$[*].outcome') AS outcomes FROM idem_lease_reconcile('CHARGE', 'rw2');
-- fails for good
SELECT idem_fail(task_id, token, '{"provider": "declined"}', retryable => false)
FROM idem_task_attempts WHERE idempotency_key = 'charge-key-000000003' AND outcome IS NULL;
SELECT status, http_status, body FROM idem_submit(41, 'CHARGE', 'charge-key-000000003', '{"amount": 900}');

-- 4. past reconcile_within: not handed to workers; it waits for an operator
SELECT reconcile_within FROM idem_set_policy('CHARGE', reconcile_within => '1 millisecond');
SELECT replayed FROM idem_submit(41, 'CHARGE', 'charge-key-000000004', '{"amount": 1100}');
SELECT idem_fail_unknown(task_id, token, '{"provider": "timeout"}') FROM idem_lease('CHARGE', 'w1');
SELECT pg_sleep(0.01);
SELECT count(*) AS reconciler_gets FROM idem_lease_reconcile('CHARGE', 'rw1');
SELECT count(*) AS plain_gets FROM idem_lease('CHARGE', 'w1');
SELECT * FROM marks('charge-key-000000004');
SELECT uncertain_tasks, reconcile_overdue, reconcile_oldest_overdue_age > '0' AS aged FROM idem_health();
SELECT reconcile_within FROM idem_set_policy('CHARGE', reconcile_within => NULL);

-- 5. an operation that does not reconcile: "unknown" is today's retryable
-- failure (and max_attempts ends it), recorded as unknown
SELECT operation, uncertain FROM idem_set_policy('SHIP_U', max_attempts => 2, retry_base => '1 hour', retry_max => '1 hour');
SELECT replayed FROM idem_submit(42, 'SHIP_U', 'ship-key-0000000001', '{"order": 1}');
SELECT idem_fail_unknown(task_id, token, '{"carrier": "timeout"}') FROM idem_lease('SHIP_U', 'w1');
SELECT * FROM marks('ship-key-0000000001');
UPDATE idem_internal.idempotency_record SET task_due_at = now() WHERE idempotency_key = 'ship-key-0000000001';
SELECT idem_fail_unknown(task_id, token, '{"carrier": "timeout"}') FROM idem_lease('SHIP_U', 'w1');
SELECT outcome, attempt FROM idem_task_attempts WHERE idempotency_key = 'ship-key-0000000001' ORDER BY token;
SELECT count(*) AS reconciler_gets FROM idem_lease_reconcile('SHIP_U', 'rw1');
-- the lapsed lease of such an operation still counts toward max_attempts (1.13)
SELECT replayed FROM idem_submit(42, 'SHIP_U', 'ship-key-0000000002', '{"order": 2}');
SELECT count(*) FROM idem_lease('SHIP_U', 'w1');
SELECT lapse('ship-key-0000000002');
SELECT count(*) FROM idem_lease('SHIP_U', 'w1');
SELECT lapse('ship-key-0000000002');
SELECT count(*) FROM idem_lease('SHIP_U', 'w1');
SELECT status FROM idem_internal.idempotency_record WHERE idempotency_key = 'ship-key-0000000002';
SELECT outcome FROM idem_task_attempts WHERE idempotency_key = 'ship-key-0000000002' ORDER BY token;

-- 6. the view: pg_monitor sees every owner, a monitor bound by
-- idem.allowed_owners only those
CREATE ROLE regress_attempts_mon;
SELECT count(*) > 0 FROM idem_grant('regress_attempts_mon', 'monitor');
SET idem.allowed_owners = '42';
SET ROLE regress_attempts_mon;
SELECT count(DISTINCT owner_id) AS owners, min(owner_id) AS owner FROM idem_task_attempts;
SELECT count(*) FROM idem_internal.idem_task_attempt;
RESET ROLE;
RESET idem.allowed_owners;
SELECT count(DISTINCT owner_id) AS owners FROM idem_task_attempts;
SELECT count(*) > 0 FROM idem_revoke('regress_attempts_mon', 'monitor');
DROP ROLE regress_attempts_mon;

-- 7. the attempts expire with their record, go with the cleanup, and with an erasure
SELECT count(*) AS rows, count(*) FILTER (WHERE a.expires_at = r.expires_at) AS with_record
FROM idem_internal.idem_task_attempt a JOIN idem_internal.idempotency_record r
  ON r.owner_id = a.owner_id AND r.id = a.task_id
WHERE r.idempotency_key = 'charge-key-000000001';
SELECT count(*) AS unfinished_expire_never FROM idem_internal.idem_task_attempt a
JOIN idem_internal.idempotency_record r ON r.owner_id = a.owner_id AND r.id = a.task_id
WHERE r.idempotency_key = 'charge-key-000000002' AND a.expires_at = 'infinity';
UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 second'
WHERE idempotency_key = 'charge-key-000000001';
UPDATE idem_internal.idem_task_attempt SET expires_at = now() - interval '1 second' WHERE task_id = :t1;
SELECT idem_cleanup_expired() > 0 AS cleaned;
SELECT count(*) AS left_after_cleanup FROM idem_internal.idem_task_attempt WHERE task_id = :t1;
SELECT count(*) > 0 AS others_kept FROM idem_internal.idem_task_attempt WHERE owner_id = 41;
SELECT idem_forget_owner(41) > 0 AS forgotten;
SELECT count(*) AS left_after_erasure FROM idem_internal.idem_task_attempt WHERE owner_id = 41;

SELECT idem_drop_policy('CHARGE'), idem_drop_policy('SHIP_U');
