/* idem--1.9--1.10.sql */
\echo Use "ALTER EXTENSION idem UPDATE TO '1.10'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Per-operation policy, kept in the database: two operations with other
-- needs (a 24-hour order key, a 30-day payment key) side by side.  A NULL
-- column is "the GUC".  Precedence: a call's own argument (ttl) > the
-- operation's policy > the GUC > the built-in default.  Each backend reads
-- the table once and again only after it changed (idem_set_policy,
-- idem_drop_policy and any other write of it invalidate every backend's
-- copy at commit): no table lookup on a call's path.
-- ---------------------------------------------------------------------------
CREATE TABLE @extschema@.idem_policy (
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
    updated_at    timestamptz NOT NULL DEFAULT pg_catalog.now()
);
REVOKE ALL ON @extschema@.idem_policy FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_policy', '');

-- any write of the table invalidates every backend's copy at commit
CREATE FUNCTION @extschema@.idem_policy_changed() RETURNS trigger
LANGUAGE C AS 'MODULE_PATHNAME', 'idem_policy_changed';
REVOKE ALL ON FUNCTION @extschema@.idem_policy_changed() FROM PUBLIC;
CREATE TRIGGER idem_policy_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON @extschema@.idem_policy FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_policy_changed();

-- what an omitted argument of idem_set_policy defaults to: "leave it
-- unchanged", told apart from an explicit NULL ("back to the GUC")
CREATE FUNCTION @extschema@.idem_policy_unchanged_interval() RETURNS interval
LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'idem_policy_unchanged';
CREATE FUNCTION @extschema@.idem_policy_unchanged_integer() RETURNS integer
LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'idem_policy_unchanged';
CREATE FUNCTION @extschema@.idem_policy_unchanged_textarray() RETURNS text[]
LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'idem_policy_unchanged';
CREATE FUNCTION @extschema@.idem_policy_unchanged_text() RETURNS text
LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'idem_policy_unchanged';
CREATE FUNCTION @extschema@.idem_policy_unchanged_boolean() RETURNS boolean
LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'idem_policy_unchanged';

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
    redact text[] DEFAULT @extschema@.idem_policy_unchanged_textarray(),
    key_format text DEFAULT @extschema@.idem_policy_unchanged_text(),
    reject_weak_keys boolean DEFAULT @extschema@.idem_policy_unchanged_boolean())
RETURNS @extschema@.idem_policy
LANGUAGE C VOLATILE CALLED ON NULL INPUT AS 'MODULE_PATHNAME', 'idem_set_policy';

-- idem_drop_policy(operation): true if it had one
CREATE FUNCTION @extschema@.idem_drop_policy(operation text) RETURNS boolean
LANGUAGE C VOLATILE STRICT AS 'MODULE_PATHNAME', 'idem_drop_policy';

-- the markers return NULL and stay callable by PUBLIC: a caller's
-- idem_set_policy fails on its own check (42501), with its own message
REVOKE ALL ON FUNCTION @extschema@.idem_set_policy(text, interval, interval, interval, integer, interval, interval, text[], text, boolean),
    @extschema@.idem_drop_policy(text) FROM PUBLIC;

-- the policies, readable by pg_monitor
CREATE VIEW @extschema@.idem_policies AS
    SELECT operation, ttl, failure_ttl, wait_timeout, max_attempts, retry_base, retry_max,
           redact, key_format, reject_weak_keys, updated_at
    FROM @extschema@.idem_policy;
REVOKE ALL ON @extschema@.idem_policies FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_policies TO pg_monitor;
