/* idem--1.10--1.11.sql */
\echo Use "ALTER EXTENSION idem UPDATE TO '1.11'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Retention that keeps the audit trail.  When a finished record expires,
-- its audit fields (owner, operation, key, request fingerprint, status,
-- HTTP status, resource id, times) move to idem_history if its operation
-- has an audit period (the policy's audit_ttl, else idem.audit_ttl): at
-- the cleanup, or when the key executes afresh, whichever comes first.
-- The request and the response (body, headers, task request, task
-- payload, last error) go with the record.  A history row lives until
-- audit_until = expires_at + audit_ttl; with reuse_after_expiry 'refuse'
-- a key is refused (IK007) until then instead of executing again.
-- ---------------------------------------------------------------------------
ALTER TABLE @extschema@.idem_policy
    ADD COLUMN audit_ttl interval,
    ADD COLUMN reuse_after_expiry text
        CHECK (reuse_after_expiry OPERATOR(pg_catalog.=) ANY (ARRAY['execute', 'refuse']::text[]));

CREATE TABLE @extschema@.idem_history (
    owner_id            bigint NOT NULL,
    operation           varchar(64) NOT NULL,
    idempotency_key     varchar(128) NOT NULL,
    record_id           bigint NOT NULL,
    request_hash        char(64) NOT NULL,
    fingerprint_version smallint,
    status              varchar(20) NOT NULL,
    http_status         integer,
    resource_id         bigint,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    expires_at          timestamptz NOT NULL,
    archived_at         timestamptz NOT NULL,
    audit_until         timestamptz NOT NULL,
    CONSTRAINT pk_idem_history PRIMARY KEY (owner_id, record_id)
);
-- what a refused key is looked up by, and what the cleanup deletes by
CREATE INDEX idem_history_key ON @extschema@.idem_history (owner_id, operation, idempotency_key);
CREATE INDEX idem_history_audit_until ON @extschema@.idem_history (audit_until);

COMMENT ON TABLE @extschema@.idem_history IS
    'idem: the audit fields of expired executions, kept until audit_until (the operation''s audit_ttl)';

SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_history', '');
REVOKE ALL ON @extschema@.idem_history FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- A keyed fingerprint: with idem.fingerprint_keys_file set, a record's
-- request_hash is HMAC-SHA-256 (keyed by that file's newest secret) of the
-- request's SHA-256, and fingerprint_version names the secret; NULL is
-- the plain SHA-256 of earlier records.
-- Headers kept as given: response_header_list holds a json form
-- (an object, or an array of [name, value] pairs) byte for byte, where a
-- caller gave one; response_headers the jsonb form otherwise.
-- ---------------------------------------------------------------------------
-- (IF NOT EXISTS: on a Citus cluster the coordinator's update propagates
-- this to the workers, which run this script too; one column a statement:
-- Citus sends an ALTER TABLE of several to a worker as several commands)
ALTER TABLE @extschema@.idempotency_record ADD COLUMN IF NOT EXISTS fingerprint_version smallint;
ALTER TABLE @extschema@.idempotency_record ADD COLUMN IF NOT EXISTS response_header_list json;

COMMENT ON COLUMN @extschema@.idempotency_record.fingerprint_version IS
    'idem: the idem.fingerprint_keys_file secret request_hash is keyed with (HMAC-SHA-256); NULL: plain SHA-256';
COMMENT ON COLUMN @extschema@.idempotency_record.response_header_list IS
    'idem: response headers as given in json form (an object, or [name, value] pairs), replayed byte for byte';

-- The inbox remembers whose message it took (idem_consume's owner), so that
-- idem_forget_owner finds it.
-- Its index: here, or on a Citus cluster distributed before 1.11 by
-- idem_distribute() run again (Citus takes no CREATE INDEX on a
-- distributed table from an extension's script).
ALTER TABLE @extschema@.idem_inbox ADD COLUMN IF NOT EXISTS owner_id bigint;
DO $inbox$
DECLARE
    distributed boolean := false;
BEGIN
    -- (dynamic: pg_dist_partition exists only with Citus)
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                                 WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1)'
            INTO distributed USING '@extschema@.idem_inbox'::pg_catalog.regclass;
    END IF;
    IF NOT distributed THEN
        CREATE INDEX idem_inbox_owner ON @extschema@.idem_inbox (owner_id) WHERE owner_id IS NOT NULL;
    END IF;
END
$inbox$;

-- What a handler of idem_run may return instead of idem_result: headers in
-- json form, kept as given.
CREATE TYPE @extschema@.idem_response AS (
    http_status integer,
    body        json,
    headers     json,
    resource_id bigint
);

-- What idem_begin and idem_run return: the headers as stored, in json form
-- too (header_list), next to the jsonb object (headers).
ALTER TYPE @extschema@.idem_outcome ADD ATTRIBUTE header_list json;

-- ---------------------------------------------------------------------------
-- New signatures.  A function is replaced (the old signature dropped, so
-- that positional calls of it stay unambiguous): idem_finish and
-- idem_complete take header_list json, idem_consume the owner.  As with
-- PostgreSQL's own modules, privileges granted on the old function do not
-- pass to the new one (granted in this script they would be recorded as
-- the extension's initial privileges, which pg_dump leaves out): the update
-- warns which roles had EXECUTE, so that the administrator grants it again
-- (idem_grant) in the same transaction.
-- ---------------------------------------------------------------------------
DO $replace$
DECLARE
    f record;
    roles text;
BEGIN
    FOR f IN
        SELECT * FROM (VALUES
            ('@extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb)',
             $create$CREATE FUNCTION @extschema@.idem_finish(
                 owner bigint, operation text, key text, http_status integer, body json,
                 resource_id bigint DEFAULT NULL, headers jsonb DEFAULT NULL,
                 header_list json DEFAULT NULL)
             RETURNS void AS 'MODULE_PATHNAME', 'idem_finish' LANGUAGE C VOLATILE$create$,
             '@extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json)', 'app'),
            ('@extschema@.idem_complete(bigint, bigint, integer, json, bigint, jsonb)',
             $create$CREATE FUNCTION @extschema@.idem_complete(
                 task_id bigint, token bigint, http_status integer, body json,
                 resource_id bigint DEFAULT NULL, headers jsonb DEFAULT NULL,
                 header_list json DEFAULT NULL)
             RETURNS void AS 'MODULE_PATHNAME', 'idem_complete' LANGUAGE C VOLATILE$create$,
             '@extschema@.idem_complete(bigint, bigint, integer, json, bigint, jsonb, json)', 'worker'),
            ('@extschema@.idem_consume(text, text, interval)',
             $create$CREATE FUNCTION @extschema@.idem_consume(
                 consumer text, message_id text, ttl interval DEFAULT NULL, owner bigint DEFAULT NULL)
             RETURNS boolean AS 'MODULE_PATHNAME', 'idem_consume' LANGUAGE C VOLATILE$create$,
             '@extschema@.idem_consume(text, text, interval, bigint)', 'consumer')
        ) AS v (old, create_it, new, kind)
    LOOP
        SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)), ', ')
          INTO roles
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid OPERATOR(pg_catalog.=) f.old::pg_catalog.regprocedure
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) 0
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner;
        EXECUTE 'DROP FUNCTION ' OPERATOR(pg_catalog.||) f.old;
        EXECUTE f.create_it;
        EXECUTE 'REVOKE ALL ON FUNCTION ' OPERATOR(pg_catalog.||) f.new OPERATOR(pg_catalog.||) ' FROM PUBLIC';
        IF roles IS NOT NULL THEN
            RAISE WARNING 'idem 1.11 replaced % by %: EXECUTE granted to % on the old function is not carried over',
                f.old, f.new, roles
                USING HINT = pg_catalog.format('Grant it again in the same transaction as the update: SELECT idem_grant(role, %L) for each role, or GRANT EXECUTE ON FUNCTION %s TO %s.',
                                               f.kind, f.new, roles);
        END IF;
    END LOOP;
