-- Per-operation policy (1.10): idem_set_policy, idem_drop_policy,
-- idem_policies; precedence (a call's argument > the policy > the GUC);
-- omitted arguments left unchanged, NULL back to the GUC; who may set.
SET client_min_messages = warning;

-- nothing set: the GUCs
SELECT count(*) AS policies FROM idem_policies;

-- a 30-day payment key beside the default 1-day one
SELECT operation, ttl, failure_ttl, wait_timeout, max_attempts, retry_base, retry_max
FROM idem_set_policy('PAY', ttl => '30 days', failure_ttl => '1 hour');
BEGIN;
SELECT replayed, expires_at = now() + interval '30 days' AS policy_ttl
FROM idem_begin(1, 'PAY', 'policy-key-000000001', '{}');
SELECT idem_finish(1, 'PAY', 'policy-key-000000001', 201, '{}');
SELECT replayed, expires_at = now() + interval '1 day' AS guc_ttl
FROM idem_begin(1, 'ORDER', 'policy-key-000000002', '{}');
SELECT idem_finish(1, 'ORDER', 'policy-key-000000002', 201, '{}');
-- the call's own ttl comes first
SELECT replayed, expires_at = now() + interval '2 hours' AS call_ttl
FROM idem_begin(1, 'PAY', 'policy-key-000000003', '{}', '2 hours');
SELECT idem_finish(1, 'PAY', 'policy-key-000000003', 201, '{}');
-- a 4xx: the policy's failure_ttl
SELECT replayed FROM idem_begin(1, 'PAY', 'policy-key-000000004', '{}');
SELECT idem_finish(1, 'PAY', 'policy-key-000000004', 402, '{"error": "declined"}');
COMMIT;
SELECT idempotency_key, status, expires_at - created_at AS lifetime FROM idem_internal.idempotency_record
WHERE idempotency_key LIKE 'policy-key-%' ORDER BY idempotency_key;

-- idem_create_order and idem_run take the policy of their operation too
SELECT (idem_set_policy('CREATE_ORDER', ttl => '3 hours')).operation;
SELECT order_id > 0 AS ordered FROM idem_create_order(2, 'policy-order-key-0001', 5, 1);
SELECT expires_at - created_at AS lifetime FROM idem_internal.idempotency_record
WHERE idempotency_key = 'policy-order-key-0001';

-- omitted: unchanged; NULL: back to the GUC
SELECT operation, ttl, failure_ttl FROM idem_set_policy('PAY', failure_ttl => NULL);
SELECT operation, ttl, failure_ttl, wait_timeout FROM idem_set_policy('PAY', wait_timeout => '250 ms');
SELECT operation, ttl, failure_ttl, wait_timeout, max_attempts, retry_base, retry_max
FROM idem_policies ORDER BY operation;

-- bad values: 22023 (or 22004 for a NULL operation), nothing written
SELECT idem_set_policy('PAY', ttl => '0 seconds');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy('PAY', ttl => '31 days');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy('PAY', failure_ttl => '-1 minute');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy('PAY', wait_timeout => '-1 second');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy('PAY', max_attempts => 0);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy('PAY', retry_base => '0 seconds');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy('PAY', retry_max => '30 days');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy('bad operation!', ttl => '1 hour');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy(NULL, ttl => '1 hour');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT operation, ttl, failure_ttl, wait_timeout FROM idem_policies WHERE operation = 'PAY';

-- tasks: the policy's max_attempts and backoff
SELECT (idem_set_policy('SHIP', max_attempts => 2, retry_base => '1 hour', retry_max => '2 hours')).operation;
SELECT replayed FROM idem_submit(3, 'SHIP', 'policy-task-key-00001', '{}');
SELECT attempt, (SELECT idem_fail(task_id, token, '{"e": 1}')) AS first_failure
FROM idem_lease('SHIP', 'w1');
SELECT task_due_at - now() BETWEEN interval '0' AND interval '1 hour' AS backoff_within_retry_base
FROM idem_internal.idempotency_record WHERE idempotency_key = 'policy-task-key-00001';
UPDATE idem_internal.idempotency_record SET task_due_at = now() WHERE idempotency_key = 'policy-task-key-00001';
SELECT attempt, (SELECT idem_fail(task_id, token, '{"e": 2}')) AS second_failure
FROM idem_lease('SHIP', 'w1');

-- key_format and reject_weak_keys: what an operation's keys must look like
SELECT operation, key_format, reject_weak_keys
FROM idem_set_policy('CHARGE', key_format => 'uuid', reject_weak_keys => true);
BEGIN;
-- a UUID in either case is one key (kept in lower case)
SELECT replayed FROM idem_begin(4, 'CHARGE', '8E03978E-40D5-43E8-BC93-6894A57F9324', '{}');
SELECT idem_finish(4, 'CHARGE', '8e03978e-40d5-43e8-bc93-6894a57f9324', 201, '{}');
SELECT replayed FROM idem_begin(4, 'CHARGE', '8e03978e-40d5-43e8-bc93-6894A57F9324', '{}');
COMMIT;
SELECT idempotency_key FROM idem_internal.idempotency_record WHERE operation = 'CHARGE';
SELECT replayed FROM idem_begin(4, 'CHARGE', 'order-7-retry-0000001', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_begin(4, 'CHARGE', '8e03978e-40d5-43e8-bc93-6894a57f932', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_begin(4, 'CHARGE', '8e03978e_40d5_43e8_bc93_6894a57f9324', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_submit(4, 'CHARGE', 'not-a-uuid-0000000001', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT operation, key_format FROM idem_set_policy('CHARGE', key_format => 'ulid');
BEGIN;
SELECT replayed FROM idem_begin(4, 'CHARGE', '01jz3k9v4s6t8w0xyz12ab34cd', '{}');
SELECT idem_finish(4, 'CHARGE', '01JZ3K9V4S6T8W0XYZ12AB34CD', 201, '{}');
COMMIT;
SELECT count(*) AS ulid_records FROM idem_internal.idempotency_record WHERE idempotency_key = '01JZ3K9V4S6T8W0XYZ12AB34CD';
SELECT replayed FROM idem_begin(4, 'CHARGE', '01JZ3K9V4S6T8W0XYZ12AB34CU', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_begin(4, 'CHARGE', '81JZ3K9V4S6T8W0XYZ12AB34CD', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- reject_weak_keys alone: all digits, or fewer than 8 distinct characters
SELECT operation, key_format, reject_weak_keys FROM idem_set_policy('CHARGE', key_format => NULL);
SELECT replayed FROM idem_begin(4, 'CHARGE', '1733059200123456', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_begin(4, 'CHARGE', 'abababababababab', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
BEGIN;
SELECT replayed FROM idem_begin(4, 'CHARGE', 'k7Qp2xZ9mB4vN8rT', '{}');
ROLLBACK;
SELECT idem_set_policy('CHARGE', key_format => 'hex');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- idem_create_order's operation too
SELECT operation, reject_weak_keys FROM idem_set_policy('CREATE_ORDER', reject_weak_keys => true);
SELECT order_id FROM idem_create_order(2, '2026120100000001', 5, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT operation, reject_weak_keys FROM idem_set_policy('CREATE_ORDER', reject_weak_keys => NULL);
-- other operations keep the token rule
BEGIN;
SELECT replayed FROM idem_begin(4, 'REFUND', '1733059200123456', '{}');
ROLLBACK;
SELECT idem_drop_policy('CHARGE');

-- redact: the members named by JSON Pointers are not stored (bodies and
-- headers); a body with none of them is kept byte for byte
SELECT operation, redact FROM idem_set_policy('SIGNUP',
    redact => ARRAY['/password', '/card/number', '/items/0/secret', '/a~1b', '/missing', '/authorization']);
BEGIN;
SELECT replayed FROM idem_begin(5, 'SIGNUP', 'redact-key-000000001', '{}');
SELECT idem_finish(5, 'SIGNUP', 'redact-key-000000001', 201,
    '{"user": "ann", "password": "s3cret", "card": {"number": "4111", "brand": "visa"}, "items": [{"secret": 1, "n": 2}], "a/b": 3}',
    headers => '{"authorization": "Bearer abc", "location": "/users/ann"}');
SELECT replayed FROM idem_begin(5, 'SIGNUP', 'redact-key-000000002', '{}');
SELECT idem_finish(5, 'SIGNUP', 'redact-key-000000002', 201, '{"user":  "bob",   "plan": "free"}');
COMMIT;
SELECT idempotency_key, response_body, response_headers FROM idem_internal.idempotency_record
WHERE operation = 'SIGNUP' ORDER BY idempotency_key;
SELECT body::text, headers FROM idem_begin(5, 'SIGNUP', 'redact-key-000000001', '{}');
SELECT body::text FROM idem_begin(5, 'SIGNUP', 'redact-key-000000002', '{}');
-- a long flow's result too
SELECT replayed FROM idem_submit(5, 'SIGNUP', 'redact-task-key-00001', '{}');
SELECT idem_complete(task_id, token, 201, '{"password": "x", "ok": true}') FROM idem_lease('SIGNUP', 'w1');
SELECT body::text FROM idem_submit(5, 'SIGNUP', 'redact-task-key-00001', '{}');
-- bad pointers: 22023
SELECT idem_set_policy('SIGNUP', redact => ARRAY['password']);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy('SIGNUP', redact => ARRAY['']);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy('SIGNUP', redact => ARRAY['/a~2b']);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_set_policy('SIGNUP', redact => ARRAY[NULL::text]);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_drop_policy('SIGNUP');

-- who may set: a superuser or the extension's owner; pg_monitor reads
CREATE ROLE regress_policy_user;
CREATE ROLE regress_policy_monitor IN ROLE pg_monitor;
GRANT USAGE ON SCHEMA public TO regress_policy_user;
SET ROLE regress_policy_user;
SELECT idem_set_policy('PAY', ttl => '1 hour');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;
-- EXECUTE granted is not enough: only the owner or a superuser
GRANT EXECUTE ON FUNCTION idem_set_policy(text, interval, interval, interval, integer, interval, interval, interval, text, text[], text, boolean, text, interval),
    idem_drop_policy(text) TO regress_policy_user;
SET ROLE regress_policy_user;
SELECT idem_set_policy('PAY', ttl => '1 hour');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_drop_policy('PAY');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_policies;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_internal.idem_policy;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;
SET ROLE regress_policy_monitor;
SELECT count(*) AS monitor_reads FROM idem_policies;
RESET ROLE;

-- drop: the GUC again
SELECT idem_drop_policy('PAY') AS dropped, idem_drop_policy('PAY') AS again;
BEGIN;
SELECT replayed, expires_at = now() + interval '1 day' AS guc_ttl
FROM idem_begin(1, 'PAY', 'policy-key-000000005', '{}');
ROLLBACK;

-- a write of the table by hand invalidates the cached copy too
UPDATE idem_internal.idem_policy SET ttl = '5 hours' WHERE operation = 'CREATE_ORDER';
SELECT order_id > 0 AS ordered FROM idem_create_order(2, 'policy-order-key-0002', 5, 1);
SELECT expires_at - created_at AS lifetime FROM idem_internal.idempotency_record
WHERE idempotency_key = 'policy-order-key-0002';

-- from PL/pgSQL too; every setting omitted: a policy that changes nothing
DO $$ BEGIN PERFORM idem_set_policy('PAY', ttl => '2 days'); PERFORM idem_set_policy('PAY'); END $$;
SELECT operation, ttl, failure_ttl, wait_timeout FROM idem_policies WHERE operation = 'PAY';

REVOKE EXECUTE ON FUNCTION idem_set_policy(text, interval, interval, interval, integer, interval, interval, interval, text, text[], text, boolean, text, interval),
    idem_drop_policy(text) FROM regress_policy_user;
REVOKE USAGE ON SCHEMA public FROM regress_policy_user;
DROP ROLE regress_policy_user, regress_policy_monitor;
TRUNCATE idem_internal.idem_policy;
SELECT count(*) AS policies FROM idem_policies;
-- the records of this test go with it
DELETE FROM idem_internal.idempotency_record
WHERE idempotency_key LIKE 'policy-%' OR idempotency_key LIKE 'redact-%' OR operation IN ('CHARGE', 'SIGNUP');
RESET client_min_messages;
