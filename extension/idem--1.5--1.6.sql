/* idem--1.5--1.6.sql: idem on Citus, distributed by owner */

\echo Use "ALTER EXTENSION idem UPDATE TO '1.6'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- idem_distribute() spreads idem over a Citus cluster: idempotency_record and
-- purchase_order by owner_id, co-located, idem_inbox by consumer, and every
-- function that takes an owner (or a consumer) delegated by it, so that a call
-- through the coordinator runs on the node that holds the owner's shard.  The
-- outbox stays a table of each node: a message commits with the transaction
-- that emitted it, on the node where it ran.
--
-- Citus wants the distribution column in every primary key and unique
-- constraint: the keys become (owner_id, id) and (owner_id, order_no); the
-- scope constraint (owner_id, operation, idempotency_key) already has it.  The
-- extension's tables on each node are that node's own (Citus does not create
-- the tables of an extension), so idem_distribute_node() runs on every node.
-- ---------------------------------------------------------------------------

-- This node's part: the keys, an index of tasks by id, and idem's sequences
-- in a range of this node's
-- own (group g > 0 draws from [g * 2^48 + 1, (g + 1) * 2^48 - 1], as Citus
-- does for the sequences of distributed tables), so that ids, order numbers,
-- message ids and fencing tokens stay unique across nodes.  Revoked from
-- PUBLIC; its DDL needs the tables' owner.
CREATE FUNCTION @extschema@.idem_distribute_node()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- each node changes its own copy: nothing to propagate
SET citus.enable_ddl_propagation = off
AS $node$
DECLARE
    grp integer;
    lo bigint;
    seq text;
BEGIN
    IF (SELECT pg_catalog.array_length(c.conkey, 1) FROM pg_catalog.pg_constraint c
         WHERE c.conrelid OPERATOR(pg_catalog.=) '@extschema@.idempotency_record'::pg_catalog.regclass
           AND c.contype OPERATOR(pg_catalog.=) 'p') OPERATOR(pg_catalog.=) 1 THEN
        ALTER TABLE @extschema@.idempotency_record
            DROP CONSTRAINT idempotency_record_pkey,
            ADD CONSTRAINT idempotency_record_pkey PRIMARY KEY (owner_id, id);
    END IF;
    IF (SELECT pg_catalog.array_length(c.conkey, 1) FROM pg_catalog.pg_constraint c
         WHERE c.conrelid OPERATOR(pg_catalog.=) '@extschema@.purchase_order'::pg_catalog.regclass
           AND c.contype OPERATOR(pg_catalog.=) 'p') OPERATOR(pg_catalog.=) 1 THEN
        ALTER TABLE @extschema@.purchase_order
            DROP CONSTRAINT purchase_order_pkey,
            ADD CONSTRAINT purchase_order_pkey PRIMARY KEY (owner_id, id),
            DROP CONSTRAINT purchase_order_order_no_key,
            ADD CONSTRAINT purchase_order_order_no_key UNIQUE (owner_id, order_no);
    END IF;
    -- a task's holder knows its id, not its owner: its calls find it by id
    -- in the shards of the node it leased from
    IF pg_catalog.to_regclass('@extschema@.idem_task_id') IS NULL THEN
        CREATE INDEX idem_task_id ON @extschema@.idempotency_record (id)
            WHERE task_attempts IS NOT NULL;
    END IF;

    EXECUTE 'SELECT groupid FROM pg_catalog.pg_dist_local_group' INTO grp;
    IF grp OPERATOR(pg_catalog.>) 0 THEN
        lo := grp::pg_catalog.int8 OPERATOR(pg_catalog.*) 281474976710656 OPERATOR(pg_catalog.+) 1;
        FOREACH seq IN ARRAY ARRAY['idempotency_record_id_seq', 'purchase_order_id_seq',
                                   'idem_outbox_message_id_seq', 'idem_task_token_seq'] LOOP
            IF (SELECT s.seqmin FROM pg_catalog.pg_sequence s
                 WHERE s.seqrelid OPERATOR(pg_catalog.=)
                       pg_catalog.format('@extschema@.%I', seq)::pg_catalog.regclass)
               OPERATOR(pg_catalog.<) lo THEN
                EXECUTE pg_catalog.format('ALTER SEQUENCE @extschema@.%I MINVALUE %s MAXVALUE %s START %s RESTART %s',
                                          seq, lo, lo OPERATOR(pg_catalog.+) 281474976710654, lo, lo);
            END IF;
        END LOOP;
    END IF;
END
$node$;

