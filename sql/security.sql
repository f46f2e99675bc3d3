--
-- Privileges, search_path hijacking, and an extension in an odd schema
--
\set SHOW_CONTEXT never

-- The tables are not PUBLIC's; the writing functions need an explicit GRANT.
CREATE ROLE regress_idem_app LOGIN;
SET ROLE regress_idem_app;
SELECT * FROM idempotency_record;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
INSERT INTO purchase_order (order_no, owner_id, sku_id, quantity, status) VALUES ('x', 1, 1, 1, 'x');
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
SELECT count(*) FROM purchase_order;	-- still no direct access
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;

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
SELECT count(*) AS real_records FROM idempotency_record WHERE owner_id = 201;
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
UPDATE "Idem Odd Schema".idempotency_record SET expires_at = now() - interval '1 hour';
SELECT "Idem Odd Schema".idem_cleanup_expired() AS deleted;
DROP EXTENSION idem;
DROP SCHEMA "Idem Odd Schema";
CREATE EXTENSION idem;

DROP OWNED BY regress_idem_app;
DROP ROLE regress_idem_app;
