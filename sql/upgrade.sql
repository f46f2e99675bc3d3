--
-- ALTER EXTENSION idem UPDATE from earlier versions gives what a fresh
-- install gives (members, grants, function security and settings, table
-- columns, constraints, indexes, types), and keeps the data.  The older
-- definitions run with this library too.  (test/upgrade/suite_after_update.sh
-- compares every member in full, from every release the update scripts name.)
--

-- What the extension consists of, as text rows (functions, not views: a
-- view would depend on the tables and block DROP EXTENSION).
CREATE FUNCTION pg_temp.idem_catalog() RETURNS TABLE (kind text, item text, detail text)
LANGUAGE sql AS $$
SELECT 'member' AS kind, pg_describe_object(d.classid, d.objid, d.objsubid) AS item,
       -- and the function's whole definition: a fresh install (extension/idem.sql)
       -- and an update must define each function alike
       concat_ws(' ', p.proacl::text, p.prosecdef::text, p.proconfig::text,
                 md5(pg_get_functiondef(p.oid))) AS detail
FROM pg_depend d
LEFT JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
LEFT JOIN pg_type t ON d.classid = 'pg_type'::regclass AND t.oid = d.objid
WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
  -- a table's row type and array types are members from PostgreSQL 17 on:
  -- left out, so that every version counts alike
  AND NOT coalesce(t.typcategory = 'A' OR EXISTS (SELECT FROM pg_class r
                   WHERE r.oid = t.typrelid AND r.relkind <> 'c'), false)
UNION ALL
SELECT 'column', c.relname || '.' || a.attname,
       concat_ws(' ', format_type(a.atttypid, a.atttypmod), a.attnotnull::text,
                 pg_get_expr(ad.adbin, ad.adrelid), a.attnum::text)
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
WHERE c.relnamespace IN ('public'::regnamespace, to_regnamespace('idem_internal')) AND c.relkind IN ('r', 'c')
  AND c.relname IN ('idempotency_record', 'purchase_order', 'idem_result', 'idem_outcome',
                    'idem_outbox', 'idem_inbox')
  AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint', (SELECT r.relname FROM pg_class r WHERE r.oid = conrelid) || '.' || conname, pg_get_constraintdef(oid)
FROM pg_constraint
WHERE conrelid IN (to_regclass('idem_internal.idempotency_record'), to_regclass('idem_internal.purchase_order'),
                   to_regclass('idem_internal.idem_outbox'), to_regclass('idem_internal.idem_inbox'))
  -- NOT NULL is a constraint row from PostgreSQL 18 on; the columns' rows
  -- say it already
  AND contype <> 'n'
UNION ALL
SELECT 'index', indexrelid::regclass::text, pg_get_indexdef(indexrelid)
FROM pg_index
WHERE indrelid IN (to_regclass('idem_internal.idempotency_record'), to_regclass('idem_internal.purchase_order'),
                   to_regclass('idem_internal.idem_outbox'), to_regclass('idem_internal.idem_inbox'))
UNION ALL
SELECT 'acl', relname, relacl::text
FROM pg_class WHERE relname IN ('idempotency_record', 'purchase_order', 'idem_outbox',
                                'idem_inbox', 'idem_outbox_message_id_seq')
  AND relnamespace IN ('public'::regnamespace, to_regnamespace('idem_internal'))
$$;

-- What a fresh install (default_version) holds.
SELECT extversion FROM pg_extension WHERE extname = 'idem';
CREATE TEMP TABLE fresh_install AS SELECT * FROM pg_temp.idem_catalog();
SELECT kind, count(*) FROM fresh_install GROUP BY kind ORDER BY kind;
SELECT item, detail FROM fresh_install
WHERE item IN ('idempotency_record.ck_idempotency_status', 'idempotency_record.response_body');

-- Differences between fresh_install and what idem_catalog shows now.
CREATE FUNCTION pg_temp.catalog_diff() RETURNS TABLE (side text, kind text, item text, detail text)
LANGUAGE sql AS $$
(SELECT 'only fresh', * FROM fresh_install EXCEPT SELECT 'only fresh', * FROM pg_temp.idem_catalog())
UNION ALL
(SELECT 'only updated', * FROM pg_temp.idem_catalog() EXCEPT SELECT 'only updated', * FROM fresh_install)
$$;

