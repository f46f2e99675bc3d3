--
-- Triggers on idem's tables run as its owner, under search_path pg_catalog,
-- pg_temp: a name they do not qualify would resolve to the caller's
-- temporary table, whose own trigger would then run with the owner's
-- rights.  For a caller (not the owner) whose session has temporary tables,
-- idem refuses to fire user-defined triggers (0A000) and writes nothing.
--
\set SHOW_CONTEXT never
\set su :USER
\set regress_db :DBNAME
CREATE ROLE regress_idem_tmp LOGIN;
GRANT EXECUTE ON FUNCTION idem_create_order(bigint, text, bigint, integer) TO regress_idem_tmp;
CREATE SCHEMA regress_tmp_trap AUTHORIZATION regress_idem_tmp;
-- an administrator's audit trigger that forgot to qualify its table
CREATE TABLE public.order_log (order_id bigint, who name);
CREATE FUNCTION public.log_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO order_log VALUES (NEW.id, current_user);
    RETURN NULL;
END $$;
CREATE TRIGGER log_order AFTER INSERT ON idem_internal.purchase_order
    FOR EACH ROW EXECUTE FUNCTION public.log_order();

\c - regress_idem_tmp
-- the caller's trap: a temporary order_log whose trigger records who ran it
CREATE TABLE regress_tmp_trap.seen (who name, superuser boolean);
CREATE FUNCTION regress_tmp_trap.trap() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_tmp_trap.seen
    SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
    RETURN NULL;
