/* idem--1.15.sql (built from extension/idem.sql): the install script of idem 1.15 */
\echo Use "CREATE EXTENSION idem" to load this file. \quit

-- The schema of idem, by subsystem: each table, index, type, view and
-- function is defined once, in its current form, with its comment and its
-- privileges.  The sections:
--
--   the internal schema and who may create in idem's schema
--   records and the article's order (the claim, the answer, the cleanup)
--   policies
--   history and audit (retention, the audit view, erasure)
--   tasks (long flows: submit, lease, heartbeat, complete, fail)
--   outbox and dead letters
--   inbox
--   statistics and health
--   sequences across a promotion
--   grants
--   Citus
--
-- idem's tables, sequences and internal functions are in idem_internal;
-- the API, its types and views in the extension's schema.  How each
-- version got here is in the CHANGELOG and the update scripts beside this
-- file (extension/idem--X--Y.sql); test/upgrade/suite_after_update.sh
-- checks that a database updated from every release has exactly the
-- members of a fresh install (test/upgrade/members.sql).  A change of the
-- current version goes into this file; the update script of the release
-- copies the definitions it replaces from here (test/upgrade/scripts.py).

-- ===========================================================================
-- The internal schema, and who may create in idem's schema
-- ===========================================================================

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_namespace n
                WHERE n.nspname OPERATOR(pg_catalog.=) 'idem_internal') THEN
        RAISE EXCEPTION 'schema "idem_internal" already exists'
            USING ERRCODE = '42P06',
                  DETAIL = 'idem keeps its tables and internal functions in a schema it creates itself; one made by another role beforehand would let that role reach them.',
                  HINT = 'Find out who created the schema "idem_internal" and why; drop it, then run the command again.';
    END IF;
END
$$;

CREATE SCHEMA idem_internal;

-- the extension's owner, whoever runs the script (a superuser may update an
-- extension another role owns)
DO $$
BEGIN
    EXECUTE pg_catalog.format('ALTER SCHEMA idem_internal OWNER TO %I',
        (SELECT r.rolname FROM pg_catalog.pg_roles r
           JOIN pg_catalog.pg_extension e ON e.extowner OPERATOR(pg_catalog.=) r.oid
          WHERE e.extname OPERATOR(pg_catalog.=) 'idem'));
END
$$;

REVOKE ALL ON SCHEMA idem_internal FROM PUBLIC;

COMMENT ON SCHEMA idem_internal IS
    'idem: its tables, sequences and internal functions (the API, views and types are in the extension''s schema)';

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

SELECT idem_internal.idem_check_schema(true);

-- ===========================================================================
-- Records and the article's order
-- One row per (owner, operation, key) in idempotency_record: the claim, the
-- request fingerprint and, once the business write is done, the answer that
-- repeats replay.  idem_create_order is the article's example; idem_begin,
-- idem_finish and idem_run the same for any operation.
-- ===========================================================================

