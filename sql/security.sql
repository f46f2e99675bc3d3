--
-- Privileges, search_path hijacking, and an extension in an odd schema
--
\set SHOW_CONTEXT never

-- The tables are not PUBLIC's; the writing functions need an explicit GRANT.
CREATE ROLE regress_idem_app LOGIN;
SET ROLE regress_idem_app;
SELECT * FROM idem_internal.idempotency_record;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
INSERT INTO idem_internal.purchase_order (order_no, owner_id, sku_id, quantity, status) VALUES ('x', 1, 1, 1, 'x');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM idem_create_order(1, 'no-grant-yet-000001', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_cleanup_expired();
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- hashing is for everyone
SELECT idem_request_hash('{"a":1}') = encode(sha256('{"a":1}'), 'hex') AS can_hash;
RESET ROLE;

GRANT EXECUTE ON FUNCTION idem_create_order(bigint, text, bigint, integer) TO regress_idem_app;
SET ROLE regress_idem_app;
SELECT order_no IS NOT NULL AS created, replayed FROM idem_create_order(200, 'granted-call-0000001', 1, 1);
SELECT replayed FROM idem_create_order(200, 'granted-call-0000001', 1, 1);
SELECT count(*) FROM idem_internal.purchase_order;	-- still no direct access
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;

-- idem_create_order takes its owner's rights only for its own work: what
-- its writes fire (a trigger here) runs as the owner under search_path
-- pg_catalog, pg_temp; the caller is the caller again afterwards, and after
-- an error caught in a subtransaction, whether it struck during a replay
-- (IK001) or during a write (the trigger refusing sku 13).
CREATE TABLE public.write_context (is_owner boolean, path text);
CREATE FUNCTION public.record_write_context() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.sku_id = 13 THEN
        RAISE EXCEPTION 'sku 13 refused';
    END IF;
    INSERT INTO public.write_context
    SELECT current_user = (SELECT r.rolname FROM pg_catalog.pg_extension e
                           JOIN pg_catalog.pg_roles r ON r.oid = e.extowner
                           WHERE e.extname = 'idem'),
           pg_catalog.current_setting('search_path');
    RETURN NULL;
END $$;
CREATE TRIGGER record_write_context AFTER INSERT ON idem_internal.purchase_order
    FOR EACH ROW EXECUTE FUNCTION public.record_write_context();
SET ROLE regress_idem_app;
SET search_path = public, pg_catalog;
SELECT replayed FROM idem_create_order(204, 'write-context-000001', 1, 1);
SELECT current_user AS caller, current_setting('search_path') AS caller_path;
DO $$
BEGIN
    PERFORM idem_create_order(204, 'write-context-000001', 2, 1);
EXCEPTION WHEN SQLSTATE 'IK001' THEN
    RAISE NOTICE 'IK001 caught; current_user %, search_path %',
        current_user, current_setting('search_path');
END $$;
DO $$
BEGIN
    PERFORM idem_create_order(204, 'write-context-000002', 13, 1);
EXCEPTION WHEN raise_exception THEN
    RAISE NOTICE '% caught; current_user %, search_path %',
        SQLERRM, current_user, current_setting('search_path');
END $$;
RESET search_path;
RESET ROLE;
SELECT is_owner, path FROM public.write_context;
SELECT count(*) AS refused_records FROM idem_internal.idempotency_record WHERE idempotency_key = 'write-context-000002';
DROP TRIGGER record_write_context ON idem_internal.purchase_order;
DROP TABLE public.write_context;
DROP FUNCTION public.record_write_context();

-- Nothing on the caller's search_path changes what idem runs: not a
-- shadowing now() or "=" operator, nor temp tables named like idem's.
CREATE SCHEMA regress_evil;
CREATE FUNCTION regress_evil.now() RETURNS timestamptz
    LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked now()'; END$$;
CREATE FUNCTION regress_evil.int8eq_evil(bigint, bigint) RETURNS boolean
    LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked ='; END$$;
CREATE OPERATOR regress_evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = regress_evil.int8eq_evil);
CREATE FUNCTION regress_evil.lpad(text, integer, text) RETURNS text
    LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked lpad()'; END$$;
CREATE TEMP TABLE idempotency_record (id int);
CREATE TEMP TABLE purchase_order (id int);
SET search_path = pg_temp, regress_evil, public, pg_catalog;
SELECT order_no IS NOT NULL AS created, replayed FROM public.idem_create_order(201, 'hijack-attempt-00001', 1, 1);
SELECT replayed FROM public.idem_create_order(201, 'hijack-attempt-00001', 1, 1);
SELECT public.idem_cleanup_expired() >= 0 AS cleanup_ran;
RESET search_path;
DROP TABLE pg_temp.idempotency_record, pg_temp.purchase_order;
SELECT count(*) AS real_records FROM idem_internal.idempotency_record WHERE owner_id = 201;
DROP SCHEMA regress_evil CASCADE;

-- Dropped and created again in the same session: the kept plans follow.
DROP EXTENSION idem;
CREATE EXTENSION idem;
SELECT order_id, replayed FROM idem_create_order(202, 'after-recreate-00001', 1, 1);

-- An extension schema whose name needs quoting (PostgreSQL refuses quotes
-- and $ in @extschema@ names), in the same backend.
DROP EXTENSION idem;
CREATE SCHEMA "Idem Odd Schema";
CREATE EXTENSION idem SCHEMA "Idem Odd Schema";
SELECT order_id, order_no, replayed FROM "Idem Odd Schema".idem_create_order(203, 'odd-schema-000000001', 1, 1);
SELECT replayed FROM "Idem Odd Schema".idem_create_order(203, 'odd-schema-000000001', 1, 1);
UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 hour';
SELECT "Idem Odd Schema".idem_cleanup_expired() AS deleted;
DROP EXTENSION idem;
DROP SCHEMA "Idem Odd Schema";
CREATE EXTENSION idem;

DROP OWNED BY regress_idem_app;
DROP ROLE regress_idem_app;
