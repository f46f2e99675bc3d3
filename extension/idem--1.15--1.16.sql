/* idem--1.15--1.16.sql */
\echo Use "ALTER EXTENSION idem UPDATE TO '1.16'" to load this file. \quit

-- A definition this update replaces is copied from idem.sql by
-- test/upgrade/scripts.py --write, between "-- from idem.sql: <first
-- line>" and "-- end"; the rest is written here.

-- ---------------------------------------------------------------------------
-- Uncertain outcomes and every attempt: the record's new task columns, the
-- reconcile index, the attempts table and its view, the policy's two
-- settings, idem_fail_unknown and idem_lease_reconcile.
-- ---------------------------------------------------------------------------
--
-- On a Citus cluster every node runs this script (the coordinator's update
-- is propagated), each for its own tables and the shards placed on it,
-- with Citus's DDL propagation off for the whole script: a worker updated
-- from before 1.13 has its shards in idem_internal only once its own
-- update moved them, so the coordinator's ALTER TABLE cannot reach them.
-- No CHECK on the policy's new column (idem_set_policy checks it), and no
-- CREATE INDEX on a distributed table (idem_distribute() makes it there).
DO $columns$
DECLARE
    citus boolean := pg_catalog.to_regclass('pg_catalog.pg_dist_shard') IS NOT NULL;
    adds text[] := ARRAY[
        'idempotency_record', 'task_leased_at timestamptz',
        'idempotency_record', 'task_uncertain_since timestamptz',
        'idempotency_record', 'task_reconcile_at timestamptz',
        'idempotency_record', 'task_reconciles integer',
        'idempotency_record', 'task_trace_context text',
        'idem_policy', 'uncertain text',
        'idem_policy', 'reconcile_within interval'];
    shards text[] := '{}';
    rel text;
BEGIN
    IF citus THEN
        PERFORM pg_catalog.set_config('idem_update.ddl_propagation',
                                      COALESCE(pg_catalog.current_setting('citus.enable_ddl_propagation', true), 'on'), true);
        PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);
        -- Citus hides shards from queries of pg_class
        PERFORM pg_catalog.set_config('citus.override_table_visibility', 'off', true);
    END IF;
    FOR i IN 1 .. pg_catalog.array_length(adds, 1) BY 2 LOOP
        IF citus THEN
            EXECUTE
                'SELECT COALESCE(pg_catalog.array_agg(c.relname::pg_catalog.text), ''{}'') FROM pg_catalog.pg_dist_shard s
                   JOIN pg_catalog.pg_class l ON l.oid OPERATOR(pg_catalog.=) s.logicalrelid
                   JOIN pg_catalog.pg_class c ON c.relnamespace OPERATOR(pg_catalog.=) l.relnamespace
                    AND c.relname OPERATOR(pg_catalog.=)
                        (l.relname::pg_catalog.text OPERATOR(pg_catalog.||) ''_'' OPERATOR(pg_catalog.||) s.shardid::pg_catalog.text)
                  WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1::pg_catalog.regclass'
                INTO shards USING 'idem_internal.' OPERATOR(pg_catalog.||) adds[i];
        END IF;
        FOREACH rel IN ARRAY ARRAY[adds[i]] OPERATOR(pg_catalog.||) shards LOOP
            EXECUTE pg_catalog.format('ALTER TABLE idem_internal.%I ADD COLUMN IF NOT EXISTS %s', rel, adds[i OPERATOR(pg_catalog.+) 1]);
        END LOOP;
    END LOOP;
END
$columns$;

-- from idem.sql: COMMENT ON COLUMN idem_internal.idempotency_record.task_leased_at IS
COMMENT ON COLUMN idem_internal.idempotency_record.task_leased_at IS
    'idem: when the current (or last) lease was handed out';
-- end
DO $reconcile_index$
DECLARE
    distributed boolean := false;
BEGIN
    -- (dynamic: pg_dist_partition exists only with Citus)
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                                 WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1)'
            INTO distributed USING 'idem_internal.idempotency_record'::pg_catalog.regclass;
    END IF;
    IF NOT distributed THEN
        CREATE INDEX idem_task_reconcile ON idem_internal.idempotency_record (operation, task_reconcile_at)
            WHERE task_reconcile_at IS NOT NULL;
    END IF;
END
$reconcile_index$;
-- from idem.sql: COMMENT ON COLUMN idem_internal.idempotency_record.task_uncertain_since IS
COMMENT ON COLUMN idem_internal.idempotency_record.task_uncertain_since IS
    'idem: since when the task''s outcome is uncertain (an attempt of an operation with uncertain => ''reconcile'' ended without one); NULL: not marked';
-- end
-- from idem.sql: COMMENT ON COLUMN idem_internal.idempotency_record.task_reconcile_at IS
COMMENT ON COLUMN idem_internal.idempotency_record.task_reconcile_at IS
    'idem: when idem_lease_reconcile may hand the marked task out next; NULL: not marked, or past reconcile_within (an operator''s)';
-- end
-- from idem.sql: COMMENT ON COLUMN idem_internal.idempotency_record.task_reconciles IS
COMMENT ON COLUMN idem_internal.idempotency_record.task_reconciles IS
    'idem: reconcile leases handed out for the task';
-- end
-- from idem.sql: COMMENT ON COLUMN idem_internal.idempotency_record.task_trace_context IS
COMMENT ON COLUMN idem_internal.idempotency_record.task_trace_context IS
    'idem: the W3C traceparent the task was submitted under (idem.trace_context); NULL: none, or finished';
-- end