-- From 1.0: a record and an order written by the 1.0 definitions replay
-- after the update, through idem_create_order and through idem_begin.
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.0';
SELECT order_id, replayed FROM idem_create_order(301, 'upgrade-key-0000001', 4, 2);
ALTER EXTENSION idem UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idem';
SELECT * FROM pg_temp.catalog_diff();
-- the preload notice: 1.0 created and dropped it in the extension's schema;
-- from 1.13 it is one internal function, not callable by PUBLIC
SELECT pronamespace::regnamespace AS schema, has_function_privilege('public', oid, 'EXECUTE') AS public_may_call
FROM pg_proc WHERE proname = 'idem_cleanup_worker_notice';
SELECT order_id, replayed FROM idem_create_order(301, 'upgrade-key-0000001', 4, 2);
SELECT replayed, http_status, body FROM idem_begin(301, 'CREATE_ORDER', 'upgrade-key-0000001', '{"sku": 4, "qty": 2}');

-- From 1.1 and from 1.2.
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.1';
SELECT order_id, replayed FROM idem_create_order(302, 'upgrade-key-0000002', 4, 2);
ALTER EXTENSION idem UPDATE;
SELECT * FROM pg_temp.catalog_diff();
SELECT order_id, replayed FROM idem_create_order(302, 'upgrade-key-0000002', 4, 2);

DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.2';
SELECT order_id, replayed FROM idem_create_order(303, 'upgrade-key-0000003', 4, 2);
-- the generic API does not exist before 1.3
SELECT count(*) AS generic_api FROM pg_proc WHERE proname IN ('idem_begin', 'idem_finish', 'idem_run');
ALTER EXTENSION idem UPDATE;
SELECT * FROM pg_temp.catalog_diff();
SELECT order_id, replayed FROM idem_create_order(303, 'upgrade-key-0000003', 4, 2);
BEGIN;
SELECT replayed FROM idem_begin(303, 'DEBIT', 'upgrade-key-0000004', '{"amount": 1}');
SELECT idem_finish(303, 'DEBIT', 'upgrade-key-0000004', 422, '{"error": "declined"}');
COMMIT;
SELECT status FROM idem_internal.idempotency_record WHERE idempotency_key = 'upgrade-key-0000004';

-- the status constraint now refuses what idem never writes
\set VERBOSITY terse
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
VALUES (303, 'DEBIT', 'upgrade-key-0000005', repeat('0', 64), 'DONE', now());
\echo SQLSTATE :LAST_ERROR_SQLSTATE
\set VERBOSITY default

-- the worker's status and its grants
SELECT count(*) >= 0 AS status_answers FROM idem_cleanup_status();
SELECT has_function_privilege('public', 'idem_cleanup_status()', 'EXECUTE') AS public_may,
       has_function_privilege('pg_monitor', 'idem_cleanup_status()', 'EXECUTE') AS monitor_may;

-- From 1.3: the outbox and the inbox do not exist before 1.4; a library
-- that knows them serves a 1.3 database, whose generic API keeps working.
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.3';
SELECT count(*) AS outbox_inbox FROM pg_proc
WHERE proname IN ('idem_outbox_emit', 'idem_outbox_fetch', 'idem_outbox_ack', 'idem_consume');
BEGIN;
SELECT replayed FROM idem_begin(304, 'NOOP', 'upgrade-key-0000006', '{}');
SELECT idem_finish(304, 'NOOP', 'upgrade-key-0000006', 200, '{"done": true}');
COMMIT;
SELECT idem_cleanup_expired();
ALTER EXTENSION idem UPDATE;
SELECT * FROM pg_temp.catalog_diff();
SELECT replayed, body FROM idem_begin(304, 'NOOP', 'upgrade-key-0000006', '{}');
BEGIN;
SELECT idem_outbox_emit('upgrade', '{"n": 1}', 'k') > 0 AS emitted;
SELECT idem_consume('upgrade', 'm-1') AS first_time;
COMMIT;
SELECT msg_key, payload FROM idem_outbox_fetch('upgrade');
SELECT idem_consume('upgrade', 'm-1') AS redelivered;

