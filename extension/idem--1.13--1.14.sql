/* idem--1.13--1.14.sql */
\echo Use "ALTER EXTENSION idem UPDATE TO '1.14'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Who may create in idem's schema.  A role that may create a function in
-- it can overload an idem function there with one that a client's call
-- matches better (a smallint, a varchar, an unknown parameter), and so run
-- its code as every caller.  The schema's owner is trusted (it could drop
-- the schema anyway), with the roles equal to it: the database's owner on a
-- schema pg_database_owner owns (PostgreSQL 15's public), pg_database_owner
-- on a schema the database's owner owns, and superusers.  CREATE EXTENSION
-- refuses a schema that grants CREATE to anyone else; ALTER EXTENSION
-- UPDATE warns; idem_health() reports it (a grant made later, a restore,
-- pg_upgrade).
-- ---------------------------------------------------------------------------
CREATE FUNCTION idem_internal.idem_schema_creators(nsp pg_catalog.oid)
RETURNS text[]
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT pg_catalog.array_agg(CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                     ELSE pg_catalog.quote_ident(r.rolname::pg_catalog.text) END
                                ORDER BY a.grantee OPERATOR(pg_catalog.<>) 0, r.rolname)
      FROM pg_catalog.pg_namespace n
     CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) a
      LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
      JOIN pg_catalog.pg_database d ON d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
     WHERE n.oid OPERATOR(pg_catalog.=) nsp
       AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
       AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
       AND NOT (pg_catalog.pg_get_userbyid(n.nspowner) OPERATOR(pg_catalog.=) 'pg_database_owner'
                AND a.grantee OPERATOR(pg_catalog.=) d.datdba)
       AND NOT (r.rolname OPERATOR(pg_catalog.=) 'pg_database_owner'
                AND n.nspowner OPERATOR(pg_catalog.=) d.datdba)
       AND NOT COALESCE(r.rolsuper, false);
END;

COMMENT ON FUNCTION idem_internal.idem_schema_creators(pg_catalog.oid) IS
    'idem: the roles besides its owner (PUBLIC included) that may create objects in a schema; NULL when none';

REVOKE ALL ON FUNCTION idem_internal.idem_schema_creators(pg_catalog.oid) FROM PUBLIC;

-- The error CREATE EXTENSION raises, or the warning an update gives.
CREATE FUNCTION idem_internal.idem_check_schema(refuse boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    nsp pg_catalog.oid;
    nspname text;
    creators text[];
    detail text;
    revoke text;
BEGIN
    SELECT n.oid, n.nspname INTO nsp, nspname
      FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
     WHERE e.extname OPERATOR(pg_catalog.=) 'idem';
    creators := idem_internal.idem_schema_creators(nsp);
    IF creators IS NULL THEN
        RETURN;
    END IF;
    detail := pg_catalog.format('CREATE on the schema is granted to %s. Such a role could create a function there that overloads an idem function and runs as whoever calls it.',
                                pg_catalog.array_to_string(creators, ', '));
    revoke := pg_catalog.format('REVOKE CREATE ON SCHEMA %s FROM %s',
                                nsp::pg_catalog.regnamespace, pg_catalog.array_to_string(creators, ', '));
    IF refuse THEN
        RAISE EXCEPTION 'schema "%" lets other roles create objects in it', nspname
            USING ERRCODE = '55000', DETAIL = detail,
                  HINT = pg_catalog.format('Revoke it (%s), or install idem in a schema of its own (CREATE SCHEMA idem; CREATE EXTENSION idem SCHEMA idem).', revoke);
    END IF;
    RAISE WARNING 'schema "%" lets other roles create objects in it', nspname
        USING DETAIL = detail,
              HINT = pg_catalog.format('Revoke it (%s); idem_health() reports it until then.', revoke);
END
$$;

COMMENT ON FUNCTION idem_internal.idem_check_schema(boolean) IS
    'idem: refuse (CREATE EXTENSION) or warn (ALTER EXTENSION UPDATE) when other roles may create in idem''s schema';

REVOKE ALL ON FUNCTION idem_internal.idem_check_schema(boolean) FROM PUBLIC;

-- Functions in idem's schema named as one of idem's but not idem's: an
-- overload a call may match instead (or, with a defaulted extra parameter,
-- that makes every call ambiguous).
CREATE FUNCTION idem_internal.idem_shadowing_functions(nsp pg_catalog.oid)
RETURNS text[]
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT pg_catalog.array_agg(p.oid::pg_catalog.regprocedure::pg_catalog.text ORDER BY p.oid::pg_catalog.regprocedure::pg_catalog.text)
      FROM pg_catalog.pg_proc p
     WHERE p.pronamespace OPERATOR(pg_catalog.=) nsp
       AND p.proname IN (SELECT m.proname FROM pg_catalog.pg_proc m
                           JOIN pg_catalog.pg_depend d ON d.objid OPERATOR(pg_catalog.=) m.oid
                          WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                            AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                            AND d.deptype OPERATOR(pg_catalog.=) 'e'
                            AND d.refobjid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension e
                                                                   WHERE e.extname OPERATOR(pg_catalog.=) 'idem'))
       AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d
                        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                          AND d.objid OPERATOR(pg_catalog.=) p.oid
                          AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                          AND d.deptype OPERATOR(pg_catalog.=) 'e');
