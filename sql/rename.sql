--
-- Renaming schemas never points idem at a look-alike (issue D2): idem finds
-- its tables by OID in its schema, found by OID too, and runs no statement
-- that names them, so a backend that already ran every function keeps
-- working on the real tables after ALTER SCHEMA ... RENAME (from 1.13 they
-- are in idem_internal, which no other role can rename), and a table
-- renamed into the old name, with triggers of its own, is never touched.
--
\set SHOW_CONTEXT never
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
SELECT 500, 'PING', 'rename-warm-' || lpad(g::text, 8, '0'), repeat('0', 64), 'SUCCEEDED', now() - interval '1 hour'
FROM generate_series(1, 3) g;
-- warm this backend: every entry point once
-- (at least ours: under valgrind, short-lived records of earlier tests may have expired too)
SELECT idem_cleanup_expired() >= 3 AS deleted_ours;
SELECT replayed FROM idem_create_order(500, 'rename-warm-key-00001', 1, 1);
BEGIN;
SELECT replayed FROM idem_begin(500, 'PING', 'rename-warm-key-00002', '{}');
SELECT idem_finish(500, 'PING', 'rename-warm-key-00002', 200, '{}');
COMMIT;

-- a look-alike schema with idem's table names and triggers that record
-- whatever reaches them
CREATE SCHEMA regress_trap;
CREATE TABLE regress_trap.fired (what text, who name);
CREATE FUNCTION regress_trap.fire() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_trap.fired VALUES (TG_OP || ' ' || TG_LEVEL, current_user);
    RETURN NULL;
END $$;
CREATE SCHEMA regress_lookalike;
CREATE TABLE regress_lookalike.idempotency_record (LIKE idem_internal.idempotency_record INCLUDING ALL);
CREATE TABLE regress_lookalike.purchase_order (LIKE idem_internal.purchase_order INCLUDING ALL);
INSERT INTO regress_lookalike.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
VALUES (501, 'PING', 'rename-lookalike-0001', repeat('0', 64), 'SUCCEEDED', now() - interval '1 hour');
CREATE TRIGGER trap_stmt BEFORE INSERT OR UPDATE OR DELETE ON regress_lookalike.idempotency_record
    FOR EACH STATEMENT EXECUTE FUNCTION regress_trap.fire();
CREATE TRIGGER trap_row BEFORE INSERT OR UPDATE OR DELETE ON regress_lookalike.idempotency_record
    FOR EACH ROW EXECUTE FUNCTION regress_trap.fire();
CREATE TRIGGER trap_order BEFORE INSERT ON regress_lookalike.purchase_order
    FOR EACH ROW EXECUTE FUNCTION regress_trap.fire();
-- expired records in the real table
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
SELECT 501, 'PING', 'rename-real-' || lpad(g::text, 8, '0'), repeat('0', 64), 'SUCCEEDED', now() - interval '1 hour'
FROM generate_series(1, 3) g;

-- the swap
ALTER SCHEMA public RENAME TO regress_real;
ALTER SCHEMA regress_lookalike RENAME TO public;
SELECT regress_real.idem_cleanup_expired() AS deleted;
SELECT replayed FROM regress_real.idem_create_order(501, 'rename-swapped-key-01', 1, 1);
SELECT replayed FROM regress_real.idem_create_order(500, 'rename-warm-key-00001', 1, 1);
BEGIN;
SELECT replayed FROM regress_real.idem_begin(501, 'PING', 'rename-swapped-key-02', '{}');
SELECT regress_real.idem_finish(501, 'PING', 'rename-swapped-key-02', 200, '{}');
COMMIT;
SELECT * FROM regress_trap.fired;
SELECT count(*) AS lookalike_records FROM public.idempotency_record;
SELECT count(*) AS lookalike_orders FROM public.purchase_order;
SELECT count(*) AS real_expired_left FROM idem_internal.idempotency_record WHERE expires_at < now();
SELECT count(*) AS real_new_records FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'rename-swapped-%';

-- and back
ALTER SCHEMA public RENAME TO regress_lookalike;
ALTER SCHEMA regress_real RENAME TO public;
SELECT replayed FROM idem_create_order(501, 'rename-swapped-key-01', 1, 1);
DROP SCHEMA regress_lookalike CASCADE;
DROP SCHEMA regress_trap CASCADE;