-- One row per (owner, operation, key).  A record stores what idem_finish
-- (or a handler) gave it: the body byte for byte (json keeps the text as
-- given), the headers to replay; a deterministic failure (a 4xx) is a
-- finished record too, FAILED_FINAL.  The task_ columns are a long flow's
-- (the tasks' section), NULL on the records of synchronous calls, which
-- cost nothing more: the null bitmap still fits the same header.  A lease
-- and a heartbeat change no indexed column: HOT updates, given room on the
-- page (fillfactor 90).
CREATE TABLE idem_internal.idempotency_record (
    id              BIGSERIAL PRIMARY KEY,
    owner_id        BIGINT NOT NULL,
    operation       VARCHAR(64) NOT NULL,
    idempotency_key VARCHAR(128) NOT NULL,
    request_hash    CHAR(64) NOT NULL,
    status          VARCHAR(20) NOT NULL,
    http_status     INTEGER,
    response_json   JSONB,
    resource_id     BIGINT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    expires_at      TIMESTAMPTZ NOT NULL,
    response_body   json,
    response_headers jsonb,
    task_request    jsonb,
    task_payload    jsonb,
    task_attempts   integer,
    task_token      bigint,
    task_due_at     timestamptz,
    task_lease_expires_at timestamptz,
    task_worker     varchar(64),
    task_heartbeat_at timestamptz,
    task_session    bigint,
    task_last_error jsonb,
    task_ttl        interval,
    fingerprint_version smallint,
    response_header_list json,
    task_lapses     integer,
    request_digest  bytea,
    task_leased_at  timestamptz,
    task_uncertain_since timestamptz,
    task_reconcile_at timestamptz,
    task_reconciles integer,
    task_trace_context text,
    CONSTRAINT uk_idempotency_scope UNIQUE (owner_id, operation, idempotency_key),
    -- pg_catalog's operator by name: an = for varchar planted in the target
    -- schema would otherwise win over pg_catalog's text = text
    CONSTRAINT ck_idempotency_status CHECK (
        status::pg_catalog.text OPERATOR(pg_catalog.=)
            ANY (ARRAY['PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_FINAL']::pg_catalog.text[]))
) WITH (fillfactor = 90);
CREATE INDEX idx_idempotency_expire ON idem_internal.idempotency_record (expires_at);

COMMENT ON TABLE idem_internal.idempotency_record IS
    'idem: one claim per (owner_id, operation, idempotency_key), with the request fingerprint and the response to replay';
COMMENT ON COLUMN idem_internal.idempotency_record.response_body IS
    'idem: the response body as idem_finish received it, replayed byte for byte (NULL for the order demo, whose response is response_json)';
COMMENT ON COLUMN idem_internal.idempotency_record.response_headers IS
    'idem: response headers to replay, a JSON object of strings';
-- fingerprint_version: with idem.fingerprint_keys_file set, request_hash is
-- HMAC-SHA-256 (keyed by that file's newest secret) of the request's
-- SHA-256, and fingerprint_version names the secret; NULL is the plain
-- SHA-256.  response_header_list: headers in json form (an object, or an
-- array of [name, value] pairs) byte for byte, where a caller gave one;
-- response_headers the jsonb form otherwise.
COMMENT ON COLUMN idem_internal.idempotency_record.fingerprint_version IS
    'idem: the idem.fingerprint_keys_file secret request_hash is keyed with (HMAC-SHA-256); NULL: plain SHA-256';
COMMENT ON COLUMN idem_internal.idempotency_record.response_header_list IS
    'idem: response headers as given in json form (an object, or [name, value] pairs), replayed byte for byte';

-- request_digest: SipHash-2-4-128 of the request's jsonb bytes, keyed with
-- idem_digest_secret (or, for a record keyed by a file secret, with a key
-- derived from that secret).  A replay that sends the very same bytes is
-- recognised by it without the canonical text and SHA-256; any other
-- request is compared by request_hash.  NULL: not recorded
-- (idem_create_order, older records); request_hash decides.
COMMENT ON COLUMN idem_internal.idempotency_record.request_digest IS
    'idem: SipHash-2-4-128 of the request''s jsonb bytes under idem_digest_secret (or fingerprint_version''s file secret); a replay of the same bytes matches it without the canonical text; NULL: request_hash decides';

-- The key of request digests: 16 random bytes (gen_random_uuid, from the
-- server's strong random source), one row, never changed.  Only idem's
-- owner reads it.  Not dumped: a database restored from a dump draws a
-- secret of its own, and its restored records are compared by request_hash.
CREATE TABLE idem_internal.idem_digest_secret (
    secret bytea NOT NULL
        CHECK (pg_catalog.length(secret) OPERATOR(pg_catalog.=) 16)
);
INSERT INTO idem_internal.idem_digest_secret (secret)
    SELECT pg_catalog.uuid_send(pg_catalog.gen_random_uuid());
REVOKE ALL ON TABLE idem_internal.idem_digest_secret FROM PUBLIC;
COMMENT ON TABLE idem_internal.idem_digest_secret IS
    'idem: the key of request digests (idempotency_record.request_digest); one row, never changed';


-- The demo business table: the order's own unique business id (order_no)
-- is the second layer of uniqueness.
CREATE TABLE idem_internal.purchase_order (
    id         BIGSERIAL PRIMARY KEY,
    order_no   VARCHAR(40) NOT NULL UNIQUE,
    owner_id   BIGINT NOT NULL,
    sku_id     BIGINT NOT NULL,
    quantity   INTEGER NOT NULL,
    status     VARCHAR(20) NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP
);

COMMENT ON TABLE idem_internal.purchase_order IS
    'idem: the demo order that idem_create_order inserts exactly once per idempotency key';

-- pg_dump must keep the rows (and the sequences' positions).
SELECT pg_catalog.pg_extension_config_dump('idem_internal.idempotency_record', '');
SELECT pg_catalog.pg_extension_config_dump('idem_internal.idempotency_record_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('idem_internal.purchase_order', '');
SELECT pg_catalog.pg_extension_config_dump('idem_internal.purchase_order_id_seq', '');

-- Callers go through the functions below; the tables are not theirs to write.
REVOKE ALL ON TABLE idem_internal.idempotency_record, idem_internal.purchase_order FROM PUBLIC;

-- Lowercase hex SHA-256 of the RFC 8785 canonical form of a JSON value.
CREATE FUNCTION @extschema@.idem_request_hash(request jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_request_hash'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_request_hash(jsonb) IS
    'idem: lowercase hex SHA-256 of the RFC 8785 (JCS) canonical form of the request';

-- The RFC 8785 canonical text itself, the input of idem_request_hash.
CREATE FUNCTION @extschema@.idem_canonical_json(request jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical_json'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_canonical_json(jsonb) IS
    'idem: the RFC 8785 (JCS) canonical serialization of a JSON value';

-- What idem_create_order returns.  A named type, so that the executor
-- reads its columns from the type cache instead of building them from the
-- function's OUT arguments on every call.
CREATE TYPE @extschema@.idem_order_outcome AS (
    order_id    bigint,
    order_no    text,
    status      text,
    http_status integer,
    replayed    boolean
);

-- The article's order flow: claim, insert the order, store the response,
-- all in the caller's transaction; a repeat replays the stored response.
-- It reads and writes its tables as idem's owner, switching in C around
-- that work only, and runs anything user-defined its writes may fire
-- (triggers, constraints) under search_path = pg_catalog, pg_temp.
CREATE FUNCTION @extschema@.idem_create_order(
    owner bigint, key text, sku bigint, qty integer)
RETURNS @extschema@.idem_order_outcome
AS 'MODULE_PATHNAME', 'idem_create_order'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer) IS
    'idem: create an order exactly once per (owner, idempotency key); repeats replay the first response';

REVOKE ALL ON FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer) FROM PUBLIC;

-- What a handler of idem_run returns.
CREATE TYPE @extschema@.idem_result AS (
    http_status integer,
    body        json,
    headers     jsonb,
    resource_id bigint
);

-- What idem_begin and idem_run return.  expires_at: when the key's record
-- expires (a replay, the stored expiry; idem_run's first execution, the
-- expiry it stored; idem_begin's claim, the expiry idem_finish will store
-- for a success (2xx/3xx) in this transaction; a 4xx result expires after
-- idem.failure_ttl instead); the client libraries send it as the
-- Idempotency-Expires header (clients/CONTRACT.md).  header_list: the
-- headers as stored in json form, next to the jsonb object (headers).
CREATE TYPE @extschema@.idem_outcome AS (
    replayed    boolean,
    http_status integer,
    body        json,
    headers     jsonb,
    resource_id bigint,
    expires_at  timestamptz,
    header_list json
);

-- What a handler of idem_run may return instead of idem_result: headers in
-- json form, kept as given.
CREATE TYPE @extschema@.idem_response AS (
    http_status integer,
    body        json,
    headers     json,
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
    resource_id bigint DEFAULT NULL, headers jsonb DEFAULT NULL,
    header_list json DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_finish'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json) IS
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
REVOKE ALL ON FUNCTION @extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_run(bigint, text, text, jsonb, regprocedure, interval) FROM PUBLIC;

-- idem_finish, returning what idem stored: the answer as a replay returns
-- it, after the operation's policy redacted it (for a copy kept elsewhere,
-- such as a fast layer in Redis, that must hold the same bytes).
CREATE FUNCTION @extschema@.idem_finish_stored(
    owner bigint, operation text, key text, http_status integer, body json,
    resource_id bigint DEFAULT NULL, headers jsonb DEFAULT NULL,
    header_list json DEFAULT NULL)
RETURNS @extschema@.idem_outcome
AS 'MODULE_PATHNAME', 'idem_finish_stored'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json) IS
    'idem: idem_finish, returning the answer as stored (redacted) and as a replay will return it';
REVOKE ALL ON FUNCTION @extschema@.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json) FROM PUBLIC;

-- Batch deletion of expired records; never waits on a row another
-- transaction holds.
CREATE FUNCTION @extschema@.idem_cleanup_expired(
    batch_size integer DEFAULT 1000, max_batches integer DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_cleanup_expired'
LANGUAGE C VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.idem_cleanup_expired(integer, integer) IS
    'idem: delete expired idempotency records in batches; returns how many were deleted';

REVOKE ALL ON FUNCTION @extschema@.idem_cleanup_expired(integer, integer) FROM PUBLIC;

-- What the cleanup worker did in each database since the server started.
CREATE FUNCTION @extschema@.idem_cleanup_status(
    OUT datid oid,
    OUT datname name,
    OUT last_run_started timestamptz,
    OUT last_run_finished timestamptz,
    OUT last_run_deleted bigint,
    OUT total_deleted bigint,
    OUT runs bigint,
    OUT last_error text,
    OUT last_error_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_cleanup_status'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.idem_cleanup_status() IS
    'idem: what the cleanup worker did in each database since the server started';

REVOKE ALL ON FUNCTION @extschema@.idem_cleanup_status() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_cleanup_status() TO pg_monitor;

-- Say so when the library is not preloaded: the worker is then absent.
CREATE FUNCTION idem_internal.idem_cleanup_worker_notice() RETURNS void
AS 'MODULE_PATHNAME', 'idem_cleanup_worker_notice'
LANGUAGE C;
COMMENT ON FUNCTION idem_internal.idem_cleanup_worker_notice() IS
    'idem: the NOTICE CREATE EXTENSION gives when idem is not in shared_preload_libraries';
REVOKE ALL ON FUNCTION idem_internal.idem_cleanup_worker_notice() FROM PUBLIC;
SELECT idem_internal.idem_cleanup_worker_notice();

-- ===========================================================================
-- Policies
-- ===========================================================================

-- ---------------------------------------------------------------------------
-- Per-operation policy, kept in the database: two operations with other
-- needs (a 24-hour order key, a 30-day payment key) side by side.  A NULL
-- column is "the GUC".  Precedence: a call's own argument (ttl) > the
-- operation's policy > the GUC > the built-in default.  Each backend reads
-- the table once and again only after it changed (idem_set_policy,
-- idem_drop_policy and any other write of it invalidate every backend's
-- copy at commit): no table lookup on a call's path.
-- ---------------------------------------------------------------------------
CREATE TABLE idem_internal.idem_policy (
    operation     text PRIMARY KEY CHECK (operation OPERATOR(pg_catalog.~) '^[A-Za-z0-9_.:-]{1,64}$'),
    ttl           interval,
    failure_ttl   interval,
    wait_timeout  interval,
    max_attempts  integer,
    retry_base    interval,
    retry_max     interval,
    redact        text[],
    key_format    text CHECK (key_format OPERATOR(pg_catalog.=) ANY (ARRAY['token', 'uuid', 'ulid']::text[])),
    reject_weak_keys boolean,
    updated_at    timestamptz NOT NULL DEFAULT pg_catalog.now(),
    audit_ttl     interval,
    reuse_after_expiry text
        CHECK (reuse_after_expiry OPERATOR(pg_catalog.=) ANY (ARRAY['execute', 'refuse']::text[])),
    uncertain     text,
    reconcile_within interval
);
REVOKE ALL ON idem_internal.idem_policy FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_policy', '');

-- any write of the table invalidates every backend's copy at commit
CREATE FUNCTION idem_internal.idem_policy_changed() RETURNS trigger
LANGUAGE C AS 'MODULE_PATHNAME', 'idem_policy_changed';
REVOKE ALL ON FUNCTION idem_internal.idem_policy_changed() FROM PUBLIC;
CREATE TRIGGER idem_policy_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON idem_internal.idem_policy FOR EACH STATEMENT EXECUTE FUNCTION idem_internal.idem_policy_changed();

-- what an omitted argument of idem_set_policy defaults to: "leave it
-- unchanged", told apart from an explicit NULL ("back to the GUC")
CREATE FUNCTION idem_internal.idem_policy_unchanged_interval() RETURNS interval
LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'idem_policy_unchanged';
CREATE FUNCTION idem_internal.idem_policy_unchanged_integer() RETURNS integer
LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'idem_policy_unchanged';
CREATE FUNCTION idem_internal.idem_policy_unchanged_textarray() RETURNS text[]
LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'idem_policy_unchanged';
CREATE FUNCTION idem_internal.idem_policy_unchanged_text() RETURNS text
LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'idem_policy_unchanged';
CREATE FUNCTION idem_internal.idem_policy_unchanged_boolean() RETURNS boolean
LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'idem_policy_unchanged';

-- idem_drop_policy(operation): true if it had one
CREATE FUNCTION @extschema@.idem_drop_policy(operation text) RETURNS boolean
LANGUAGE C VOLATILE STRICT AS 'MODULE_PATHNAME', 'idem_drop_policy';
REVOKE ALL ON FUNCTION @extschema@.idem_drop_policy(text) FROM PUBLIC;

-- idem_set_policy(operation, ...): every argument after operation named and
-- optional; omitted: unchanged; NULL: the GUC.  Superuser or the
-- extension's owner only (42501); bad values 22023.  Returns the policy.
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
REVOKE ALL ON FUNCTION @extschema@.idem_set_policy(text, interval, interval, interval, integer, interval, interval, interval, text, text[], text, boolean, text, interval) FROM PUBLIC;

-- the policies, readable by pg_monitor
CREATE VIEW @extschema@.idem_policies AS
    SELECT operation, ttl, failure_ttl, wait_timeout, max_attempts, retry_base, retry_max,
           audit_ttl, reuse_after_expiry, redact, key_format, reject_weak_keys, updated_at,
           uncertain, reconcile_within
    FROM idem_internal.idem_policy;
REVOKE ALL ON @extschema@.idem_policies FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_policies TO pg_monitor;

-- ===========================================================================
-- History and audit
-- ===========================================================================

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
CREATE TABLE idem_internal.idem_history (
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
CREATE INDEX idem_history_key ON idem_internal.idem_history (owner_id, operation, idempotency_key);
CREATE INDEX idem_history_audit_until ON idem_internal.idem_history (audit_until);

COMMENT ON TABLE idem_internal.idem_history IS
    'idem: the audit fields of expired executions, kept until audit_until (the operation''s audit_ttl)';

SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_history', '');
REVOKE ALL ON idem_internal.idem_history FROM PUBLIC;

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
-- order (idem_create_order's), history row, task attempt and inbox entry
-- of the owner, and (undelivered => 'delete') its outbox messages not yet
-- delivered, in batches of batch_size rows a statement, at most
-- max_batches batches a table (all when NULL); returns how many rows went.
-- Superuser only.
-- ---------------------------------------------------------------------------

CREATE FUNCTION @extschema@.idem_forget_owner(
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
REVOKE ALL ON FUNCTION @extschema@.idem_forget_owner(bigint, integer, integer, text) FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.idem_forget_owner(bigint, integer, integer, text) IS
    'idem: an erasure request: remove every record, order, history row, task attempt, inbox entry and failure, outbox dead letter and (undelivered => ''delete'') outbox message of owner (superuser only)';

-- ===========================================================================
-- Tasks
-- ===========================================================================

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

-- what a lease scans: the unfinished tasks of an operation, soonest due first
CREATE INDEX idem_task_due ON idem_internal.idempotency_record (operation, task_due_at)
    WHERE task_due_at IS NOT NULL;

-- fencing tokens: one sequence, so a task's every new token is greater than
-- all its earlier ones (and than every token of every other task)
CREATE SEQUENCE idem_internal.idem_task_token_seq;
SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_task_token_seq', '');
REVOKE ALL ON SEQUENCE idem_internal.idem_task_token_seq FROM PUBLIC;

COMMENT ON COLUMN idem_internal.idempotency_record.task_request IS
    'idem: a task''s request, as idem_submit received it, handed to the worker by idem_lease';
COMMENT ON COLUMN idem_internal.idempotency_record.task_payload IS
    'idem: what else idem_submit gave the worker (not part of the fingerprint)';
COMMENT ON COLUMN idem_internal.idempotency_record.task_attempts IS
    'idem: attempts started (leases handed out); NULL: not a task';
COMMENT ON COLUMN idem_internal.idempotency_record.task_token IS
    'idem: the fencing token of the current (or last) lease';
COMMENT ON COLUMN idem_internal.idempotency_record.task_due_at IS
    'idem: when a worker may lease the task next (a lapsed lease is taken over); NULL once finished';
COMMENT ON COLUMN idem_internal.idempotency_record.task_lease_expires_at IS
    'idem: end of the current lease; NULL when not leased';
COMMENT ON COLUMN idem_internal.idempotency_record.task_worker IS
    'idem: the worker holding (or that last held) the lease';
COMMENT ON COLUMN idem_internal.idempotency_record.task_heartbeat_at IS
    'idem: the lease''s start or last idem_heartbeat';
COMMENT ON COLUMN idem_internal.idempotency_record.task_session IS
    'idem: the session a bind_session lease lapses with; NULL otherwise';
COMMENT ON COLUMN idem_internal.idempotency_record.task_last_error IS
    'idem: the error of the last idem_fail';
COMMENT ON COLUMN idem_internal.idempotency_record.task_ttl IS
    'idem: how long the finished record is kept (NULL: idem.ttl, or idem.failure_ttl for a failure)';
-- task_lapses: how often a task's lease lapsed, or its bound session
-- ended, before its worker ended the attempt; each counts as an attempt,
-- so that a task whose worker keeps dying ends FAILED_FINAL after
-- max_attempts.
COMMENT ON COLUMN idem_internal.idempotency_record.task_lapses IS
    'idem: how many of the task''s attempts ended by their lease lapsing (or their bound session ending), not by idem_complete or idem_fail';
COMMENT ON COLUMN idem_internal.idempotency_record.task_leased_at IS
    'idem: when the current (or last) lease was handed out';

-- ---------------------------------------------------------------------------
-- Uncertain outcomes.  For an operation whose policy says uncertain =>
-- 'reconcile', an attempt that ends without a known outcome (idem_fail_unknown,
-- a lease that lapses, a bound session that ends) leaves the task
-- PROCESSING with task_uncertain_since set and task_due_at NULL: no
-- idem_lease sees it again.  Only idem_lease_reconcile hands it out, through
-- idem_task_reconcile, with the attempts so far; its holder completes the
-- task with the provider's answer, fails it for good, declares that the
-- attempt had no effect (idem_fail, retryable: the task is due again) or
-- that the outcome is still unknown (idem_fail_unknown: reconciled again
-- after a backoff).  Past the policy's reconcile_within the task waits for
-- an operator (task_reconcile_at NULL; idem_health counts it).
-- ---------------------------------------------------------------------------
CREATE INDEX idem_task_reconcile ON idem_internal.idempotency_record (operation, task_reconcile_at)
    WHERE task_reconcile_at IS NOT NULL;

COMMENT ON COLUMN idem_internal.idempotency_record.task_uncertain_since IS
    'idem: since when the task''s outcome is uncertain (an attempt of an operation with uncertain => ''reconcile'' ended without one); NULL: not marked';
COMMENT ON COLUMN idem_internal.idempotency_record.task_reconcile_at IS
    'idem: when idem_lease_reconcile may hand the marked task out next; NULL: not marked, or past reconcile_within (an operator''s)';
COMMENT ON COLUMN idem_internal.idempotency_record.task_reconciles IS
    'idem: reconcile leases handed out for the task';
COMMENT ON COLUMN idem_internal.idempotency_record.task_trace_context IS
    'idem: the W3C traceparent the task was submitted under (idem.trace_context); NULL: none, or finished';

-- ---------------------------------------------------------------------------
-- Every ended attempt of a task: one row when its lease ends (idem_complete,
-- idem_fail, idem_fail_unknown, or found lapsed by the next lease), with
-- the error as the operation's policy redacts it.  A row expires with its
-- task's record (infinity while the task is unfinished); the cleanup
-- deletes it, idem_forget_owner erases it.  The lease in progress is read
-- from the record (idem_task_attempts).
-- ---------------------------------------------------------------------------
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
CREATE INDEX idem_task_attempt_expires ON idem_internal.idem_task_attempt (expires_at);

COMMENT ON TABLE idem_internal.idem_task_attempt IS
    'idem: every ended attempt of a task (its lease: worker, token, times, outcome, redacted error), kept as long as the task''s record';

SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_task_attempt', '');
REVOKE ALL ON idem_internal.idem_task_attempt FROM PUBLIC;

-- idem_task_attempts: the attempts of every task, the one in progress
-- included (outcome NULL), oldest first; as idem_audit, read through a
-- function as idem's owner, every owner for pg_monitor, else those of the
-- caller's idem.allowed_owners.
CREATE FUNCTION @extschema@.idem_task_attempt_entries(
    owner bigint DEFAULT NULL,
    OUT owner_id bigint, OUT task_id bigint, OUT operation text, OUT idempotency_key text,
    OUT attempt integer, OUT reconcile boolean, OUT worker text, OUT token bigint,
    OUT started_at timestamptz, OUT ended_at timestamptz, OUT outcome text,
    OUT http_status integer, OUT error jsonb)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_task_attempt_entries'
LANGUAGE C STABLE CALLED ON NULL INPUT;
REVOKE ALL ON FUNCTION @extschema@.idem_task_attempt_entries(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_task_attempt_entries(bigint) TO pg_monitor;

CREATE VIEW @extschema@.idem_task_attempts AS
    SELECT * FROM @extschema@.idem_task_attempt_entries(NULL::pg_catalog.int8);
REVOKE ALL ON @extschema@.idem_task_attempts FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_task_attempts TO pg_monitor;

COMMENT ON VIEW @extschema@.idem_task_attempts IS
    'idem: every attempt of every task: worker, fencing token, start, end, outcome (succeeded, failed, retryable, unknown, lapsed; NULL while it runs), redacted error';


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
    resource_id bigint DEFAULT NULL, headers jsonb DEFAULT NULL,
    header_list json DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_complete(bigint, bigint, integer, json, bigint, jsonb, json) IS
    'idem: store the task''s result in the worker''s transaction (2xx/3xx SUCCEEDED, 4xx FAILED_FINAL); IK004 if the token is stale';

-- The trace context the task was submitted under, for its lease's holder
-- (the libraries' workers resume the submitter's trace from it).
CREATE FUNCTION @extschema@.idem_task_trace_context(task_id bigint, token bigint)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_task_trace_context'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_task_trace_context(bigint, bigint) IS
    'idem: the W3C traceparent the task was submitted under (idem.trace_context), or NULL; IK004 if the token is stale';

CREATE FUNCTION @extschema@.idem_fail(
    task_id bigint, token bigint, error jsonb, retryable boolean DEFAULT true)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_fail(bigint, bigint, jsonb, boolean) IS
    'idem: report a failed attempt: FAILED_RETRYABLE with a backoff while attempts are left, else FAILED_FINAL (HTTP 500); IK004 if the token is stale';

-- An attempt whose outcome the worker does not know (a provider's timeout).
CREATE FUNCTION @extschema@.idem_fail_unknown(
    task_id bigint, token bigint, error jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_fail_unknown'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_fail_unknown(bigint, bigint, jsonb) IS
    'idem: report an attempt whose outcome is unknown: with uncertain => ''reconcile'' the task is marked for reconciliation (PROCESSING), else as idem_fail''s retryable failure; IK004 if the token is stale';

-- Lease the marked tasks of an operation, with their attempts so far.
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

COMMENT ON FUNCTION @extschema@.idem_lease_reconcile(text, text, interval, integer, boolean) IS
    'idem: hand tasks whose outcome is uncertain to a reconciling worker, with their attempts so far, each with a new fencing token';

-- Like the other entry points: granted by the administrator, to the roles
-- that act for owners (idem_submit) and to the workers (the others).
REVOKE ALL ON FUNCTION @extschema@.idem_submit(bigint, text, text, jsonb, jsonb, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_lease(text, text, interval, integer, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_heartbeat(bigint, bigint, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_complete(bigint, bigint, integer, json, bigint, jsonb, json) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_fail(bigint, bigint, jsonb, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_fail_unknown(bigint, bigint, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_lease_reconcile(text, text, interval, integer, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_task_trace_context(bigint, bigint) FROM PUBLIC;

-- ===========================================================================
-- Operators
-- ===========================================================================

-- ---------------------------------------------------------------------------
-- An operator's actions (the operator kind, idem_grant(role, 'operator')),
-- each bound by the caller's idem.allowed_owners and
-- idem.allowed_operations: on a task, cancel, retry now, resolve with an
-- answer, settle an uncertain outcome; on dead letters, the redrive and
-- discard functions below.  The states each task action takes:
--
--   cancel   due, leased, uncertain, reconciling -> FAILED_FINAL (500)
--   retry    FAILED_RETRYABLE waiting for its next attempt -> due now
--   resolve  due, leased, uncertain, reconciling -> the answer given
--   settle   uncertain, reconciling -> the answer (happened), or
--            FAILED_RETRYABLE due now (did not happen)
--
-- any other: IK008.  A lease the action finds ends (a new fencing token:
-- the holder's late call is IK004).  Each action writes a row of
-- idem_operator_audit in the same transaction.
-- ---------------------------------------------------------------------------

-- Who did what, when and why: session_user and current_user as the
-- caller had them, the action, its target, arguments and reason, the
-- state before and after.  Kept idem.operator_audit_ttl (expires_at).
-- Only idem's owner changes or deletes a row (a trigger refuses everyone
-- else; superusers included), but for the cleanup's deletion of expired
-- rows and idem_forget_owner's removal of a row's arguments.
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
CREATE INDEX idem_operator_audit_expires ON idem_internal.idem_operator_audit (expires_at);

COMMENT ON TABLE idem_internal.idem_operator_audit IS
    'idem: every operator action (who, as whom, what, on which task or message, why, the state before and after); changed by nobody but idem''s owner';

SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_operator_audit', '');
SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_operator_audit_id_seq', '');
REVOKE ALL ON idem_internal.idem_operator_audit FROM PUBLIC;
REVOKE ALL ON SEQUENCE idem_internal.idem_operator_audit_id_seq FROM PUBLIC;

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
REVOKE ALL ON FUNCTION idem_internal.idem_operator_audit_guard() FROM PUBLIC;
CREATE TRIGGER idem_operator_audit_guard BEFORE UPDATE OR DELETE ON idem_internal.idem_operator_audit
    FOR EACH ROW EXECUTE FUNCTION idem_internal.idem_operator_audit_guard();
CREATE TRIGGER idem_operator_audit_truncate BEFORE TRUNCATE ON idem_internal.idem_operator_audit
    FOR EACH STATEMENT EXECUTE FUNCTION idem_internal.idem_operator_audit_guard();

-- Whether the caller's idem.allowed_owners lets it act for an owner (NULL:
-- a message without one); the caller's setting, though run as idem's
-- owner.  (PUBLIC keeps EXECUTE: it answers about the caller's own binding,
-- and idem_operator_actions calls it as its reader.)
CREATE FUNCTION idem_internal.idem_owner_visible(owner bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_owner_visible'
LANGUAGE C VOLATILE;

-- the audit as operators and monitors read it: pg_monitor every owner,
-- another role those of its idem.allowed_owners
CREATE VIEW @extschema@.idem_operator_actions WITH (security_barrier) AS
    SELECT a.id, a.owner_id, a.acted_at, a.session_user_name, a.current_user_name, a.action, a.target,
           a.target_id, a.operation, a.key, a.arguments, a.reason, a.state_before, a.state_after
      FROM idem_internal.idem_operator_audit a
     WHERE pg_catalog.pg_has_role(CURRENT_USER, 'pg_monitor', 'USAGE')
        OR idem_internal.idem_owner_visible(a.owner_id);
REVOKE ALL ON @extschema@.idem_operator_actions FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_operator_actions TO pg_monitor;
COMMENT ON VIEW @extschema@.idem_operator_actions IS
    'idem: the operators'' actions (idem_operator_audit), for the owners the reader may see';

CREATE FUNCTION @extschema@.idem_task_cancel(task_id bigint, reason text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_task_cancel'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_task_cancel(bigint, text) IS
    'idem: an operator ends an unfinished task FAILED_FINAL (HTTP 500, {"error": {"cancelled": reason}}); audited';

CREATE FUNCTION @extschema@.idem_task_retry(task_id bigint, reason text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_task_retry'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_task_retry(bigint, text) IS
    'idem: an operator makes a task waiting for its next attempt due now; audited';

CREATE FUNCTION @extschema@.idem_task_resolve(
    task_id bigint, http_status integer, body json, reason text,
    resource_id bigint DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_task_resolve'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_task_resolve(bigint, integer, json, text, bigint, jsonb) IS
    'idem: an operator ends an unfinished task with an answer (2xx/3xx SUCCEEDED, 4xx FAILED_FINAL), replayed to the client; audited';

CREATE FUNCTION @extschema@.idem_task_settle(
    task_id bigint, happened boolean, reason text,
    http_status integer DEFAULT NULL, body json DEFAULT NULL, resource_id bigint DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_task_settle'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_task_settle(bigint, boolean, text, integer, json, bigint) IS
    'idem: an operator settles a task whose outcome is uncertain: the provider''s answer (happened), or due again (did not happen); audited';

REVOKE ALL ON FUNCTION @extschema@.idem_task_cancel(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_task_retry(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_task_resolve(bigint, integer, json, text, bigint, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_task_settle(bigint, boolean, text, integer, json, bigint) FROM PUBLIC;

-- ===========================================================================
-- Outbox and dead letters
-- ===========================================================================

-- ---------------------------------------------------------------------------
-- Outbox: messages written in the transaction whose business rows they
-- announce, delivered by independent publishers.
--
-- idem_outbox_emit keeps a message in the transaction's memory and inserts
-- it when the transaction commits (at PRE_COMMIT), so a row exists exactly
-- for the messages of committed transactions.  commit_seq is the delivery
-- order: for a message with a key it is drawn at that moment, under a lock
-- of (topic, msg_key) held until the commit is done, so that for one key
-- commit_seq follows commit order; without a key it is the message id.
--
-- ready marks what a fetch may hand out: every keyless message, and of each
-- key only its head, the unacknowledged message with the least commit_seq.
-- It is kept under the same key lock: a message is inserted ready if its
-- key has no unacknowledged message, and acknowledging a head makes the
-- next message of its key ready.  So a fetch walks only deliverable rows,
-- however long a key's backlog.
-- ---------------------------------------------------------------------------
CREATE SEQUENCE idem_internal.idem_outbox_message_id_seq;

-- A fetch's lease is a HOT update (it changes no indexed column): with
-- fillfactor 50 a page keeps room for a new version of each of its rows.
-- An acknowledged message is deleted by idem_outbox_ack itself; the
-- cleanup deletes only what was marked acknowledged (acked_at) before
-- acknowledgements deleted.
CREATE TABLE idem_internal.idem_outbox (
    message_id   bigint PRIMARY KEY,
    topic        varchar(128) NOT NULL,
    msg_key      varchar(256),
    payload      jsonb NOT NULL,
    headers      jsonb,
    emitted_at   timestamptz NOT NULL,
    commit_seq   bigint NOT NULL,
    attempt      integer NOT NULL,
    ready        boolean NOT NULL,
    leased_until timestamptz,
    acked_at     timestamptz,
    owner_id     bigint,
    nacks        integer,
    lapses       integer,
    last_reason  text,
    not_before   timestamptz,
    dead_at      timestamptz
) WITH (fillfactor = 50);

ALTER SEQUENCE idem_internal.idem_outbox_message_id_seq
    OWNED BY idem_internal.idem_outbox.message_id;

-- what a fetch scans: the deliverable messages of a topic, in order
CREATE INDEX idem_outbox_pending ON idem_internal.idem_outbox (topic, commit_seq)
    WHERE acked_at IS NULL AND ready;
-- each key's unacknowledged messages, in order: its head, the next one
CREATE INDEX idem_outbox_key_order ON idem_internal.idem_outbox (topic, msg_key, commit_seq)
    WHERE acked_at IS NULL AND msg_key IS NOT NULL;
-- what the cleanup deletes: acknowledged messages, oldest first
CREATE INDEX idem_outbox_acked ON idem_internal.idem_outbox (acked_at)
    WHERE acked_at IS NOT NULL;

COMMENT ON TABLE idem_internal.idem_outbox IS
    'idem: messages of committed transactions, leased to publishers by idem_outbox_fetch until idem_outbox_ack';

-- owner_id: the owner given to idem_outbox_emit, or the owner of the
-- emitting transaction's unfinished claims; idem_forget_owner finds it.
COMMENT ON COLUMN idem_internal.idem_outbox.owner_id IS
    'idem: the owner the message is about (idem_outbox_emit''s owner, or the owner of the emitting transaction''s claims), for idem_forget_owner';
CREATE INDEX idem_outbox_owner ON idem_internal.idem_outbox (owner_id) WHERE owner_id IS NOT NULL;

COMMENT ON COLUMN idem_internal.idem_outbox.nacks IS
    'idem: how many times a publisher reported the message not delivered (idem_outbox_nack); NULL: never';
COMMENT ON COLUMN idem_internal.idem_outbox.lapses IS
    'idem: how many of its leases lapsed without an ack or a nack (a publisher gone, a broker down); never a reason to dead-letter it';
COMMENT ON COLUMN idem_internal.idem_outbox.last_reason IS
    'idem: the reason of its last nack';
COMMENT ON COLUMN idem_internal.idem_outbox.not_before IS
    'idem: not fetched before this time (a nack''s retry_after)';
COMMENT ON COLUMN idem_internal.idem_outbox.dead_at IS
    'idem: when it became a dead letter of a topic whose on_dead is ''block'': its key''s head, not deliverable until redriven';

SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_outbox', '');
SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_outbox_message_id_seq', '');
REVOKE ALL ON TABLE idem_internal.idem_outbox FROM PUBLIC;
REVOKE ALL ON SEQUENCE idem_internal.idem_outbox_message_id_seq FROM PUBLIC;

-- Emit a message with the caller's transaction.
CREATE FUNCTION @extschema@.idem_outbox_emit(
    topic text, payload jsonb, msg_key text DEFAULT NULL, headers jsonb DEFAULT NULL,
    owner bigint DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_emit'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_outbox_emit(text, jsonb, text, jsonb, bigint) IS
    'idem: emit a message that exists if and only if the calling transaction commits; returns its id';

-- Lease the deliverable messages of a topic: ready (keyless, or the head
-- of its key), not acknowledged, not leased or with a lapsed lease.  FOR
-- UPDATE SKIP LOCKED: concurrent fetchers never lease one message; a row
-- leased and committed meanwhile is checked again on its new version.
CREATE FUNCTION @extschema@.idem_outbox_fetch(
    topic text,
    batch integer DEFAULT 100,
    lease interval DEFAULT interval '30 seconds')
RETURNS TABLE (message_id bigint, msg_key text, payload jsonb, headers jsonb,
               attempt integer, emitted_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    t timestamptz := pg_catalog.clock_timestamp();
BEGIN
    IF idem_outbox_fetch.topic IS NULL OR batch IS NULL OR lease IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null',
            CASE WHEN idem_outbox_fetch.topic IS NULL THEN 'topic'
                 WHEN batch IS NULL THEN 'batch' ELSE 'lease' END
            USING ERRCODE = '22004';
    END IF;
    -- no user trigger on the outbox runs as the owner for a caller with
    -- temporary tables: the check of every idem write (0A000)
    PERFORM idem_internal.idem_outbox_guard();
    IF idem_outbox_fetch.topic OPERATOR(pg_catalog.!~) '^[A-Za-z0-9_.:-]{1,128}$' THEN
        RAISE EXCEPTION 'topic must be 1 to 128 characters from A-Z, a-z, 0-9, "_", ".", ":" and "-"'
            USING ERRCODE = '22023';
    END IF;
    IF batch OPERATOR(pg_catalog.<) 1 OR batch OPERATOR(pg_catalog.>) 10000 THEN
        RAISE EXCEPTION 'batch must be between 1 and 10000'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has batch %s.', batch);
    END IF;
    IF lease OPERATOR(pg_catalog.<=) interval '0' THEN
        RAISE EXCEPTION 'lease must be a positive interval'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has lease %s.', lease);
    END IF;

    -- the locked rows are updated where the lock found them (ctid): the
    -- lock holds them until the end of the transaction
    RETURN QUERY
    WITH due AS (
        SELECT o.ctid
          FROM idem_internal.idem_outbox o
         WHERE o.topic OPERATOR(pg_catalog.=) idem_outbox_fetch.topic
           AND o.acked_at IS NULL AND o.ready
           AND (o.leased_until IS NULL OR o.leased_until OPERATOR(pg_catalog.<=) t)
           AND (o.not_before IS NULL OR o.not_before OPERATOR(pg_catalog.<=) t)
         ORDER BY o.commit_seq
         LIMIT batch
           FOR UPDATE OF o SKIP LOCKED
    ), leased AS (
        UPDATE idem_internal.idem_outbox o
           SET attempt = o.attempt OPERATOR(pg_catalog.+) 1,
               -- a lease still set lapsed: neither acked nor nacked (1.13)
               lapses = CASE WHEN o.leased_until IS NULL THEN o.lapses
                             ELSE COALESCE(o.lapses, 0) OPERATOR(pg_catalog.+) 1 END,
               not_before = NULL,
               leased_until = t OPERATOR(pg_catalog.+) lease
          FROM due
         WHERE o.ctid OPERATOR(pg_catalog.=) due.ctid
        RETURNING o.message_id, o.msg_key, o.payload, o.headers, o.attempt,
                  o.emitted_at, o.commit_seq
    )
    SELECT l.message_id, l.msg_key::pg_catalog.text, l.payload, l.headers,
           l.attempt, l.emitted_at
      FROM leased l
     ORDER BY l.commit_seq;
END
$$;

COMMENT ON FUNCTION @extschema@.idem_outbox_fetch(text, integer, interval) IS
    'idem: lease up to batch deliverable messages of a topic, in commit order per key';

-- Take the commit-order locks of (topic, msg_key) pairs, in one global
-- order, until the end of the transaction: what a committing emitter of
-- those keys takes too.  For idem_outbox_ack only.
CREATE FUNCTION idem_internal.idem_outbox_lock_keys(topics text[], keys text[])
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_lock_keys'
LANGUAGE C VOLATILE STRICT;

-- Acknowledge delivered messages: each is deleted.  Under the locks of
-- their keys, so that no emitter of those keys commits meanwhile, each key
-- whose head was acknowledged gets its next message ready.  READ
-- COMMITTED: each statement sees what committed before it, the work of the
-- emitters the locks waited for included.  C (outbox_ack.c): it writes as
-- the extension's owner, like idem_outbox_emit.  With more than 16 keys it
-- takes the outbox-wide key lock in SHARE mode, which excludes every
-- committing emitter and lets acknowledgements run together: every message
-- an acknowledgement deletes is its key's head, and the key's next message
-- is touched by nobody else meanwhile; an id that is not its key's head
-- (not obtained from a fetch) takes it in EXCLUSIVE mode.
CREATE FUNCTION @extschema@.idem_outbox_ack(message_ids bigint[])
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_ack'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_outbox_ack(bigint[]) IS
    'idem: delete the acknowledged messages (the publisher has them confirmed by its broker) and make each key''s next message deliverable; returns how many were not already acknowledged';

-- Granted by the administrator to producers, publishers and consumers.
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_emit(text, jsonb, text, jsonb, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_fetch(text, integer, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_ack(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_internal.idem_outbox_lock_keys(text[], text[]) FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- The outbox's fetch and acknowledgement update idem_outbox as the
-- extension's owner (SECURITY DEFINER): like every write of idem's C code,
-- they refuse to fire user triggers of the table as the owner for a caller
-- whose session has temporary tables, whose names would capture the names
-- such a trigger does not qualify (0A000).
-- ---------------------------------------------------------------------------
CREATE FUNCTION idem_internal.idem_outbox_guard()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_guard'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION idem_internal.idem_outbox_guard() IS
    'idem: refuse to fire idem_outbox''s user triggers as its owner for a session with temporary tables (for idem_outbox_fetch and idem_outbox_ack)';

REVOKE ALL ON FUNCTION idem_internal.idem_outbox_guard() FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- Dead letters: one message that can never be delivered or applied does
-- not stop a topic.  docs/dead-letters.md.
--
-- Only a publisher's explicit report counts: idem_outbox_nack.  A lease that
-- lapses (a relay that died, a broker down for a while) is never a reason
-- to give a message up; it is counted (lapses) and shown by idem_health().
-- A message refused for good (permanent), or nacked max_deliveries times
-- (its topic's setting, else idem.outbox_max_deliveries), is a dead letter:
-- a copy goes to idem_outbox_dead with its attempts and last reason, and
-- its topic's on_dead says what its key's later messages do:
--   'block' (the default: per-key order is a promise): the message stays
--           in idem_outbox as its key's head, marked dead (dead_at) and not
--           deliverable, so the key's later messages wait behind it;
--           idem_outbox_redrive makes it deliverable again, in its place;
--   'skip':  it leaves idem_outbox and its key's next message becomes the
--           head; a redriven message is appended after the key's messages
--           of the moment, with the header "idem-redriven".
-- A dead letter stays until an operator redrives it (idem_outbox_redrive)
-- or discards it (idem_outbox_discard), or idem_forget_owner erases it: the
-- cleanup never deletes one (it is a committed message nobody received).
-- ---------------------------------------------------------------------------
CREATE TABLE idem_internal.idem_outbox_topic (
    topic          varchar(128) PRIMARY KEY,
    max_deliveries integer,
    on_dead        text NOT NULL,
    updated_at     timestamptz NOT NULL,
    CONSTRAINT idem_outbox_topic_name CHECK (topic OPERATOR(pg_catalog.~) '^[A-Za-z0-9_.:-]{1,128}$'),
    CONSTRAINT idem_outbox_topic_max_deliveries CHECK (max_deliveries OPERATOR(pg_catalog.>=) 1
                                                        AND max_deliveries OPERATOR(pg_catalog.<=) 1000),
    CONSTRAINT idem_outbox_topic_on_dead CHECK (on_dead OPERATOR(pg_catalog.=) ANY (ARRAY['block', 'skip']))
);
COMMENT ON TABLE idem_internal.idem_outbox_topic IS
    'idem: per-topic dead-letter settings (idem_outbox_set_topic): max_deliveries (NULL: idem.outbox_max_deliveries) and on_dead';

CREATE TABLE idem_internal.idem_outbox_dead (
    message_id  bigint PRIMARY KEY,
    topic       varchar(128) NOT NULL,
    msg_key     varchar(256),
    payload     jsonb NOT NULL,
    headers     jsonb,
    emitted_at  timestamptz NOT NULL,
    owner_id    bigint,
    attempts    integer NOT NULL,
    nacks       integer NOT NULL,
    lapses      integer NOT NULL,
    permanent   boolean NOT NULL,
    last_reason text,
    on_dead     text NOT NULL,
    dead_at     timestamptz NOT NULL
);
CREATE INDEX idem_outbox_dead_topic ON idem_internal.idem_outbox_dead (topic, dead_at);
CREATE INDEX idem_outbox_dead_owner ON idem_internal.idem_outbox_dead (owner_id) WHERE owner_id IS NOT NULL;
COMMENT ON TABLE idem_internal.idem_outbox_dead IS
    'idem: outbox messages given up (refused for good, or nacked max_deliveries times), with their attempts and last reason, until redriven, discarded or erased';

SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_outbox_topic', '');
SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_outbox_dead', '');
REVOKE ALL ON TABLE idem_internal.idem_outbox_topic, idem_internal.idem_outbox_dead FROM PUBLIC;

-- Make each key's first undelivered message its head (ready), unless it is
-- already or a dead letter is first: after a head left the outbox (a
-- dead letter of a 'skip' topic, a discarded one).  Called under the keys'
-- locks (idem_outbox_lock_keys), as a statement of its own: in READ
-- COMMITTED it sees the messages of every emitter the locks waited for.
CREATE FUNCTION idem_internal.idem_outbox_promote(topics text[], keys text[])
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    UPDATE idem_internal.idem_outbox o
       SET ready = true
      FROM (SELECT DISTINCT ON (h.topic, h.msg_key) h.message_id, h.ready, h.dead_at
              FROM ROWS FROM (pg_catalog.unnest(topics), pg_catalog.unnest(keys)) AS k (topic, msg_key)
              JOIN idem_internal.idem_outbox h
                ON h.topic::pg_catalog.text OPERATOR(pg_catalog.=) k.topic
               AND h.msg_key::pg_catalog.text OPERATOR(pg_catalog.=) k.msg_key
             WHERE h.acked_at IS NULL
             ORDER BY h.topic, h.msg_key, h.commit_seq) AS head
     WHERE o.message_id OPERATOR(pg_catalog.=) head.message_id
       AND NOT head.ready AND head.dead_at IS NULL;
END;
REVOKE ALL ON FUNCTION idem_internal.idem_outbox_promote(text[], text[]) FROM PUBLIC;

-- What the dead-letter functions check first: no NULL argument (22004), the
-- outbox's guard, READ COMMITTED (0A000: after taking its keys' locks a call
-- must see what committed before them).
CREATE FUNCTION idem_internal.idem_outbox_dead_letter_check(fn text, args text[], nulls boolean[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    FOR i IN 1 .. pg_catalog.cardinality(args) LOOP
        IF nulls[i] THEN
            RAISE EXCEPTION 'argument "%" of % must not be null', args[i], fn USING ERRCODE = '22004';
        END IF;
    END LOOP;
    PERFORM idem_internal.idem_outbox_guard();
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RAISE EXCEPTION '% must run in a READ COMMITTED transaction', fn USING ERRCODE = '0A000',
            DETAIL = 'After taking its keys'' locks it must see what committed before them.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION idem_internal.idem_outbox_dead_letter_check(text, text[], boolean[]) FROM PUBLIC;

-- The dead letters of message_ids an entry point acts on, as it audits them
-- (with the state after, after): 42501 first unless each is of an owner
-- the caller may act for.
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
REVOKE ALL ON FUNCTION idem_internal.idem_dead_letters_acted(bigint[], jsonb) FROM PUBLIC;

-- The checks of idem_outbox_redrive and idem_outbox_discard, then the
-- commit-order locks of their dead letters' keys; the keys locked.
CREATE FUNCTION idem_internal.idem_outbox_lock_dead(fn text, message_ids bigint[],
                                                    OUT topics text[], OUT keys text[])
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idem_internal.idem_outbox_dead_letter_check(fn, ARRAY['message_ids'], ARRAY[message_ids IS NULL]);
    SELECT pg_catalog.array_agg(d.topic::pg_catalog.text), pg_catalog.array_agg(d.msg_key::pg_catalog.text)
      INTO topics, keys
      FROM idem_internal.idem_outbox_dead d
     WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids) AND d.msg_key IS NOT NULL;
    PERFORM idem_internal.idem_outbox_lock_keys(topics, keys);
END
$$;
REVOKE ALL ON FUNCTION idem_internal.idem_outbox_lock_dead(text, bigint[]) FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- idem_outbox_set_topic: a topic's dead-letter settings.  Superuser or the
-- extension's owner.  max_deliveries NULL: idem.outbox_max_deliveries.
-- ---------------------------------------------------------------------------
CREATE FUNCTION @extschema@.idem_outbox_set_topic(
    topic text, max_deliveries integer DEFAULT NULL, on_dead text DEFAULT 'block')
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF topic IS NULL OR on_dead IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null', CASE WHEN topic IS NULL THEN 'topic' ELSE 'on_dead' END
            USING ERRCODE = '22004';
    END IF;
    IF topic OPERATOR(pg_catalog.!~) '^[A-Za-z0-9_.:-]{1,128}$' THEN
        RAISE EXCEPTION 'topic must be 1 to 128 characters from A-Z, a-z, 0-9, "_", ".", ":" and "-"'
            USING ERRCODE = '22023';
    END IF;
    IF max_deliveries OPERATOR(pg_catalog.<) 1 OR max_deliveries OPERATOR(pg_catalog.>) 1000 THEN
        RAISE EXCEPTION 'max_deliveries must be between 1 and 1000, or NULL for idem.outbox_max_deliveries'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has max_deliveries %s.', max_deliveries);
    END IF;
    IF on_dead OPERATOR(pg_catalog.<>) ALL (ARRAY['block', 'skip']) THEN
        RAISE EXCEPTION 'on_dead must be ''block'' or ''skip''' USING ERRCODE = '22023',
            DETAIL = pg_catalog.format('The call has on_dead %L.', on_dead),
            HINT = '''block'': a dead letter holds its key''s later messages back until redriven (per-key order kept); ''skip'': they go on.';
    END IF;
    INSERT INTO idem_internal.idem_outbox_topic AS s (topic, max_deliveries, on_dead, updated_at)
    VALUES (topic, max_deliveries, on_dead, pg_catalog.now())
    ON CONFLICT ON CONSTRAINT idem_outbox_topic_pkey DO UPDATE
       SET max_deliveries = excluded.max_deliveries, on_dead = excluded.on_dead, updated_at = excluded.updated_at;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_set_topic(text, integer, text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_outbox_set_topic(text, integer, text) IS
    'idem: a topic''s dead-letter settings: max_deliveries (NULL: idem.outbox_max_deliveries) and on_dead (''block'' or ''skip'')';

-- ---------------------------------------------------------------------------
-- idem_outbox_nack (SECURITY DEFINER, a publisher's): the broker did not
-- take these messages.  Counted only for a message handed out and still
-- undelivered; its lease ends (fetched again at once, or after retry_after).
-- permanent, or max_deliveries nacks: a dead letter.  Returns how many
-- became dead letters.
-- ---------------------------------------------------------------------------
CREATE FUNCTION @extschema@.idem_outbox_nack(
    message_ids bigint[], reason text, permanent boolean DEFAULT false,
    retry_after interval DEFAULT interval '0')
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t timestamptz := pg_catalog.clock_timestamp();
    fallback integer;
    ktopics text[];
    kkeys text[];
    dead bigint;
BEGIN
    PERFORM idem_internal.idem_outbox_dead_letter_check('idem_outbox_nack',
        ARRAY['message_ids', 'reason', 'permanent', 'retry_after'],
        ARRAY[message_ids IS NULL, reason IS NULL, permanent IS NULL, retry_after IS NULL]);
    IF retry_after OPERATOR(pg_catalog.<) interval '0' THEN
        RAISE EXCEPTION 'retry_after must not be negative'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has retry_after %s.', retry_after);
    END IF;
    -- the library is loaded by the guard: its GUC is defined
    fallback := COALESCE(pg_catalog.current_setting('idem.outbox_max_deliveries', true), '5')::pg_catalog.int4;

    -- the keys' locks first, before any row is written (as idem_outbox_ack)
    SELECT pg_catalog.array_agg(o.topic::pg_catalog.text), pg_catalog.array_agg(o.msg_key::pg_catalog.text)
      INTO ktopics, kkeys
      FROM idem_internal.idem_outbox o
     WHERE o.message_id OPERATOR(pg_catalog.=) ANY (message_ids) AND o.msg_key IS NOT NULL
       AND o.acked_at IS NULL AND o.dead_at IS NULL AND o.leased_until IS NOT NULL;
    PERFORM idem_internal.idem_outbox_lock_keys(ktopics, kkeys);

    WITH nacked AS (
        UPDATE idem_internal.idem_outbox o
           SET nacks = COALESCE(o.nacks, 0) OPERATOR(pg_catalog.+) 1,
               last_reason = pg_catalog.left(reason, 1000),
               leased_until = NULL,
               not_before = CASE WHEN retry_after OPERATOR(pg_catalog.>) interval '0'
                                 THEN t OPERATOR(pg_catalog.+) retry_after END
         WHERE o.message_id OPERATOR(pg_catalog.=) ANY (message_ids)
           AND o.acked_at IS NULL AND o.dead_at IS NULL AND o.leased_until IS NOT NULL
        RETURNING o.*
    )
    INSERT INTO idem_internal.idem_outbox_dead
        (message_id, topic, msg_key, payload, headers, emitted_at, owner_id, attempts, nacks, lapses,
         permanent, last_reason, on_dead, dead_at)
    SELECT n.message_id, n.topic, n.msg_key, n.payload, n.headers, n.emitted_at, n.owner_id, n.attempt,
           n.nacks, COALESCE(n.lapses, 0), permanent, n.last_reason,
           CASE WHEN n.msg_key IS NULL THEN 'skip' ELSE COALESCE(s.on_dead, 'block') END, t
      FROM nacked n
      LEFT JOIN idem_internal.idem_outbox_topic s ON s.topic OPERATOR(pg_catalog.=) n.topic
     WHERE permanent OR n.nacks OPERATOR(pg_catalog.>=) COALESCE(s.max_deliveries, fallback);
    GET DIAGNOSTICS dead = ROW_COUNT;
    IF dead OPERATOR(pg_catalog.=) 0 THEN
        RETURN 0;
    END IF;

    -- 'block': the dead letter stays its key's head, not deliverable
    UPDATE idem_internal.idem_outbox o
       SET dead_at = t, ready = false, not_before = NULL
      FROM idem_internal.idem_outbox_dead d
     WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids) AND d.dead_at OPERATOR(pg_catalog.=) t
       AND d.on_dead OPERATOR(pg_catalog.=) 'block'
       AND o.message_id OPERATOR(pg_catalog.=) d.message_id;
    -- 'skip' (and keyless): it leaves the outbox, its key's next message is the head
    WITH gone AS (
        DELETE FROM idem_internal.idem_outbox o
         USING idem_internal.idem_outbox_dead d
         WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids) AND d.dead_at OPERATOR(pg_catalog.=) t
           AND d.on_dead OPERATOR(pg_catalog.=) 'skip'
           AND o.message_id OPERATOR(pg_catalog.=) d.message_id
        RETURNING o.topic, o.msg_key)
    SELECT pg_catalog.array_agg(g.topic::pg_catalog.text), pg_catalog.array_agg(g.msg_key::pg_catalog.text)
      INTO ktopics, kkeys
      FROM gone g WHERE g.msg_key IS NOT NULL;
    PERFORM idem_internal.idem_outbox_promote(ktopics, kkeys);
    RETURN dead;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_nack(bigint[], text, boolean, interval) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_outbox_nack(bigint[], text, boolean, interval) IS
    'idem: a publisher''s report that its broker did not take these fetched messages (permanent: never will); returns how many became dead letters';

-- ---------------------------------------------------------------------------
-- idem_outbox_redrive: dead letters delivered again.  Of a 'block' topic:
-- the message is its key's head again, in its place; of a 'skip' topic (or
-- keyless): appended after its key's messages of the moment, with the
-- header "idem-redriven".  The work of the entry point
-- idem_outbox_redrive (superuser, the extension's owner, the operator
-- kind), which calls it as idem's owner and audits each message it returns.
-- ---------------------------------------------------------------------------
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
REVOKE ALL ON FUNCTION idem_internal.idem_outbox_redrive_rows(bigint[], text) FROM PUBLIC;

CREATE FUNCTION @extschema@.idem_outbox_redrive(message_ids bigint[], reason text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_redrive'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_redrive(bigint[], text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_outbox_redrive(bigint[], text) IS
    'idem: deliver dead letters again: in their key''s place (on_dead ''block'') or after its messages with the header idem-redriven (''skip''); returns how many';

-- ---------------------------------------------------------------------------
-- idem_outbox_discard: dead letters given up for good; a blocked key's next
-- message becomes its head.  The work of the entry point
-- idem_outbox_discard, as for idem_outbox_redrive.
-- ---------------------------------------------------------------------------
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
REVOKE ALL ON FUNCTION idem_internal.idem_outbox_discard_rows(bigint[], text) FROM PUBLIC;

CREATE FUNCTION @extschema@.idem_outbox_discard(message_ids bigint[], reason text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_discard'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_discard(bigint[], text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_outbox_discard(bigint[], text) IS
    'idem: give dead letters up for good (their blocked keys go on); returns how many';

-- ===========================================================================
-- Inbox
-- ===========================================================================

-- ---------------------------------------------------------------------------
-- Inbox: one row per (consumer, message_id) a consumer's transaction took
-- effect for.
-- ---------------------------------------------------------------------------
CREATE TABLE idem_internal.idem_inbox (
    consumer    varchar(64) NOT NULL,
    message_id  varchar(512) NOT NULL,
    consumed_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    owner_id    bigint,
    CONSTRAINT pk_idem_inbox PRIMARY KEY (consumer, message_id)
);
CREATE INDEX idem_inbox_expires ON idem_internal.idem_inbox (expires_at);
-- the owner idem_consume was given: what idem_forget_owner finds
CREATE INDEX idem_inbox_owner ON idem_internal.idem_inbox (owner_id) WHERE owner_id IS NOT NULL;

COMMENT ON TABLE idem_internal.idem_inbox IS
    'idem: the messages each consumer has taken effect for, until they expire';

SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_inbox', '');

REVOKE ALL ON TABLE idem_internal.idem_inbox FROM PUBLIC;

-- Take effect for a message once per consumer.
CREATE FUNCTION @extschema@.idem_consume(
    consumer text, message_id text, ttl interval DEFAULT NULL, owner bigint DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_consume'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_consume(text, text, interval, bigint) IS
    'idem: true the first time consumer takes message_id in a committed transaction, false for every redelivery';
REVOKE ALL ON FUNCTION @extschema@.idem_consume(text, text, interval, bigint) FROM PUBLIC;

-- A consumer's failures: a message whose effect failed (an undecodable
-- payload, a handler that raised) has a row here, written outside the
-- effect's transaction (idem_consume_failed), so that its attempts survive
-- restarts; past the limit it is dead (dead_at).  A dead message of a topic
-- whose on_dead is 'block' holds its key back for that consumer: the key's
-- later messages are set aside (behind names the dead one) until the
-- operator redrives them (idem_inbox_redrive) and the broker delivers them
-- again.  A row goes when its message is applied (idem_consume_check, in
-- the effect's transaction), or when discarded or erased; never by age.
CREATE TABLE idem_internal.idem_inbox_failure (
    consumer        varchar(64) NOT NULL,
    message_id      varchar(512) NOT NULL,
    msg_key         varchar(256),
    owner_id        bigint,
    attempts        integer NOT NULL,
    last_reason     text,
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    dead_at         timestamptz,
    blocks          boolean NOT NULL,
    behind          varchar(512),
    redriven        boolean NOT NULL,
    CONSTRAINT pk_idem_inbox_failure PRIMARY KEY (consumer, message_id)
);
CREATE INDEX idem_inbox_failure_blocking ON idem_internal.idem_inbox_failure (consumer, msg_key)
    WHERE dead_at IS NOT NULL AND blocks;
CREATE INDEX idem_inbox_failure_owner ON idem_internal.idem_inbox_failure (owner_id) WHERE owner_id IS NOT NULL;
COMMENT ON TABLE idem_internal.idem_inbox_failure IS
    'idem: messages a consumer failed to apply: attempts, last reason, dead letters and the messages set aside behind them';

SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_inbox_failure', '');
REVOKE ALL ON TABLE idem_internal.idem_inbox_failure FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- A consumer's side (SECURITY DEFINER, a consumer's).
--
-- idem_consume_check, in the effect's transaction before idem_consume:
--   'apply'     go on (a failure row of this message goes with the commit);
--   'dead'      this message is a dead letter (not redriven): set it aside again;
--   'set_aside' its key is held back behind a dead letter (blocked_by) of a
--               'block' topic: recorded here, set it aside (commit, then the
--               broker's dead-lettering).
-- ---------------------------------------------------------------------------
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

CREATE FUNCTION @extschema@.idem_consume_check(
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
CREATE FUNCTION @extschema@.idem_consume_failed(
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

-- idem_inbox_redrive: a consumer's dead letters (and what was set aside
-- behind them) applied again when the broker delivers them again (the
-- operator moves them back from the broker's dead-letter queue or stream);
-- discard: given up for good, their keys go on.  All of the consumer's
-- when message_ids is NULL.  The work of the entry point
-- idem_inbox_redrive, as for idem_outbox_redrive.
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
REVOKE ALL ON FUNCTION idem_internal.idem_inbox_redrive_rows(text, text[], boolean, text) FROM PUBLIC;

CREATE FUNCTION @extschema@.idem_inbox_redrive(
    consumer text, message_ids text[] DEFAULT NULL, discard boolean DEFAULT false, reason text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_inbox_redrive'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION @extschema@.idem_inbox_redrive(text, text[], boolean, text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_inbox_redrive(text, text[], boolean, text) IS
    'idem: let a consumer apply its dead letters when delivered again (or discard them: their keys go on); returns how many';

-- ===========================================================================
-- Statistics and health
-- ===========================================================================

CREATE FUNCTION @extschema@.idem_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.idem_stats_reset() IS
    'idem: set every counter of idem_stats back to 0';

-- Count n in idem_stats at commit (for idem's own PL/pgSQL functions).
CREATE FUNCTION idem_internal.idem_stats_add(name text, counter text, n bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_stats_add'
LANGUAGE C VOLATILE STRICT;
REVOKE ALL ON FUNCTION @extschema@.idem_stats_reset() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_internal.idem_stats_add(text, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats_reset() TO pg_monitor;

CREATE FUNCTION @extschema@.idem_stats_entries(
    OUT dbid oid, OUT operation text, OUT kind text,
    OUT calls bigint, OUT executed bigint, OUT replayed bigint, OUT conflicts bigint,
    OUT in_flight bigint, OUT waits bigint, OUT renewed bigint, OUT failed_final bigint,
    OUT leases bigint, OUT takeovers bigint, OUT stale_tokens bigint, OUT retries bigint,
    OUT outbox_emitted bigint, OUT outbox_acked bigint, OUT inbox_duplicates bigint,
    OUT cleanup_deleted bigint, OUT stats_reset timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats_entries'
LANGUAGE C VOLATILE STRICT;

REVOKE ALL ON FUNCTION @extschema@.idem_stats_entries() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats_entries() TO pg_monitor;

-- idem_stats: the counters, and each topic's and consumer's dead letters
-- and the oldest one's age, read from the tables: a topic or consumer with
-- dead letters has a row even with no counters since the last reset or
-- restart, its counters NULL.
CREATE VIEW @extschema@.idem_stats AS
SELECT COALESCE(e.dbid, dl.dbid) AS dbid, d.datname,
       COALESCE(e.operation, dl.name) AS operation, COALESCE(e.kind, dl.kind) AS kind,
       e.calls, e.executed, e.replayed, e.conflicts, e.in_flight, e.waits, e.renewed,
       e.failed_final, e.leases, e.takeovers, e.stale_tokens, e.retries,
       e.outbox_emitted, e.outbox_acked, e.inbox_duplicates, e.cleanup_deleted, e.stats_reset,
       COALESCE(dl.dead_letters, 0) AS dead_letters, dl.oldest_age AS oldest_dead_letter_age
  FROM @extschema@.idem_stats_entries() e
  FULL JOIN (
        SELECT db.oid AS dbid, x.kind, x.name, x.dead_letters, x.oldest_age
          FROM pg_catalog.pg_database db,
               (SELECT 'topic'::pg_catalog.text AS kind, o.topic::pg_catalog.text AS name,
                       pg_catalog.count(*) AS dead_letters,
                       pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(o.dead_at) AS oldest_age
                  FROM idem_internal.idem_outbox_dead o GROUP BY o.topic
                UNION ALL
                SELECT 'consumer', f.consumer::pg_catalog.text, pg_catalog.count(*),
                       pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(f.dead_at)
                  FROM idem_internal.idem_inbox_failure f WHERE f.dead_at IS NOT NULL GROUP BY f.consumer) x
         WHERE db.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) dl
    ON dl.dbid OPERATOR(pg_catalog.=) e.dbid AND dl.kind OPERATOR(pg_catalog.=) e.kind
   AND dl.name OPERATOR(pg_catalog.=) e.operation
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) COALESCE(e.dbid, dl.dbid);

COMMENT ON VIEW @extschema@.idem_stats IS
    'idem: counters per (database, kind, name) since the last idem_stats_reset(); kind is operation, topic or consumer; committed work only for what calls write; dead letters of this database''s topics and consumers';

REVOKE ALL ON @extschema@.idem_stats FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_stats TO pg_monitor;

-- ---------------------------------------------------------------------------
-- idem_health (SECURITY DEFINER, called by monitors): a SQL-standard body.
-- ---------------------------------------------------------------------------
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
COMMENT ON FUNCTION @extschema@.idem_health() IS
    'idem: backlog, PROCESSING records, outbox and inbox (lease lapses, dead letters), disk use, the cleanup worker''s last round, operations refusing reuse without an audit period, who could plant functions in idem''s schema, and tasks whose outcome is uncertain (those past reconcile_within wait for an operator), for this database';
REVOKE ALL ON FUNCTION @extschema@.idem_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_health() TO pg_monitor;

-- ===========================================================================
-- Sequences across a promotion
-- ===========================================================================

-- ---------------------------------------------------------------------------
-- No sequence value twice across a promotion.  idem hands values of its
-- sequences out (message ids an inbox keeps, fencing tokens a cut-off
-- worker holds, order ids and numbers, task ids); a standby promoted after
-- asynchronous replication has only the values it replayed and would hand
-- out again those the old primary drew since.  So the first draw on a new
-- timeline moves each idem sequence 2^36 ahead, and idem_timeline_seq
-- records the timeline that was done for (sequence.c).  Marked now with the
-- current timeline: only a later one moves the sequences.
-- ---------------------------------------------------------------------------
CREATE SEQUENCE idem_internal.idem_timeline_seq MINVALUE 0 START 0;

COMMENT ON SEQUENCE idem_internal.idem_timeline_seq IS
    'idem: the timeline idem''s sequences were last moved ahead for (a new one moves them 2^36 on its first draw)';

REVOKE ALL ON SEQUENCE idem_internal.idem_timeline_seq FROM PUBLIC;

CREATE FUNCTION idem_internal.idem_timeline_mark()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_timeline_mark'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION idem_internal.idem_timeline_mark() IS
    'idem: record the current timeline in idem_timeline_seq without moving the sequences (CREATE EXTENSION, the update to 1.12)';

REVOKE ALL ON FUNCTION idem_internal.idem_timeline_mark() FROM PUBLIC;

SELECT idem_internal.idem_timeline_mark();

-- ===========================================================================
-- Grants
-- ===========================================================================

-- Grant or revoke a kind's privileges; the checks by OID.  The GRANT itself
-- names the object as it is called now (a GRANT runs nothing).
CREATE FUNCTION idem_internal.idem_grant_kind(role regrole, kind text, grant_them boolean)
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

-- (PUBLIC keeps EXECUTE on idem_grant_kind: it runs with the caller's
-- rights, so it can grant only what the caller could; idem_grant and
-- idem_revoke, which a granting role is given, call it.)
COMMENT ON FUNCTION idem_internal.idem_grant_kind(regrole, text, boolean) IS
    'idem: for idem_grant and idem_revoke';

-- ---------------------------------------------------------------------------
-- The privileges of each kind of user, as OIDs bound when this script runs.
-- ---------------------------------------------------------------------------
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
    'idem: the privileges idem_grant gives one kind of user (app, worker, publisher, consumer, monitor, operator)';

CREATE FUNCTION @extschema@.idem_grant(role regrole, kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT g.privilege, g.object FROM idem_internal.idem_grant_kind(role, kind, true) g;
END;
COMMENT ON FUNCTION @extschema@.idem_grant(regrole, text) IS
    'idem: grant role what one kind of idem user needs: app, worker, publisher, consumer, monitor or operator';
REVOKE ALL ON FUNCTION @extschema@.idem_grant(regrole, text) FROM PUBLIC;

CREATE FUNCTION @extschema@.idem_revoke(role regrole, kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT g.privilege, g.object FROM idem_internal.idem_grant_kind(role, kind, false) g;
END;
COMMENT ON FUNCTION @extschema@.idem_revoke(regrole, text) IS
    'idem: revoke from role what idem_grant gave it for one kind (its schema USAGE stays)';
REVOKE ALL ON FUNCTION @extschema@.idem_revoke(regrole, text) FROM PUBLIC;

-- ===========================================================================
-- Citus
-- ===========================================================================

-- ---------------------------------------------------------------------------
-- idem_distribute() spreads idem over a Citus cluster: idempotency_record and
-- purchase_order by owner_id, co-located, idem_inbox by consumer, and every
-- function that takes an owner (or a consumer) delegated by it, so that a call
-- through the coordinator runs on the node that holds the owner's shard.  The
-- outbox stays a table of each node: a message commits with the transaction
-- that emitted it, on the node where it ran.
--
-- Citus wants the distribution column in every primary key and unique
-- constraint: the keys become (owner_id, id) and (owner_id, order_no); the
-- scope constraint (owner_id, operation, idempotency_key) already has it.  The
-- extension's tables on each node are that node's own (Citus does not create
-- the tables of an extension), so idem_distribute_node() runs on every node.
-- ---------------------------------------------------------------------------

-- This node's part: the keys, an index of tasks by id, and idem's sequences
-- in a range of this node's
-- own (group g > 0 draws from [g * 2^48 + 1, (g + 1) * 2^48 - 1], as Citus
-- does for the sequences of distributed tables), so that ids, order numbers,
-- message ids and fencing tokens stay unique across nodes.  Revoked from
-- PUBLIC; its DDL needs the tables' owner.
CREATE FUNCTION idem_internal.idem_distribute_node()
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

COMMENT ON FUNCTION idem_internal.idem_distribute_node() IS
    'idem_distribute()''s part on each node: keys with the distribution column, sequences in this node''s range';

-- Run once on the Citus coordinator, as a superuser; running it again
-- changes nothing.
CREATE FUNCTION @extschema@.idem_distribute()
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

COMMENT ON FUNCTION @extschema@.idem_distribute() IS
    'distribute idem over a Citus cluster by owner (run once, on the coordinator, as a superuser)';

REVOKE ALL ON FUNCTION idem_internal.idem_distribute_node() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_distribute() FROM PUBLIC;

-- The cleanup of a Citus cluster runs on each worker node: there it calls
-- this one, in idem_internal, not the one in the extension's schema.
CREATE FUNCTION idem_internal.idem_cleanup_node(batch_size integer, max_batches integer)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_cleanup_expired'
LANGUAGE C VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON FUNCTION idem_internal.idem_cleanup_node(integer, integer) FROM PUBLIC;

COMMENT ON FUNCTION idem_internal.idem_cleanup_node(integer, integer) IS
    'idem: idem_cleanup_expired on one Citus worker node (the coordinator''s cleanup calls it there)';

-- the entry points delegated to the node of their first argument's shard,
-- with the table they go with: OIDs bound here
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

REVOKE ALL ON FUNCTION idem_internal.idem_delegated_functions() FROM PUBLIC;

-- ===========================================================================
-- Default privileges
-- ===========================================================================

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