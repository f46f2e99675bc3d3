--
-- idem_distribute() on a server without Citus: a clear error (0A000) and
-- nothing changed; only a superuser may run it.  The Citus stage
-- (test/citus/run.sh) tests it on a cluster.
--
CREATE FUNCTION pg_temp.keys() RETURNS TABLE (conname name, def text)
LANGUAGE sql AS $$
SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
 WHERE conrelid IN ('idem_internal.idempotency_record'::regclass, 'idem_internal.purchase_order'::regclass)
   AND contype IN ('p', 'u')
 ORDER BY conname
$$;
CREATE TEMP TABLE keys_before AS SELECT * FROM pg_temp.keys();
SELECT * FROM keys_before;
SELECT last_value FROM idem_internal.idempotency_record_id_seq \gset before_

\set VERBOSITY default
SELECT idem_distribute();
\set VERBOSITY terse
SELECT idem_distribute();
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- nothing changed: the keys, the sequences' ranges
SELECT count(*) AS changed_keys FROM
  ((SELECT * FROM keys_before EXCEPT SELECT * FROM pg_temp.keys())
   UNION ALL (SELECT * FROM pg_temp.keys() EXCEPT SELECT * FROM keys_before)) d;
SELECT seqmin, seqmax FROM pg_sequence WHERE seqrelid = 'idem_internal.idempotency_record_id_seq'::regclass;
SELECT last_value = :before_last_value AS same_last_value FROM idem_internal.idempotency_record_id_seq;

-- a role that is not a superuser, even granted EXECUTE, may not
CREATE ROLE regress_idem_distributor;
GRANT EXECUTE ON FUNCTION idem_distribute() TO regress_idem_distributor;
SET ROLE regress_idem_distributor;
SELECT idem_distribute();
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;
-- and without a grant, not at all
SELECT has_function_privilege('public', 'idem_distribute()', 'EXECUTE') AS public_may,
       has_function_privilege('public', 'idem_internal.idem_distribute_node()', 'EXECUTE') AS public_may_node;
REVOKE EXECUTE ON FUNCTION idem_distribute() FROM regress_idem_distributor;
DROP ROLE regress_idem_distributor;
\set VERBOSITY default
