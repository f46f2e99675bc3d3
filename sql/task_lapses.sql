-- A task whose worker keeps dying ends (1.13): a lapsed lease counts as an
-- attempt; past max_attempts the next lease ends the task FAILED_FINAL with
-- the reason "lease lapsed N times", and the client's repeat gets it.
SELECT operation, max_attempts FROM idem_set_policy('CRASHY', max_attempts => 2);
CREATE FUNCTION lapse(k text) RETURNS void LANGUAGE sql AS $$
    UPDATE idem_internal.idempotency_record SET task_lease_expires_at = now() - interval '1 second'
    WHERE operation = 'CRASHY' AND idempotency_key = k
$$;

-- the worker dies twice: leased twice, then ended, never leased a third time
SELECT replayed, status FROM idem_submit(11, 'CRASHY', 'lapse-key-0000000001', '{"charge": 10}');
SELECT attempt FROM idem_lease('CRASHY', 'w1', '1 minute');
SELECT lapse('lapse-key-0000000001');
SELECT attempt FROM idem_lease('CRASHY', 'w2', '1 minute');
SELECT lapse('lapse-key-0000000001');
SELECT count(*) AS leased_a_third_time FROM idem_lease('CRASHY', 'w3', '1 minute');
SELECT status, http_status, response_body, task_attempts, task_lapses, task_last_error,
       task_request IS NULL AS request_cleared, task_due_at IS NULL AS not_due,
       expires_at > now() + interval '1 minute' AS kept_for_failure_ttl
FROM idem_internal.idempotency_record WHERE idempotency_key = 'lapse-key-0000000001';
-- the client's repeat gets the stored failure
SELECT replayed, status, http_status, body FROM idem_submit(11, 'CRASHY', 'lapse-key-0000000001', '{"charge": 10}');
SELECT count(*) AS leased_again FROM idem_lease('CRASHY', 'w4', '1 minute');

-- failures and lapses together count: a retryable failure, then lapses
SELECT operation, max_attempts FROM idem_set_policy('CRASHY', max_attempts => 3, retry_base => '1 second', retry_max => '1 second');
SELECT replayed FROM idem_submit(11, 'CRASHY', 'lapse-key-0000000002', '{"charge": 20}');
SELECT attempt, idem_fail(task_id, token, '{"e": "gateway timeout"}', true) FROM idem_lease('CRASHY', 'w1', '1 minute');
UPDATE idem_internal.idempotency_record SET task_due_at = now() - interval '1 second' WHERE idempotency_key = 'lapse-key-0000000002';
SELECT attempt FROM idem_lease('CRASHY', 'w1', '1 minute');
SELECT lapse('lapse-key-0000000002');
SELECT attempt FROM idem_lease('CRASHY', 'w2', '1 minute');
SELECT lapse('lapse-key-0000000002');
SELECT count(*) AS leased_a_fourth_time FROM idem_lease('CRASHY', 'w3', '1 minute');
SELECT status, task_attempts, task_lapses, response_body FROM idem_internal.idempotency_record
WHERE idempotency_key = 'lapse-key-0000000002';

-- a lapse within the limit: the next worker completes it
SELECT replayed FROM idem_submit(11, 'CRASHY', 'lapse-key-0000000003', '{"charge": 30}');
SELECT attempt FROM idem_lease('CRASHY', 'w1', '1 minute');
SELECT lapse('lapse-key-0000000003');
SELECT attempt, idem_complete(task_id, token, 200, '{"charged": 30}') FROM idem_lease('CRASHY', 'w2', '1 minute');
SELECT status, task_attempts, task_lapses FROM idem_internal.idempotency_record
WHERE idempotency_key = 'lapse-key-0000000003';

-- counted with the final failures
SELECT failed_final, takeovers FROM idem_stats
WHERE datname = current_database() AND kind = 'operation' AND operation = 'CRASHY';
DROP FUNCTION lapse(text);
SELECT idem_drop_policy('CRASHY');
