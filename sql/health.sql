--
-- idem_health(): the figures an operator watches, after known writes and
-- expiries; its grants.
--
TRUNCATE idem_internal.idempotency_record, idem_internal.idem_outbox, idem_internal.idem_inbox;
-- 3 live records, 2 expired ones, 1 committed PROCESSING record
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at, created_at)
SELECT 1, 'HEALTH', 'health-key-' || lpad(g::text, 8, '0'), repeat('0', 64),
       CASE WHEN g = 6 THEN 'PROCESSING' ELSE 'SUCCEEDED' END,
       CASE WHEN g <= 2 THEN now() - interval '1 hour' ELSE now() + interval '1 day' END,
       now() - interval '90 seconds'
FROM generate_series(1, 6) g;
-- 3 messages, 1 acknowledged; 2 inbox entries, 1 expired
SELECT count(idem_outbox_emit('health', jsonb_build_object('n', g))) FROM generate_series(1, 3) g;
SELECT idem_outbox_ack(ARRAY(SELECT min(message_id) FROM idem_internal.idem_outbox));
SELECT idem_consume('health', 'm-1'), idem_consume('health', 'm-2');
UPDATE idem_internal.idem_inbox SET expires_at = now() - interval '1 second' WHERE message_id = 'm-1';

SELECT records, expired_backlog, oldest_expires_at < now() AS oldest_is_past,
       processing, oldest_processing_age >= interval '90 seconds' AS processing_age_ok,
       outbox_unacked, outbox_oldest_unacked_age >= interval '0' AS outbox_age_ok,
       outbox_acked_backlog, inbox_entries, inbox_expired_backlog,
       table_bytes > 0 AS has_table_bytes, index_bytes > 0 AS has_index_bytes
FROM idem_health();
-- after the cleanup: the backlogs are gone
SELECT idem_cleanup_expired() AS deleted;
SELECT records, expired_backlog, outbox_acked_backlog, inbox_entries, inbox_expired_backlog
FROM idem_health();

-- for monitoring roles, not for PUBLIC
SELECT has_function_privilege('pg_monitor', 'idem_health()', 'EXECUTE') AS monitor_may,
       has_function_privilege('public', 'idem_health()', 'EXECUTE') AS public_may;
TRUNCATE idem_internal.idempotency_record, idem_internal.idem_outbox, idem_internal.idem_inbox;
