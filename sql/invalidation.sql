--
-- A backend keeps idem's catalog (tables, layouts, result types) and the
-- handlers it checked until one of them changes: a temporary table or an
-- unrelated function of the session leaves them be, a changed handler or
-- result type is read again in the same backend.
--
\set SHOW_CONTEXT never
CREATE FUNCTION inval_handler(request jsonb) RETURNS idem_result LANGUAGE sql
    AS $$ SELECT ROW(201, json_build_object('v', 1), NULL, NULL)::idem_result $$;
SELECT replayed, body FROM idem_run(1, 'INVAL', 'inval-key-000000001', '{}', 'inval_handler(jsonb)');

-- a temporary table and a function of the session's own: the same answers
CREATE TEMP TABLE inval_scratch (id int);
CREATE FUNCTION pg_temp.inval_other() RETURNS int LANGUAGE sql AS 'SELECT 1';
SELECT replayed, body FROM idem_run(1, 'INVAL', 'inval-key-000000001', '{}', 'inval_handler(jsonb)');
SELECT replayed, body FROM idem_run(1, 'INVAL', 'inval-key-000000002', '{}', 'inval_handler(jsonb)');
SELECT replayed FROM idem_create_order(1, 'inval-order-0000001', 7, 1);

-- the handler replaced: its new body runs for a new key
CREATE OR REPLACE FUNCTION inval_handler(request jsonb) RETURNS idem_result LANGUAGE sql
    AS $$ SELECT ROW(201, json_build_object('v', 2), NULL, NULL)::idem_result $$;
SELECT replayed, body FROM idem_run(1, 'INVAL', 'inval-key-000000003', '{}', 'inval_handler(jsonb)');

-- dropped and created again as something else: checked again (42883)
DROP FUNCTION inval_handler(jsonb);
CREATE FUNCTION inval_handler(request jsonb) RETURNS int LANGUAGE sql AS 'SELECT 1';
SELECT replayed FROM idem_run(1, 'INVAL', 'inval-key-000000004', '{}', 'inval_handler(jsonb)');
DROP FUNCTION inval_handler(jsonb);

-- idem_order_outcome altered: the backend that cached it reads the type
-- again and refuses it (55000, nothing written), then takes it back
ALTER TYPE idem_order_outcome ADD ATTRIBUTE note text;
SELECT * FROM idem_create_order(1, 'inval-order-0000002', 7, 1);
ALTER TYPE idem_order_outcome DROP ATTRIBUTE note;
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE idempotency_key = 'inval-order-0000002';
SELECT order_id IS NOT NULL AS has_order, status, http_status, replayed FROM idem_create_order(1, 'inval-order-0000001', 7, 1);

DROP TABLE inval_scratch;
DELETE FROM idem_internal.purchase_order WHERE id IN
    (SELECT resource_id FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'inval-order-%');
DELETE FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'inval-%';