-- From 1.4: tasks do not exist before 1.5; a library that knows them
-- serves a 1.4 database (records read, written and replayed), and after
-- the update a record made before is no task.
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.4';
SELECT count(*) AS tasks FROM pg_proc WHERE proname IN ('idem_submit', 'idem_lease');
BEGIN;
SELECT replayed FROM idem_begin(305, 'NOOP', 'upgrade-key-0000007', '{}');
SELECT idem_finish(305, 'NOOP', 'upgrade-key-0000007', 201, '{"done": true}');
COMMIT;
SELECT replayed, body FROM idem_begin(305, 'NOOP', 'upgrade-key-0000007', '{}');
ALTER EXTENSION idem UPDATE;
SELECT * FROM pg_temp.catalog_diff();
SELECT replayed, body FROM idem_begin(305, 'NOOP', 'upgrade-key-0000007', '{}');
-- the record made at 1.4 is no task: a submit of its key replays it
SELECT replayed, status, http_status, task_id FROM idem_submit(305, 'NOOP', 'upgrade-key-0000007', '{}');
SELECT replayed, status, http_status FROM idem_submit(305, 'LONG', 'upgrade-key-0000008', '{"n": 1}');
SELECT key, request, attempt FROM idem_lease('LONG', 'upgrade-worker');

-- From 1.5: idem_distribute() does not exist before 1.6; a task submitted
-- at 1.5 is leased after the update.
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.5';
SELECT count(*) AS distribute FROM pg_proc WHERE proname LIKE 'idem_distribute%';
SELECT replayed, status FROM idem_submit(306, 'LONG', 'upgrade-key-0000009', '{"n": 2}');
ALTER EXTENSION idem UPDATE;
SELECT * FROM pg_temp.catalog_diff();
SELECT key, request, attempt FROM idem_lease('LONG', 'upgrade-worker');

-- From 1.6: idem_stats has no kind column before 1.7, and reads with the
-- new library all the same; after the update it has one, and the outbox's
-- fetch and acknowledgement go through idem_outbox_guard().
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.6';
SELECT count(*) FILTER (WHERE attname = 'kind') AS kind_columns, count(*) AS columns
FROM pg_attribute WHERE attrelid = 'idem_stats'::regclass AND attnum > 0;
SELECT count(*) >= 0 AS stats_read FROM idem_stats;
SELECT idem_outbox_emit('upgrade-topic', '{}', 'k') > 0 AS emitted;
ALTER EXTENSION idem UPDATE;
SELECT * FROM pg_temp.catalog_diff();
SELECT count(*) FILTER (WHERE attname = 'kind') AS kind_columns FROM pg_attribute
WHERE attrelid = 'idem_stats'::regclass AND attnum > 0;
-- the fetch (SQL) calls the guard; the acknowledgement is C since 1.12,
-- guarded by its writes (tempschema)
SELECT p.proname, l.lanname, l.lanname = 'c' OR p.prosrc LIKE '%idem_outbox_guard()%' AS guarded
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.proname IN ('idem_outbox_fetch', 'idem_outbox_ack') ORDER BY p.proname;
SELECT count(*) AS fetched FROM idem_outbox_fetch('upgrade-topic');

-- From 1.7: idem_grant and idem_revoke do not exist before 1.8; after the
-- update they grant a kind's rights, as on a fresh install.
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.7';
SELECT count(*) AS grant_functions FROM pg_proc WHERE proname IN ('idem_grant', 'idem_revoke');
ALTER EXTENSION idem UPDATE;
SELECT * FROM pg_temp.catalog_diff();
CREATE ROLE regress_idem_upgraded;
SELECT privilege, object FROM idem_grant('regress_idem_upgraded', 'consumer');
SELECT has_function_privilege('regress_idem_upgraded', 'idem_consume(text, text, interval, bigint)', 'EXECUTE') AS consumes;
SELECT count(*) FROM idem_revoke('regress_idem_upgraded', 'consumer');
DROP ROLE regress_idem_upgraded;

