--
-- Retention that keeps the audit trail (1.11): audit_ttl, idem_internal.idem_history,
-- idem_audit, reuse_after_expiry 'refuse' (IK007), idem_forget_owner.
--
\set SHOW_CONTEXT never
TRUNCATE idem_internal.idempotency_record, idem_internal.idem_history, idem_internal.idem_inbox;

-- a payment keeps 30 days of audit after its record; an order none
SELECT operation, audit_ttl, reuse_after_expiry
FROM idem_set_policy('PAY', audit_ttl => '30 days');
SELECT operation, audit_ttl FROM idem_set_policy('ORDER', ttl => '1 day');

CREATE FUNCTION pay_handler(request jsonb) RETURNS idem_result
LANGUAGE sql AS $$ SELECT (201, '{"charged": true}'::json, '{"X-Card": "4242"}'::jsonb, 77)::idem_result $$;

SELECT replayed, http_status FROM idem_run(31, 'PAY', 'retention-pay-000001', '{"amount": 10}', 'pay_handler(jsonb)');
SELECT replayed, http_status FROM idem_run(31, 'PAY', 'retention-pay-000002', '{"amount": 20}', 'pay_handler(jsonb)');
SELECT replayed, http_status FROM idem_run(31, 'ORDER', 'retention-ord-000001', '{"sku": 1}', 'pay_handler(jsonb)');
-- a long flow of the payment operation, finished
SELECT replayed FROM idem_submit(31, 'PAY', 'retention-task-00001', '{"amount": 30}', '{"card": "4242"}');
SELECT task_id, token FROM idem_lease('PAY', 'w1') \gset
SELECT idem_complete(:task_id, :token, 200, '{"done": 1}');
SELECT status, task_request, task_payload FROM idem_internal.idempotency_record WHERE id = :task_id;

-- everything expires; nothing has been cleaned yet.  The cleanup deletes
-- every record, and keeps the payments' audit fields (one transaction, so
-- that now() is the same)
BEGIN;
UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 hour';
SELECT idem_cleanup_expired() AS deleted;
SELECT count(*) AS records_left FROM idem_internal.idempotency_record;
SELECT owner_id, operation, idempotency_key, status, http_status, resource_id,
       length(request_hash) AS fingerprint_length, fingerprint_version,
       expires_at = now() - interval '1 hour' AS kept_expiry,
       audit_until = expires_at + interval '30 days' AS audit_until_ok,
       archived_at = now() AS archived_now
FROM idem_internal.idem_history ORDER BY idempotency_key;
COMMIT;
-- what the history holds: the audit fields, no request or response
SELECT string_agg(attname, ', ' ORDER BY attnum) AS history_columns
FROM pg_attribute WHERE attrelid = 'idem_internal.idem_history'::regclass AND attnum > 0 AND NOT attisdropped;

-- the key executes afresh after its expiry (reuse_after_expiry 'execute'),
-- and idem_audit shows both executions
SELECT replayed, http_status FROM idem_run(31, 'PAY', 'retention-pay-000001', '{"amount": 10}', 'pay_handler(jsonb)');
SELECT idempotency_key, status, http_status, resource_id, live,
       (archived_at IS NULL) = live AS archived_iff_past
FROM idem_audit WHERE idempotency_key = 'retention-pay-000001' ORDER BY live, executed_at;

-- an expired record replaced before the cleanup reached it: the renewal
-- itself archives it
UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 minute'
WHERE idempotency_key = 'retention-pay-000001';
SELECT replayed FROM idem_run(31, 'PAY', 'retention-pay-000001', '{"amount": 10}', 'pay_handler(jsonb)');
SELECT count(*) FILTER (WHERE live) AS live, count(*) FILTER (WHERE NOT live) AS past
FROM idem_audit WHERE idempotency_key = 'retention-pay-000001';

-- the history goes at audit_until, in the cleanup's batches
UPDATE idem_internal.idem_history SET audit_until = now() - interval '1 second'
WHERE idempotency_key = 'retention-pay-000002';
SELECT idem_cleanup_expired(1) AS deleted;
SELECT count(*) AS history_of_key_2 FROM idem_internal.idem_history WHERE idempotency_key = 'retention-pay-000002';