END
$replace$;

COMMENT ON FUNCTION @extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json) IS
    'idem: store the result of the key this transaction claimed with idem_begin';
COMMENT ON FUNCTION @extschema@.idem_complete(bigint, bigint, integer, json, bigint, jsonb, json) IS
    'idem: store the task''s result in the worker''s transaction (2xx/3xx SUCCEEDED, 4xx FAILED_FINAL); IK004 if the token is stale';
COMMENT ON FUNCTION @extschema@.idem_consume(text, text, interval, bigint) IS
    'idem: true the first time consumer takes message_id in a committed transaction, false for every redelivery';

DROP VIEW @extschema@.idem_policies;
DROP FUNCTION @extschema@.idem_set_policy(text, interval, interval, interval, integer, interval, interval, text[], text, boolean);

-- idem_set_policy(operation, ...): every argument after operation named and
-- optional; omitted: unchanged; NULL: the GUC.  Superuser or the
-- extension's owner only (42501); bad values 22023.  Returns the policy.
CREATE FUNCTION @extschema@.idem_set_policy(
    operation text,
    ttl interval DEFAULT @extschema@.idem_policy_unchanged_interval(),
    failure_ttl interval DEFAULT @extschema@.idem_policy_unchanged_interval(),
    wait_timeout interval DEFAULT @extschema@.idem_policy_unchanged_interval(),
    max_attempts integer DEFAULT @extschema@.idem_policy_unchanged_integer(),
    retry_base interval DEFAULT @extschema@.idem_policy_unchanged_interval(),
    retry_max interval DEFAULT @extschema@.idem_policy_unchanged_interval(),
    audit_ttl interval DEFAULT @extschema@.idem_policy_unchanged_interval(),
    reuse_after_expiry text DEFAULT @extschema@.idem_policy_unchanged_text(),
    redact text[] DEFAULT @extschema@.idem_policy_unchanged_textarray(),
    key_format text DEFAULT @extschema@.idem_policy_unchanged_text(),
    reject_weak_keys boolean DEFAULT @extschema@.idem_policy_unchanged_boolean())