-- From 1.8: idem_outcome has no expires_at before 1.9, and idem_begin and
-- idem_run answer with the five columns it has; after the update, six.
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.8';
BEGIN;
SELECT * FROM idem_begin(307, 'DEBIT', 'upgrade-key-0000010', '{}');
ROLLBACK;
ALTER EXTENSION idem UPDATE;
SELECT * FROM pg_temp.catalog_diff();
BEGIN;
SELECT replayed, expires_at > now() AS expires FROM idem_begin(307, 'DEBIT', 'upgrade-key-0000011', '{}');
ROLLBACK;

-- From 1.9: no policies before 1.10; after the update idem_set_policy
-- works and its ttl applies, as on a fresh install.
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.9';
SELECT count(*) AS policy_tables FROM pg_class WHERE relname = 'idem_policy';
BEGIN;
SELECT replayed, expires_at = now() + interval '1 day' AS guc_ttl FROM idem_begin(308, 'PAY', 'upgrade-key-0000012', '{}');
ROLLBACK;
ALTER EXTENSION idem UPDATE;
SELECT * FROM pg_temp.catalog_diff();
SELECT operation, ttl FROM idem_set_policy('PAY', ttl => '30 days');
BEGIN;
SELECT replayed, expires_at = now() + interval '30 days' AS policy_ttl FROM idem_begin(308, 'PAY', 'upgrade-key-0000012', '{}');
ROLLBACK;
SELECT idem_drop_policy('PAY');

-- From 1.10: idem_finish, idem_complete and idem_consume get new
-- signatures in 1.11 (header_list json, owner bigint); the update warns
-- which roles had EXECUTE on the old ones, and idem_grant in the same
-- transaction gives it again, recorded as the administrator's grant (not
-- as an initial privilege of the extension, which pg_dump would leave
-- out); idem_set_policy of 1.10 (no audit_ttl) still works with the new
-- library until the update; idem_outcome gets header_list; records get
-- fingerprint_version.
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.10';
CREATE ROLE regress_idem_upgraded;
SELECT count(*) > 0 AS granted FROM idem_grant('regress_idem_upgraded', 'app');
GRANT EXECUTE ON FUNCTION idem_complete(bigint, bigint, integer, json, bigint, jsonb) TO regress_idem_upgraded WITH GRANT OPTION;
SELECT operation, ttl, key_format FROM idem_set_policy('PAY', ttl => '2 days', key_format => 'uuid');
BEGIN;
SELECT replayed, expires_at = now() + interval '2 days' AS policy_ttl FROM idem_begin(309, 'PAY', '0b2c2d3e-0000-4000-8000-000000000001', '{}');
SELECT idem_finish(309, 'PAY', '0b2c2d3e-0000-4000-8000-000000000001', 201, '{"id": 1}', NULL, '{"X-A": "1"}');
COMMIT;
CREATE FUNCTION pg_temp.executes() RETURNS TABLE (function regprocedure, executes boolean, public_executes boolean)
LANGUAGE sql AS $$
    SELECT p.oid::regprocedure, has_function_privilege('regress_idem_upgraded', p.oid, 'EXECUTE'),
           has_function_privilege('public', p.oid, 'EXECUTE')
    FROM pg_proc p WHERE proname IN ('idem_finish', 'idem_complete', 'idem_consume', 'idem_create_order') ORDER BY p.proname
$$;
BEGIN;
ALTER EXTENSION idem UPDATE;
SELECT * FROM pg_temp.executes();
SELECT count(*) AS granted FROM idem_grant('regress_idem_upgraded', 'app');
SELECT count(*) AS granted FROM idem_grant('regress_idem_upgraded', 'worker');
COMMIT;
SELECT * FROM pg_temp.executes();
-- the grants are the administrator's: none is an initial privilege
SELECT count(*) AS initial_grants FROM pg_init_privs i, aclexplode(i.initprivs) a
WHERE a.grantee = 'regress_idem_upgraded'::regrole;
SELECT operation, ttl, key_format, audit_ttl, reuse_after_expiry FROM idem_policies;
-- the record of 1.10 replays, with its headers in both forms
SELECT replayed, http_status, body, headers, header_list FROM idem_begin(309, 'PAY', '0b2c2d3e-0000-4000-8000-000000000001', '{}');
SELECT fingerprint_version FROM idem_internal.idempotency_record WHERE owner_id = 309;
SELECT idem_drop_policy('PAY');
SELECT count(*) FROM idem_revoke('regress_idem_upgraded', 'app');
SELECT count(*) FROM idem_revoke('regress_idem_upgraded', 'worker');
DROP ROLE regress_idem_upgraded;
-- the grants gone, the update is a fresh install
SELECT * FROM pg_temp.catalog_diff();