-- from idem.sql: CREATE TABLE idem_internal.idem_task_attempt (
CREATE TABLE idem_internal.idem_task_attempt (
    owner_id    bigint NOT NULL,
    task_id     bigint NOT NULL,
    token       bigint NOT NULL,
    attempt     integer NOT NULL,
    reconcile   boolean NOT NULL,
    worker      varchar(64) NOT NULL,
    started_at  timestamptz NOT NULL,
    ended_at    timestamptz NOT NULL,
    outcome     varchar(16) NOT NULL
        CHECK (outcome::pg_catalog.text OPERATOR(pg_catalog.=)
               ANY (ARRAY['succeeded', 'failed', 'retryable', 'unknown', 'lapsed']::pg_catalog.text[])),
    http_status integer,
    error       jsonb,
    expires_at  timestamptz NOT NULL,
    CONSTRAINT pk_idem_task_attempt PRIMARY KEY (owner_id, task_id, token)
);
-- end
-- from idem.sql: CREATE INDEX idem_task_attempt_expires ON idem_internal.idem_task_attempt (expires_at);
CREATE INDEX idem_task_attempt_expires ON idem_internal.idem_task_attempt (expires_at);
-- end
-- from idem.sql: COMMENT ON TABLE idem_internal.idem_task_attempt IS
COMMENT ON TABLE idem_internal.idem_task_attempt IS
    'idem: every ended attempt of a task (its lease: worker, token, times, outcome, redacted error), kept as long as the task''s record';
-- end
-- from idem.sql: SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_task_attempt', '');
SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_task_attempt', '');
-- end
-- from idem.sql: REVOKE ALL ON idem_internal.idem_task_attempt FROM PUBLIC;
REVOKE ALL ON idem_internal.idem_task_attempt FROM PUBLIC;
-- end
-- from idem.sql: CREATE FUNCTION @extschema@.idem_task_attempt_entries(
CREATE FUNCTION @extschema@.idem_task_attempt_entries(
    owner bigint DEFAULT NULL,
    OUT owner_id bigint, OUT task_id bigint, OUT operation text, OUT idempotency_key text,
    OUT attempt integer, OUT reconcile boolean, OUT worker text, OUT token bigint,
    OUT started_at timestamptz, OUT ended_at timestamptz, OUT outcome text,
    OUT http_status integer, OUT error jsonb)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_task_attempt_entries'
LANGUAGE C STABLE CALLED ON NULL INPUT;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_task_attempt_entries(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_task_attempt_entries(bigint) FROM PUBLIC;
-- end
-- from idem.sql: GRANT EXECUTE ON FUNCTION @extschema@.idem_task_attempt_entries(bigint) TO pg_monitor;
GRANT EXECUTE ON FUNCTION @extschema@.idem_task_attempt_entries(bigint) TO pg_monitor;
-- end
-- from idem.sql: CREATE VIEW @extschema@.idem_task_attempts AS
CREATE VIEW @extschema@.idem_task_attempts AS
    SELECT * FROM @extschema@.idem_task_attempt_entries(NULL::pg_catalog.int8);
-- end
-- from idem.sql: REVOKE ALL ON @extschema@.idem_task_attempts FROM PUBLIC;
REVOKE ALL ON @extschema@.idem_task_attempts FROM PUBLIC;
-- end
-- from idem.sql: GRANT SELECT ON @extschema@.idem_task_attempts TO pg_monitor;
GRANT SELECT ON @extschema@.idem_task_attempts TO pg_monitor;
-- end
-- from idem.sql: COMMENT ON VIEW @extschema@.idem_task_attempts IS
COMMENT ON VIEW @extschema@.idem_task_attempts IS
    'idem: every attempt of every task: worker, fencing token, start, end, outcome (succeeded, failed, retryable, unknown, lapsed; NULL while it runs), redacted error';
-- end

-- from idem.sql: CREATE FUNCTION @extschema@.idem_fail_unknown(
CREATE FUNCTION @extschema@.idem_fail_unknown(
    task_id bigint, token bigint, error jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_fail_unknown'
LANGUAGE C VOLATILE;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_fail_unknown(bigint, bigint, jsonb) IS
COMMENT ON FUNCTION @extschema@.idem_fail_unknown(bigint, bigint, jsonb) IS
    'idem: report an attempt whose outcome is unknown: with uncertain => ''reconcile'' the task is marked for reconciliation (PROCESSING), else as idem_fail''s retryable failure; IK004 if the token is stale';
-- end
-- from idem.sql: CREATE FUNCTION @extschema@.idem_task_trace_context(task_id bigint, token bigint)
CREATE FUNCTION @extschema@.idem_task_trace_context(task_id bigint, token bigint)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_task_trace_context'
LANGUAGE C VOLATILE;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_task_trace_context(bigint, bigint) IS
COMMENT ON FUNCTION @extschema@.idem_task_trace_context(bigint, bigint) IS
    'idem: the W3C traceparent the task was submitted under (idem.trace_context), or NULL; IK004 if the token is stale';
-- end
-- from idem.sql: CREATE FUNCTION @extschema@.idem_lease_reconcile(
CREATE FUNCTION @extschema@.idem_lease_reconcile(
    operation text, worker text, lease interval DEFAULT '30 seconds',
    batch integer DEFAULT 1, bind_session boolean DEFAULT false,
    OUT task_id bigint, OUT owner bigint, OUT key text, OUT request jsonb,
    OUT payload jsonb, OUT attempt integer, OUT token bigint,
    OUT lease_expires_at timestamptz, OUT uncertain_since timestamptz,
    OUT attempts jsonb)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_lease_reconcile'
LANGUAGE C VOLATILE ROWS 1;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_lease_reconcile(text, text, interval, integer, boolean) IS
COMMENT ON FUNCTION @extschema@.idem_lease_reconcile(text, text, interval, integer, boolean) IS
    'idem: hand tasks whose outcome is uncertain to a reconciling worker, with their attempts so far, each with a new fencing token';
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_fail_unknown(bigint, bigint, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_fail_unknown(bigint, bigint, jsonb) FROM PUBLIC;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_lease_reconcile(text, text, interval, integer, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_lease_reconcile(text, text, interval, integer, boolean) FROM PUBLIC;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_task_trace_context(bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_task_trace_context(bigint, bigint) FROM PUBLIC;
-- end


-- from idem.sql, replaced: CREATE VIEW @extschema@.idem_policies AS
CREATE OR REPLACE VIEW @extschema@.idem_policies AS
    SELECT operation, ttl, failure_ttl, wait_timeout, max_attempts, retry_base, retry_max,
           audit_ttl, reuse_after_expiry, redact, key_format, reject_weak_keys, updated_at,
           uncertain, reconcile_within
    FROM idem_internal.idem_policy;
-- end

-- ---------------------------------------------------------------------------
-- Operators: the audit, its guard and view, the task actions; the
-- dead-letter functions become entry points that audit (dropped above).
-- ---------------------------------------------------------------------------
-- from idem.sql: CREATE TABLE idem_internal.idem_operator_audit (
CREATE TABLE idem_internal.idem_operator_audit (
    id                 bigserial,
    owner_id           bigint NOT NULL,
    acted_at           timestamptz NOT NULL,
    session_user_name  text NOT NULL,
    current_user_name  text NOT NULL,
    action             text NOT NULL,
    target             text NOT NULL,
    target_id          bigint,
    operation          text,
    key                text,
    arguments          jsonb,
    reason             text,
    state_before       jsonb,
    state_after        jsonb,
    expires_at         timestamptz NOT NULL,
    CONSTRAINT pk_idem_operator_audit PRIMARY KEY (owner_id, id)
);
-- end
-- from idem.sql: CREATE INDEX idem_operator_audit_expires ON idem_internal.idem_operator_audit (expires_at);
CREATE INDEX idem_operator_audit_expires ON idem_internal.idem_operator_audit (expires_at);
-- end
-- from idem.sql: COMMENT ON TABLE idem_internal.idem_operator_audit IS
COMMENT ON TABLE idem_internal.idem_operator_audit IS
    'idem: every operator action (who, as whom, what, on which task or message, why, the state before and after); changed by nobody but idem''s owner';
-- end
-- from idem.sql: SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_operator_audit', '');
SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_operator_audit', '');
-- end
-- from idem.sql: SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_operator_audit_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_operator_audit_id_seq', '');
-- end
-- from idem.sql: REVOKE ALL ON idem_internal.idem_operator_audit FROM PUBLIC;
REVOKE ALL ON idem_internal.idem_operator_audit FROM PUBLIC;
-- end
-- from idem.sql: REVOKE ALL ON SEQUENCE idem_internal.idem_operator_audit_id_seq FROM PUBLIC;
REVOKE ALL ON SEQUENCE idem_internal.idem_operator_audit_id_seq FROM PUBLIC;
-- end
-- from idem.sql: CREATE FUNCTION idem_internal.idem_operator_audit_guard()
CREATE FUNCTION idem_internal.idem_operator_audit_guard()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_user OPERATOR(pg_catalog.=) (SELECT c.relowner::pg_catalog.regrole::pg_catalog.name
                                             FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) TG_RELID) THEN
        RETURN CASE WHEN TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    -- retention: a row past its expiry
    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' AND OLD.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN
        RETURN OLD;
    END IF;
    -- an erasure (idem_forget_owner): the arguments gone, nothing else changed
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND NEW.arguments IS NULL
       AND ROW(NEW.id, NEW.owner_id, NEW.acted_at, NEW.session_user_name, NEW.current_user_name, NEW.action,
               NEW.target, NEW.target_id, NEW.operation, NEW.key, NEW.reason, NEW.state_before::pg_catalog.text,
               NEW.state_after::pg_catalog.text, NEW.expires_at)
           IS NOT DISTINCT FROM
           ROW(OLD.id, OLD.owner_id, OLD.acted_at, OLD.session_user_name, OLD.current_user_name, OLD.action,
               OLD.target, OLD.target_id, OLD.operation, OLD.key, OLD.reason, OLD.state_before::pg_catalog.text,
               OLD.state_after::pg_catalog.text, OLD.expires_at) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'idem''s operator audit cannot be changed'
        USING ERRCODE = '42501',
              DETAIL = pg_catalog.format('%s of idem_operator_audit by %I refused.', TG_OP, current_user),
              HINT = 'Only idem''s owner may; the cleanup deletes rows idem.operator_audit_ttl after their action.';
END
$$;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION idem_internal.idem_operator_audit_guard() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_internal.idem_operator_audit_guard() FROM PUBLIC;
-- end
-- from idem.sql: CREATE TRIGGER idem_operator_audit_guard BEFORE UPDATE OR DELETE ON idem_internal.idem_operator_audit
CREATE TRIGGER idem_operator_audit_guard BEFORE UPDATE OR DELETE ON idem_internal.idem_operator_audit
    FOR EACH ROW EXECUTE FUNCTION idem_internal.idem_operator_audit_guard();
-- end
-- from idem.sql: CREATE TRIGGER idem_operator_audit_truncate BEFORE TRUNCATE ON idem_internal.idem_operator_audit
CREATE TRIGGER idem_operator_audit_truncate BEFORE TRUNCATE ON idem_internal.idem_operator_audit
    FOR EACH STATEMENT EXECUTE FUNCTION idem_internal.idem_operator_audit_guard();
-- end
-- from idem.sql: CREATE FUNCTION idem_internal.idem_owner_visible(owner bigint)
CREATE FUNCTION idem_internal.idem_owner_visible(owner bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_owner_visible'
LANGUAGE C VOLATILE;
-- end
-- from idem.sql: CREATE VIEW @extschema@.idem_operator_actions WITH (security_barrier) AS
CREATE VIEW @extschema@.idem_operator_actions WITH (security_barrier) AS
    SELECT a.id, a.owner_id, a.acted_at, a.session_user_name, a.current_user_name, a.action, a.target,
           a.target_id, a.operation, a.key, a.arguments, a.reason, a.state_before, a.state_after
      FROM idem_internal.idem_operator_audit a
     WHERE pg_catalog.pg_has_role(CURRENT_USER, 'pg_monitor', 'USAGE')
        OR idem_internal.idem_owner_visible(a.owner_id);
-- end
-- from idem.sql: REVOKE ALL ON @extschema@.idem_operator_actions FROM PUBLIC;
REVOKE ALL ON @extschema@.idem_operator_actions FROM PUBLIC;
-- end
-- from idem.sql: GRANT SELECT ON @extschema@.idem_operator_actions TO pg_monitor;
GRANT SELECT ON @extschema@.idem_operator_actions TO pg_monitor;
-- end
-- from idem.sql: COMMENT ON VIEW @extschema@.idem_operator_actions IS
COMMENT ON VIEW @extschema@.idem_operator_actions IS
    'idem: the operators'' actions (idem_operator_audit), for the owners the reader may see';
-- end
-- from idem.sql: CREATE FUNCTION @extschema@.idem_task_cancel(task_id bigint, reason text)
CREATE FUNCTION @extschema@.idem_task_cancel(task_id bigint, reason text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_task_cancel'
LANGUAGE C VOLATILE;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_task_cancel(bigint, text) IS
COMMENT ON FUNCTION @extschema@.idem_task_cancel(bigint, text) IS
    'idem: an operator ends an unfinished task FAILED_FINAL (HTTP 500, {"error": {"cancelled": reason}}); audited';
-- end
-- from idem.sql: CREATE FUNCTION @extschema@.idem_task_retry(task_id bigint, reason text)
CREATE FUNCTION @extschema@.idem_task_retry(task_id bigint, reason text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_task_retry'
LANGUAGE C VOLATILE;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_task_retry(bigint, text) IS
COMMENT ON FUNCTION @extschema@.idem_task_retry(bigint, text) IS
    'idem: an operator makes a task waiting for its next attempt due now; audited';
-- end
-- from idem.sql: CREATE FUNCTION @extschema@.idem_task_resolve(
CREATE FUNCTION @extschema@.idem_task_resolve(
    task_id bigint, http_status integer, body json, reason text,
    resource_id bigint DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_task_resolve'
LANGUAGE C VOLATILE;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_task_resolve(bigint, integer, json, text, bigint, jsonb) IS
COMMENT ON FUNCTION @extschema@.idem_task_resolve(bigint, integer, json, text, bigint, jsonb) IS
    'idem: an operator ends an unfinished task with an answer (2xx/3xx SUCCEEDED, 4xx FAILED_FINAL), replayed to the client; audited';
-- end
-- from idem.sql: CREATE FUNCTION @extschema@.idem_task_settle(
CREATE FUNCTION @extschema@.idem_task_settle(
    task_id bigint, happened boolean, reason text,
    http_status integer DEFAULT NULL, body json DEFAULT NULL, resource_id bigint DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_task_settle'
LANGUAGE C VOLATILE;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_task_settle(bigint, boolean, text, integer, json, bigint) IS
COMMENT ON FUNCTION @extschema@.idem_task_settle(bigint, boolean, text, integer, json, bigint) IS
    'idem: an operator settles a task whose outcome is uncertain: the provider''s answer (happened), or due again (did not happen); audited';
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_task_cancel(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_task_cancel(bigint, text) FROM PUBLIC;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_task_retry(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_task_retry(bigint, text) FROM PUBLIC;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_task_resolve(bigint, integer, json, text, bigint, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_task_resolve(bigint, integer, json, text, bigint, jsonb) FROM PUBLIC;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_task_settle(bigint, boolean, text, integer, json, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_task_settle(bigint, boolean, text, integer, json, bigint) FROM PUBLIC;
-- end
-- from idem.sql: CREATE FUNCTION idem_internal.idem_dead_letters_acted(message_ids bigint[], after jsonb)
CREATE FUNCTION idem_internal.idem_dead_letters_acted(message_ids bigint[], after jsonb)
RETURNS TABLE (owner_id bigint, message_id bigint, topic text, msg_key text, state_before jsonb, state_after jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    other bigint;
BEGIN
    SELECT d.message_id INTO other FROM idem_internal.idem_outbox_dead d
     WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids)
       AND NOT idem_internal.idem_owner_visible(d.owner_id) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'permission denied for a dead letter of another owner'
            USING ERRCODE = '42501', DETAIL = pg_catalog.format('Dead letter %s belongs to an owner outside this role''s idem.allowed_owners.', other);
    END IF;
    RETURN QUERY SELECT d.owner_id, d.message_id, d.topic::pg_catalog.text, d.msg_key::pg_catalog.text,
                        pg_catalog.jsonb_build_object('dead_at', d.dead_at, 'on_dead', d.on_dead, 'last_reason', d.last_reason),
                        after
                   FROM idem_internal.idem_outbox_dead d
                  WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids) ORDER BY d.message_id;
END
$$;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION idem_internal.idem_dead_letters_acted(bigint[], jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_internal.idem_dead_letters_acted(bigint[], jsonb) FROM PUBLIC;
-- end

-- from idem.sql, replaced: CREATE FUNCTION @extschema@.idem_forget_owner(
CREATE OR REPLACE FUNCTION @extschema@.idem_forget_owner(
    owner bigint,
    batch_size integer DEFAULT 10000,
    max_batches integer DEFAULT NULL,
    undelivered text DEFAULT 'keep')
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
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
    IF owner IS NULL OR batch_size IS NULL OR undelivered IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null',
            CASE WHEN owner IS NULL THEN 'owner' WHEN batch_size IS NULL THEN 'batch_size' ELSE 'undelivered' END
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
    IF undelivered OPERATOR(pg_catalog.<>) ALL (ARRAY['keep', 'delete']) THEN
        RAISE EXCEPTION 'undelivered must be ''keep'' or ''delete''' USING ERRCODE = '22023',
            DETAIL = pg_catalog.format('The call has undelivered %L.', undelivered),
            HINT = '''keep'': the owner''s messages not yet delivered are delivered, then erased at their acknowledgement; ''delete'': they are erased now and never delivered.';
    END IF;

    -- the owner's outbox dead letters (1.13), whatever undelivered says: a
    -- dead letter is delivered only if redriven; its blocked key goes on
    IF EXISTS (SELECT FROM idem_internal.idem_outbox_dead d WHERE d.owner_id OPERATOR(pg_catalog.=) owner) THEN
        total := @extschema@.idem_outbox_discard(ARRAY(
            SELECT d.message_id FROM idem_internal.idem_outbox_dead d WHERE d.owner_id OPERATOR(pg_catalog.=) owner),
            'erasure: idem_forget_owner');
    END IF;

    -- each table in statements of batch_size rows, at most max_batches
    FOR tbl, keys IN SELECT t.tbl, t.keys FROM (VALUES
        ('idem_internal.idempotency_record', 'id', true),
        ('idem_internal.purchase_order', 'id', true),
        ('idem_internal.idem_history', 'record_id', true),
        ('idem_internal.idem_task_attempt', 'task_id, token', true),
        ('idem_internal.idem_inbox', 'consumer, message_id', true),
        ('idem_internal.idem_inbox_failure', 'consumer, message_id', true),
        ('idem_internal.idem_outbox', 'message_id', undelivered OPERATOR(pg_catalog.=) 'delete')) AS t (tbl, keys, wanted)
        WHERE t.wanted
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
    -- the owner's operator audit stays, without its payloads
    UPDATE idem_internal.idem_operator_audit a SET arguments = NULL
     WHERE a.owner_id OPERATOR(pg_catalog.=) owner AND a.arguments IS NOT NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total OPERATOR(pg_catalog.+) n;
    RETURN total;
END
$$;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_forget_owner(bigint, integer, integer, text) IS
COMMENT ON FUNCTION @extschema@.idem_forget_owner(bigint, integer, integer, text) IS
    'idem: an erasure request: remove every record, order, history row, task attempt, inbox entry and failure, outbox dead letter and (undelivered => ''delete'') outbox message of owner (superuser only)';
-- end
-- from idem.sql, replaced: CREATE FUNCTION idem_internal.idem_distribute_node()
CREATE OR REPLACE FUNCTION idem_internal.idem_distribute_node()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET citus.enable_ddl_propagation = off
AS $$
DECLARE
    grp integer;
    lo bigint;
    seq text;
BEGIN
    IF (SELECT pg_catalog.array_length(c.conkey, 1) FROM pg_catalog.pg_constraint c
         WHERE c.conrelid OPERATOR(pg_catalog.=) 'idem_internal.idempotency_record'::pg_catalog.regclass
           AND c.contype OPERATOR(pg_catalog.=) 'p') OPERATOR(pg_catalog.=) 1 THEN
        ALTER TABLE idem_internal.idempotency_record
            DROP CONSTRAINT idempotency_record_pkey,
            ADD CONSTRAINT idempotency_record_pkey PRIMARY KEY (owner_id, id);
    END IF;
    IF (SELECT pg_catalog.array_length(c.conkey, 1) FROM pg_catalog.pg_constraint c
         WHERE c.conrelid OPERATOR(pg_catalog.=) 'idem_internal.purchase_order'::pg_catalog.regclass
           AND c.contype OPERATOR(pg_catalog.=) 'p') OPERATOR(pg_catalog.=) 1 THEN
        ALTER TABLE idem_internal.purchase_order
            DROP CONSTRAINT purchase_order_pkey,
            ADD CONSTRAINT purchase_order_pkey PRIMARY KEY (owner_id, id),
            DROP CONSTRAINT purchase_order_order_no_key,
            ADD CONSTRAINT purchase_order_order_no_key UNIQUE (owner_id, order_no);
    END IF;
    -- a task's holder knows its id, not its owner: its calls find it by id
    -- in the shards of the node it leased from
    IF pg_catalog.to_regclass('idem_internal.idem_task_id') IS NULL THEN
        CREATE INDEX idem_task_id ON idem_internal.idempotency_record (id)
            WHERE task_attempts IS NOT NULL;
    END IF;

    EXECUTE 'SELECT groupid FROM pg_catalog.pg_dist_local_group' INTO grp;
    IF grp OPERATOR(pg_catalog.>) 0 THEN
        lo := grp::pg_catalog.int8 OPERATOR(pg_catalog.*) 281474976710656 OPERATOR(pg_catalog.+) 1;
        FOREACH seq IN ARRAY ARRAY['idempotency_record_id_seq', 'purchase_order_id_seq',
                                   'idem_outbox_message_id_seq', 'idem_task_token_seq',
                                   'idem_operator_audit_id_seq'] LOOP
            IF (SELECT s.seqmin FROM pg_catalog.pg_sequence s
                 WHERE s.seqrelid OPERATOR(pg_catalog.=)
                       pg_catalog.format('idem_internal.%I', seq)::pg_catalog.regclass)
               OPERATOR(pg_catalog.<) lo THEN
                EXECUTE pg_catalog.format('ALTER SEQUENCE idem_internal.%I MINVALUE %s MAXVALUE %s START %s RESTART %s',
                                          seq, lo, lo OPERATOR(pg_catalog.+) 281474976710654, lo, lo);
            END IF;
        END LOOP;
    END IF;
END
$$;
-- end
-- from idem.sql, replaced: CREATE FUNCTION @extschema@.idem_distribute()
CREATE OR REPLACE FUNCTION @extschema@.idem_distribute()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
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
    PERFORM idem_internal.idem_distribute_node();

    SELECT e.extversion INTO version FROM pg_catalog.pg_extension e
     WHERE e.extname OPERATOR(pg_catalog.=) 'idem';
    FOR r IN SELECT w.nodename, w.nodeport, w.success, w.result
               FROM pg_catalog.run_command_on_workers(
                    'SELECT extversion FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) ''idem''') w LOOP
        IF NOT r.success OR r.result IS DISTINCT FROM version THEN
            RAISE EXCEPTION 'idem % is not installed on worker node %:%', version, r.nodename, r.nodeport
                USING ERRCODE = '55000',
                      DETAIL = pg_catalog.format('The node answered: %s', r.result),
                      HINT = 'Citus creates an extension on every node when it is created on the coordinator: install idem''s files on every node, then ALTER EXTENSION idem UPDATE.';
        END IF;
    END LOOP;
    FOR r IN SELECT w.nodename, w.nodeport, w.success, w.result
               FROM pg_catalog.run_command_on_workers(
                    'SELECT idem_internal.idem_distribute_node()') w LOOP
        IF NOT r.success THEN
            RAISE EXCEPTION 'idem_distribute() failed on worker node %:%', r.nodename, r.nodeport
                USING ERRCODE = '55000', DETAIL = r.result;
        END IF;
    END LOOP;

    -- the distributed tables, each once: records and orders by owner,
    -- co-located; the inbox by consumer; an owner's history, attempts and
    -- operators' actions with its records.  The audit's guard triggers go
    -- onto every shard (Citus wants them declared safe).
    PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
    FOR r IN SELECT * FROM (VALUES
                 ('idem_internal.idempotency_record', 'owner_id', 'default'),
                 ('idem_internal.purchase_order', 'owner_id', 'idem_internal.idempotency_record'),
                 ('idem_internal.idem_inbox', 'consumer', 'default'),
                 ('idem_internal.idem_history', 'owner_id', 'idem_internal.idempotency_record'),
                 ('idem_internal.idem_task_attempt', 'owner_id', 'idem_internal.idempotency_record'),
                 ('idem_internal.idem_operator_audit', 'owner_id', 'idem_internal.idempotency_record')) AS v (tbl, col, colocate)
    LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                        WHERE p.logicalrelid OPERATOR(pg_catalog.=) r.tbl::pg_catalog.regclass) THEN
            PERFORM pg_catalog.create_distributed_table(r.tbl::pg_catalog.regclass, r.col,
                                                        colocate_with => r.colocate);
        END IF;
    END LOOP;
    -- the inbox by owner (on a cluster distributed before 1.11)
    IF pg_catalog.to_regclass('idem_internal.idem_inbox_owner') IS NULL THEN
        CREATE INDEX idem_inbox_owner ON idem_internal.idem_inbox (owner_id) WHERE owner_id IS NOT NULL;
    END IF;
    -- the reconcile lease's index (on a cluster distributed before 1.16)
    IF pg_catalog.to_regclass('idem_internal.idem_task_reconcile') IS NULL THEN
        CREATE INDEX idem_task_reconcile ON idem_internal.idempotency_record (operation, task_reconcile_at)
            WHERE task_reconcile_at IS NOT NULL;
    END IF;
    -- the policies on every node
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) 'idem_internal.idem_policy'::pg_catalog.regclass) THEN
        -- its statement trigger only tells the node's backends that the
        -- policies changed: Citus puts it on every placement
        PERFORM pg_catalog.create_reference_table('idem_internal.idem_policy');
    END IF;

    -- force_delegation: delegated inside a transaction block too, as part of
    -- the distributed transaction
    FOR r IN SELECT f.fn, f.tbl FROM idem_internal.idem_delegated_functions() f LOOP
        PERFORM pg_catalog.create_distributed_function(r.fn, '$1', colocate_with => r.tbl::pg_catalog.text,
                                                       force_delegation => true);
    END LOOP;
END
$$;
-- end

-- ---------------------------------------------------------------------------
-- Two functions whose result or arguments change are replaced:
-- idem_set_policy (uncertain, reconcile_within) and idem_health (the
-- uncertain tasks).  As with PostgreSQL's own modules, EXECUTE granted on
-- the old function does not pass to the new one (granted here it would be
-- recorded as the extension's initial privilege, which pg_dump leaves
-- out): the update warns which roles had it, to grant it again in the same
-- transaction; and which roles have the worker's or the monitor's
-- privileges, which 1.16 extends (idem_grant gives the new ones).  The
-- functions whose bodies name idem_health go and come back.
-- ---------------------------------------------------------------------------
DO $replace$
DECLARE
    f record;
    roles text;
BEGIN
    FOR f IN SELECT * FROM (VALUES
        ('@extschema@.idem_set_policy(text, interval, interval, interval, integer, interval, interval, interval, text, text[], text, boolean)',
         '@extschema@.idem_set_policy(text, interval, interval, interval, integer, interval, interval, interval, text, text[], text, boolean, text, interval)',
         'GRANT EXECUTE ON FUNCTION %2$s TO %1$s'),
        ('@extschema@.idem_health()', '@extschema@.idem_health()', 'SELECT idem_grant(role, ''monitor'') for each role, or GRANT EXECUTE ON FUNCTION %2$s TO %1$s'),
        ('@extschema@.idem_outbox_redrive(bigint[])', '@extschema@.idem_outbox_redrive(bigint[], text)',
         'SELECT idem_grant(role, ''operator'') for each role, or GRANT EXECUTE ON FUNCTION %2$s TO %1$s'),
        ('@extschema@.idem_outbox_discard(bigint[])', '@extschema@.idem_outbox_discard(bigint[], text)',
         'SELECT idem_grant(role, ''operator'') for each role, or GRANT EXECUTE ON FUNCTION %2$s TO %1$s'),
        ('@extschema@.idem_inbox_redrive(text, text[], boolean)', '@extschema@.idem_inbox_redrive(text, text[], boolean, text)',
         'SELECT idem_grant(role, ''operator'') for each role, or GRANT EXECUTE ON FUNCTION %2$s TO %1$s')
        ) AS v (old, new, how)
    LOOP
        SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)), ', ')
          INTO roles
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid OPERATOR(pg_catalog.=) f.old::pg_catalog.regprocedure
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) 0
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 'pg_monitor'::pg_catalog.regrole;
        IF roles IS NOT NULL THEN
            RAISE WARNING 'idem 1.16 replaced %: EXECUTE granted to % on the old function is not carried over', f.old, roles
                USING HINT = 'Grant it again in the same transaction as the update: ' OPERATOR(pg_catalog.||)
                             pg_catalog.format(f.how, roles, f.new) OPERATOR(pg_catalog.||) '.';
        END IF;
    END LOOP;
    FOR f IN SELECT * FROM (VALUES
        ('worker', '@extschema@.idem_lease(text, text, interval, integer, boolean)', 'idem_lease_reconcile, idem_fail_unknown and idem_task_trace_context'),
        ('monitor', '@extschema@.idem_cleanup_status()', 'the view idem_task_attempts and idem_task_attempt_entries')) AS v (kind, marker, what)
    LOOP
        SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)), ', ')
          INTO roles
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid OPERATOR(pg_catalog.=) f.marker::pg_catalog.regprocedure
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) 0
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 'pg_monitor'::pg_catalog.regrole;
        IF roles IS NOT NULL THEN
            RAISE WARNING 'idem 1.16 gives the % kind %: % ha% the 1.15 privileges only', f.kind, f.what, roles,
                CASE WHEN roles OPERATOR(pg_catalog.~) ',' THEN 've' ELSE 's' END
                USING HINT = pg_catalog.format('Grant them in the same transaction as the update: SELECT idem_grant(role, %L) for each role.', f.kind);
        END IF;
    END LOOP;
END
$replace$;

DROP FUNCTION @extschema@.idem_privileges(text);
DROP FUNCTION idem_internal.idem_privileges(text);
DROP FUNCTION @extschema@.idem_health();
DROP FUNCTION @extschema@.idem_set_policy(text, interval, interval, interval, integer, interval, interval, interval, text, text[], text, boolean);
DROP FUNCTION @extschema@.idem_outbox_redrive(bigint[]);
DROP FUNCTION @extschema@.idem_outbox_discard(bigint[]);
DROP FUNCTION @extschema@.idem_inbox_redrive(text, text[], boolean);

-- from idem.sql: CREATE FUNCTION @extschema@.idem_set_policy(
CREATE FUNCTION @extschema@.idem_set_policy(
    operation text,
    ttl interval DEFAULT idem_internal.idem_policy_unchanged_interval(),
    failure_ttl interval DEFAULT idem_internal.idem_policy_unchanged_interval(),
    wait_timeout interval DEFAULT idem_internal.idem_policy_unchanged_interval(),
    max_attempts integer DEFAULT idem_internal.idem_policy_unchanged_integer(),
    retry_base interval DEFAULT idem_internal.idem_policy_unchanged_interval(),
    retry_max interval DEFAULT idem_internal.idem_policy_unchanged_interval(),
    audit_ttl interval DEFAULT idem_internal.idem_policy_unchanged_interval(),
    reuse_after_expiry text DEFAULT idem_internal.idem_policy_unchanged_text(),
    redact text[] DEFAULT idem_internal.idem_policy_unchanged_textarray(),
    key_format text DEFAULT idem_internal.idem_policy_unchanged_text(),
    reject_weak_keys boolean DEFAULT idem_internal.idem_policy_unchanged_boolean(),
    uncertain text DEFAULT idem_internal.idem_policy_unchanged_text(),
    reconcile_within interval DEFAULT idem_internal.idem_policy_unchanged_interval())
RETURNS idem_internal.idem_policy
LANGUAGE C VOLATILE CALLED ON NULL INPUT AS 'MODULE_PATHNAME', 'idem_set_policy';
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_set_policy(text, interval, interval, interval, integer, interval, interval, interval, text, text[], text, boolean, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_set_policy(text, interval, interval, interval, integer, interval, interval, interval, text, text[], text, boolean, text, interval) FROM PUBLIC;
-- end

-- from idem.sql: CREATE FUNCTION @extschema@.idem_health(
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
    OUT shadowing_functions text[],
    OUT uncertain_tasks bigint,
    OUT reconcile_overdue bigint,
    OUT reconcile_oldest_overdue_age interval)
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
    idem_internal.idem_shadowing_functions('@extschema@'::pg_catalog.regnamespace::pg_catalog.oid),
    (SELECT pg_catalog.count(*) FROM idem_internal.idempotency_record r
      WHERE r.task_uncertain_since IS NOT NULL),
    overdue.n, overdue.oldest_age
FROM (SELECT pg_catalog.sum(pg_catalog.pg_table_size(t.rel))::pg_catalog.int8 AS table_bytes,
             pg_catalog.sum(pg_catalog.pg_indexes_size(t.rel))::pg_catalog.int8 AS index_bytes
        FROM pg_catalog.unnest(ARRAY['idem_internal.idempotency_record'::pg_catalog.regclass,
                                     'idem_internal.purchase_order'::pg_catalog.regclass,
                                     'idem_internal.idem_outbox'::pg_catalog.regclass,
                                     'idem_internal.idem_inbox'::pg_catalog.regclass,
                                     'idem_internal.idem_outbox_dead'::pg_catalog.regclass,
                                     'idem_internal.idem_inbox_failure'::pg_catalog.regclass,
                                     'idem_internal.idem_task_attempt'::pg_catalog.regclass]) AS t(rel)) sizes
-- marked tasks past their operation's reconcile_within: an operator's
CROSS JOIN (SELECT pg_catalog.count(*) AS n,
                   pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(r.task_uncertain_since) AS oldest_age
              FROM idem_internal.idempotency_record r
              LEFT JOIN idem_internal.idem_policy p
                ON p.operation OPERATOR(pg_catalog.=) r.operation::pg_catalog.text
             WHERE r.task_uncertain_since IS NOT NULL
               AND (r.task_reconcile_at IS NULL
                    OR r.task_uncertain_since OPERATOR(pg_catalog.+) p.reconcile_within
                       OPERATOR(pg_catalog.<=) pg_catalog.now())) overdue
LEFT JOIN @extschema@.idem_cleanup_status() w
       ON w.datid OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                          WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database());
END;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_health() IS
COMMENT ON FUNCTION @extschema@.idem_health() IS
    'idem: backlog, PROCESSING records, outbox and inbox (lease lapses, dead letters), disk use, the cleanup worker''s last round, operations refusing reuse without an audit period, who could plant functions in idem''s schema, and tasks whose outcome is uncertain (those past reconcile_within wait for an operator), for this database';
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_health() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_health() FROM PUBLIC;
-- end
-- from idem.sql: GRANT EXECUTE ON FUNCTION @extschema@.idem_health() TO pg_monitor;
GRANT EXECUTE ON FUNCTION @extschema@.idem_health() TO pg_monitor;
-- end

-- from idem.sql: CREATE FUNCTION idem_internal.idem_outbox_redrive_rows(message_ids bigint[], reason text)
CREATE FUNCTION idem_internal.idem_outbox_redrive_rows(message_ids bigint[], reason text)
RETURNS TABLE (owner_id bigint, message_id bigint, topic text, msg_key text, state_before jsonb, state_after jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ktopics text[];
    kkeys text[];
    n bigint;
    m bigint;
    t text;
BEGIN
    SELECT l.topics, l.keys INTO ktopics, kkeys
      FROM idem_internal.idem_outbox_lock_dead('idem_outbox_redrive', message_ids) l;
    RETURN QUERY SELECT * FROM idem_internal.idem_dead_letters_acted(message_ids, '{"redriven": true}');

    -- 'block': in place
    WITH back AS (
        DELETE FROM idem_internal.idem_outbox_dead d
         USING idem_internal.idem_outbox o
         WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids)
           AND o.message_id OPERATOR(pg_catalog.=) d.message_id AND o.dead_at IS NOT NULL
        RETURNING d.message_id)
    UPDATE idem_internal.idem_outbox o
       SET dead_at = NULL, ready = true, nacks = NULL, not_before = NULL, leased_until = NULL
      FROM back
     WHERE o.message_id OPERATOR(pg_catalog.=) back.message_id;
    GET DIAGNOSTICS n = ROW_COUNT;

    -- the others: appended, in their first order
    WITH back AS (
        DELETE FROM idem_internal.idem_outbox_dead d
         WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids)
        RETURNING d.*),
    ordered AS (
        SELECT b.*, pg_catalog.row_number() OVER (PARTITION BY b.topic, b.msg_key ORDER BY b.message_id) AS nth
          FROM back b ORDER BY b.message_id)
    INSERT INTO idem_internal.idem_outbox
        (message_id, topic, msg_key, payload, headers, emitted_at, commit_seq, attempt, ready, owner_id)
    SELECT b.message_id, b.topic, b.msg_key, b.payload,
           COALESCE(b.headers, '{}'::pg_catalog.jsonb) OPERATOR(pg_catalog.||)
               pg_catalog.jsonb_build_object('idem-redriven', 'true'),
           b.emitted_at, pg_catalog.nextval('idem_internal.idem_outbox_message_id_seq'::pg_catalog.regclass), 0,
           b.msg_key IS NULL OR (b.nth OPERATOR(pg_catalog.=) 1 AND NOT EXISTS (
               SELECT FROM idem_internal.idem_outbox h
                WHERE h.topic OPERATOR(pg_catalog.=) b.topic AND h.msg_key OPERATOR(pg_catalog.=) b.msg_key
                  AND h.acked_at IS NULL)),
           b.owner_id
      FROM ordered b;
    GET DIAGNOSTICS m = ROW_COUNT;

    FOR t IN SELECT DISTINCT k.topic FROM pg_catalog.unnest(ktopics) AS k (topic) LOOP
        PERFORM pg_catalog.pg_notify('idem_outbox', t);
    END LOOP;
    IF m OPERATOR(pg_catalog.>) 0 THEN
        PERFORM pg_catalog.pg_notify('idem_outbox', o.topic) FROM idem_internal.idem_outbox o
          WHERE o.message_id OPERATOR(pg_catalog.=) ANY (message_ids) AND o.msg_key IS NULL;
    END IF;
END
$$;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION idem_internal.idem_outbox_redrive_rows(bigint[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_internal.idem_outbox_redrive_rows(bigint[], text) FROM PUBLIC;
-- end
-- from idem.sql: CREATE FUNCTION @extschema@.idem_outbox_redrive(message_ids bigint[], reason text DEFAULT NULL)
CREATE FUNCTION @extschema@.idem_outbox_redrive(message_ids bigint[], reason text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_redrive'
LANGUAGE C VOLATILE;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_outbox_redrive(bigint[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_redrive(bigint[], text) FROM PUBLIC;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_outbox_redrive(bigint[], text) IS
COMMENT ON FUNCTION @extschema@.idem_outbox_redrive(bigint[], text) IS
    'idem: deliver dead letters again: in their key''s place (on_dead ''block'') or after its messages with the header idem-redriven (''skip''); returns how many';
-- end
-- from idem.sql: CREATE FUNCTION idem_internal.idem_outbox_discard_rows(message_ids bigint[], reason text)
CREATE FUNCTION idem_internal.idem_outbox_discard_rows(message_ids bigint[], reason text)
RETURNS TABLE (owner_id bigint, message_id bigint, topic text, msg_key text, state_before jsonb, state_after jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ktopics text[];
    kkeys text[];
BEGIN
    SELECT l.topics, l.keys INTO ktopics, kkeys
      FROM idem_internal.idem_outbox_lock_dead('idem_outbox_discard', message_ids) l;
    RETURN QUERY SELECT * FROM idem_internal.idem_dead_letters_acted(message_ids, '{"discarded": true}');
    DELETE FROM idem_internal.idem_outbox o
     USING idem_internal.idem_outbox_dead d
     WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids)
       AND o.message_id OPERATOR(pg_catalog.=) d.message_id AND o.dead_at IS NOT NULL;
    DELETE FROM idem_internal.idem_outbox_dead d WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids);
    PERFORM idem_internal.idem_outbox_promote(ktopics, kkeys);
END
$$;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION idem_internal.idem_outbox_discard_rows(bigint[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_internal.idem_outbox_discard_rows(bigint[], text) FROM PUBLIC;
-- end
-- from idem.sql: CREATE FUNCTION @extschema@.idem_outbox_discard(message_ids bigint[], reason text DEFAULT NULL)
CREATE FUNCTION @extschema@.idem_outbox_discard(message_ids bigint[], reason text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_discard'
LANGUAGE C VOLATILE;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_outbox_discard(bigint[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_discard(bigint[], text) FROM PUBLIC;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_outbox_discard(bigint[], text) IS
COMMENT ON FUNCTION @extschema@.idem_outbox_discard(bigint[], text) IS
    'idem: give dead letters up for good (their blocked keys go on); returns how many';
-- end
-- from idem.sql: CREATE FUNCTION idem_internal.idem_inbox_redrive_rows(
CREATE FUNCTION idem_internal.idem_inbox_redrive_rows(
    consumer text, message_ids text[], discard boolean, reason text)
RETURNS TABLE (owner_id bigint, message_id bigint, topic text, msg_key text, state_before jsonb, state_after jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF consumer IS NULL OR discard IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null', CASE WHEN consumer IS NULL THEN 'consumer' ELSE 'discard' END
            USING ERRCODE = '22004';
    END IF;
    IF EXISTS (SELECT FROM idem_internal.idem_inbox_failure f
                WHERE f.consumer OPERATOR(pg_catalog.=) idem_inbox_redrive_rows.consumer AND f.dead_at IS NOT NULL
                  AND (message_ids IS NULL OR f.message_id OPERATOR(pg_catalog.=) ANY (message_ids))
                  AND NOT idem_internal.idem_owner_visible(f.owner_id)) THEN
        RAISE EXCEPTION 'permission denied for a dead letter of another owner'
            USING ERRCODE = '42501', DETAIL = 'A dead letter of consumer ' OPERATOR(pg_catalog.||) consumer
                  OPERATOR(pg_catalog.||) ' belongs to an owner outside this role''s idem.allowed_owners.';
    END IF;
    IF discard THEN
        RETURN QUERY
        DELETE FROM idem_internal.idem_inbox_failure f
         WHERE f.consumer OPERATOR(pg_catalog.=) idem_inbox_redrive_rows.consumer AND f.dead_at IS NOT NULL
           AND (message_ids IS NULL OR f.message_id OPERATOR(pg_catalog.=) ANY (message_ids))
        RETURNING f.owner_id, NULL::pg_catalog.int8, f.consumer::pg_catalog.text,
                  f.message_id::pg_catalog.text,
                  pg_catalog.jsonb_build_object('dead_at', f.dead_at, 'attempts', f.attempts),
                  pg_catalog.jsonb_build_object('discarded', true);
    ELSE
        RETURN QUERY
        UPDATE idem_internal.idem_inbox_failure f SET redriven = true, attempts = 0
         WHERE f.consumer OPERATOR(pg_catalog.=) idem_inbox_redrive_rows.consumer AND f.dead_at IS NOT NULL
           AND (message_ids IS NULL OR f.message_id OPERATOR(pg_catalog.=) ANY (message_ids))
        RETURNING f.owner_id, NULL::pg_catalog.int8, f.consumer::pg_catalog.text,
                  f.message_id::pg_catalog.text,
                  pg_catalog.jsonb_build_object('dead_at', f.dead_at),
                  pg_catalog.jsonb_build_object('redriven', true);
    END IF;
END
$$;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION idem_internal.idem_inbox_redrive_rows(text, text[], boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_internal.idem_inbox_redrive_rows(text, text[], boolean, text) FROM PUBLIC;
-- end
-- from idem.sql: CREATE FUNCTION @extschema@.idem_inbox_redrive(
CREATE FUNCTION @extschema@.idem_inbox_redrive(
    consumer text, message_ids text[] DEFAULT NULL, discard boolean DEFAULT false, reason text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_inbox_redrive'
LANGUAGE C VOLATILE;
-- end
-- from idem.sql: REVOKE ALL ON FUNCTION @extschema@.idem_inbox_redrive(text, text[], boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_inbox_redrive(text, text[], boolean, text) FROM PUBLIC;
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_inbox_redrive(text, text[], boolean, text) IS
COMMENT ON FUNCTION @extschema@.idem_inbox_redrive(text, text[], boolean, text) IS
    'idem: let a consumer apply its dead letters when delivered again (or discard them: their keys go on); returns how many';
-- end

-- from idem.sql, replaced: CREATE FUNCTION idem_internal.idem_grant_kind(role regrole, kind text, grant_them boolean)
CREATE OR REPLACE FUNCTION idem_internal.idem_grant_kind(role regrole, kind text, grant_them boolean)
RETURNS TABLE (privilege text, object text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p record;
    can boolean;
    schema_name name := (SELECT n.nspname FROM pg_catalog.pg_extension e
                         JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
                         WHERE e.extname OPERATOR(pg_catalog.=) 'idem');
    needs_usage boolean;
BEGIN
    IF role IS NULL OR kind IS NULL THEN
        RAISE EXCEPTION 'idem_%: role and kind must not be NULL', CASE WHEN grant_them THEN 'grant' ELSE 'revoke' END
            USING ERRCODE = '22004';
    END IF;
    IF NOT EXISTS (SELECT FROM idem_internal.idem_privileges(kind)) THEN
        RAISE EXCEPTION 'unknown kind of idem user: "%"', kind
            USING ERRCODE = '22023',
                  HINT = 'The kinds are app, worker, publisher, consumer, monitor and operator.';
    END IF;
    -- every privilege is checked first: nothing is granted unless all can be
    FOR p IN SELECT * FROM idem_internal.idem_privileges(kind) LOOP
        IF p.fn IS NOT NULL THEN
            can := pg_catalog.has_function_privilege(p.fn::pg_catalog.oid, 'EXECUTE WITH GRANT OPTION');
        ELSE
            can := pg_catalog.has_table_privilege(p.rel::pg_catalog.oid, 'SELECT WITH GRANT OPTION');
        END IF;
        IF NOT can THEN
            RAISE EXCEPTION 'permission denied to % idem''s "%" privileges', CASE WHEN grant_them THEN 'grant' ELSE 'revoke' END, kind
                USING ERRCODE = '42501',
                      DETAIL = pg_catalog.format('%I cannot grant %s ON %s.', current_user, p.privilege, p.object),
                      HINT = 'Run it as idem''s owner or as a superuser.';
        END IF;
    END LOOP;
    needs_usage := grant_them AND NOT pg_catalog.has_schema_privilege(role, schema_name, 'USAGE');
    IF needs_usage AND NOT pg_catalog.has_schema_privilege(schema_name, 'USAGE WITH GRANT OPTION') THEN
        RAISE EXCEPTION 'permission denied to grant idem''s "%" privileges', kind
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('%I cannot grant USAGE ON SCHEMA %I.', current_user, schema_name),
                  HINT = 'Run it as idem''s owner or as a superuser.';
    END IF;
    IF needs_usage THEN
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA %I TO %s', schema_name, role);
        privilege := 'USAGE';
        object := pg_catalog.format('SCHEMA %I', schema_name);
        RETURN NEXT;
    END IF;
    FOR p IN SELECT * FROM idem_internal.idem_privileges(kind) LOOP
        IF grant_them THEN
            EXECUTE pg_catalog.format('GRANT %s ON %s TO %s', p.privilege, p.object, role);
        ELSE
            EXECUTE pg_catalog.format('REVOKE %s ON %s FROM %s', p.privilege, p.object, role);
        END IF;
        privilege := p.privilege;
        object := p.object;
        RETURN NEXT;
    END LOOP;
END
$$;
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
        ('worker', 'EXECUTE', '@extschema@.idem_fail_unknown(bigint, bigint, jsonb)'::pg_catalog.regprocedure, NULL),
        ('worker', 'EXECUTE', '@extschema@.idem_lease_reconcile(text, text, interval, integer, boolean)'::pg_catalog.regprocedure, NULL),
        ('worker', 'EXECUTE', '@extschema@.idem_task_trace_context(bigint, bigint)'::pg_catalog.regprocedure, NULL),
        ('publisher', 'EXECUTE', '@extschema@.idem_outbox_fetch(text, integer, interval)'::pg_catalog.regprocedure, NULL),
        ('publisher', 'EXECUTE', '@extschema@.idem_outbox_ack(bigint[])'::pg_catalog.regprocedure, NULL),
        ('publisher', 'EXECUTE', '@extschema@.idem_outbox_nack(bigint[], text, boolean, interval)'::pg_catalog.regprocedure, NULL),
        ('consumer', 'EXECUTE', '@extschema@.idem_consume(text, text, interval, bigint)'::pg_catalog.regprocedure, NULL),
        ('consumer', 'EXECUTE', '@extschema@.idem_consume_check(text, text, text, bigint)'::pg_catalog.regprocedure, NULL),
        ('consumer', 'EXECUTE', '@extschema@.idem_consume_failed(text, text, text, text, text, integer, bigint)'::pg_catalog.regprocedure, NULL),
        ('operator', 'EXECUTE', '@extschema@.idem_task_cancel(bigint, text)'::pg_catalog.regprocedure, NULL),
        ('operator', 'EXECUTE', '@extschema@.idem_task_retry(bigint, text)'::pg_catalog.regprocedure, NULL),
        ('operator', 'EXECUTE', '@extschema@.idem_task_resolve(bigint, integer, json, text, bigint, jsonb)'::pg_catalog.regprocedure, NULL),
        ('operator', 'EXECUTE', '@extschema@.idem_task_settle(bigint, boolean, text, integer, json, bigint)'::pg_catalog.regprocedure, NULL),
        ('operator', 'EXECUTE', '@extschema@.idem_outbox_redrive(bigint[], text)'::pg_catalog.regprocedure, NULL),
        ('operator', 'EXECUTE', '@extschema@.idem_outbox_discard(bigint[], text)'::pg_catalog.regprocedure, NULL),
        ('operator', 'EXECUTE', '@extschema@.idem_inbox_redrive(text, text[], boolean, text)'::pg_catalog.regprocedure, NULL),
        ('operator', 'SELECT', NULL, '@extschema@.idem_operator_actions'::pg_catalog.regclass),
        ('operator', 'SELECT', NULL, '@extschema@.idem_task_attempts'::pg_catalog.regclass),
        ('operator', 'EXECUTE', '@extschema@.idem_task_attempt_entries(bigint)'::pg_catalog.regprocedure, NULL),
        ('monitor', 'SELECT', NULL, '@extschema@.idem_stats'::pg_catalog.regclass),
        ('monitor', 'SELECT', NULL, '@extschema@.idem_operator_actions'::pg_catalog.regclass),
        ('monitor', 'SELECT', NULL, '@extschema@.idem_audit'::pg_catalog.regclass),
        ('monitor', 'SELECT', NULL, '@extschema@.idem_task_attempts'::pg_catalog.regclass),
        ('monitor', 'EXECUTE', '@extschema@.idem_task_attempt_entries(bigint)'::pg_catalog.regprocedure, NULL),
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
    'idem: the privileges idem_grant gives one kind of user (app, worker, publisher, consumer, monitor, operator)';
-- end
-- from idem.sql: COMMENT ON FUNCTION @extschema@.idem_grant(regrole, text) IS
COMMENT ON FUNCTION @extschema@.idem_grant(regrole, text) IS
    'idem: grant role what one kind of idem user needs: app, worker, publisher, consumer, monitor or operator';
-- end

-- last, so that it sees the functions this update created
SELECT idem_internal.idem_revoke_foreign_privileges();

-- Citus's DDL propagation as it was
DO $propagation$
BEGIN
    IF pg_catalog.current_setting('idem_update.ddl_propagation', true) IS NOT NULL
       AND pg_catalog.current_setting('idem_update.ddl_propagation', true) OPERATOR(pg_catalog.<>) '' THEN
        PERFORM pg_catalog.set_config('citus.enable_ddl_propagation',
                                      pg_catalog.current_setting('idem_update.ddl_propagation'), true);
    END IF;
END
$propagation$;
