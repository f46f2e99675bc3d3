/* idem--1.0--1.1.sql: the cleanup background worker's status */

\echo Use "ALTER EXTENSION idem UPDATE TO '1.1'" to load this file. \quit

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
CREATE FUNCTION @extschema@.idem_cleanup_worker_notice() RETURNS void
AS 'MODULE_PATHNAME', 'idem_cleanup_worker_notice'
LANGUAGE C;
SELECT @extschema@.idem_cleanup_worker_notice();
DROP FUNCTION @extschema@.idem_cleanup_worker_notice();
