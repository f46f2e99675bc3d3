--
-- idem_stats: known calls give exact counts; what a call writes counts only
-- once its transaction commits; idem_stats_reset(); grants.
--
\set SHOW_CONTEXT never
\set VERBOSITY terse
SELECT idem_stats_reset();
SELECT count(*) FILTER (WHERE calls + executed + replayed + conflicts + in_flight + outbox_emitted > 0) AS nonzero_rows,
       bool_and(stats_reset > now() - interval '1 minute') AS reset_now
FROM idem_stats;

-- orders: executed (committed), executed then rolled back, replayed, conflict
SELECT order_id > 0 AS ok FROM idem_create_order(71, 'stats-key-0000000001', 1, 1);
SELECT replayed FROM idem_create_order(71, 'stats-key-0000000001', 1, 1);
SELECT idem_create_order(71, 'stats-key-0000000001', 1, 2);
BEGIN;
SELECT replayed FROM idem_create_order(71, 'stats-key-0000000002', 1, 1);
ROLLBACK;

-- the generic API: a 4xx (failed_final), a finish rolled back to a
-- savepoint and done again (executed once), a second claim of a key in one
-- transaction (in_flight), an expired record executed anew (renewed)
BEGIN;
SELECT replayed FROM idem_begin(71, 'STATS_OP', 'stats-key-0000000003', '{}');
SELECT idem_finish(71, 'STATS_OP', 'stats-key-0000000003', 422, '{"error": "no"}');
COMMIT;
BEGIN;
SELECT replayed FROM idem_begin(71, 'STATS_OP', 'stats-key-0000000004', '{}');
SAVEPOINT s;
SELECT idem_finish(71, 'STATS_OP', 'stats-key-0000000004', 201, '{}');
ROLLBACK TO s;
SELECT idem_finish(71, 'STATS_OP', 'stats-key-0000000004', 201, '{}');
COMMIT;
BEGIN;
SELECT replayed FROM idem_begin(71, 'STATS_OP', 'stats-key-0000000006', '{}');
SELECT idem_begin(71, 'STATS_OP', 'stats-key-0000000006', '{}');
ROLLBACK;
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
VALUES (71, 'STATS_OP', 'stats-key-0000000005', idem_request_hash('{}'), 'SUCCEEDED', now() - interval '1 second');
BEGIN;
SELECT replayed FROM idem_begin(71, 'STATS_OP', 'stats-key-0000000005', '{}');
SELECT idem_finish(71, 'STATS_OP', 'stats-key-0000000005', 200, '{}');
COMMIT;

-- outbox and inbox (rows named by topic and consumer)
SELECT idem_outbox_emit('stats_topic', '{}') > 0 AS emitted;
BEGIN;
SELECT idem_outbox_emit('stats_topic', '{}') > 0 AS rolled_back;
ROLLBACK;
SELECT idem_outbox_emit('stats_topic', '{}', 'k') > 0 AS emitted;
SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_internal.idem_outbox WHERE topic = 'stats_topic'));
SELECT idem_consume('stats_consumer', 'm-1'), idem_consume('stats_consumer', 'm-1'),
       idem_consume('stats_consumer', 'm-1');
-- a topic and a consumer named like an operation count in rows of their own
SELECT idem_outbox_emit('STATS_OP', '{}') > 0 AS emitted;
SELECT idem_consume('STATS_OP', 'm-2'), idem_consume('STATS_OP', 'm-2');
-- the cleanup: 2 acknowledged messages, the 4xx record once it expires, and
-- an expired inbox entry (counted under its consumer)
UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 second'
WHERE idempotency_key = 'stats-key-0000000003';
UPDATE idem_internal.idem_inbox SET expires_at = now() - interval '1 second'
WHERE consumer = 'stats_consumer' AND message_id = 'm-1';
SELECT idem_cleanup_expired() AS deleted;

SELECT operation, kind, calls, executed, replayed, conflicts, in_flight, waits, renewed, failed_final,
       leases, takeovers, stale_tokens, retries, outbox_emitted, outbox_acked, inbox_duplicates,
       cleanup_deleted
FROM idem_stats
WHERE datname = current_database() AND operation IN ('CREATE_ORDER', 'STATS_OP', 'stats_topic', 'stats_consumer')
ORDER BY operation, kind;
-- the "(other)" row has no kind
SELECT kind IS NULL AS no_kind FROM idem_stats WHERE operation = '(other)';

-- reset: every counter back to 0, the rows stay
SELECT idem_stats_reset();
SELECT count(*) > 0 AS rows_kept, sum(calls + executed + replayed + conflicts + outbox_emitted + inbox_duplicates) AS total
FROM idem_stats WHERE datname = current_database();

-- for monitoring roles, not for PUBLIC
SELECT has_table_privilege('pg_monitor', 'idem_stats', 'SELECT') AS monitor_reads,
       has_function_privilege('pg_monitor', 'idem_stats_reset()', 'EXECUTE') AS monitor_resets,
       has_table_privilege('public', 'idem_stats', 'SELECT') AS public_reads,
       has_function_privilege('public', 'idem_stats_reset()', 'EXECUTE') AS public_resets,
       has_function_privilege('public', 'idem_internal.idem_stats_add(text, text, bigint)', 'EXECUTE') AS public_adds;
TRUNCATE idem_internal.idempotency_record, idem_internal.idem_outbox, idem_internal.idem_inbox;
