-- test/bench/peers.sql: what users would otherwise write, and the least work
-- any design can do: the one set of baselines of test/bench/bench.sh,
-- outbox_bench.sh and instructions.sh (loaded after CREATE EXTENSION idem).
-- Each gets its own copy of the protocol's tables, so the variants do not
-- share rows.

CREATE SCHEMA peer;     -- peers A (PL/pgSQL) and B (client-driven)
CREATE SCHEMA lim;      -- limit 5: one statement writing both rows
CREATE SCHEMA bench;    -- helpers
CREATE SCHEMA plain;    -- messaging: the outbox, inbox and queues in plain SQL

DO $$
DECLARE s text;
BEGIN
    FOREACH s IN ARRAY ARRAY['peer', 'lim'] LOOP
        EXECUTE format($ddl$
            CREATE TABLE %1$I.idempotency_record (
                id              BIGSERIAL PRIMARY KEY,
                owner_id        BIGINT NOT NULL,
                operation       VARCHAR(64) NOT NULL,
                idempotency_key VARCHAR(128) NOT NULL,
                request_hash    CHAR(64) NOT NULL,
                status          VARCHAR(20) NOT NULL,
                http_status     INTEGER,
                response_json   JSONB,
                resource_id     BIGINT,
                created_at      TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
                updated_at      TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
                expires_at      TIMESTAMPTZ NOT NULL,
                CONSTRAINT uk_idempotency_scope UNIQUE (owner_id, operation, idempotency_key),
                CONSTRAINT ck_idempotency_status CHECK (status IN ('PROCESSING', 'SUCCEEDED')));
            CREATE INDEX ON %1$I.idempotency_record (expires_at);
            CREATE TABLE %1$I.purchase_order (
                id          BIGSERIAL PRIMARY KEY,
                order_no    VARCHAR(64) NOT NULL UNIQUE,
                owner_id    BIGINT NOT NULL,
                sku_id      BIGINT NOT NULL,
                quantity    INTEGER NOT NULL,
                status      VARCHAR(20) NOT NULL,
                created_at  TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP)$ddl$, s);
    END LOOP;
END $$;

