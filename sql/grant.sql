--
-- idem_grant(role, kind): a role gets what one kind of idem user needs and
-- nothing more (each kind's rights beyond PUBLIC's, computed over every
-- member of the extension); idem_revoke takes them back; a caller who
-- cannot grant them all gets 42501 and nothing is granted; a bad kind is
-- 22023, a NULL 22004.
--
\set SHOW_CONTEXT never
\set su :USER
CREATE ROLE regress_idem_baseline;
CREATE ROLE regress_idem_k_app;
CREATE ROLE regress_idem_k_worker;
CREATE ROLE regress_idem_k_publisher;
CREATE ROLE regress_idem_k_consumer;
CREATE ROLE regress_idem_k_monitor;

-- What a role may use of idem beyond what a role with no grant may.
CREATE FUNCTION pg_temp.rights(r regrole) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(what, ', ' ORDER BY what), '(none)') FROM (
        SELECT p.proname::text AS what
        FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
        WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
          AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
          AND has_function_privilege(r, p.oid, 'EXECUTE')
          AND NOT has_function_privilege('regress_idem_baseline', p.oid, 'EXECUTE')
        UNION ALL
        SELECT c.relname || ' (' || m || ')'
        FROM pg_depend d JOIN pg_class c ON c.oid = d.objid,
             unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) m
        WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
          AND d.classid = 'pg_class'::regclass AND d.deptype = 'e'
          AND c.relkind IN ('r', 'v', 'S')
          AND has_table_privilege(r, c.oid, m)
          AND NOT has_table_privilege('regress_idem_baseline', c.oid, m)
    ) s
$$;

SELECT * FROM idem_grant('regress_idem_k_app', 'app');
SELECT count(*) FROM idem_grant('regress_idem_k_worker', 'worker');
SELECT count(*) FROM idem_grant('regress_idem_k_publisher', 'publisher');
SELECT count(*) FROM idem_grant('regress_idem_k_consumer', 'consumer');
SELECT * FROM idem_grant('regress_idem_k_monitor', 'monitor');
SELECT k, pg_temp.rights(('regress_idem_k_' || k)::regrole)
FROM unnest(ARRAY['app', 'worker', 'publisher', 'consumer', 'monitor']) k;
SELECT pg_temp.rights('regress_idem_baseline');
-- granting twice changes nothing
SELECT count(*) FROM idem_grant('regress_idem_k_consumer', 'consumer');
SELECT pg_temp.rights('regress_idem_k_consumer');

-- each kind can do its work
SET ROLE regress_idem_k_app;
SELECT order_id > 0 AS ordered, replayed FROM idem_create_order(31, 'grant-key-0000000001', 1, 1);
BEGIN;
SELECT replayed FROM idem_begin(31, 'DEBIT', 'grant-key-0000000002', '{"n": 1}');
SELECT idem_finish(31, 'DEBIT', 'grant-key-0000000002', 201, '{}');
COMMIT;
SELECT status FROM idem_submit(31, 'SHIP', 'grant-key-0000000003', '{}');
SELECT idem_outbox_emit('grant-topic', '{"n": 1}') > 0 AS emitted;
SELECT count(*) FROM idem_lease('SHIP', 'w', '1 minute', 1);       -- not an app's
RESET ROLE;
SET ROLE regress_idem_k_worker;
SELECT count(*) FROM idem_lease('SHIP', 'w', '1 minute', 1);
SELECT * FROM idem_outbox_fetch('grant-topic');                    -- not a worker's
RESET ROLE;
SET ROLE regress_idem_k_publisher;
SELECT count(*) FROM idem_outbox_fetch('grant-topic');
SELECT idem_consume('c1', 'm1');                                    -- not a publisher's
RESET ROLE;
SET ROLE regress_idem_k_consumer;
SELECT idem_consume('c1', 'm1'), idem_consume('c1', 'm1');
SELECT count(*) FROM idem_stats;                                     -- not a consumer's
RESET ROLE;
SET ROLE regress_idem_k_monitor;
SELECT count(*) >= 0 AS reads FROM idem_stats;
SELECT records >= 0 AS reads FROM idem_health();
SELECT idem_stats_reset();                                           -- reading only
RESET ROLE;

-- idem_revoke takes a kind back
SELECT count(*) FROM idem_revoke('regress_idem_k_worker', 'worker');
SELECT pg_temp.rights('regress_idem_k_worker');

-- bad input: nothing granted
SELECT * FROM idem_grant('regress_idem_baseline', 'admin');
SELECT * FROM idem_grant('regress_idem_baseline', NULL);
SELECT * FROM idem_grant(NULL, 'app');
SELECT * FROM idem_grant('regress_idem_no_such_role', 'app');
SELECT pg_temp.rights('regress_idem_baseline');

-- a caller who may run idem_grant but cannot grant the rights: 42501, and
-- nothing granted (the check comes before the first GRANT)
CREATE ROLE regress_idem_granter;
GRANT EXECUTE ON FUNCTION idem_grant(regrole, text) TO regress_idem_granter;
GRANT EXECUTE ON FUNCTION idem_create_order(bigint, text, bigint, integer) TO regress_idem_granter WITH GRANT OPTION;
SET ROLE regress_idem_granter;
SELECT * FROM idem_grant('regress_idem_baseline', 'app');
RESET ROLE;
SELECT pg_temp.rights('regress_idem_baseline');
-- PUBLIC may not run idem_grant at all
SET ROLE regress_idem_baseline;
SELECT * FROM idem_grant('regress_idem_baseline', 'app');
RESET ROLE;

-- idem in a schema of its own: the grant includes the schema's USAGE, once
\set regdb :DBNAME
CREATE DATABASE regress_idem_grant_db;
\c regress_idem_grant_db
CREATE SCHEMA regress_idem_home;
CREATE EXTENSION idem SCHEMA regress_idem_home;
SELECT * FROM regress_idem_home.idem_grant('regress_idem_k_consumer', 'consumer');
SELECT * FROM regress_idem_home.idem_grant('regress_idem_k_consumer', 'consumer');
SET ROLE regress_idem_k_consumer;
SELECT regress_idem_home.idem_consume('c1', 'm1');
RESET ROLE;
SELECT * FROM regress_idem_home.idem_revoke('regress_idem_k_consumer', 'consumer');
REVOKE USAGE ON SCHEMA regress_idem_home FROM regress_idem_k_consumer;
\c :regdb
DROP DATABASE regress_idem_grant_db;

DELETE FROM idem_internal.idempotency_record WHERE owner_id = 31;
DELETE FROM idem_internal.purchase_order WHERE owner_id = 31;
DELETE FROM idem_internal.idem_outbox WHERE topic = 'grant-topic';
DELETE FROM idem_internal.idem_inbox WHERE consumer = 'c1';
REVOKE ALL ON FUNCTION idem_grant(regrole, text) FROM regress_idem_granter;
REVOKE ALL ON FUNCTION idem_create_order(bigint, text, bigint, integer) FROM regress_idem_granter CASCADE;
SELECT count(*) FROM unnest(ARRAY['app', 'worker', 'publisher', 'consumer', 'monitor']) k,
    LATERAL idem_revoke(('regress_idem_k_' || k)::regrole, k);
DROP ROLE regress_idem_baseline, regress_idem_granter, regress_idem_k_app, regress_idem_k_worker,
    regress_idem_k_publisher, regress_idem_k_consumer, regress_idem_k_monitor;
