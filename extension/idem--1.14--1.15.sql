/* idem--1.14--1.15.sql */
\echo Use "ALTER EXTENSION idem UPDATE TO '1.15'" to load this file. \quit

-- A definition this update replaces is copied from idem.sql by
-- test/upgrade/scripts.py --write, between "-- from idem.sql: <first
-- line>" and "-- end"; the rest is written here.


-- ---------------------------------------------------------------------------
-- idem_create_order returns the named type idem_order_outcome instead of
-- OUT arguments (the same columns, by name and position).  The function is
-- replaced, so, as with PostgreSQL's own modules, EXECUTE granted on the
-- old one does not pass to the new one (granted here it would be recorded
-- as the extension's initial privilege, which pg_dump leaves out): the
-- update warns which roles had it, to grant it again in the same
-- transaction.  The two functions whose bodies name it go and come back.
-- ---------------------------------------------------------------------------
DO $replace$
DECLARE
    roles text;
BEGIN
    SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)), ', ')
      INTO roles
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.oid OPERATOR(pg_catalog.=) '@extschema@.idem_create_order(bigint, text, bigint, integer)'::pg_catalog.regprocedure
       AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
       AND a.grantee OPERATOR(pg_catalog.<>) 0
       AND a.grantee OPERATOR(pg_catalog.<>) p.proowner;
    IF roles IS NOT NULL THEN
        RAISE WARNING 'idem 1.15 replaced @extschema@.idem_create_order(bigint, text, bigint, integer), which now returns idem_order_outcome: EXECUTE granted to % on the old function is not carried over', roles
            USING HINT = pg_catalog.format('Grant it again in the same transaction as the update: SELECT idem_grant(role, ''app'') for each role, or GRANT EXECUTE ON FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer) TO %s.', roles);
    END IF;
END
$replace$;

DROP FUNCTION @extschema@.idem_privileges(text);
DROP FUNCTION idem_internal.idem_privileges(text);
DROP FUNCTION idem_internal.idem_delegated_functions();
DROP FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer);

-- from idem.sql: CREATE TYPE @extschema@.idem_order_outcome AS (
CREATE TYPE @extschema@.idem_order_outcome AS (
    order_id    bigint,
    order_no    text,
    status      text,
    http_status integer,
    replayed    boolean
);
-- end

-- from idem.sql: CREATE FUNCTION @extschema@.idem_create_order(
CREATE FUNCTION @extschema@.idem_create_order(
    owner bigint, key text, sku bigint, qty integer)
RETURNS @extschema@.idem_order_outcome
AS 'MODULE_PATHNAME', 'idem_create_order'
LANGUAGE C VOLATILE;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer) IS
COMMENT ON FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer) IS
    'idem: create an order exactly once per (owner, idempotency key); repeats replay the first response';
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer) FROM PUBLIC;
-- end