-- Peer A: the article's flow in PL/pgSQL.  Validate the key, SHA-256 of the
-- canonical request, claim with ON CONFLICT DO NOTHING, read on conflict
-- (IK001 on a different request, IK002 while processing, else replay),
-- insert the order, store the response on the record.
CREATE FUNCTION peer.create_order(p_owner bigint, p_key text, p_sku bigint, p_qty integer,
    OUT order_id bigint, OUT order_no text, OUT status text, OUT http_status integer,
    OUT replayed boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_hash text;
    v_record_id bigint;
    r peer.idempotency_record;
BEGIN
    IF p_key IS NULL OR p_key !~ '^[A-Za-z0-9_-]{16,128}$' THEN
        RAISE EXCEPTION 'invalid idempotency key' USING ERRCODE = '22023';
    END IF;
    IF p_qty IS NULL OR p_qty < 1 OR p_qty > 100 THEN
        RAISE EXCEPTION 'qty must be between 1 and 100' USING ERRCODE = '22023';
    END IF;
    v_hash := encode(sha256(convert_to(
        '{"qty":' || p_qty || ',"sku":' || p_sku || '}', 'UTF8')), 'hex');

    INSERT INTO peer.idempotency_record
        (owner_id, operation, idempotency_key, request_hash, status, expires_at)
    VALUES (p_owner, 'CREATE_ORDER', p_key, v_hash, 'PROCESSING', now() + interval '1 day')
    ON CONFLICT (owner_id, operation, idempotency_key) DO NOTHING
    RETURNING id INTO v_record_id;

    IF v_record_id IS NULL THEN
        SELECT * INTO r FROM peer.idempotency_record
        WHERE owner_id = p_owner AND operation = 'CREATE_ORDER' AND idempotency_key = p_key;
        IF r.request_hash <> v_hash THEN
            RAISE EXCEPTION 'idempotency key was already used with a different request'
                USING ERRCODE = 'IK001';
        END IF;
        IF r.status <> 'SUCCEEDED' THEN
            RAISE EXCEPTION 'a request with this idempotency key is still being processed'
                USING ERRCODE = 'IK002';
        END IF;
        order_id := (r.response_json ->> 'orderId')::bigint;
        order_no := r.response_json ->> 'orderNo';
        status := r.response_json ->> 'status';
        http_status := r.http_status;
        replayed := true;
        RETURN;
    END IF;

    INSERT INTO peer.purchase_order AS o (id, order_no, owner_id, sku_id, quantity, status)
    SELECT n, 'ORD-' || lpad(n::text, 12, '0'), p_owner, p_sku, p_qty, 'CREATED'
    FROM nextval('peer.purchase_order_id_seq') n
    RETURNING o.id, o.order_no, o.status INTO order_id, order_no, status;

    UPDATE peer.idempotency_record
    SET status = 'SUCCEEDED', http_status = 201, resource_id = order_id,
        response_json = jsonb_build_object('orderId', order_id, 'orderNo', order_no, 'status', status),
        updated_at = now()
    WHERE id = v_record_id;
    http_status := 201;
    replayed := false;
END $$;

-- The mixed workload's mismatched calls: IK001 is the expected answer.
CREATE FUNCTION bench.expect_key_reused(p_owner bigint, p_key text)
RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.idem_create_order(p_owner, p_key, 999, 7);
    RAISE EXCEPTION 'expected IK001 for key %', p_key;
EXCEPTION WHEN SQLSTATE 'IK001' THEN
    RETURN 1;
END $$;

-- One backend, many calls: 4 replays for each fresh key, a commit every 100.
CREATE PROCEDURE bench.calls(p_from bigint, p_to bigint)
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN p_from .. p_to LOOP
        IF i % 5 = 0 THEN
            PERFORM public.idem_create_order(7, 'mem-' || lpad(i::text, 16, '0'), 1001, 1);
        ELSE
            PERFORM public.idem_create_order(1, 'replay-' || lpad((i % 1000 + 1)::text, 12, '0'), 1001, 1);
        END IF;
        IF i % 100 = 0 THEN
            COMMIT;
        END IF;
    END LOOP;
END $$;

-- The backend's private memory, in kB (RssAnon: shared buffers do not count).
CREATE FUNCTION bench.rss_anon_kb() RETURNS bigint LANGUAGE sql AS $$
    SELECT (regexp_match(pg_read_file('/proc/self/status'), 'RssAnon:\s+(\d+)'))[1]::bigint
$$;

-- Messaging.  An emit's baseline: one INSERT of the same row into a copy of
-- idem's outbox table (its columns, defaults and indexes: LIKE ... INCLUDING
-- ALL, nothing added) and a NOTIFY, as idem_outbox_emit sends one:
--   WITH i AS (INSERT INTO plain.outbox (message_id, topic, msg_key, payload,
--              emitted_at, commit_seq, attempt, ready)
--              VALUES (nextval('plain.outbox_seq'), ..., nextval('plain.outbox_seq'), 0, true)
--              RETURNING message_id)
--   SELECT i.message_id, pg_notify('idem_outbox', 'bench') FROM i;
CREATE TABLE plain.outbox (LIKE idem_internal.idem_outbox INCLUDING ALL);
CREATE SEQUENCE plain.outbox_seq;
-- a consume's: INSERT ... ON CONFLICT DO NOTHING into a copy of idem's inbox
CREATE TABLE plain.inbox (LIKE idem_internal.idem_inbox INCLUDING ALL);

-- A drain's: pgmq's queue table and its read and delete, in plain SQL
-- (pgmq 1.5: read = UPDATE ... SET vt, read_ct over FOR UPDATE SKIP LOCKED
-- in msg_id order; then DELETE by id).  No per-key order: the least a
-- queue does.
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

-- What a user writes for an outbox with leases: SKIP LOCKED, then ack by
-- id; the delivery order (seq) indexed apart from the key, as in
-- idem_internal.idem_outbox, so that the planner scans the partial index of
-- unacknowledged rows (outbox_bench.sh's third drain).
CREATE TABLE plain.queue (id bigserial PRIMARY KEY, seq bigint NOT NULL, topic text NOT NULL,
                          payload jsonb NOT NULL, attempt int NOT NULL DEFAULT 0,
                          leased_until timestamptz, acked_at timestamptz) WITH (fillfactor = 90);
CREATE INDEX ON plain.queue (topic, seq) WHERE acked_at IS NULL;
CREATE FUNCTION plain.fetch(t text, n int) RETURNS SETOF plain.queue LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    WITH d AS (SELECT id FROM plain.queue WHERE topic = t AND acked_at IS NULL
                 AND (leased_until IS NULL OR leased_until <= clock_timestamp())
               ORDER BY seq LIMIT n FOR UPDATE SKIP LOCKED)
    UPDATE plain.queue q SET attempt = q.attempt + 1, leased_until = clock_timestamp() + interval '30 seconds'
    FROM d WHERE q.id = d.id RETURNING q.*;
END $$;
CREATE FUNCTION plain.ack(ids bigint[]) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
    UPDATE plain.queue SET acked_at = clock_timestamp() WHERE id = ANY (ids) AND acked_at IS NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