END $$;
CREATE TEMP TABLE order_log (order_id bigint, who name);
CREATE TRIGGER trap AFTER INSERT ON order_log FOR EACH ROW EXECUTE FUNCTION regress_tmp_trap.trap();
SELECT * FROM idem_create_order(600, 'temp-trap-key-000001', 1, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS trap_fired FROM regress_tmp_trap.seen;
DROP TABLE pg_temp.order_log;

\c - :su
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE owner_id = 600;
-- a session of the same role without temporary tables is not refused (the
-- trigger then finds no order_log at all: it must qualify its names)
CREATE OR REPLACE FUNCTION public.log_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.order_log VALUES (NEW.id, current_user);
    RETURN NULL;
END $$;
\c - regress_idem_tmp
SELECT replayed FROM idem_create_order(600, 'temp-trap-key-000001', 1, 1);
\c - :su
SELECT who FROM public.order_log;
DROP TRIGGER log_order ON idem_internal.purchase_order;
DROP FUNCTION public.log_order();
DROP TABLE public.order_log;
DROP SCHEMA regress_tmp_trap CASCADE;
REVOKE EXECUTE ON FUNCTION idem_create_order(bigint, text, bigint, integer) FROM regress_idem_tmp;
DROP ROLE regress_idem_tmp;

--
-- The same for every other function that writes as the owner: the outbox's
-- fetch and acknowledgement (SQL functions), the emit, the generic API, the
-- long flows, the inbox and the cleanup.  An administrator's audit trigger
-- on each of idem's tables pins search_path = public and forgets to
-- qualify its table; a role with EXECUTE only creates a temporary table of
-- that name with a trigger of its own.  Each call is 0A000, the trap never
-- fires, nothing is written.
--
CREATE ROLE regress_idem_pub LOGIN;
CREATE SCHEMA regress_pub_trap AUTHORIZATION regress_idem_pub;
CREATE TABLE public.outbox_audit (tbl text, op text, who name);
CREATE FUNCTION public.audit_row() RETURNS trigger LANGUAGE plpgsql
SET search_path = public AS $$
BEGIN
    INSERT INTO outbox_audit VALUES (TG_TABLE_NAME, TG_OP, current_user);
    RETURN NULL;
END $$;
CREATE TRIGGER audit_row AFTER INSERT OR UPDATE OR DELETE ON idem_internal.idem_outbox
    FOR EACH ROW EXECUTE FUNCTION public.audit_row();
CREATE TRIGGER audit_row AFTER INSERT OR UPDATE OR DELETE ON idem_internal.idempotency_record
    FOR EACH ROW EXECUTE FUNCTION public.audit_row();
CREATE TRIGGER audit_row AFTER INSERT OR UPDATE OR DELETE ON idem_internal.idem_inbox
    FOR EACH ROW EXECUTE FUNCTION public.audit_row();
GRANT EXECUTE ON FUNCTION idem_outbox_fetch(text, integer, interval), idem_outbox_ack(bigint[]),
    idem_outbox_emit(text, jsonb, text, jsonb, bigint), idem_consume(text, text, interval, bigint),
    idem_begin(bigint, text, text, jsonb, interval),
    idem_finish(bigint, text, text, integer, json, bigint, jsonb, json),
    idem_run(bigint, text, text, jsonb, regprocedure, interval),
    idem_submit(bigint, text, text, jsonb, jsonb, interval),
    idem_lease(text, text, interval, integer, boolean),
    idem_heartbeat(bigint, bigint, interval),
    idem_complete(bigint, bigint, integer, json, bigint, jsonb, json),
    idem_fail(bigint, bigint, jsonb, boolean),
    idem_cleanup_expired(integer, integer) TO regress_idem_pub;
CREATE FUNCTION public.pub_handler(request jsonb) RETURNS idem_result LANGUAGE sql
AS $$ SELECT ROW(200, '{}', NULL, NULL)::idem_result $$;
-- what there is to fetch, acknowledge, lease, complete and clean up
SELECT idem_outbox_emit('tmp-topic', '{"n": 1}', 'k1') AS msg \gset
SELECT task_id AS task FROM idem_submit(700, 'TMP_TASK', 'temp-trap-task-00001', '{}') \gset
SELECT token FROM idem_lease('TMP_TASK', 'admin-worker') \gset
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
VALUES (700, 'TMP', 'temp-trap-expired-01', repeat('0', 64), 'SUCCEEDED', now() - interval '1 hour');
TRUNCATE public.outbox_audit;

\c - regress_idem_pub
CREATE TABLE regress_pub_trap.seen (who name, superuser boolean);
CREATE FUNCTION regress_pub_trap.trap() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_pub_trap.seen
    SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
    RETURN NEW;
END $$;
CREATE TEMP TABLE outbox_audit (tbl text, op text, who name);
CREATE TRIGGER trap BEFORE INSERT ON outbox_audit FOR EACH ROW EXECUTE FUNCTION regress_pub_trap.trap();
SELECT count(*) FROM idem_outbox_fetch('tmp-topic');
\echo idem_outbox_fetch SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_outbox_ack(ARRAY[:msg]::bigint[]);
\echo idem_outbox_ack SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_outbox_emit('tmp-topic', '{"n": 2}', 'k2');
\echo idem_outbox_emit SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_consume('tmp-consumer', 'tmp-message-1');
\echo idem_consume SQLSTATE :LAST_ERROR_SQLSTATE
BEGIN;
SELECT replayed FROM idem_begin(700, 'TMP', 'temp-trap-begin-0001', '{}');
SELECT idem_finish(700, 'TMP', 'temp-trap-begin-0001', 200, '{}');
\echo idem_begin, idem_finish SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT replayed FROM idem_run(700, 'TMP', 'temp-trap-run-000001', '{}', 'public.pub_handler(jsonb)');
\echo idem_run SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_submit(700, 'TMP_TASK', 'temp-trap-task-00002', '{}');
\echo idem_submit SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_lease('TMP_TASK', 'pub-worker', lease => '1 millisecond');
\echo idem_lease SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_heartbeat(:task, :token);
\echo idem_heartbeat SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_complete(:task, :token, 200, '{}');
\echo idem_complete SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_fail(:task, :token, '{}');
\echo idem_fail SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_cleanup_expired();
\echo idem_cleanup_expired SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS trap_fired FROM regress_pub_trap.seen;
DROP TABLE pg_temp.outbox_audit;
-- a new session of the same role, without temporary tables: the calls go through
\c - regress_idem_pub
SELECT count(*) AS fetched FROM idem_outbox_fetch('tmp-topic');
SELECT idem_outbox_ack(ARRAY[:msg]::bigint[]) AS acked;

\c - :su
-- nothing was written by the refused calls; the last two wrote as the owner
SELECT tbl, op, who FROM public.outbox_audit ORDER BY tbl, op;
SELECT count(*) AS unacked FROM idem_internal.idem_outbox WHERE message_id = :msg;
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE owner_id = 700;
SELECT task_lease_expires_at > now() AS admin_lease_holds FROM idem_internal.idempotency_record WHERE id = :task;
SELECT count(*) AS inbox FROM idem_internal.idem_inbox WHERE consumer = 'tmp-consumer';
DROP TRIGGER audit_row ON idem_internal.idem_outbox;
DROP TRIGGER audit_row ON idem_internal.idempotency_record;
DROP TRIGGER audit_row ON idem_internal.idem_inbox;
DROP FUNCTION public.audit_row();
DROP FUNCTION public.pub_handler(jsonb);
DROP TABLE public.outbox_audit;
DELETE FROM idem_internal.idempotency_record WHERE owner_id = 700;
DELETE FROM idem_internal.idem_outbox WHERE topic = 'tmp-topic';
DROP SCHEMA regress_pub_trap CASCADE;
DROP OWNED BY regress_idem_pub;
DROP ROLE regress_idem_pub;
