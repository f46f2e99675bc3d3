/* idem--1.3--1.4.sql: the transactional outbox and the consumer inbox */

\echo Use "ALTER EXTENSION idem UPDATE TO '1.4'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Outbox: messages written in the transaction whose business rows they
-- announce, delivered by independent publishers.
--
-- idem_outbox_emit keeps a message in the transaction's memory and inserts
-- it when the transaction commits (at PRE_COMMIT), so a row exists exactly
-- for the messages of committed transactions.  commit_seq is the delivery
-- order: for a message with a key it is drawn at that moment, under a lock
-- of (topic, msg_key) held until the commit is done, so that for one key
-- commit_seq follows commit order; without a key it is the message id.
--
-- ready marks what a fetch may hand out: every keyless message, and of each
-- key only its head, the unacknowledged message with the least commit_seq.
-- It is kept under the same key lock: a message is inserted ready if its
-- key has no unacknowledged message, and acknowledging a head makes the
-- next message of its key ready.  So a fetch walks only deliverable rows,
-- however long a key's backlog.
-- ---------------------------------------------------------------------------
CREATE SEQUENCE @extschema@.idem_outbox_message_id_seq;

CREATE TABLE @extschema@.idem_outbox (
    message_id   bigint PRIMARY KEY,
    topic        varchar(128) NOT NULL,
    msg_key      varchar(256),
    payload      jsonb NOT NULL,
    headers      jsonb,
    emitted_at   timestamptz NOT NULL,
    commit_seq   bigint NOT NULL,
    attempt      integer NOT NULL,
    ready        boolean NOT NULL,
    leased_until timestamptz,
    acked_at     timestamptz
) WITH (fillfactor = 90);

ALTER SEQUENCE @extschema@.idem_outbox_message_id_seq
    OWNED BY @extschema@.idem_outbox.message_id;

-- what a fetch scans: the deliverable messages of a topic, in order
CREATE INDEX idem_outbox_pending ON @extschema@.idem_outbox (topic, commit_seq)
    WHERE acked_at IS NULL AND ready;
-- each key's unacknowledged messages, in order: its head, the next one
CREATE INDEX idem_outbox_key_order ON @extschema@.idem_outbox (topic, msg_key, commit_seq)
    WHERE acked_at IS NULL AND msg_key IS NOT NULL;
-- what the cleanup deletes: acknowledged messages, oldest first
CREATE INDEX idem_outbox_acked ON @extschema@.idem_outbox (acked_at)
    WHERE acked_at IS NOT NULL;

COMMENT ON TABLE @extschema@.idem_outbox IS
    'idem: messages of committed transactions, leased to publishers by idem_outbox_fetch until idem_outbox_ack';

-- ---------------------------------------------------------------------------
-- Inbox: one row per (consumer, message_id) a consumer's transaction took
-- effect for.
-- ---------------------------------------------------------------------------
CREATE TABLE @extschema@.idem_inbox (
    consumer    varchar(64) NOT NULL,
    message_id  varchar(512) NOT NULL,
    consumed_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    CONSTRAINT pk_idem_inbox PRIMARY KEY (consumer, message_id)
);
CREATE INDEX idem_inbox_expires ON @extschema@.idem_inbox (expires_at);

COMMENT ON TABLE @extschema@.idem_inbox IS
    'idem: the messages each consumer has taken effect for, until they expire';

SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_outbox', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_outbox_message_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_inbox', '');

REVOKE ALL ON TABLE @extschema@.idem_outbox, @extschema@.idem_inbox FROM PUBLIC;
REVOKE ALL ON SEQUENCE @extschema@.idem_outbox_message_id_seq FROM PUBLIC;

