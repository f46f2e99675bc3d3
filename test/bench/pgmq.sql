-- test/bench/pgmq.sql: pgmq's queue table and its read and delete, in plain
-- SQL (schema plain, created by the caller): the peer of idem's keyed drain
-- for test/bench/outbox_bench.sh (wall clock) and test/bench/instructions.sh
-- (instructions).
CREATE TABLE plain.pgmq (msg_id bigserial PRIMARY KEY, read_ct int NOT NULL DEFAULT 0,
                         enqueued_at timestamptz NOT NULL DEFAULT now(),
                         vt timestamptz NOT NULL DEFAULT clock_timestamp(), message jsonb);
CREATE INDEX ON plain.pgmq (vt);
CREATE FUNCTION plain.pgmq_read(n int) RETURNS SETOF plain.pgmq LANGUAGE sql AS $$
    WITH cte AS (SELECT msg_id FROM plain.pgmq WHERE vt <= clock_timestamp()
                 ORDER BY msg_id LIMIT n FOR UPDATE SKIP LOCKED)
    UPDATE plain.pgmq m SET vt = clock_timestamp() + interval '30 seconds', read_ct = m.read_ct + 1
    FROM cte WHERE m.msg_id = cte.msg_id RETURNING m.*
$$;
CREATE FUNCTION plain.pgmq_delete(ids bigint[]) RETURNS bigint LANGUAGE sql AS $$
    WITH d AS (DELETE FROM plain.pgmq WHERE msg_id = ANY (ids) RETURNING 1) SELECT count(*) FROM d
$$;
