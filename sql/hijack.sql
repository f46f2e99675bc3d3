--
-- An operator planted before CREATE EXTENSION must never run (issue D1).
-- In PostgreSQL 15 a database's owner owns its public schema; there an
-- exact =(varchar, varchar) would win over pg_catalog's text = text for
-- any unqualified "status IN (...)" of idem's scripts, and idem writes its
-- records as the extension's owner, a superuser.  Since 1.3 the status
-- constraint names pg_catalog's operator, whatever the search_path, and the
-- update from every released version repairs an older install.
--
\set SHOW_CONTEXT never
\set su :USER
\set regress_db :DBNAME
CREATE ROLE regress_idem_dbo LOGIN;
CREATE DATABASE regress_idem_planted OWNER regress_idem_dbo;
\c regress_idem_planted regress_idem_dbo
CREATE FUNCTION public.pwn_eq(a varchar, b varchar) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        ALTER ROLE regress_idem_dbo SUPERUSER;
    END IF;
    RETURN a::text = b::text;
END $$;
CREATE OPERATOR public.= (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = public.pwn_eq);
\c - :su
-- a fresh install: calls that write records (an order, a generic result)
CREATE EXTENSION idem;
SELECT replayed FROM idem_create_order(1, 'planted-operator-0001', 1, 1);
BEGIN;
SELECT replayed FROM idem_begin(1, 'PING', 'planted-operator-0002', '{}');
SELECT idem_finish(1, 'PING', 'planted-operator-0002', 422, '{}');
COMMIT;
SELECT rolsuper AS dbo_is_superuser FROM pg_roles WHERE rolname = 'regress_idem_dbo';
SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'ck_idempotency_status';
-- an install made at 1.0 with the operator planted, used, then updated
DROP EXTENSION idem;
CREATE EXTENSION idem VERSION '1.0';
SELECT count(*) AS planted_operator_in_constraint FROM pg_depend d
JOIN pg_constraint c ON d.classid = 'pg_constraint'::regclass AND d.objid = c.oid
WHERE c.conname = 'ck_idempotency_status' AND d.refclassid = 'pg_operator'::regclass
  AND d.refobjid = 'public.=(varchar, varchar)'::regoperator;
-- the 1.0 script names pg_catalog's operator too: a record written at 1.0
SELECT replayed FROM idem_create_order(1, 'planted-operator-0004', 1, 1);
SELECT rolsuper AS dbo_is_superuser FROM pg_roles WHERE rolname = 'regress_idem_dbo';
ALTER EXTENSION idem UPDATE;
SELECT count(*) AS planted_operator_in_constraint FROM pg_depend d
JOIN pg_constraint c ON d.classid = 'pg_constraint'::regclass AND d.objid = c.oid
WHERE c.conname = 'ck_idempotency_status' AND d.refclassid = 'pg_operator'::regclass
  AND d.refobjid = 'public.=(varchar, varchar)'::regoperator;
SELECT replayed FROM idem_create_order(1, 'planted-operator-0003', 1, 1);
SELECT rolsuper AS dbo_is_superuser FROM pg_roles WHERE rolname = 'regress_idem_dbo';
\c :regress_db :su
DROP DATABASE regress_idem_planted;
DROP ROLE regress_idem_dbo;