END;

COMMENT ON FUNCTION idem_internal.idem_shadowing_functions(pg_catalog.oid) IS
    'idem: functions in a schema named as one of idem''s that are not idem''s; NULL when none';

REVOKE ALL ON FUNCTION idem_internal.idem_shadowing_functions(pg_catalog.oid) FROM PUBLIC;

-- An update never refuses (it would hold back security fixes): it warns.
SELECT idem_internal.idem_check_schema(false);

-- idem_health() has two new columns: schema_creators and
-- shadowing_functions.  It is replaced; idem_privileges, which names it by
-- OID, is dropped first and created again as before.  EXECUTE granted on
-- the old idem_health does not pass to the new one: the update warns which
-- roles had it, to grant it again (idem_grant(role, 'monitor')) in the same
-- transaction.  pg_monitor gets it again from this script.
DO $replace$
DECLARE
    roles text;
BEGIN
    SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)), ', ')
      INTO roles
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.oid OPERATOR(pg_catalog.=) '@extschema@.idem_health()'::pg_catalog.regprocedure
       AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
       AND a.grantee OPERATOR(pg_catalog.<>) 0
       AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
       AND a.grantee OPERATOR(pg_catalog.<>) 'pg_monitor'::pg_catalog.regrole;
    IF roles IS NOT NULL THEN
        RAISE WARNING 'idem 1.14 replaced idem_health() (two new columns): roles %, granted EXECUTE on it, do not have it on the new function', roles
            USING HINT = pg_catalog.format('Grant it in the same transaction as the update: SELECT idem_grant(role, %L) for each of %s.',
                                           'monitor', roles);
    END IF;
END
$replace$;
DROP FUNCTION @extschema@.idem_privileges(text);
DROP FUNCTION idem_internal.idem_privileges(text);
DROP FUNCTION @extschema@.idem_health();
CREATE FUNCTION @extschema@.idem_health(
    OUT records bigint,
    OUT expired_backlog bigint,
    OUT oldest_expires_at timestamptz,
    OUT processing bigint,
    OUT oldest_processing_age interval,
    OUT outbox_unacked bigint,
    OUT outbox_oldest_unacked_age interval,
    OUT outbox_acked_backlog bigint,
    OUT outbox_lease_lapses bigint,
    OUT outbox_dead bigint,
    OUT outbox_oldest_dead_age interval,
    OUT inbox_entries bigint,
    OUT inbox_expired_backlog bigint,
    OUT inbox_dead bigint,
    OUT inbox_oldest_dead_age interval,
    OUT table_bytes bigint,
    OUT index_bytes bigint,
    OUT worker_last_run_started timestamptz,
    OUT worker_last_run_finished timestamptz,
    OUT worker_last_run_deleted bigint,
    OUT worker_last_error text,
    OUT worker_last_error_at timestamptz,
    OUT refuse_without_audit text[],
    OUT schema_creators text[],
    OUT shadowing_functions text[])
