--
-- idem_create_order writes a new key's rows without planning a statement
-- (src/rowwrite.c).  What an INSERT statement would do still happens:
-- constraints, triggers, foreign keys; and a table altered beyond what
-- idem writes is refused, in the same backend that cached its layout.
--
\set SHOW_CONTEXT never

-- The same key three times in one statement (g * 0: three calls, not one
-- call's result rescanned): the first call executes, the next two replay its
-- uncommitted order.
SELECT g, order_id IS NOT NULL AS has_order, replayed
FROM generate_series(1, 3) g, LATERAL idem_create_order(400 + g * 0, 'same-statement-key-01', 5, 1)
ORDER BY g;
SELECT count(DISTINCT order_id) AS order_ids
FROM generate_series(1, 3) g, LATERAL idem_create_order(400 + g * 0, 'same-statement-key-01', 5, 1);
SELECT count(*) AS orders FROM idem_internal.purchase_order WHERE owner_id = 400;

-- A new key and a renewed expired key write the same rows: the finished
-- record holds the order as its response.
SELECT order_id IS NOT NULL AS executed, replayed
FROM idem_create_order(401, 'fresh-shape-key-0001', 6, 2);
SELECT replayed FROM idem_create_order(401, 'renew-shape-key-0001', 6, 2);
UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 second'
WHERE owner_id = 401 AND idempotency_key = 'renew-shape-key-0001';
SELECT replayed FROM idem_create_order(401, 'renew-shape-key-0001', 6, 3);
SELECT r.idempotency_key, r.operation, r.status, r.http_status,
       r.request_hash = idem_request_hash(jsonb_build_object('sku', o.sku_id, 'qty', o.quantity)) AS hash_ok,
       r.response_json = jsonb_build_object('orderId', o.id, 'orderNo', o.order_no, 'status', 'CREATED') AS response_ok,
       r.resource_id = o.id AS resource_ok,
       o.order_no = 'ORD-' || lpad(o.id::text, 12, '0') AS order_no_ok,
       o.status, o.quantity, o.owner_id,
       r.created_at = r.updated_at AND o.created_at = r.created_at AS times_ok,
       r.expires_at - r.created_at AS ttl
FROM idem_internal.idempotency_record r JOIN idem_internal.purchase_order o ON o.id = r.resource_id
WHERE r.owner_id = 401 ORDER BY r.idempotency_key;

-- Row triggers fire: BEFORE can change the order, and the first answer and
-- every replay show the order as stored (the record's response is built from
-- the stored row); AFTER sees the row.  They run inside idem_create_order,
-- so under its search_path: they qualify their names.
CREATE TABLE order_audit (order_id bigint, order_no text, status text);
CREATE FUNCTION order_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.order_audit VALUES (NEW.id, NEW.order_no, NEW.status);
    RETURN NULL;
END $$;
CREATE FUNCTION order_flag_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.quantity = 42 THEN
        NEW.status := 'FLAGGED';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER order_audit AFTER INSERT ON idem_internal.purchase_order
    FOR EACH ROW EXECUTE FUNCTION order_audit_row();
CREATE TRIGGER order_flag BEFORE INSERT ON idem_internal.purchase_order
    FOR EACH ROW EXECUTE FUNCTION order_flag_row();
SELECT status, replayed FROM idem_create_order(402, 'trigger-key-0000001', 7, 42);
SELECT status, replayed FROM idem_create_order(402, 'trigger-key-0000001', 7, 42);
SELECT r.response_json->>'status' AS stored_status, r.response_json->>'orderNo' = o.order_no AS stored_no
FROM idem_internal.idempotency_record r JOIN idem_internal.purchase_order o ON o.id = r.resource_id WHERE r.owner_id = 402;
SELECT a.order_no = o.order_no AS audited, a.status
FROM order_audit a JOIN idem_internal.purchase_order o ON o.id = a.order_id WHERE o.owner_id = 402;

-- Triggers read through a snapshot taken for the write, as a statement's
-- triggers do: a STABLE one sees the orders that earlier calls of the same
-- statement wrote (not the calling query's older snapshot).
CREATE FUNCTION order_seen_row() RETURNS trigger LANGUAGE plpgsql STABLE AS $$
BEGIN
    RAISE NOTICE 'order of qty % sees % earlier orders', NEW.quantity,
        (SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id = 406);
    RETURN NULL;
END $$;
CREATE TRIGGER order_seen AFTER INSERT ON idem_internal.purchase_order
    FOR EACH ROW WHEN (NEW.owner_id = 406) EXECUTE FUNCTION order_seen_row();
SELECT g, replayed
FROM generate_series(1, 3) g, LATERAL idem_create_order(406, 'trigger-snapshot-0' || g, 1, g)
ORDER BY g;
DROP TRIGGER order_seen ON idem_internal.purchase_order;

-- An AFTER trigger that fails takes the whole call with it.
CREATE FUNCTION order_refuse_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'orders of sku % are closed', NEW.sku_id USING ERRCODE = 'P0001';
END $$;
CREATE TRIGGER order_refuse AFTER INSERT ON idem_internal.purchase_order
    FOR EACH ROW WHEN (NEW.sku_id = 13) EXECUTE FUNCTION order_refuse_row();
SELECT * FROM idem_create_order(402, 'trigger-key-0000002', 13, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE idempotency_key = 'trigger-key-0000002';
SELECT count(*) AS audited FROM order_audit a JOIN idem_internal.purchase_order o ON o.id = a.order_id
WHERE o.sku_id = 13;
DROP TRIGGER order_refuse ON idem_internal.purchase_order;
DROP TRIGGER order_flag ON idem_internal.purchase_order;
DROP TRIGGER order_audit ON idem_internal.purchase_order;

-- A foreign key added by the application is checked: 23503, nothing written.
CREATE TABLE sku (id bigint PRIMARY KEY);
INSERT INTO sku VALUES (8);
ALTER TABLE idem_internal.purchase_order ADD CONSTRAINT order_sku_fk
    FOREIGN KEY (sku_id) REFERENCES sku (id) NOT VALID;
SELECT replayed FROM idem_create_order(403, 'foreign-key-0000001', 8, 1);
SELECT * FROM idem_create_order(403, 'foreign-key-0000002', 9, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE owner_id = 403;
ALTER TABLE idem_internal.purchase_order DROP CONSTRAINT order_sku_fk;

-- A CHECK constraint added after calls in this backend is checked: 23514.
ALTER TABLE idem_internal.purchase_order ADD CONSTRAINT order_small CHECK (quantity <= 50) NOT VALID;
\set VERBOSITY terse
SELECT * FROM idem_create_order(403, 'check-constraint-001', 8, 60);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE idempotency_key = 'check-constraint-001';
ALTER TABLE idem_internal.purchase_order DROP CONSTRAINT order_small;

-- A column idem does not know: refused (55000), nothing written; dropped
-- again, calls work, with the dropped column's slot left empty.
ALTER TABLE idem_internal.purchase_order ADD COLUMN note text NOT NULL DEFAULT 'none';
SELECT * FROM idem_create_order(404, 'altered-table-00001', 8, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE owner_id = 404;
ALTER TABLE idem_internal.purchase_order DROP COLUMN note;
SELECT replayed FROM idem_create_order(404, 'altered-table-00001', 8, 1);
SELECT replayed FROM idem_create_order(404, 'altered-table-00001', 8, 1);
-- a column too short for the keys idem accepts
ALTER TABLE idem_internal.idempotency_record ALTER COLUMN idempotency_key TYPE varchar(100);
SELECT * FROM idem_create_order(404, 'altered-table-00002', 8, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ALTER TABLE idem_internal.idempotency_record ALTER COLUMN idempotency_key TYPE varchar(128);
SELECT replayed FROM idem_create_order(404, 'altered-table-00002', 8, 1);

-- The arbiter must be what the protocol relies on: a valid, immediate unique
-- index on exactly (owner_id, operation, idempotency_key).  A partial one
-- would let one key execute once per status, an expression index compares
-- something else, a deferrable one decides only at commit, an invalid one is
-- not maintained: all refused
-- (55000), nothing written, through every entry point.
ALTER TABLE idem_internal.idempotency_record DROP CONSTRAINT uk_idempotency_scope;
CREATE UNIQUE INDEX uk_idempotency_scope ON idem_internal.idempotency_record (owner_id, operation, idempotency_key)
    WHERE status = 'PROCESSING';
SELECT * FROM idem_create_order(405, 'scope-index-key-0001', 8, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(405, 'DEBIT', 'scope-index-key-0001', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
DROP INDEX idem_internal.uk_idempotency_scope;
CREATE UNIQUE INDEX uk_idempotency_scope ON idem_internal.idempotency_record (owner_id, lower(operation), idempotency_key);
SELECT * FROM idem_create_order(405, 'scope-index-key-0001', 8, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
DROP INDEX idem_internal.uk_idempotency_scope;
ALTER TABLE idem_internal.idempotency_record ADD CONSTRAINT uk_idempotency_scope
    UNIQUE (owner_id, operation, idempotency_key) DEFERRABLE;
SELECT * FROM idem_create_order(405, 'scope-index-key-0001', 8, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ALTER TABLE idem_internal.idempotency_record DROP CONSTRAINT uk_idempotency_scope;
CREATE UNIQUE INDEX uk_idempotency_scope ON idem_internal.idempotency_record (owner_id, idempotency_key, operation);
SELECT * FROM idem_create_order(405, 'scope-index-key-0001', 8, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
DROP INDEX idem_internal.uk_idempotency_scope;
-- an invalid one: CREATE UNIQUE INDEX CONCURRENTLY that failed on duplicates
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
SELECT 405, 'DUP', 'duplicate-key-000001', repeat('0', 64), 'SUCCEEDED', now() + interval '1 hour'
FROM generate_series(1, 2);
CREATE UNIQUE INDEX CONCURRENTLY uk_idempotency_scope ON idem_internal.idempotency_record (owner_id, operation, idempotency_key);
SELECT indisvalid FROM pg_index WHERE indexrelid = 'idem_internal.uk_idempotency_scope'::regclass;
SELECT * FROM idem_create_order(405, 'scope-index-key-0001', 8, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
DROP INDEX idem_internal.uk_idempotency_scope;
DELETE FROM idem_internal.idempotency_record WHERE owner_id = 405 AND operation = 'DUP';
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE owner_id = 405;
-- put back as installed: calls work again
ALTER TABLE idem_internal.idempotency_record ADD CONSTRAINT uk_idempotency_scope
    UNIQUE (owner_id, operation, idempotency_key);
SELECT replayed FROM idem_create_order(405, 'scope-index-key-0001', 8, 1);
SELECT replayed FROM idem_create_order(405, 'scope-index-key-0001', 8, 1);

-- Past 10^12 orders the number keeps every digit: no two orders share one
-- (lpad would truncate 1000000000000 to the number of order 100000000000).
SELECT last_value AS saved_order_id FROM idem_internal.purchase_order_id_seq \gset
SELECT setval('idem_internal.purchase_order_id_seq', 999999999998);
SELECT order_no, replayed FROM idem_create_order(4060, 'wide-order-no-key-001', 1, 1);
SELECT order_no, replayed FROM idem_create_order(4060, 'wide-order-no-key-002', 1, 1);
SELECT order_no, replayed FROM idem_create_order(4060, 'wide-order-no-key-002', 1, 1);
SELECT order_no = 'ORD-' || id::text AS whole_id FROM idem_internal.purchase_order WHERE owner_id = 4060 ORDER BY id;
DELETE FROM idem_internal.purchase_order WHERE owner_id = 4060;
DELETE FROM idem_internal.idempotency_record WHERE owner_id = 4060;
SELECT setval('idem_internal.purchase_order_id_seq', :saved_order_id) = :saved_order_id AS restored;

DROP TABLE order_audit, sku;
DROP FUNCTION order_audit_row(), order_flag_row(), order_refuse_row(), order_seen_row();
