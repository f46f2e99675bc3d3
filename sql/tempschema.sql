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
CREATE TRIGGER log_order AFTER INSERT ON purchase_order
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
SELECT count(*) AS records FROM idempotency_record WHERE owner_id = 600;
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
DROP TRIGGER log_order ON purchase_order;
DROP FUNCTION public.log_order();
DROP TABLE public.order_log;
DROP SCHEMA regress_tmp_trap CASCADE;
REVOKE EXECUTE ON FUNCTION idem_create_order(bigint, text, bigint, integer) FROM regress_idem_tmp;
DROP ROLE regress_idem_tmp;