COMMENT ON FUNCTION @extschema@.idem_distribute_node() IS
    'idem_distribute()''s part on each node: keys with the distribution column, sequences in this node''s range';

-- Run once on the Citus coordinator, as a superuser; running it again
-- changes nothing.
CREATE FUNCTION @extschema@.idem_distribute()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $dist$
DECLARE
    r record;
    version text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles ro
                    WHERE ro.rolname OPERATOR(pg_catalog.=) CURRENT_USER AND ro.rolsuper) THEN
        RAISE EXCEPTION 'permission denied to distribute idem'
            USING ERRCODE = '42501', HINT = 'Run idem_distribute() as a superuser.';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'idem_distribute() needs the Citus extension'
            USING ERRCODE = '0A000',
                  DETAIL = 'Citus is not installed in this database; nothing was changed.',
                  HINT = 'Install Citus (its packages are at https://github.com/citusdata/citus), CREATE EXTENSION citus before idem, and add the worker nodes.';
    END IF;
    IF (SELECT groupid FROM pg_catalog.pg_dist_local_group) OPERATOR(pg_catalog.<>) 0 THEN
        RAISE EXCEPTION 'idem_distribute() must run on the Citus coordinator'
            USING ERRCODE = '55000';
    END IF;
    PERFORM @extschema@.idem_distribute_node();

    SELECT e.extversion INTO version FROM pg_catalog.pg_extension e
     WHERE e.extname OPERATOR(pg_catalog.=) 'idem';
    FOR r IN SELECT w.nodename, w.nodeport, w.success, w.result
               FROM pg_catalog.run_command_on_workers(
                    'SELECT extversion FROM pg_catalog.pg_extension WHERE extname = ''idem''') w LOOP
        IF NOT r.success OR r.result IS DISTINCT FROM version THEN
            RAISE EXCEPTION 'idem % is not installed on worker node %:%', version, r.nodename, r.nodeport
                USING ERRCODE = '55000',
                      DETAIL = pg_catalog.format('The node answered: %s', r.result),
                      HINT = 'Citus creates an extension on every node when it is created on the coordinator: install idem''s files on every node, then ALTER EXTENSION idem UPDATE.';
        END IF;
    END LOOP;
    FOR r IN SELECT w.nodename, w.nodeport, w.success, w.result
               FROM pg_catalog.run_command_on_workers(
                    'SELECT @extschema@.idem_distribute_node()') w LOOP
        IF NOT r.success THEN
            RAISE EXCEPTION 'idem_distribute() failed on worker node %:%', r.nodename, r.nodeport
                USING ERRCODE = '55000', DETAIL = r.result;
        END IF;
    END LOOP;

    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) '@extschema@.idempotency_record'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_distributed_table('@extschema@.idempotency_record', 'owner_id');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) '@extschema@.purchase_order'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_distributed_table('@extschema@.purchase_order', 'owner_id',
                                                    colocate_with => '@extschema@.idempotency_record');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) '@extschema@.idem_inbox'::pg_catalog.regclass) THEN
        PERFORM pg_catalog.create_distributed_table('@extschema@.idem_inbox', 'consumer');
    END IF;

    -- force_delegation: delegated inside a transaction block too, as part of
    -- the distributed transaction
    FOR r IN SELECT f.fn::pg_catalog.regprocedure AS fn, f.tbl
               FROM (VALUES
                   ('@extschema@.idem_create_order(bigint, text, bigint, integer)', '@extschema@.idempotency_record'),
                   ('@extschema@.idem_begin(bigint, text, text, jsonb, interval)', '@extschema@.idempotency_record'),
                   ('@extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb)', '@extschema@.idempotency_record'),
                   ('@extschema@.idem_run(bigint, text, text, jsonb, regprocedure, interval)', '@extschema@.idempotency_record'),
                   ('@extschema@.idem_submit(bigint, text, text, jsonb, jsonb, interval)', '@extschema@.idempotency_record'),
                   ('@extschema@.idem_consume(text, text, interval)', '@extschema@.idem_inbox')) AS f (fn, tbl) LOOP
        PERFORM pg_catalog.create_distributed_function(r.fn, '$1', colocate_with => r.tbl,
                                                       force_delegation => true);
    END LOOP;
END
$dist$;

COMMENT ON FUNCTION @extschema@.idem_distribute() IS
    'distribute idem over a Citus cluster by owner (run once, on the coordinator, as a superuser)';

REVOKE ALL ON FUNCTION @extschema@.idem_distribute_node() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_distribute() FROM PUBLIC;