-- From 1.11: an acknowledgement deletes its messages in 1.12.  A message
-- acknowledged under 1.11 (acked_at set, kept) is deleted by the cleanup;
-- a key's backlog left by 1.11 drains in order with the new functions,
-- and a publisher granted on 1.11 keeps its grants (same signatures).
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.11';
CREATE ROLE regress_idem_pub11;
SELECT count(*) > 0 AS granted FROM idem_grant('regress_idem_pub11', 'publisher');
SELECT count(idem_outbox_emit('up', jsonb_build_object('n', n), 'k')) AS emitted FROM generate_series(1, 3) n;
SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_outbox_fetch('up'))) AS acked_on_1_11;
ALTER EXTENSION idem UPDATE;
SELECT payload->>'n' AS n, acked_at IS NOT NULL AS acked, ready FROM idem_internal.idem_outbox ORDER BY commit_seq;
-- the update records the current timeline: no sequence moved on this one
SELECT s.last_value = (pg_control_checkpoint()).timeline_id AS timeline_marked, s.is_called
FROM idem_internal.idem_timeline_seq s;
SELECT max(message_id) < 100 AS ids_not_moved FROM idem_internal.idem_outbox;
SET ROLE regress_idem_pub11;
SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_outbox_fetch('up'))) AS acked_on_1_12;
RESET ROLE;
SELECT payload->>'n' AS n, acked_at IS NOT NULL AS acked, ready FROM idem_internal.idem_outbox ORDER BY commit_seq;
SELECT idem_cleanup_expired() AS deleted;
SELECT payload->>'n' AS n, ready FROM idem_internal.idem_outbox ORDER BY commit_seq;
SELECT count(*) FROM idem_revoke('regress_idem_pub11', 'publisher');
DROP ROLE regress_idem_pub11;
SELECT * FROM pg_temp.catalog_diff();

-- From 1.14: idem_create_order returns idem_order_outcome (the same
-- columns).  The update warns which roles had EXECUTE; until idem_grant
-- gives it again, in the same transaction, they are refused (42501); an
-- order of 1.14 replays with the same answer; the update is a fresh
-- install.
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.14';
CREATE ROLE regress_idem_app14;
SELECT count(*) > 0 AS granted FROM idem_grant('regress_idem_app14', 'app');
SET ROLE regress_idem_app14;
SELECT order_id, order_no, status, http_status, replayed FROM idem_create_order(314, 'upgrade-order-0000000001', 7, 2);
RESET ROLE;
BEGIN;
ALTER EXTENSION idem UPDATE;
SELECT pg_get_function_result('idem_create_order(bigint, text, bigint, integer)'::regprocedure) AS returns;
SAVEPOINT before_grant;
SET ROLE regress_idem_app14;
SELECT replayed FROM idem_create_order(314, 'upgrade-order-0000000001', 7, 2);
ROLLBACK TO SAVEPOINT before_grant;
SELECT count(*) > 0 AS granted FROM idem_grant('regress_idem_app14', 'app');
COMMIT;
SET ROLE regress_idem_app14;
SELECT order_id, order_no, status, http_status, replayed FROM idem_create_order(314, 'upgrade-order-0000000001', 7, 2);
SELECT * FROM idem_create_order(314, 'upgrade-order-0000000002', 7, 2);
RESET ROLE;
SELECT count(*) FROM idem_revoke('regress_idem_app14', 'app');
DROP ROLE regress_idem_app14;
SELECT * FROM pg_temp.catalog_diff();

-- a version that does not exist
ALTER EXTENSION idem UPDATE TO '9.9';

-- leave a fresh install for the tests that follow
DROP EXTENSION idem;
CREATE EXTENSION idem;
