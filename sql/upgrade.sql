--
-- ALTER EXTENSION idem UPDATE from 1.0 gives what a fresh install gives,
-- and keeps the 1.0 data.  The 1.0 definitions run with this library too.
--

-- The extension's member objects, with the grants, the security and the
-- settings of its functions.
CREATE TEMP VIEW idem_members AS
SELECT pg_describe_object(d.classid, d.objid, d.objsubid) AS member,
       coalesce(p.proacl::text, '') AS acl,
       coalesce(p.prosecdef::text, '') AS secdef,
       coalesce(p.proconfig::text, '') AS config
FROM pg_depend d
LEFT JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem');

-- What a fresh install (default_version) holds.
CREATE TEMP TABLE fresh_install AS SELECT * FROM idem_members;
SELECT extversion FROM pg_extension WHERE extname = 'idem';

DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.0';
SELECT extversion FROM pg_extension WHERE extname = 'idem';
SELECT order_id, replayed FROM idem_create_order(301, 'upgrade-key-0000001', 4, 2);

ALTER EXTENSION idem UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idem';

-- the same members with the same grants; the script's helper is gone
CREATE TEMP TABLE updated AS SELECT * FROM idem_members;
(SELECT 'only fresh' AS side, * FROM fresh_install EXCEPT SELECT 'only fresh', * FROM updated)
UNION ALL
(SELECT 'only updated', * FROM updated EXCEPT SELECT 'only updated', * FROM fresh_install);
SELECT count(*) AS members FROM updated;
SELECT count(*) AS leftover_helpers FROM pg_proc WHERE proname = 'idem_cleanup_worker_notice';

-- idem_create_order switches to its owner itself (1.2)
SELECT p.prosecdef, p.proconfig FROM pg_proc p
WHERE p.oid = 'idem_create_order(bigint, text, bigint, integer)'::regprocedure;

-- the 1.0 record replays; the new function answers
SELECT order_id, replayed FROM idem_create_order(301, 'upgrade-key-0000001', 4, 2);
SELECT count(*) >= 0 AS status_answers FROM idem_cleanup_status();
SELECT has_function_privilege('public', 'idem_cleanup_status()', 'EXECUTE') AS public_may,
       has_function_privilege('pg_monitor', 'idem_cleanup_status()', 'EXECUTE') AS monitor_may;

-- a version that does not exist
ALTER EXTENSION idem UPDATE TO '9.9';
