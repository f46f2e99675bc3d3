-- idem.trace_context (1.16): the W3C traceparent of the caller's request,
-- which idem_outbox_emit copies into a message's headers ("traceparent",
-- unless the emit names one) and idem_submit into the task's record, where
-- the lease's holder reads it (idem_task_trace_context).
-- a malformed value is refused when set: 22023
SET idem.trace_context = 'nonsense';
SET idem.trace_context = '00-00000000000000000000000000000000-00f067aa0ba902b7-01';
SET idem.trace_context = '00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01';
SET idem.trace_context = 'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET idem.trace_context = '00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01';
SET idem.trace_context = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra';
SHOW idem.trace_context;

-- 1. messages: copied, beside the emit's headers; the emit's own wins
BEGIN;
SET LOCAL idem.trace_context = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SELECT idem_outbox_emit('trace.topic', '{"n": 1}', 'k1') IS NOT NULL AS emitted;
SELECT idem_outbox_emit('trace.topic', '{"n": 2}', 'k2', '{"source": "web"}') IS NOT NULL AS emitted;
SELECT idem_outbox_emit('trace.topic', '{"n": 3}', 'k3',
                        '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}') IS NOT NULL AS emitted;
COMMIT;
-- SET LOCAL ends with the transaction: the next emit has no trace context
SHOW idem.trace_context;
SELECT idem_outbox_emit('trace.topic', '{"n": 4}', 'k4') IS NOT NULL AS emitted;
SELECT payload->>'n' AS n, headers FROM idem_internal.idem_outbox WHERE topic = 'trace.topic' ORDER BY message_id;
-- a rolled-back emit leaves nothing, whatever the setting
BEGIN;
SET LOCAL idem.trace_context = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SELECT idem_outbox_emit('trace.topic', '{"n": 5}', 'k5') IS NOT NULL AS emitted;
ROLLBACK;
SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = 'trace.topic';

-- 2. tasks: the record keeps the submitter's, its holder reads it
-- (errors shown by SQLSTATE and message, the ids as N: other tests drew ids before)
CREATE FUNCTION trace_error(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '[0-9]+', 'N', 'g');
END
$$;
BEGIN;
SET LOCAL idem.trace_context = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SELECT replayed, status FROM idem_submit(51, 'TRACE_EXPORT', 'trace-task-0000001', '{"rows": 10}');
COMMIT;
SELECT replayed, status FROM idem_submit(51, 'TRACE_EXPORT', 'trace-task-0000002', '{"rows": 20}');
SELECT task_id AS t1, token AS k1 FROM idem_lease('TRACE_EXPORT', 'w1') \gset
SELECT task_id AS t2, token AS k2 FROM idem_lease('TRACE_EXPORT', 'w1') \gset
SELECT idem_task_trace_context(:t1, :k1);
SELECT idem_task_trace_context(:t2, :k2) IS NULL AS none;
-- only the lease's holder: IK004 for another token; 22004 for a NULL
SELECT trace_error(format('SELECT idem_task_trace_context(%s, %s)', :t1, :k1 + 1000));
SELECT trace_error(format('SELECT idem_task_trace_context(NULL, %s)', :k1));
SELECT trace_error(format('SELECT idem_task_trace_context(%s, NULL)', :t1));
-- a repeat of the submit under another trace keeps the first
BEGIN;
SET LOCAL idem.trace_context = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
SELECT replayed, status FROM idem_submit(51, 'TRACE_EXPORT', 'trace-task-0000001', '{"rows": 10}');
COMMIT;
SELECT idem_task_trace_context(:t1, :k1);
-- finished: the record lets it go
SELECT idem_complete(:t1, :k1, 200, '{"done": true}');
SELECT task_trace_context IS NULL AS cleared FROM idem_internal.idempotency_record WHERE id = :t1;
SELECT trace_error(format('SELECT idem_task_trace_context(%s, %s)', :t1, :k1));

-- 3. the worker kind may read it; a role without idem's grants may not
CREATE ROLE trace_worker;
CREATE ROLE trace_nobody;
SELECT count(*) > 0 AS granted FROM idem_grant('trace_worker', 'worker');
SET ROLE trace_worker;
SELECT idem_task_trace_context(:t2, :k2) IS NULL AS none;
RESET ROLE;
SET ROLE trace_nobody;
SELECT trace_error(format('SELECT idem_task_trace_context(%s, %s)', :t2, :k2));
RESET ROLE;
SELECT count(*) >= 0 AS revoked FROM idem_revoke('trace_worker', 'worker');
DROP ROLE trace_worker;
DROP ROLE trace_nobody;
SELECT idem_fail(:t2, :k2, '{"why": "test over"}', false);
DROP FUNCTION trace_error(text);
