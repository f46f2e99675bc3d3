--
-- idem.allowed_owners: a role bound by a superuser to its owners acts for
-- no other owner (42501, nothing read or written), and cannot unbind itself.
--
\set SHOW_CONTEXT never
\set su :USER
\set regress_db :DBNAME

-- The value: owners and ranges, checked when set.
SET idem.allowed_owners = '7, 100-199, -5..-1';
SHOW idem.allowed_owners;
SET idem.allowed_owners = '7-';
SET idem.allowed_owners = '9-7';
SET idem.allowed_owners = '7,,8';
SET idem.allowed_owners = 'seven';
SET idem.allowed_owners = '99999999999999999999';
RESET idem.allowed_owners;

-- Tenant 8's record, made by an unbound session.
SELECT replayed FROM idem_create_order(8, 'tenant-eight-key-0001', 1, 1);

CREATE ROLE regress_idem_t7 LOGIN;
CREATE ROLE regress_idem_other;
GRANT regress_idem_other TO regress_idem_t7;
GRANT EXECUTE ON FUNCTION idem_create_order(bigint, text, bigint, integer),
    idem_begin(bigint, text, text, jsonb, interval),
    idem_finish(bigint, text, text, integer, json, bigint, jsonb, json),
    idem_run(bigint, text, text, jsonb, regprocedure, interval)
    TO regress_idem_t7, regress_idem_other;
CREATE SCHEMA regress_t7_schema AUTHORIZATION regress_idem_t7;
CREATE FUNCTION ok_handler(request jsonb) RETURNS idem_result
LANGUAGE sql AS $$ SELECT ROW(200, '{}', NULL, NULL)::idem_result $$;
ALTER ROLE regress_idem_t7 SET idem.allowed_owners = '7, 100-199';

\c - regress_idem_t7
SHOW idem.allowed_owners;
-- its own owners: every function works
SELECT replayed FROM idem_create_order(7, 'tenant-seven-key-0001', 1, 1);
SELECT replayed FROM idem_create_order(150, 'tenant-seven-key-0001', 1, 1);
SELECT replayed FROM idem_run(7, 'PING', 'tenant-seven-key-0002', '{}', 'ok_handler(jsonb)');
BEGIN;
SELECT replayed FROM idem_begin(7, 'PING', 'tenant-seven-key-0003', '{}');
SELECT idem_finish(7, 'PING', 'tenant-seven-key-0003', 200, '{}');
COMMIT;
-- another owner: refused, by every function, replays of its records included
SELECT * FROM idem_create_order(8, 'tenant-eight-key-0001', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(8, 'tenant-eight-key-0002', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(8, 'PING', 'tenant-eight-key-0003', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_finish(8, 'PING', 'tenant-eight-key-0003', 200, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(200, 'PING', 'tenant-eight-key-0004', '{}', 'ok_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- no way out: SET, SET LOCAL, RESET, set_config, SET ROLE, a function's SET clause
SET idem.allowed_owners = '';
\echo SQLSTATE :LAST_ERROR_SQLSTATE
BEGIN;
SET LOCAL idem.allowed_owners = '8';
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK;
RESET idem.allowed_owners;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT set_config('idem.allowed_owners', '8', false);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ALL;
SHOW idem.allowed_owners;
SET ROLE regress_idem_other;
SELECT * FROM idem_create_order(8, 'tenant-eight-key-0002', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;
CREATE FUNCTION regress_t7_schema.unbind() RETURNS text
LANGUAGE sql SET idem.allowed_owners = '8' AS $$ SELECT current_setting('idem.allowed_owners') $$;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
CREATE FUNCTION regress_t7_schema.unbind() RETURNS text
LANGUAGE plpgsql AS $$ BEGIN PERFORM set_config('idem.allowed_owners', '8', true); RETURN 'x'; END $$;
SELECT regress_t7_schema.unbind();
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SHOW idem.allowed_owners;
SELECT * FROM idem_create_order(8, 'tenant-eight-key-0002', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE

\c - :su
-- nothing was written for owners 8 and 200 by the bound role
SELECT owner_id, idempotency_key FROM idem_internal.idempotency_record
WHERE idempotency_key LIKE 'tenant-%' ORDER BY owner_id, idempotency_key;
-- an unbound role (the superuser here) acts for any owner
SELECT replayed FROM idem_create_order(8, 'tenant-eight-key-0001', 1, 1);

DROP FUNCTION regress_t7_schema.unbind(), ok_handler(jsonb);
DROP SCHEMA regress_t7_schema;
REVOKE ALL ON FUNCTION idem_create_order(bigint, text, bigint, integer),
    idem_begin(bigint, text, text, jsonb, interval),
    idem_finish(bigint, text, text, integer, json, bigint, jsonb, json),
    idem_run(bigint, text, text, jsonb, regprocedure, interval)
    FROM regress_idem_t7, regress_idem_other;
DROP ROLE regress_idem_t7;
DROP ROLE regress_idem_other;