RETURNS @extschema@.idem_policy
LANGUAGE C VOLATILE CALLED ON NULL INPUT AS 'MODULE_PATHNAME', 'idem_set_policy';
REVOKE ALL ON FUNCTION @extschema@.idem_set_policy(text, interval, interval, interval, integer, interval, interval, interval, text, text[], text, boolean) FROM PUBLIC;

-- the policies, readable by pg_monitor
CREATE VIEW @extschema@.idem_policies AS
    SELECT operation, ttl, failure_ttl, wait_timeout, max_attempts, retry_base, retry_max,
           audit_ttl, reuse_after_expiry, redact, key_format, reject_weak_keys, updated_at
    FROM @extschema@.idem_policy;
REVOKE ALL ON @extschema@.idem_policies FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_policies TO pg_monitor;

-- ---------------------------------------------------------------------------
-- idem_audit: every execution of a key, the live records and the history,
-- without requests or responses.  pg_monitor reads every owner; another
-- role granted SELECT on the view and EXECUTE on idem_audit_entries()
-- reads only the owners its idem.allowed_owners names (every owner when
-- that is empty, as for calls).  A function, read as idem's owner, so that
-- no view depends on the columns of idem's tables; given an owner, it reads
-- that owner's rows only, through the indexes.
-- ---------------------------------------------------------------------------
CREATE FUNCTION @extschema@.idem_audit_entries(
    owner bigint DEFAULT NULL,
    OUT owner_id bigint, OUT operation text, OUT idempotency_key text, OUT record_id bigint,
    OUT status text, OUT http_status integer, OUT resource_id bigint, OUT request_hash text,
    OUT executed_at timestamptz, OUT finished_at timestamptz, OUT expires_at timestamptz,
    OUT archived_at timestamptz, OUT audit_until timestamptz, OUT live boolean)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_audit_entries'
