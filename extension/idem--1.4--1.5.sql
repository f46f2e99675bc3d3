/* idem--1.4--1.5.sql: long flows (tasks leased to workers, fencing tokens, backoff) */

\echo Use "ALTER EXTENSION idem UPDATE TO '1.5'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- A long flow's record is its task.  idem_submit commits the record as
-- PROCESSING with the request a worker needs; idem_lease hands it to a
-- worker with a fencing token; idem_complete stores the result (SUCCEEDED,
-- or FAILED_FINAL for a 4xx) in the worker's transaction; idem_fail makes it
-- FAILED_RETRYABLE with a backoff, or FAILED_FINAL.  Until it is finished
-- the record never expires (expires_at is infinity); once finished it
-- expires task_ttl (or idem.ttl, idem.failure_ttl) after that moment.
--
-- task_due_at is when a worker may lease the task next: the submit time, the
-- end of the current lease (a lapsed lease is taken over), or the time of the
-- next attempt after a retryable failure; NULL once finished.  The task
-- columns are NULL on the records of synchronous calls, which cost nothing
-- more: the null bitmap still fits the same header.
-- ---------------------------------------------------------------------------
ALTER TABLE @extschema@.idempotency_record
    ADD COLUMN task_request jsonb,
    ADD COLUMN task_payload jsonb,
    ADD COLUMN task_attempts integer,
    ADD COLUMN task_token bigint,
    ADD COLUMN task_due_at timestamptz,
    ADD COLUMN task_lease_expires_at timestamptz,
    ADD COLUMN task_worker varchar(64),
    ADD COLUMN task_heartbeat_at timestamptz,
    ADD COLUMN task_session bigint,
    ADD COLUMN task_last_error jsonb,
    ADD COLUMN task_ttl interval,
    DROP CONSTRAINT ck_idempotency_status,
    ADD CONSTRAINT ck_idempotency_status CHECK (
        status::pg_catalog.text OPERATOR(pg_catalog.=)
            ANY (ARRAY['PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_FINAL']::pg_catalog.text[]));

-- a lease and a heartbeat change no indexed column: HOT updates, given room
-- on the page
ALTER TABLE @extschema@.idempotency_record SET (fillfactor = 90);

-- what a lease scans: the unfinished tasks of an operation, soonest due first
CREATE INDEX idem_task_due ON @extschema@.idempotency_record (operation, task_due_at)
    WHERE task_due_at IS NOT NULL;

-- fencing tokens: one sequence, so a task's every new token is greater than
-- all its earlier ones (and than every token of every other task)
CREATE SEQUENCE @extschema@.idem_task_token_seq;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_task_token_seq', '');
REVOKE ALL ON SEQUENCE @extschema@.idem_task_token_seq FROM PUBLIC;

COMMENT ON COLUMN @extschema@.idempotency_record.task_request IS
    'idem: a task''s request, as idem_submit received it, handed to the worker by idem_lease';
COMMENT ON COLUMN @extschema@.idempotency_record.task_payload IS
    'idem: what else idem_submit gave the worker (not part of the fingerprint)';
COMMENT ON COLUMN @extschema@.idempotency_record.task_attempts IS
    'idem: attempts started (leases handed out); NULL: not a task';
COMMENT ON COLUMN @extschema@.idempotency_record.task_token IS
    'idem: the fencing token of the current (or last) lease';
COMMENT ON COLUMN @extschema@.idempotency_record.task_due_at IS
    'idem: when a worker may lease the task next (a lapsed lease is taken over); NULL once finished';
COMMENT ON COLUMN @extschema@.idempotency_record.task_lease_expires_at IS
    'idem: end of the current lease; NULL when not leased';
COMMENT ON COLUMN @extschema@.idempotency_record.task_worker IS
    'idem: the worker holding (or that last held) the lease';
COMMENT ON COLUMN @extschema@.idempotency_record.task_heartbeat_at IS
    'idem: the lease''s start or last idem_heartbeat';
COMMENT ON COLUMN @extschema@.idempotency_record.task_session IS
    'idem: the session a bind_session lease lapses with; NULL otherwise';
COMMENT ON COLUMN @extschema@.idempotency_record.task_last_error IS
    'idem: the error of the last idem_fail';
COMMENT ON COLUMN @extschema@.idempotency_record.task_ttl IS
    'idem: how long the finished record is kept (NULL: idem.ttl, or idem.failure_ttl for a failure)';

-- Submit a long flow: PROCESSING with a task due now, or the key's current state.
CREATE FUNCTION @extschema@.idem_submit(
    owner bigint, operation text, key text, request jsonb,
    payload jsonb DEFAULT NULL, ttl interval DEFAULT NULL,
    OUT replayed boolean, OUT status text, OUT http_status integer,
    OUT body json, OUT headers jsonb, OUT resource_id bigint, OUT task_id bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_submit'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_submit(bigint, text, text, jsonb, jsonb, interval) IS
    'idem: commit (owner, operation, key) as PROCESSING with a task for a worker, or report its current state';

-- Lease due tasks of an operation to a worker.
CREATE FUNCTION @extschema@.idem_lease(
    operation text, worker text, lease interval DEFAULT '30 seconds',
    batch integer DEFAULT 1, bind_session boolean DEFAULT false,
    OUT task_id bigint, OUT owner bigint, OUT key text, OUT request jsonb,
    OUT payload jsonb, OUT attempt integer, OUT token bigint,
    OUT lease_expires_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_lease'
LANGUAGE C VOLATILE ROWS 1;

COMMENT ON FUNCTION @extschema@.idem_lease(text, text, interval, integer, boolean) IS
    'idem: hand due tasks of an operation to a worker (new, retry due, or lease lapsed), each with a new fencing token';

CREATE FUNCTION @extschema@.idem_heartbeat(
    task_id bigint, token bigint, extend interval DEFAULT NULL)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_heartbeat'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_heartbeat(bigint, bigint, interval) IS
    'idem: extend the lease the token holds (by extend, or by the interval it was granted); IK004 if the token is stale';

CREATE FUNCTION @extschema@.idem_complete(
    task_id bigint, token bigint, http_status integer, body json,
    resource_id bigint DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_complete(bigint, bigint, integer, json, bigint, jsonb) IS
    'idem: store the task''s result in the worker''s transaction (2xx/3xx SUCCEEDED, 4xx FAILED_FINAL); IK004 if the token is stale';

CREATE FUNCTION @extschema@.idem_fail(
    task_id bigint, token bigint, error jsonb, retryable boolean DEFAULT true)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_fail(bigint, bigint, jsonb, boolean) IS
    'idem: report a failed attempt: FAILED_RETRYABLE with a backoff while attempts are left, else FAILED_FINAL (HTTP 500); IK004 if the token is stale';

-- Like the other entry points: granted by the administrator, to the roles
-- that act for owners (idem_submit) and to the workers (the others).
REVOKE ALL ON FUNCTION @extschema@.idem_submit(bigint, text, text, jsonb, jsonb, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_lease(text, text, interval, integer, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_heartbeat(bigint, bigint, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_complete(bigint, bigint, integer, json, bigint, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_fail(bigint, bigint, jsonb, boolean) FROM PUBLIC;