RETURNS record
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
SELECT
    (SELECT pg_catalog.count(*) FROM idem_internal.idempotency_record),
    (SELECT pg_catalog.count(*) FROM idem_internal.idempotency_record r
      WHERE r.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()),
    (SELECT pg_catalog.min(r.expires_at) FROM idem_internal.idempotency_record r),
    (SELECT pg_catalog.count(*) FROM idem_internal.idempotency_record r
      WHERE r.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PROCESSING'),
    (SELECT pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(r.created_at)
       FROM idem_internal.idempotency_record r
      WHERE r.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PROCESSING'),
    (SELECT pg_catalog.count(*) FROM idem_internal.idem_outbox o WHERE o.acked_at IS NULL),
    (SELECT pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(o.emitted_at)
       FROM idem_internal.idem_outbox o WHERE o.acked_at IS NULL),
    (SELECT pg_catalog.count(*) FROM idem_internal.idem_outbox o WHERE o.acked_at IS NOT NULL),
    (SELECT COALESCE(pg_catalog.sum(COALESCE(o.lapses, 0) OPERATOR(pg_catalog.+)
                (o.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now())::pg_catalog.int4), 0)::pg_catalog.int8
       FROM idem_internal.idem_outbox o WHERE o.acked_at IS NULL AND o.dead_at IS NULL),
    (SELECT pg_catalog.count(*) FROM idem_internal.idem_outbox_dead d),
    (SELECT pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(d.dead_at) FROM idem_internal.idem_outbox_dead d),
    (SELECT pg_catalog.count(*) FROM idem_internal.idem_inbox i),
    (SELECT pg_catalog.count(*) FROM idem_internal.idem_inbox i
      WHERE i.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()),
    (SELECT pg_catalog.count(*) FROM idem_internal.idem_inbox_failure f WHERE f.dead_at IS NOT NULL),
    (SELECT pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(f.dead_at)
       FROM idem_internal.idem_inbox_failure f WHERE f.dead_at IS NOT NULL),
    sizes.table_bytes, sizes.index_bytes,
    w.last_run_started, w.last_run_finished, w.last_run_deleted, w.last_error, w.last_error_at,
    (SELECT pg_catalog.array_agg(u.operation ORDER BY u.operation) FROM (
        SELECT p.operation::pg_catalog.text AS operation FROM idem_internal.idem_policy p
         WHERE COALESCE(p.reuse_after_expiry,
                                   pg_catalog.current_setting('idem.reuse_after_expiry', true)) OPERATOR(pg_catalog.=) 'refuse'
           AND COALESCE(p.audit_ttl, COALESCE(pg_catalog.current_setting('idem.audit_ttl', true), '0')::pg_catalog.interval)
               OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval
        UNION ALL
        SELECT '*' WHERE pg_catalog.current_setting('idem.reuse_after_expiry', true) OPERATOR(pg_catalog.=) 'refuse'
           AND COALESCE(pg_catalog.current_setting('idem.audit_ttl', true), '0')::pg_catalog.interval
               OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval) u),
    idem_internal.idem_schema_creators('@extschema@'::pg_catalog.regnamespace::pg_catalog.oid),
    idem_internal.idem_shadowing_functions('@extschema@'::pg_catalog.regnamespace::pg_catalog.oid)
FROM (SELECT pg_catalog.sum(pg_catalog.pg_table_size(t.rel))::pg_catalog.int8 AS table_bytes,
             pg_catalog.sum(pg_catalog.pg_indexes_size(t.rel))::pg_catalog.int8 AS index_bytes
        FROM pg_catalog.unnest(ARRAY['idem_internal.idempotency_record'::pg_catalog.regclass,
                                     'idem_internal.purchase_order'::pg_catalog.regclass,
                                     'idem_internal.idem_outbox'::pg_catalog.regclass,
                                     'idem_internal.idem_inbox'::pg_catalog.regclass,
                                     'idem_internal.idem_outbox_dead'::pg_catalog.regclass,
                                     'idem_internal.idem_inbox_failure'::pg_catalog.regclass]) AS t(rel)) sizes
LEFT JOIN @extschema@.idem_cleanup_status() w
       ON w.datid OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                          WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database());
END;
COMMENT ON FUNCTION @extschema@.idem_health() IS
    'idem: backlog, PROCESSING records, outbox and inbox (lease lapses, dead letters), disk use, the cleanup worker''s last round, operations refusing reuse without an audit period, and who could plant functions in idem''s schema, for this database';
REVOKE ALL ON FUNCTION @extschema@.idem_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_health() TO pg_monitor;

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

COMMENT ON FUNCTION idem_internal.idem_privileges(text) IS
    'idem: the privileges of one kind of user, with the objects'' OIDs (idem_privileges, idem_grant)';

CREATE FUNCTION @extschema@.idem_privileges(kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT p.privilege, p.object FROM idem_internal.idem_privileges(idem_privileges.kind) p;
END;
COMMENT ON FUNCTION @extschema@.idem_privileges(text) IS
    'idem: the privileges idem_grant gives one kind of user (app, worker, publisher, consumer, monitor)';


-- idem_consume_check and idem_consume_failed check their consumer, message
-- id and owner as idem_consume does (before 1.14 they took any consumer
-- name and message id, and ignored idem.allowed_owners).
-- idem_consume's rules for the arguments idem_consume_check and
-- idem_consume_failed share with it (22004, 22023), and the caller's
-- idem.allowed_owners for the owner (42501).
CREATE FUNCTION idem_internal.idem_consume_args(consumer text, message_id text, owner bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_consume_args'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_internal.idem_consume_args(text, text, bigint) IS
    'idem: check a consumer''s arguments as idem_consume does (for idem_consume_check and idem_consume_failed)';
REVOKE ALL ON FUNCTION idem_internal.idem_consume_args(text, text, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION @extschema@.idem_consume_check(
    consumer text, message_id text, msg_key text DEFAULT NULL, owner bigint DEFAULT NULL,
    OUT verdict text, OUT blocked_by text, OUT attempts integer)
RETURNS record
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    PERFORM idem_internal.idem_consume_args(idem_consume_check.consumer, idem_consume_check.message_id, owner);
    attempts := 0;
    SELECT f.* INTO r FROM idem_internal.idem_inbox_failure f
     WHERE f.consumer OPERATOR(pg_catalog.=) idem_consume_check.consumer
       AND f.message_id OPERATOR(pg_catalog.=) idem_consume_check.message_id
       FOR UPDATE;
    IF FOUND THEN
        attempts := r.attempts;
        IF r.dead_at IS NOT NULL AND NOT r.redriven THEN
            verdict := 'dead';
            blocked_by := r.behind;
            RETURN;
        END IF;
        DELETE FROM idem_internal.idem_inbox_failure f
         WHERE f.consumer OPERATOR(pg_catalog.=) idem_consume_check.consumer
           AND f.message_id OPERATOR(pg_catalog.=) idem_consume_check.message_id;
        IF r.redriven THEN
            verdict := 'apply';     -- redriven: in the order the operator delivers them again
            RETURN;
        END IF;
    END IF;
    IF idem_consume_check.msg_key IS NOT NULL THEN
        SELECT f.message_id INTO blocked_by FROM idem_internal.idem_inbox_failure f
         WHERE f.consumer OPERATOR(pg_catalog.=) idem_consume_check.consumer
           AND f.msg_key OPERATOR(pg_catalog.=) idem_consume_check.msg_key
           AND f.dead_at IS NOT NULL AND f.blocks
           AND f.message_id OPERATOR(pg_catalog.<>) idem_consume_check.message_id
         ORDER BY f.dead_at, f.message_id LIMIT 1;
        IF blocked_by IS NOT NULL THEN
            INSERT INTO idem_internal.idem_inbox_failure AS f
                (consumer, message_id, msg_key, owner_id, attempts, last_reason, first_failed_at,
                 last_failed_at, dead_at, blocks, behind, redriven)
            VALUES (idem_consume_check.consumer, idem_consume_check.message_id, idem_consume_check.msg_key,
                    owner, 0, pg_catalog.format('set aside behind the dead letter %s of its key', blocked_by),
                    pg_catalog.now(), pg_catalog.now(), pg_catalog.now(), true, blocked_by, false);
            verdict := 'set_aside';
            RETURN;
        END IF;
    END IF;
    verdict := 'apply';
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_consume_check(text, text, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_consume_check(text, text, text, bigint) IS
    'idem: before applying a message: ''apply'', ''dead'' (a dead letter) or ''set_aside'' (its key waits behind a dead letter); for consumers';

-- idem_consume_failed, in a transaction of its own after the effect's
-- rolled back: one more attempt; dead past the limit (max_attempts, else
-- the topic's max_deliveries, else idem.outbox_max_deliveries).
CREATE OR REPLACE FUNCTION @extschema@.idem_consume_failed(
    consumer text, message_id text, reason text, msg_key text DEFAULT NULL, topic text DEFAULT NULL,
    max_attempts integer DEFAULT NULL, owner bigint DEFAULT NULL,
    OUT attempts integer, OUT dead boolean)
RETURNS record
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    lim integer;
    on_dead text;
    holds boolean;
BEGIN
    PERFORM idem_internal.idem_consume_args(idem_consume_failed.consumer, idem_consume_failed.message_id, owner);
    IF max_attempts OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'max_attempts must be at least 1, or NULL for the topic''s max_deliveries'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has max_attempts %s.', max_attempts);
    END IF;
    PERFORM idem_internal.idem_outbox_guard();      -- loads the library: its GUC
    SELECT s.max_deliveries, s.on_dead INTO lim, on_dead
      FROM idem_internal.idem_outbox_topic s WHERE s.topic OPERATOR(pg_catalog.=) idem_consume_failed.topic;
    lim := COALESCE(max_attempts, lim,
                    COALESCE(pg_catalog.current_setting('idem.outbox_max_deliveries', true), '5')::pg_catalog.int4);
    holds := idem_consume_failed.msg_key IS NOT NULL AND COALESCE(on_dead, 'block') OPERATOR(pg_catalog.=) 'block';
    INSERT INTO idem_internal.idem_inbox_failure AS f
        (consumer, message_id, msg_key, owner_id, attempts, last_reason, first_failed_at, last_failed_at,
         dead_at, blocks, behind, redriven)
    VALUES (idem_consume_failed.consumer, idem_consume_failed.message_id, idem_consume_failed.msg_key, owner, 1,
            pg_catalog.left(reason, 1000), pg_catalog.now(), pg_catalog.now(),
            CASE WHEN lim OPERATOR(pg_catalog.<=) 1 THEN pg_catalog.now() END, holds, NULL, false)
    ON CONFLICT ON CONSTRAINT pk_idem_inbox_failure DO UPDATE
       SET attempts = f.attempts OPERATOR(pg_catalog.+) 1,
           last_reason = excluded.last_reason,
           last_failed_at = excluded.last_failed_at,
           dead_at = CASE WHEN f.attempts OPERATOR(pg_catalog.+) 1 OPERATOR(pg_catalog.>=) lim
                          THEN pg_catalog.now() END,
           blocks = excluded.blocks, behind = NULL, redriven = false
    RETURNING f.attempts, f.dead_at IS NOT NULL INTO attempts, dead;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_consume_failed(text, text, text, text, text, integer, bigint) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_consume_failed(text, text, text, text, text, integer, bigint) IS
    'idem: count a failed attempt to apply a message (outside the effect''s transaction); dead past the limit; for consumers';

-- ---------------------------------------------------------------------------
-- Nothing in idem_internal carries a privilege idem did not grant.  Default
-- privileges (ALTER DEFAULT PRIVILEGES ... GRANT SELECT ON TABLES TO app)
-- apply to what this script creates; idem grants nothing in idem_internal
-- to a named role, and nothing on its tables, sequences or the schema to
-- PUBLIC.  Run at the end of the install and of every update.
-- ---------------------------------------------------------------------------
CREATE FUNCTION idem_internal.idem_revoke_foreign_privileges()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT 'SCHEMA' AS kind, 'idem_internal' AS object, a.grantee, a.privilege_type
          FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
         WHERE n.nspname OPERATOR(pg_catalog.=) 'idem_internal'
           AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
        UNION ALL
        SELECT 'TABLE', c.oid::pg_catalog.regclass::pg_catalog.text, a.grantee, a.privilege_type
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
         WHERE c.relnamespace OPERATOR(pg_catalog.=) 'idem_internal'::pg_catalog.regnamespace
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
        UNION ALL
        SELECT 'FUNCTION', p.oid::pg_catalog.regprocedure::pg_catalog.text, a.grantee, a.privilege_type
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idem_internal'::pg_catalog.regnamespace
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0
        UNION ALL
        SELECT 'TYPE', t.oid::pg_catalog.regtype::pg_catalog.text, a.grantee, a.privilege_type
          FROM pg_catalog.pg_type t, pg_catalog.aclexplode(t.typacl) a
         WHERE t.typnamespace OPERATOR(pg_catalog.=) 'idem_internal'::pg_catalog.regnamespace
           AND a.grantee OPERATOR(pg_catalog.<>) t.typowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0
    LOOP
        -- TABLE covers sequences too (GRANT ... ON TABLE takes a sequence)
        EXECUTE pg_catalog.format('REVOKE %s ON %s %s FROM %s', g.privilege_type,
            CASE WHEN g.kind OPERATOR(pg_catalog.=) 'SCHEMA' THEN 'SCHEMA' WHEN g.kind OPERATOR(pg_catalog.=) 'TABLE' THEN 'TABLE'
                 WHEN g.kind OPERATOR(pg_catalog.=) 'FUNCTION' THEN 'FUNCTION' ELSE 'TYPE' END,
            g.object,
            CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END);
    END LOOP;
END
$$;

COMMENT ON FUNCTION idem_internal.idem_revoke_foreign_privileges() IS
    'idem: revoke what default privileges granted on idem_internal and its objects (run by the install and every update)';

REVOKE ALL ON FUNCTION idem_internal.idem_revoke_foreign_privileges() FROM PUBLIC;

SELECT idem_internal.idem_revoke_foreign_privileges();