-- from idem.sql: CREATE FUNCTION idem_internal.idem_privileges(kind text)
CREATE FUNCTION idem_internal.idem_privileges(kind text)
RETURNS TABLE (privilege text, object text, fn pg_catalog.regprocedure, rel pg_catalog.regclass)
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT p.privilege,
           -- spelled as before 1.13: "(bigint, text)"
           CASE WHEN p.fn IS NOT NULL THEN pg_catalog.format('FUNCTION %s', pg_catalog.replace(p.fn::pg_catalog.text, ',', ', '))
                ELSE pg_catalog.format('TABLE %s', p.rel) END,
           p.fn, p.rel
    FROM (VALUES
        ('app', 'EXECUTE', '@extschema@.idem_create_order(bigint, text, bigint, integer)'::pg_catalog.regprocedure, NULL::pg_catalog.regclass),
        ('app', 'EXECUTE', '@extschema@.idem_begin(bigint, text, text, jsonb, interval)'::pg_catalog.regprocedure, NULL),
        ('app', 'EXECUTE', '@extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json)'::pg_catalog.regprocedure, NULL),
        ('app', 'EXECUTE', '@extschema@.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json)'::pg_catalog.regprocedure, NULL),
        ('app', 'EXECUTE', '@extschema@.idem_run(bigint, text, text, jsonb, regprocedure, interval)'::pg_catalog.regprocedure, NULL),
        ('app', 'EXECUTE', '@extschema@.idem_submit(bigint, text, text, jsonb, jsonb, interval)'::pg_catalog.regprocedure, NULL),
        ('app', 'EXECUTE', '@extschema@.idem_outbox_emit(text, jsonb, text, jsonb, bigint)'::pg_catalog.regprocedure, NULL),
        ('worker', 'EXECUTE', '@extschema@.idem_lease(text, text, interval, integer, boolean)'::pg_catalog.regprocedure, NULL),
        ('worker', 'EXECUTE', '@extschema@.idem_heartbeat(bigint, bigint, interval)'::pg_catalog.regprocedure, NULL),
        ('worker', 'EXECUTE', '@extschema@.idem_complete(bigint, bigint, integer, json, bigint, jsonb, json)'::pg_catalog.regprocedure, NULL),
        ('worker', 'EXECUTE', '@extschema@.idem_fail(bigint, bigint, jsonb, boolean)'::pg_catalog.regprocedure, NULL),
        ('publisher', 'EXECUTE', '@extschema@.idem_outbox_fetch(text, integer, interval)'::pg_catalog.regprocedure, NULL),
        ('publisher', 'EXECUTE', '@extschema@.idem_outbox_ack(bigint[])'::pg_catalog.regprocedure, NULL),
        ('publisher', 'EXECUTE', '@extschema@.idem_outbox_nack(bigint[], text, boolean, interval)'::pg_catalog.regprocedure, NULL),
        ('consumer', 'EXECUTE', '@extschema@.idem_consume(text, text, interval, bigint)'::pg_catalog.regprocedure, NULL),
        ('consumer', 'EXECUTE', '@extschema@.idem_consume_check(text, text, text, bigint)'::pg_catalog.regprocedure, NULL),
        ('consumer', 'EXECUTE', '@extschema@.idem_consume_failed(text, text, text, text, text, integer, bigint)'::pg_catalog.regprocedure, NULL),
        ('monitor', 'SELECT', NULL, '@extschema@.idem_stats'::pg_catalog.regclass),
        ('monitor', 'SELECT', NULL, '@extschema@.idem_audit'::pg_catalog.regclass),
        ('monitor', 'EXECUTE', '@extschema@.idem_audit_entries(bigint)'::pg_catalog.regprocedure, NULL),
        ('monitor', 'EXECUTE', '@extschema@.idem_stats_entries()'::pg_catalog.regprocedure, NULL),
        ('monitor', 'EXECUTE', '@extschema@.idem_health()'::pg_catalog.regprocedure, NULL),
        ('monitor', 'EXECUTE', '@extschema@.idem_cleanup_status()'::pg_catalog.regprocedure, NULL)
    ) AS p (kind, privilege, fn, rel)
    WHERE p.kind OPERATOR(pg_catalog.=) idem_privileges.kind;
END;
-- end
-- from idem.sql: COMMENT ON FUNCTION idem_internal.idem_privileges(text) IS
COMMENT ON FUNCTION idem_internal.idem_privileges(text) IS
    'idem: the privileges of one kind of user, with the objects'' OIDs (idem_privileges, idem_grant)';
-- end
-- from idem.sql: CREATE FUNCTION @extschema@.idem_privileges(kind text)
CREATE FUNCTION @extschema@.idem_privileges(kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT p.privilege, p.object FROM idem_internal.idem_privileges(idem_privileges.kind) p;
END;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_privileges(text) IS
COMMENT ON FUNCTION @extschema@.idem_privileges(text) IS
    'idem: the privileges idem_grant gives one kind of user (app, worker, publisher, consumer, monitor)';
-- end

-- from idem.sql: CREATE FUNCTION idem_internal.idem_delegated_functions()
CREATE FUNCTION idem_internal.idem_delegated_functions()
RETURNS TABLE (fn pg_catalog.regprocedure, tbl pg_catalog.regclass)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT f.fn, f.tbl FROM (VALUES
        ('@extschema@.idem_create_order(bigint, text, bigint, integer)'::pg_catalog.regprocedure, 'idem_internal.idempotency_record'::pg_catalog.regclass),
        ('@extschema@.idem_begin(bigint, text, text, jsonb, interval)'::pg_catalog.regprocedure, 'idem_internal.idempotency_record'::pg_catalog.regclass),
        ('@extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json)'::pg_catalog.regprocedure, 'idem_internal.idempotency_record'::pg_catalog.regclass),
        ('@extschema@.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json)'::pg_catalog.regprocedure, 'idem_internal.idempotency_record'::pg_catalog.regclass),
        ('@extschema@.idem_run(bigint, text, text, jsonb, regprocedure, interval)'::pg_catalog.regprocedure, 'idem_internal.idempotency_record'::pg_catalog.regclass),
        ('@extschema@.idem_submit(bigint, text, text, jsonb, jsonb, interval)'::pg_catalog.regprocedure, 'idem_internal.idempotency_record'::pg_catalog.regclass),
        ('@extschema@.idem_consume(text, text, interval, bigint)'::pg_catalog.regprocedure, 'idem_internal.idem_inbox'::pg_catalog.regclass)
    ) AS f (fn, tbl);
END;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION idem_internal.idem_delegated_functions() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_internal.idem_delegated_functions() FROM PUBLIC;
-- end

-- last, so that it sees the functions this update created
SELECT idem_internal.idem_revoke_foreign_privileges();
