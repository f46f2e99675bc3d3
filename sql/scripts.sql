--
-- Install and update scripts fail closed (issue 10 §2): a non-superuser
-- who owns the target schema, or has CREATE on public, plants every object
-- name idem's scripts create or resolve; CREATE EXTENSION idem and ALTER
-- EXTENSION idem UPDATE from every released version either fail with an
-- error or ignore the object: never adopt it (make it a member) and never
-- run it.  Each attempt runs in a subtransaction and is rolled back.
--
\set SHOW_CONTEXT never
\set VERBOSITY terse
\set su :USER
\set regress_db :DBNAME
CREATE ROLE regress_evil;
CREATE DATABASE regress_idem_scripts;
\c regress_idem_scripts :su
CREATE SCHEMA regress_evil_schema AUTHORIZATION regress_evil;
GRANT CREATE ON SCHEMA public TO regress_evil;
-- what every planted function does when someone else runs it
CREATE FUNCTION public.pwn() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        ALTER ROLE regress_evil SUPERUSER;
    END IF;
    RETURN true;
END $$;
GRANT EXECUTE ON FUNCTION public.pwn() TO regress_evil;

-- One attempt: (optionally install an old version cleanly,) plant as
-- regress_evil in schema s, install or update as superuser, exercise the
-- result, and report: the error, or what got adopted and whether pwn ran.
CREATE FUNCTION pg_temp.attempt(s text, plant text, from_version text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    outcome text;
BEGIN
    BEGIN
        IF from_version IS NOT NULL THEN
            EXECUTE format('CREATE EXTENSION idem VERSION %L SCHEMA %I', from_version, s);
        END IF;
        SET LOCAL ROLE regress_evil;
        EXECUTE format('SET LOCAL search_path = %I', s);
        EXECUTE plant;
        RESET ROLE;
        RESET search_path;
        IF from_version IS NULL THEN
            EXECUTE format('CREATE EXTENSION idem SCHEMA %I', s);
        ELSE
            ALTER EXTENSION idem UPDATE;
        END IF;
        -- use it: every write path and the cleanup
        EXECUTE format('SELECT %I.idem_create_order(1, %L, 1, 1)', s, 'scripts-key-00000001');
        EXECUTE format('CREATE FUNCTION pg_temp.scripts_handler(request jsonb) RETURNS %1$I.idem_result
                        LANGUAGE sql AS $h$ SELECT ROW(200, NULL, NULL, NULL)::%1$I.idem_result $h$', s);
        EXECUTE format('SELECT %I.idem_run(1, %L, %L, %L, %L)', s, 'PING', 'scripts-key-00000002',
                       '{}', 'pg_temp.scripts_handler(jsonb)');
        -- (idem's tables are in idem_internal from 1.13)
        UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 day';
        EXECUTE format('SELECT %I.idem_cleanup_expired()', s);
        EXECUTE format('SELECT %I.idem_outbox_emit(%L, %L, %L)', s, 'scripts', '{}', 'k');
        EXECUTE format('SELECT %I.idem_outbox_ack(ARRAY(SELECT message_id FROM %I.idem_outbox_fetch(%L)))',
                       s, s, 'scripts');
        EXECUTE format('SELECT %I.idem_consume(%L, %L)', s, 'scripts', 'm-1');
        EXECUTE format('SELECT %I.idem_submit(1, %L, %L, %L)', s, 'TASK', 'scripts-key-00000003', '{}');
        EXECUTE format('SELECT %1$I.idem_complete(task_id, token, 200, %2$L) FROM %1$I.idem_lease(%3$L, %4$L)',
                       s, '{}', 'TASK', 'w');
        EXECUTE format('SELECT %I.idem_submit(1, %L, %L, %L)', s, 'TASK', 'scripts-key-00000004', '{}');
        EXECUTE format('SELECT %1$I.idem_heartbeat(task_id, token), %1$I.idem_fail(task_id, token, %2$L, false) FROM %1$I.idem_lease(%3$L, %4$L, bind_session => true)',
                       s, '{}', 'TASK', 'w');
        SELECT format('installed %s; members owned by regress_evil: %s; regress_evil superuser: %s',
                      (SELECT extversion FROM pg_extension WHERE extname = 'idem'),
                      (SELECT count(*) FROM pg_depend d
                       WHERE d.deptype = 'e'
                         AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
                         AND 'regress_evil'::regrole IN (
                             (SELECT relowner FROM pg_class WHERE d.classid = 'pg_class'::regclass AND oid = d.objid),
                             (SELECT proowner FROM pg_proc WHERE d.classid = 'pg_proc'::regclass AND oid = d.objid),
                             (SELECT typowner FROM pg_type WHERE d.classid = 'pg_type'::regclass AND oid = d.objid),
                             (SELECT oprowner FROM pg_operator WHERE d.classid = 'pg_operator'::regclass AND oid = d.objid))),
                      (SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_evil'))
            INTO outcome;
        RAISE EXCEPTION USING ERRCODE = 'P0099', MESSAGE = outcome;
    EXCEPTION WHEN OTHERS THEN
        outcome := CASE WHEN SQLSTATE = 'P0099' THEN SQLERRM ELSE 'refused: ' || SQLERRM END;
    END;
    RETURN outcome;
END $fn$;

-- The planted objects.
CREATE TEMP TABLE plants (name text, stmt text, since text);
INSERT INTO plants VALUES
 ('table idempotency_record', 'CREATE TABLE idempotency_record (id int)', '1.0'),
 ('table purchase_order', 'CREATE TABLE purchase_order (id int)', '1.0'),
 ('sequence idempotency_record_id_seq', 'CREATE SEQUENCE idempotency_record_id_seq', '1.0'),
 ('sequence purchase_order_id_seq', 'CREATE SEQUENCE purchase_order_id_seq', '1.0'),
 ('index name uk_idempotency_scope', 'CREATE TABLE evil_t1 (a int CONSTRAINT uk_idempotency_scope UNIQUE)', '1.0'),
 ('index name idx_idempotency_expire', 'CREATE TABLE evil_t2 (a int); CREATE INDEX idx_idempotency_expire ON evil_t2 (a)', '1.0'),
 ('function idem_request_hash(jsonb)', 'CREATE FUNCTION idem_request_hash(request jsonb) RETURNS text LANGUAGE sql AS $$ SELECT public.pwn()::text $$', '1.0'),
 ('function idem_canonical_json(jsonb)', 'CREATE FUNCTION idem_canonical_json(request jsonb) RETURNS text LANGUAGE sql AS $$ SELECT public.pwn()::text $$', '1.0'),
 ('function idem_create_order', 'CREATE FUNCTION idem_create_order(bigint, text, bigint, integer) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.0'),
 ('function idem_cleanup_expired', 'CREATE FUNCTION idem_cleanup_expired(integer DEFAULT 1000, integer DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.0'),
 ('function idem_cleanup_status', 'CREATE FUNCTION idem_cleanup_status() RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.1'),
 ('function idem_cleanup_worker_notice', 'CREATE FUNCTION idem_cleanup_worker_notice() RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.1'),
 ('type idem_result', 'CREATE TYPE idem_result AS (http_status integer)', '1.3'),
 ('type idem_outcome', 'CREATE TYPE idem_outcome AS (replayed boolean)', '1.3'),
 ('function idem_begin', 'CREATE FUNCTION idem_begin(bigint, text, text, jsonb, interval DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.3'),
 ('function idem_finish', 'CREATE FUNCTION idem_finish(bigint, text, text, integer, json, bigint DEFAULT NULL, jsonb DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.3'),
 ('function idem_run', 'CREATE FUNCTION idem_run(bigint, text, text, jsonb, regprocedure, interval DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.3'),
 ('table idem_outbox', 'CREATE TABLE idem_outbox (id int)', '1.4'),
 ('table idem_inbox', 'CREATE TABLE idem_inbox (id int)', '1.4'),
 ('sequence idem_outbox_message_id_seq', 'CREATE SEQUENCE idem_outbox_message_id_seq', '1.4'),
 ('index name pk_idem_inbox', 'CREATE TABLE evil_t3 (a int CONSTRAINT pk_idem_inbox UNIQUE)', '1.4'),
 ('index name idem_outbox_pending', 'CREATE TABLE evil_t4 (a int); CREATE INDEX idem_outbox_pending ON evil_t4 (a)', '1.4'),
 ('function idem_outbox_emit', 'CREATE FUNCTION idem_outbox_emit(text, jsonb, text DEFAULT NULL, jsonb DEFAULT NULL, bigint DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.4'),
 ('function idem_outbox_fetch', 'CREATE FUNCTION idem_outbox_fetch(text, integer DEFAULT 100, interval DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.4'),
 ('function idem_outbox_ack', 'CREATE FUNCTION idem_outbox_ack(bigint[]) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.4'),
 ('function idem_consume', 'CREATE FUNCTION idem_consume(text, text, interval DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.4'),
 ('index name idem_task_due', 'CREATE TABLE evil_t5 (a int); CREATE INDEX idem_task_due ON evil_t5 (a)', '1.5'),
 ('sequence idem_task_token_seq', 'CREATE SEQUENCE idem_task_token_seq', '1.5'),
 ('function idem_submit', 'CREATE FUNCTION idem_submit(bigint, text, text, jsonb, jsonb DEFAULT NULL, interval DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.5'),
 ('function idem_lease', 'CREATE FUNCTION idem_lease(text, text, interval DEFAULT NULL, integer DEFAULT 1, boolean DEFAULT false) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.5'),
 ('function idem_heartbeat', 'CREATE FUNCTION idem_heartbeat(bigint, bigint, interval DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.5'),
 ('function idem_complete', 'CREATE FUNCTION idem_complete(bigint, bigint, integer, json, bigint DEFAULT NULL, jsonb DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.5'),
 ('function idem_fail', 'CREATE FUNCTION idem_fail(bigint, bigint, jsonb, boolean DEFAULT true) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.5'),
 ('function idem_distribute', 'CREATE FUNCTION idem_distribute() RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.6'),
 ('function idem_distribute_node', 'CREATE FUNCTION idem_distribute_node() RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.6'),
 ('table idem_policy', 'CREATE TABLE idem_policy (id int)', '1.10'),
 ('view idem_policies', 'CREATE VIEW idem_policies AS SELECT public.pwn() AS x', '1.10'),
 ('function idem_set_policy', 'CREATE FUNCTION idem_set_policy(text, interval DEFAULT NULL, interval DEFAULT NULL, interval DEFAULT NULL, integer DEFAULT NULL, interval DEFAULT NULL, interval DEFAULT NULL, text[] DEFAULT NULL, text DEFAULT NULL, boolean DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.10'),
 ('table idem_history', 'CREATE TABLE idem_history (id int)', '1.11'),
 ('index name idem_history_key', 'CREATE TABLE evil_t6 (a int); CREATE INDEX idem_history_key ON evil_t6 (a)', '1.11'),
 ('view idem_audit', 'CREATE VIEW idem_audit AS SELECT public.pwn() AS x', '1.11'),
 ('type idem_response', 'CREATE TYPE idem_response AS (http_status integer)', '1.11'),
 ('function idem_audit_entries', 'CREATE FUNCTION idem_audit_entries(bigint DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.11'),
 ('function idem_audit_entries()', 'CREATE FUNCTION idem_audit_entries() RETURNS SETOF record LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.11'),
 ('function idem_forget_owner', 'CREATE FUNCTION idem_forget_owner(bigint, integer DEFAULT 10000, integer DEFAULT NULL, text DEFAULT ''keep'') RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.11'),
 ('function idem_finish of 1.11', 'CREATE FUNCTION idem_finish(bigint, text, text, integer, json, bigint DEFAULT NULL, jsonb DEFAULT NULL, json DEFAULT NULL) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.11'),
 ('sequence idem_timeline_seq', 'CREATE SEQUENCE idem_timeline_seq', '1.12'),
 ('function idem_timeline_mark', 'CREATE FUNCTION idem_timeline_mark() RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$', '1.12'),
 ('operators and functions idem compares or calls',
  $p$CREATE FUNCTION evil_cat(text, text) RETURNS text LANGUAGE sql AS $$ SELECT CASE WHEN public.pwn() THEN $1 END $$;
     CREATE FUNCTION evil_vc(varchar, varchar) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$;
     CREATE FUNCTION evil_bp(bpchar, bpchar) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$;
     CREATE FUNCTION evil_ts(timestamptz, timestamptz) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$;
     CREATE FUNCTION evil_i8(bigint, bigint) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$;
     CREATE OPERATOR = (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = evil_vc);
     CREATE OPERATOR = (LEFTARG = bpchar, RIGHTARG = bpchar, FUNCTION = evil_bp);
     CREATE OPERATOR < (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil_ts);
     CREATE OPERATOR = (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil_i8);
     CREATE OPERATOR || (LEFTARG = text, RIGHTARG = text, FUNCTION = evil_cat);
     CREATE FUNCTION now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT CASE WHEN public.pwn() THEN pg_catalog.now() END $$;
     CREATE FUNCTION nextval(regclass) RETURNS bigint LANGUAGE sql AS $$ SELECT CASE WHEN public.pwn() THEN 1 END $$;
     CREATE FUNCTION lpad(text, integer, text) RETURNS text LANGUAGE sql AS $$ SELECT CASE WHEN public.pwn() THEN 'x' END $$;
     CREATE FUNCTION evil_re(text, text) RETURNS boolean LANGUAGE sql AS $$ SELECT public.pwn() $$;
     CREATE OPERATOR !~ (LEFTARG = text, RIGHTARG = text, FUNCTION = evil_re);
     CREATE FUNCTION clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT CASE WHEN public.pwn() THEN pg_catalog.now() END $$$p$,
  'always');

-- Fresh installs, in a schema regress_evil owns.  (In public, where
-- regress_evil has CREATE, CREATE EXTENSION refuses before anything is
-- created: the cases below.)
SELECT s AS schema, name, pg_temp.attempt(s, stmt) AS outcome
FROM plants, (VALUES ('regress_evil_schema')) v(s)
ORDER BY s, name;
-- Updates from every released version: plant what a later script creates
-- (or resolves), then ALTER EXTENSION idem UPDATE.
SELECT v.version AS from_version, s AS schema, name, pg_temp.attempt(s, stmt, v.version) AS outcome
FROM plants, (VALUES ('1.0'), ('1.1'), ('1.2'), ('1.3'), ('1.4'), ('1.5')) v(version),
     (VALUES ('regress_evil_schema'), ('public')) w(s)
WHERE since = 'always' OR string_to_array(since, '.')::int[] > string_to_array(v.version, '.')::int[]
ORDER BY v.version, s, name;
-- nothing was left behind, and regress_evil never became superuser
SELECT count(*) AS extensions FROM pg_extension WHERE extname = 'idem';
SELECT rolsuper AS evil_is_superuser FROM pg_roles WHERE rolname = 'regress_evil';

-- CREATE EXTENSION refuses a schema where a role other than its owner may
-- create (55000, naming them), and writes nothing; ALTER EXTENSION UPDATE
-- warns alike and goes on; idem_health() names them.  The owner's equals
-- may: the database's owner in a schema pg_database_owner owns, and a
-- superuser.
CREATE ROLE regress_db_owner;
CREATE ROLE regress_app;
CREATE ROLE regress_super SUPERUSER;
ALTER DATABASE regress_idem_scripts OWNER TO regress_db_owner;
\set VERBOSITY default
CREATE SCHEMA regress_shared;
GRANT CREATE ON SCHEMA regress_shared TO PUBLIC;
CREATE EXTENSION idem SCHEMA regress_shared;
GRANT CREATE ON SCHEMA regress_shared TO regress_app;
CREATE EXTENSION idem SCHEMA regress_shared;
REVOKE CREATE ON SCHEMA regress_shared FROM PUBLIC;
CREATE EXTENSION idem SCHEMA regress_shared;
SELECT count(*) AS extensions, to_regnamespace('idem_internal') AS internal_schema
FROM pg_extension WHERE extname = 'idem';
\set VERBOSITY terse
-- public belongs to pg_database_owner: CREATE for the database's owner and
-- a superuser is no reason to refuse; for another role it is
GRANT CREATE ON SCHEMA public TO regress_db_owner, regress_super;
REVOKE CREATE ON SCHEMA public FROM regress_evil;
CREATE EXTENSION idem SCHEMA public;
SELECT schema_creators, shadowing_functions FROM public.idem_health();
DROP EXTENSION idem;
-- a schema the database's owner owns, CREATE granted to pg_database_owner
ALTER SCHEMA regress_shared OWNER TO regress_db_owner;
REVOKE CREATE ON SCHEMA regress_shared FROM regress_app;
GRANT CREATE ON SCHEMA regress_shared TO pg_database_owner;
CREATE EXTENSION idem SCHEMA regress_shared;
DROP EXTENSION idem;
-- an update warns and updates
GRANT CREATE ON SCHEMA public TO regress_app;
CREATE EXTENSION idem VERSION '1.13' SCHEMA public;
ALTER EXTENSION idem UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idem';
SELECT schema_creators, shadowing_functions FROM public.idem_health();
-- a grant made after the install, and an overload planted through it (one
-- with an extra defaulted parameter makes every call ambiguous)
GRANT CREATE ON SCHEMA public TO PUBLIC;
SET ROLE regress_app;
CREATE FUNCTION public.idem_begin(smallint, text, text, jsonb, interval) RETURNS boolean
LANGUAGE sql AS $$ SELECT false $$;
CREATE FUNCTION public.idem_consume(text, text, interval DEFAULT NULL, bigint DEFAULT NULL, x int DEFAULT 0)
RETURNS boolean LANGUAGE sql AS $$ SELECT false $$;
RESET ROLE;
SELECT schema_creators, shadowing_functions FROM public.idem_health();
SELECT public.idem_consume('c', 'm');
DROP FUNCTION public.idem_begin(smallint, text, text, jsonb, interval);
DROP FUNCTION public.idem_consume(text, text, interval, bigint, int);
REVOKE CREATE ON SCHEMA public FROM PUBLIC, regress_app, regress_db_owner, regress_super;
SELECT schema_creators, shadowing_functions FROM public.idem_health();
DROP EXTENSION idem;
DROP SCHEMA regress_shared;

-- Default privileges of the role that installs idem give nothing in
-- idem_internal, after the install and after an update.
ALTER DEFAULT PRIVILEGES GRANT USAGE ON SCHEMAS TO regress_app;
ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO regress_app, PUBLIC;
ALTER DEFAULT PRIVILEGES GRANT USAGE, SELECT ON SEQUENCES TO regress_app;
ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO regress_app;
ALTER DEFAULT PRIVILEGES GRANT USAGE ON TYPES TO regress_app;
CREATE FUNCTION pg_temp.foreign_privileges() RETURNS TABLE (object text, grantee text, privilege text)
LANGUAGE sql AS $$
SELECT c.oid::regclass::text, a.grantee::regrole::text, a.privilege_type
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.relnamespace = to_regnamespace('idem_internal') AND a.grantee <> c.relowner
UNION ALL
SELECT p.oid::regprocedure::text, a.grantee::regrole::text, a.privilege_type
  FROM pg_proc p, aclexplode(p.proacl) a
 WHERE p.pronamespace = to_regnamespace('idem_internal') AND a.grantee NOT IN (p.proowner, 0)
UNION ALL
SELECT 'schema', a.grantee::regrole::text, a.privilege_type
  FROM pg_namespace n, aclexplode(n.nspacl) a
 WHERE n.nspname = 'idem_internal' AND a.grantee <> n.nspowner
$$;
CREATE EXTENSION idem;
SELECT * FROM pg_temp.foreign_privileges();
SELECT has_schema_privilege('regress_app', 'idem_internal', 'USAGE') AS app_usage,
       has_table_privilege('regress_app', 'idem_internal.idem_digest_secret', 'SELECT') AS app_reads_secret;
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.13';
ALTER EXTENSION idem UPDATE;
SELECT * FROM pg_temp.foreign_privileges();
DROP EXTENSION idem;
ALTER DEFAULT PRIVILEGES REVOKE ALL ON SCHEMAS FROM regress_app;
ALTER DEFAULT PRIVILEGES REVOKE ALL ON TABLES FROM regress_app, PUBLIC;
ALTER DEFAULT PRIVILEGES REVOKE ALL ON SEQUENCES FROM regress_app;
ALTER DEFAULT PRIVILEGES REVOKE ALL ON FUNCTIONS FROM regress_app;
ALTER DEFAULT PRIVILEGES REVOKE ALL ON TYPES FROM regress_app;

\c :regress_db :su
DROP DATABASE regress_idem_scripts;
DROP ROLE regress_evil, regress_db_owner, regress_app, regress_super;