LANGUAGE C STABLE CALLED ON NULL INPUT;
REVOKE ALL ON FUNCTION @extschema@.idem_audit_entries(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_audit_entries(bigint) TO pg_monitor;

-- (its argument typed: no other idem_audit_entries can be the one called)
CREATE VIEW @extschema@.idem_audit AS
    SELECT * FROM @extschema@.idem_audit_entries(NULL::pg_catalog.int8);
REVOKE ALL ON @extschema@.idem_audit FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_audit TO pg_monitor;

COMMENT ON VIEW @extschema@.idem_audit IS
    'idem: every execution of a key, live (the record) or past (idem_history), without requests or responses';

-- ---------------------------------------------------------------------------
-- idem_forget_owner(owner): an erasure request.  Removes every record,
-- history row and inbox entry of the owner, in batches of batch_size rows
-- a statement, at most max_batches batches a table (all when NULL);
-- returns how many rows went.  Superuser only.
-- ---------------------------------------------------------------------------
CREATE FUNCTION @extschema@.idem_forget_owner(
    owner bigint, batch_size integer DEFAULT 10000, max_batches integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $forget$
DECLARE
    total bigint := 0;
    n bigint;
    batches integer;
    tbl text;
    keys text;
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER) THEN
        RAISE EXCEPTION 'permission denied to forget an owner'
            USING ERRCODE = '42501', HINT = 'Only a superuser may call idem_forget_owner.';
    END IF;
    IF owner IS NULL OR batch_size IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null', CASE WHEN owner IS NULL THEN 'owner' ELSE 'batch_size' END
            USING ERRCODE = '22004';
    END IF;
    IF batch_size OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'batch_size must be at least 1' USING ERRCODE = '22023',
            DETAIL = pg_catalog.format('The call has batch_size %s.', batch_size);
    END IF;
    IF max_batches OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'max_batches must be at least 1, or NULL for no limit' USING ERRCODE = '22023',
            DETAIL = pg_catalog.format('The call has max_batches %s.', max_batches);
    END IF;

    -- each table in statements of batch_size rows, at most max_batches
    FOR tbl, keys IN SELECT * FROM (VALUES
        ('@extschema@.idempotency_record', 'id'),
        ('@extschema@.idem_history', 'record_id'),
        ('@extschema@.idem_inbox', 'consumer, message_id')) AS t (tbl, keys)
    LOOP
        batches := 0;
        LOOP
            EXECUTE pg_catalog.format(
                'DELETE FROM %1$s WHERE owner_id OPERATOR(pg_catalog.=) $1 AND (%2$s) IN'
                ' (SELECT %2$s FROM %1$s WHERE owner_id OPERATOR(pg_catalog.=) $1 LIMIT $2)', tbl, keys)
                USING owner, batch_size;
            GET DIAGNOSTICS n = ROW_COUNT;
            total := total OPERATOR(pg_catalog.+) n;
            batches := batches OPERATOR(pg_catalog.+) 1;
            EXIT WHEN n OPERATOR(pg_catalog.<) batch_size OR batches OPERATOR(pg_catalog.>=) max_batches;
        END LOOP;
    END LOOP;
    RETURN total;
END
$forget$;
REVOKE ALL ON FUNCTION @extschema@.idem_forget_owner(bigint, integer, integer) FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.idem_forget_owner(bigint, integer, integer) IS
    'idem: an erasure request: remove every record, history row and inbox entry of owner (superuser only)';

-- The privileges of a kind, with the new signatures, and the audit for
-- monitors.
CREATE OR REPLACE FUNCTION @extschema@.idem_privileges(kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $privileges$
    SELECT p.privilege, p.object
    FROM (VALUES
        ('app', 'EXECUTE', 'FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer)'),
        ('app', 'EXECUTE', 'FUNCTION @extschema@.idem_begin(bigint, text, text, jsonb, interval)'),
        ('app', 'EXECUTE', 'FUNCTION @extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json)'),
        ('app', 'EXECUTE', 'FUNCTION @extschema@.idem_run(bigint, text, text, jsonb, regprocedure, interval)'),
        ('app', 'EXECUTE', 'FUNCTION @extschema@.idem_submit(bigint, text, text, jsonb, jsonb, interval)'),
        ('app', 'EXECUTE', 'FUNCTION @extschema@.idem_outbox_emit(text, jsonb, text, jsonb)'),
        ('worker', 'EXECUTE', 'FUNCTION @extschema@.idem_lease(text, text, interval, integer, boolean)'),
        ('worker', 'EXECUTE', 'FUNCTION @extschema@.idem_heartbeat(bigint, bigint, interval)'),
        ('worker', 'EXECUTE', 'FUNCTION @extschema@.idem_complete(bigint, bigint, integer, json, bigint, jsonb, json)'),
        ('worker', 'EXECUTE', 'FUNCTION @extschema@.idem_fail(bigint, bigint, jsonb, boolean)'),
        ('publisher', 'EXECUTE', 'FUNCTION @extschema@.idem_outbox_fetch(text, integer, interval)'),
        ('publisher', 'EXECUTE', 'FUNCTION @extschema@.idem_outbox_ack(bigint[])'),
        ('consumer', 'EXECUTE', 'FUNCTION @extschema@.idem_consume(text, text, interval, bigint)'),
        ('monitor', 'SELECT', 'TABLE @extschema@.idem_stats'),
        ('monitor', 'SELECT', 'TABLE @extschema@.idem_audit'),
        ('monitor', 'EXECUTE', 'FUNCTION @extschema@.idem_audit_entries(bigint)'),
        ('monitor', 'EXECUTE', 'FUNCTION @extschema@.idem_stats_entries()'),
        ('monitor', 'EXECUTE', 'FUNCTION @extschema@.idem_health()'),
        ('monitor', 'EXECUTE', 'FUNCTION @extschema@.idem_cleanup_status()')
    ) AS p (kind, privilege, object)
    WHERE p.kind OPERATOR(pg_catalog.=) idem_privileges.kind
$privileges$;

-- ---------------------------------------------------------------------------
-- idem_distribute() of 1.11: the new signatures delegated, idem_history
-- distributed by owner with the records, idem_policy a reference table
-- (every node holds the policies).  On a cluster distributed before 1.11,
-- run it again after the update.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION @extschema@.idem_distribute()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $dist$
DECLARE
    r record;
    version text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles ro
                    WHERE ro.rolname OPERATOR(pg_catalog.=) CURRENT_USER AND ro.rolsuper) THEN
        RAISE EXCEPTION 'permission denied to distribute idem'
            USING ERRCODE = '42501', HINT = 'Run idem_distribute() as a superuser.';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'idem_distribute() needs the Citus extension'
            USING ERRCODE = '0A000',
                  DETAIL = 'Citus is not installed in this database; nothing was changed.',
                  HINT = 'Install Citus (its packages are at https://github.com/citusdata/citus), CREATE EXTENSION citus before idem, and add the worker nodes.';
    END IF;
    IF (SELECT groupid FROM pg_catalog.pg_dist_local_group) OPERATOR(pg_catalog.<>) 0 THEN
        RAISE EXCEPTION 'idem_distribute() must run on the Citus coordinator'
            USING ERRCODE = '55000';
    END IF;
    PERFORM @extschema@.idem_distribute_node();

    SELECT e.extversion INTO version FROM pg_catalog.pg_extension e
     WHERE e.extname OPERATOR(pg_catalog.=) 'idem';
    FOR r IN SELECT w.nodename, w.nodeport, w.success, w.result
               FROM pg_catalog.run_command_on_workers(
                    'SELECT extversion FROM pg_catalog.pg_extension WHERE extname = ''idem''') w LOOP
        IF NOT r.success OR r.result IS DISTINCT FROM version THEN
            RAISE EXCEPTION 'idem % is not installed on worker node %:%', version, r.nodename, r.nodeport
                USING ERRCODE = '55000',
                      DETAIL = pg_catalog.format('The node answered: %s', r.result),
                      HINT = 'Citus creates an extension on every node when it is created on the coordinator: install idem''s files on every node, then ALTER EXTENSION idem UPDATE.';
        END IF;
    END LOOP;
    FOR r IN SELECT w.nodename, w.nodeport, w.success, w.result
               FROM pg_catalog.run_command_on_workers(
                    'SELECT @extschema@.idem_distribute_node()') w LOOP
        IF NOT r.success THEN
            RAISE EXCEPTION 'idem_distribute() failed on worker node %:%', r.nodename, r.nodeport
                USING ERRCODE = '55000', DETAIL = r.result;
        END IF;
    END LOOP;

    -- the distributed tables, each once: records and orders by owner,
    -- co-located; the inbox by consumer; (1.11) an owner's history with its
    -- records
    FOR r IN SELECT * FROM (VALUES
                 ('@extschema@.idempotency_record', 'owner_id', 'default'),
                 ('@extschema@.purchase_order', 'owner_id', '@extschema@.idempotency_record'),
                 ('@extschema@.idem_inbox', 'consumer', 'default'),
                 ('@extschema@.idem_history', 'owner_id', '@extschema@.idempotency_record')) AS v (tbl, col, colocate)
    LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                        WHERE p.logicalrelid OPERATOR(pg_catalog.=) r.tbl::pg_catalog.regclass) THEN
            PERFORM pg_catalog.create_distributed_table(r.tbl::pg_catalog.regclass, r.col,
                                                        colocate_with => r.colocate);
        END IF;
    END LOOP;
    -- the inbox by owner (on a cluster distributed before 1.11)
    IF pg_catalog.to_regclass('@extschema@.idem_inbox_owner') IS NULL THEN
        CREATE INDEX idem_inbox_owner ON @extschema@.idem_inbox (owner_id) WHERE owner_id IS NOT NULL;
    END IF;
    -- the policies on every node
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) '@extschema@.idem_policy'::pg_catalog.regclass) THEN
        -- its statement trigger only tells the node's backends that the
        -- policies changed: Citus puts it on every placement
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM pg_catalog.create_reference_table('@extschema@.idem_policy');
    END IF;

    -- force_delegation: delegated inside a transaction block too, as part of
    -- the distributed transaction
    FOR r IN SELECT f.fn::pg_catalog.regprocedure AS fn, f.tbl
               FROM (VALUES
                   ('@extschema@.idem_create_order(bigint, text, bigint, integer)', '@extschema@.idempotency_record'),
                   ('@extschema@.idem_begin(bigint, text, text, jsonb, interval)', '@extschema@.idempotency_record'),
                   ('@extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json)', '@extschema@.idempotency_record'),
                   ('@extschema@.idem_run(bigint, text, text, jsonb, regprocedure, interval)', '@extschema@.idempotency_record'),
                   ('@extschema@.idem_submit(bigint, text, text, jsonb, jsonb, interval)', '@extschema@.idempotency_record'),
                   ('@extschema@.idem_consume(text, text, interval, bigint)', '@extschema@.idem_inbox')) AS f (fn, tbl) LOOP
        PERFORM pg_catalog.create_distributed_function(r.fn, '$1', colocate_with => r.tbl,
                                                       force_delegation => true);
    END LOOP;
END
$dist$;

