/* idem--1.2--1.3.sql: the generic API (idem_begin, idem_finish, idem_run) */

\echo Use "ALTER EXTENSION idem UPDATE TO '1.3'" to load this file. \quit

-- A record stores what idem_finish (or a handler) gave it: the body byte for
-- byte (json keeps the text as given), the headers to replay; and a
-- deterministic failure (a 4xx) is a finished record too, FAILED_FINAL.
-- The constraint is written with pg_catalog's operator, whatever the
-- search_path this script runs under.
ALTER TABLE @extschema@.idempotency_record
    ADD COLUMN response_body json,
    ADD COLUMN response_headers jsonb,
    DROP CONSTRAINT ck_idempotency_status,
    ADD CONSTRAINT ck_idempotency_status CHECK (
        status::pg_catalog.text OPERATOR(pg_catalog.=)
            ANY (ARRAY['PROCESSING', 'SUCCEEDED', 'FAILED_FINAL']::pg_catalog.text[]));

COMMENT ON COLUMN @extschema@.idempotency_record.response_body IS
    'idem: the response body as idem_finish received it, replayed byte for byte (NULL for the order demo, whose response is response_json)';
COMMENT ON COLUMN @extschema@.idempotency_record.response_headers IS
    'idem: response headers to replay, a JSON object of strings';

-- What a handler of idem_run returns.
CREATE TYPE @extschema@.idem_result AS (
    http_status integer,
    body        json,
    headers     jsonb,
    resource_id bigint
);

-- What idem_begin and idem_run return.
CREATE TYPE @extschema@.idem_outcome AS (
    replayed    boolean,
    http_status integer,
    body        json,
    headers     jsonb,
    resource_id bigint
);

-- Claim a key for the caller's transaction, or replay its finished result.
CREATE FUNCTION @extschema@.idem_begin(
    owner bigint, operation text, key text, request jsonb,
    ttl interval DEFAULT NULL)
RETURNS @extschema@.idem_outcome
AS 'MODULE_PATHNAME', 'idem_begin'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_begin(bigint, text, text, jsonb, interval) IS
    'idem: claim (owner, operation, key) for this transaction (replayed = false), or replay its finished result';

-- Store the result of the claim this transaction holds.
CREATE FUNCTION @extschema@.idem_finish(
    owner bigint, operation text, key text, http_status integer, body json,
    resource_id bigint DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_finish'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb) IS
    'idem: store the result of the key this transaction claimed with idem_begin';

-- Begin, call the handler as the caller, finish: in one call.
CREATE FUNCTION @extschema@.idem_run(
    owner bigint, operation text, key text, request jsonb,
    handler regprocedure, ttl interval DEFAULT NULL)
RETURNS @extschema@.idem_outcome
AS 'MODULE_PATHNAME', 'idem_run'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_run(bigint, text, text, jsonb, regprocedure, interval) IS
    'idem: run handler(request) once per (owner, operation, key), as the caller; repeats replay its result';

-- Like idem_create_order: granted by the administrator to the roles that
-- act for the owners.
REVOKE ALL ON FUNCTION @extschema@.idem_begin(bigint, text, text, jsonb, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_run(bigint, text, text, jsonb, regprocedure, interval) FROM PUBLIC;