-- reuse_after_expiry 'refuse': a key in its audit period is refused with
-- IK007, whether its record is still there (expired) or in the history
SELECT operation, audit_ttl, reuse_after_expiry FROM idem_set_policy('PAY', reuse_after_expiry => 'refuse');
-- (the details name times: terse)
\set VERBOSITY terse
UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 minute'
WHERE idempotency_key = 'retention-pay-000001';
SELECT replayed FROM idem_run(31, 'PAY', 'retention-pay-000001', '{"amount": 10}', 'pay_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_cleanup_expired() AS deleted;
BEGIN;
SELECT replayed FROM idem_begin(31, 'PAY', 'retention-pay-000001', '{"amount": 10}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK;
-- the task's key too (archived by the cleanup)
SELECT replayed FROM idem_submit(31, 'PAY', 'retention-task-00001', '{"amount": 30}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
\set VERBOSITY default
-- the detail of a refusal names the expiry and the end of the audit period
DO $$
BEGIN
    PERFORM idem_begin(31, 'PAY', 'retention-task-00001', '{"amount": 30}');
EXCEPTION WHEN SQLSTATE 'IK007' THEN
    DECLARE d text;
    BEGIN
        GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL;
        RAISE NOTICE 'names audit_until: %', strpos(d, (SELECT to_char(audit_until, 'YYYY-MM-DD HH24:MI:SS') FROM idem_internal.idem_history
            WHERE idempotency_key = 'retention-task-00001')) > 0;
    END;
END $$;
-- nothing written by a refusal
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE owner_id = 31;
-- a new key is not refused; a key whose audit period ended executes
SELECT replayed FROM idem_run(31, 'PAY', 'retention-pay-000003', '{"amount": 10}', 'pay_handler(jsonb)');
UPDATE idem_internal.idem_history SET audit_until = now() - interval '1 second'
WHERE idempotency_key = 'retention-pay-000001';
SELECT replayed FROM idem_run(31, 'PAY', 'retention-pay-000001', '{"amount": 10}', 'pay_handler(jsonb)');
-- the refusals count with the conflicts
SELECT conflicts >= 3 AS counted FROM idem_stats
WHERE datname = current_database() AND kind = 'operation' AND operation = 'PAY';
-- back to the GUC (execute)
SELECT reuse_after_expiry FROM idem_set_policy('PAY', reuse_after_expiry => NULL);
SHOW idem.reuse_after_expiry;
SHOW idem.audit_ttl;

-- bad values: 22023, nothing written
SELECT idem_set_policy('PAY', reuse_after_expiry => 'sometimes');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy('PAY', audit_ttl => '-1 day');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy('PAY', audit_ttl => '0');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT audit_ttl, reuse_after_expiry FROM idem_policies WHERE operation = 'PAY';
-- the settings are the server's (the cleanup worker reads them)
SET idem.audit_ttl = '1 day';
SET idem.reuse_after_expiry = 'refuse';

-- idem_audit: pg_monitor reads every owner; another role granted it reads
-- the owners its idem.allowed_owners names
CREATE ROLE regress_audit_reader;
CREATE ROLE regress_audit_monitor IN ROLE pg_monitor;
GRANT SELECT ON idem_audit TO regress_audit_reader;
GRANT EXECUTE ON FUNCTION idem_audit_entries(bigint) TO regress_audit_reader;
SELECT replayed FROM idem_run(32, 'PAY', 'retention-pay-000032', '{"amount": 1}', 'pay_handler(jsonb)');
SET ROLE regress_audit_monitor;
SELECT owner_id, count(*) FROM idem_audit GROUP BY 1 ORDER BY 1;
-- one owner's, through the indexes
SELECT owner_id, count(*) FROM idem_audit_entries(32) GROUP BY 1;
SELECT count(*) FROM idem_internal.idem_history;
RESET ROLE;
SET idem.allowed_owners = '32';
SET ROLE regress_audit_reader;
SELECT owner_id, count(*) FROM idem_audit GROUP BY 1 ORDER BY 1;
RESET ROLE;
SET idem.allowed_owners = '1-30, 33-99';
SET ROLE regress_audit_reader;
SELECT owner_id, count(*) FROM idem_audit GROUP BY 1 ORDER BY 1;
RESET ROLE;
RESET idem.allowed_owners;
SET ROLE regress_audit_reader;
SELECT owner_id, count(*) FROM idem_audit GROUP BY 1 ORDER BY 1;
-- the tables and the function are not the reader's
SELECT count(*) FROM idem_internal.idem_history;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;
SET ROLE regress_audit_monitor;
SELECT count(*) FROM idem_internal.idem_history;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT has_table_privilege('public', 'idem_audit', 'SELECT') AS public_reads,
       has_function_privilege('public', 'idem_audit_entries(bigint)', 'EXECUTE') AS public_executes;

-- idem_forget_owner: every record, history row and inbox entry of the
-- owner, in batches; superuser only
SELECT idem_consume('billing', 'msg-31-1', owner => 31), idem_consume('billing', 'msg-31-2', owner => 31),
       idem_consume('billing', 'msg-32-1', owner => 32), idem_consume('billing', 'msg-none');
UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 minute' WHERE owner_id = 31;
SELECT idem_cleanup_expired() AS deleted;
SELECT replayed FROM idem_run(31, 'PAY', 'retention-pay-000004', '{"amount": 4}', 'pay_handler(jsonb)');
SELECT (SELECT count(*) FROM idem_internal.idempotency_record WHERE owner_id = 31) AS records,
       (SELECT count(*) FROM idem_internal.idem_history WHERE owner_id = 31) AS history,
       (SELECT count(*) FROM idem_internal.idem_inbox WHERE owner_id = 31) AS inbox;
SET ROLE regress_audit_monitor;
SELECT idem_forget_owner(31);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;
-- EXECUTE granted is not enough
GRANT EXECUTE ON FUNCTION idem_forget_owner(bigint, integer, integer, text) TO regress_audit_monitor;
SET ROLE regress_audit_monitor;
SELECT idem_forget_owner(31);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;
REVOKE ALL ON FUNCTION idem_forget_owner(bigint, integer, integer, text) FROM regress_audit_monitor;
SELECT idem_forget_owner(31, batch_size => 0);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_forget_owner(NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- one batch of 1 row a table, then the rest
SELECT idem_forget_owner(31, batch_size => 1, max_batches => 1) AS forgotten;
SELECT idem_forget_owner(31, batch_size => 1) AS forgotten;
SELECT (SELECT count(*) FROM idem_internal.idempotency_record WHERE owner_id = 31) AS records,
       (SELECT count(*) FROM idem_internal.idem_history WHERE owner_id = 31) AS history,
       (SELECT count(*) FROM idem_internal.idem_inbox WHERE owner_id = 31) AS inbox;
-- other owners' rows stay; the inbox entry without an owner too
SELECT (SELECT count(*) FROM idem_internal.idempotency_record WHERE owner_id = 32) AS records_32,
       (SELECT count(*) FROM idem_internal.idem_inbox WHERE owner_id = 32) AS inbox_32,
       (SELECT count(*) FROM idem_internal.idem_inbox WHERE owner_id IS NULL) AS inbox_no_owner;
-- the forgotten owner's key executes afresh
SELECT replayed FROM idem_run(31, 'PAY', 'retention-pay-000004', '{"amount": 4}', 'pay_handler(jsonb)');
-- idem_consume's owner is bound by idem.allowed_owners
SET idem.allowed_owners = '32';
SELECT idem_consume('billing', 'msg-31-3', owner => 31);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET idem.allowed_owners;

REVOKE ALL ON idem_audit FROM regress_audit_reader;
REVOKE ALL ON FUNCTION idem_audit_entries(bigint) FROM regress_audit_reader;
DROP ROLE regress_audit_reader, regress_audit_monitor;
SELECT idem_drop_policy('PAY'), idem_drop_policy('ORDER');
DROP FUNCTION pay_handler(jsonb);
TRUNCATE idem_internal.idempotency_record, idem_internal.idem_history, idem_internal.idem_inbox;

-- reuse_after_expiry 'refuse' with no audit period (neither the policy's
-- audit_ttl nor idem.audit_ttl) would execute expired keys again: the
-- policy warns, and idem_health() names the operation (1.13)
SELECT operation, reuse_after_expiry, audit_ttl FROM idem_set_policy('NOAUDIT', reuse_after_expiry => 'refuse');
SELECT refuse_without_audit FROM idem_health();
SELECT operation, audit_ttl FROM idem_set_policy('NOAUDIT', audit_ttl => '1 day');
SELECT refuse_without_audit FROM idem_health();
SELECT idem_drop_policy('NOAUDIT');