-- Emit a message with the caller's transaction.
CREATE FUNCTION @extschema@.idem_outbox_emit(
    topic text, payload jsonb, msg_key text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_emit'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_outbox_emit(text, jsonb, text, jsonb) IS
    'idem: emit a message that exists if and only if the calling transaction commits; returns its id';

-- Lease the deliverable messages of a topic: ready (keyless, or the head
-- of its key), not acknowledged, not leased or with a lapsed lease.  FOR
-- UPDATE SKIP LOCKED: concurrent fetchers never lease one message; a row
-- leased and committed meanwhile is checked again on its new version.
CREATE FUNCTION @extschema@.idem_outbox_fetch(
    topic text, batch integer DEFAULT 100, lease interval DEFAULT '30 seconds')
RETURNS TABLE (message_id bigint, msg_key text, payload jsonb, headers jsonb,
               attempt integer, emitted_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fetch$
#variable_conflict use_column
DECLARE
    t timestamptz := pg_catalog.clock_timestamp();
BEGIN
    IF idem_outbox_fetch.topic IS NULL OR batch IS NULL OR lease IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null',
            CASE WHEN idem_outbox_fetch.topic IS NULL THEN 'topic'
                 WHEN batch IS NULL THEN 'batch' ELSE 'lease' END
            USING ERRCODE = '22004';
    END IF;
    IF idem_outbox_fetch.topic OPERATOR(pg_catalog.!~) '^[A-Za-z0-9_.:-]{1,128}$' THEN
        RAISE EXCEPTION 'topic must be 1 to 128 characters from A-Z, a-z, 0-9, "_", ".", ":" and "-"'
            USING ERRCODE = '22023';
    END IF;
    IF batch OPERATOR(pg_catalog.<) 1 OR batch OPERATOR(pg_catalog.>) 10000 THEN
        RAISE EXCEPTION 'batch must be between 1 and 10000'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has batch %s.', batch);
    END IF;
    IF lease OPERATOR(pg_catalog.<=) interval '0' THEN
        RAISE EXCEPTION 'lease must be a positive interval'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has lease %s.', lease);
    END IF;

    RETURN QUERY
    WITH due AS (
        SELECT o.message_id
          FROM @extschema@.idem_outbox o
         WHERE o.topic OPERATOR(pg_catalog.=) idem_outbox_fetch.topic
           AND o.acked_at IS NULL AND o.ready
           AND (o.leased_until IS NULL OR o.leased_until OPERATOR(pg_catalog.<=) t)
         ORDER BY o.commit_seq
         LIMIT batch
           FOR UPDATE OF o SKIP LOCKED
    ), leased AS (
        UPDATE @extschema@.idem_outbox o
           SET attempt = o.attempt OPERATOR(pg_catalog.+) 1,
               leased_until = t OPERATOR(pg_catalog.+) lease
          FROM due
         WHERE o.message_id OPERATOR(pg_catalog.=) due.message_id
        RETURNING o.message_id, o.msg_key, o.payload, o.headers, o.attempt,
                  o.emitted_at, o.commit_seq
    )
    SELECT l.message_id, l.msg_key::pg_catalog.text, l.payload, l.headers,
           l.attempt, l.emitted_at
      FROM leased l
     ORDER BY l.commit_seq;
END
$fetch$;

COMMENT ON FUNCTION @extschema@.idem_outbox_fetch(text, integer, interval) IS
    'idem: lease up to batch deliverable messages of a topic, in commit order per key';

-- Take the commit-order locks of (topic, msg_key) pairs, in one global
-- order, until the end of the transaction: what a committing emitter of
-- those keys takes too.  For idem_outbox_ack only.
CREATE FUNCTION @extschema@.idem_outbox_lock_keys(topics text[], keys text[])
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_lock_keys'
LANGUAGE C VOLATILE STRICT;

-- ---------------------------------------------------------------------------
-- Statistics: counters per (database, operation) in shared memory (needs
-- shared_preload_libraries), read through the idem_stats view.
-- ---------------------------------------------------------------------------
CREATE FUNCTION @extschema@.idem_stats_entries(
    OUT dbid oid, OUT operation text,
    OUT calls bigint, OUT executed bigint, OUT replayed bigint, OUT conflicts bigint,
    OUT in_flight bigint, OUT waits bigint, OUT renewed bigint, OUT failed_final bigint,
    OUT leases bigint, OUT takeovers bigint, OUT stale_tokens bigint, OUT retries bigint,
    OUT outbox_emitted bigint, OUT outbox_acked bigint, OUT inbox_duplicates bigint,
    OUT cleanup_deleted bigint, OUT stats_reset timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats_entries'
LANGUAGE C VOLATILE STRICT;

CREATE VIEW @extschema@.idem_stats AS
SELECT e.dbid, d.datname, e.operation,
       e.calls, e.executed, e.replayed, e.conflicts, e.in_flight, e.waits, e.renewed,
       e.failed_final, e.leases, e.takeovers, e.stale_tokens, e.retries,
       e.outbox_emitted, e.outbox_acked, e.inbox_duplicates, e.cleanup_deleted, e.stats_reset
  FROM @extschema@.idem_stats_entries() e
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) e.dbid;

COMMENT ON VIEW @extschema@.idem_stats IS
    'idem: counters per (database, operation) since the last idem_stats_reset(); committed work only for what calls write';

CREATE FUNCTION @extschema@.idem_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.idem_stats_reset() IS
    'idem: set every counter of idem_stats back to 0';

-- Count n in idem_stats at commit (for idem's own PL/pgSQL functions).
CREATE FUNCTION @extschema@.idem_stats_add(name text, counter text, n bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_stats_add'
LANGUAGE C VOLATILE STRICT;

REVOKE ALL ON FUNCTION @extschema@.idem_stats_entries() FROM PUBLIC;
REVOKE ALL ON @extschema@.idem_stats FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_stats_reset() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_stats_add(text, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats_entries() TO pg_monitor;
GRANT SELECT ON @extschema@.idem_stats TO pg_monitor;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats_reset() TO pg_monitor;

-- Acknowledge delivered messages; the cleanup worker deletes them later.
-- Under the locks of their keys, so that no emitter of those keys commits
-- meanwhile, each key whose head was acknowledged gets its next message
-- ready.  READ COMMITTED: each statement sees what committed before it, the
-- work of the emitters the locks waited for included.
CREATE FUNCTION @extschema@.idem_outbox_ack(message_ids bigint[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $ack$
DECLARE
    n bigint;
    topics text[];
    keys text[];
BEGIN
    IF message_ids IS NULL THEN
        RAISE EXCEPTION 'argument "message_ids" must not be null' USING ERRCODE = '22004';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RAISE EXCEPTION 'idem_outbox_ack must run in a READ COMMITTED transaction'
            USING ERRCODE = '0A000';
    END IF;
    SELECT pg_catalog.array_agg(k.topic), pg_catalog.array_agg(k.msg_key)
      INTO topics, keys
      FROM (SELECT DISTINCT o.topic::pg_catalog.text AS topic, o.msg_key::pg_catalog.text AS msg_key
              FROM @extschema@.idem_outbox o
             WHERE o.message_id OPERATOR(pg_catalog.=) ANY (message_ids)
               AND o.acked_at IS NULL AND o.msg_key IS NOT NULL) k;
    IF topics IS NOT NULL THEN
        PERFORM @extschema@.idem_outbox_lock_keys(topics, keys);
    END IF;

    -- counted in idem_stats per topic, when the transaction commits
    WITH acked AS (
        UPDATE @extschema@.idem_outbox o
           SET acked_at = pg_catalog.clock_timestamp(), ready = false
         WHERE o.message_id OPERATOR(pg_catalog.=) ANY (message_ids)
           AND o.acked_at IS NULL
        RETURNING o.topic::pg_catalog.text AS topic
    ), per_topic AS (
        SELECT a.topic, pg_catalog.count(*) AS n FROM acked a GROUP BY a.topic
    )
    SELECT COALESCE(pg_catalog.sum(@extschema@.idem_stats_add(p.topic, 'outbox_acked', p.n)), 0)
      INTO n
      FROM per_topic p;

    -- the new head of each key: ready (if it was not already)
    IF topics IS NOT NULL THEN
        UPDATE @extschema@.idem_outbox o
           SET ready = true
          FROM ROWS FROM (pg_catalog.unnest(topics), pg_catalog.unnest(keys)) AS k(topic, msg_key),
               LATERAL (SELECT h.message_id
                          FROM @extschema@.idem_outbox h
                         WHERE h.topic OPERATOR(pg_catalog.=) k.topic
                           AND h.msg_key OPERATOR(pg_catalog.=) k.msg_key
                           AND h.acked_at IS NULL
                         ORDER BY h.commit_seq
                         LIMIT 1) head
         WHERE o.message_id OPERATOR(pg_catalog.=) head.message_id
           AND NOT o.ready;
    END IF;
    RETURN n;
END
$ack$;

COMMENT ON FUNCTION @extschema@.idem_outbox_ack(bigint[]) IS
    'idem: acknowledge delivered messages; returns how many were not acknowledged before';

-- Take effect for a message once per consumer.
CREATE FUNCTION @extschema@.idem_consume(
    consumer text, message_id text, ttl interval DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_consume'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_consume(text, text, interval) IS
    'idem: true the first time consumer takes message_id in a committed transaction, false for every redelivery';

-- What an operator watches, for this database: the record backlog the
-- cleanup has not reached yet, committed PROCESSING records, the outbox's
-- unacknowledged messages and their age, the inbox, idem's disk use, and
-- the worker's last round.  Counts are exact (the backlog and the outbox
-- through their indexes; records and inbox entries by a scan).
CREATE FUNCTION @extschema@.idem_health(
    OUT records bigint,
    OUT expired_backlog bigint,
    OUT oldest_expires_at timestamptz,
    OUT processing bigint,
    OUT oldest_processing_age interval,
    OUT outbox_unacked bigint,
    OUT outbox_oldest_unacked_age interval,
    OUT outbox_acked_backlog bigint,
    OUT inbox_entries bigint,
    OUT inbox_expired_backlog bigint,
    OUT table_bytes bigint,
    OUT index_bytes bigint,
    OUT worker_last_run_started timestamptz,
    OUT worker_last_run_finished timestamptz,
    OUT worker_last_run_deleted bigint,
    OUT worker_last_error text,
    OUT worker_last_error_at timestamptz)
RETURNS record
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $health$
SELECT
    (SELECT pg_catalog.count(*) FROM @extschema@.idempotency_record),
    (SELECT pg_catalog.count(*) FROM @extschema@.idempotency_record r
      WHERE r.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()),
    (SELECT pg_catalog.min(r.expires_at) FROM @extschema@.idempotency_record r),
    (SELECT pg_catalog.count(*) FROM @extschema@.idempotency_record r
      WHERE r.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PROCESSING'),
    (SELECT pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(r.created_at)
       FROM @extschema@.idempotency_record r
      WHERE r.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PROCESSING'),
    (SELECT pg_catalog.count(*) FROM @extschema@.idem_outbox o WHERE o.acked_at IS NULL),
    (SELECT pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(o.emitted_at)
       FROM @extschema@.idem_outbox o WHERE o.acked_at IS NULL),
    (SELECT pg_catalog.count(*) FROM @extschema@.idem_outbox o WHERE o.acked_at IS NOT NULL),
    (SELECT pg_catalog.count(*) FROM @extschema@.idem_inbox i),
    (SELECT pg_catalog.count(*) FROM @extschema@.idem_inbox i
      WHERE i.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()),
    sizes.table_bytes, sizes.index_bytes,
    w.last_run_started, w.last_run_finished, w.last_run_deleted, w.last_error, w.last_error_at
FROM (SELECT pg_catalog.sum(pg_catalog.pg_table_size(t.rel))::pg_catalog.int8 AS table_bytes,
             pg_catalog.sum(pg_catalog.pg_indexes_size(t.rel))::pg_catalog.int8 AS index_bytes
        FROM pg_catalog.unnest(ARRAY['@extschema@.idempotency_record'::pg_catalog.regclass,
                                     '@extschema@.purchase_order'::pg_catalog.regclass,
                                     '@extschema@.idem_outbox'::pg_catalog.regclass,
                                     '@extschema@.idem_inbox'::pg_catalog.regclass]) AS t(rel)) sizes
LEFT JOIN @extschema@.idem_cleanup_status() w
       ON w.datid OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                          WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
$health$;

COMMENT ON FUNCTION @extschema@.idem_health() IS
    'idem: backlog, PROCESSING records, outbox and inbox, disk use and the cleanup worker''s last round, for this database';

REVOKE ALL ON FUNCTION @extschema@.idem_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_health() TO pg_monitor;

-- Granted by the administrator to producers, publishers and consumers.
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_emit(text, jsonb, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_fetch(text, integer, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_ack(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_lock_keys(text[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_consume(text, text, interval) FROM PUBLIC;
