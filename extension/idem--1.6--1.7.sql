/* idem--1.6--1.7.sql */
\echo Use "ALTER EXTENSION idem UPDATE TO '1.7'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- The outbox's fetch and acknowledgement update idem_outbox as the
-- extension's owner (SECURITY DEFINER): like every write of idem's C code,
-- they refuse to fire user triggers of the table as the owner for a caller
-- whose session has temporary tables, whose names would capture the names
-- such a trigger does not qualify (0A000).
-- ---------------------------------------------------------------------------
CREATE FUNCTION @extschema@.idem_outbox_guard()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_guard'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.idem_outbox_guard() IS
    'idem: refuse to fire idem_outbox''s user triggers as its owner for a session with temporary tables (for idem_outbox_fetch and idem_outbox_ack)';

REVOKE ALL ON FUNCTION @extschema@.idem_outbox_guard() FROM PUBLIC;

CREATE OR REPLACE FUNCTION @extschema@.idem_outbox_fetch(
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
    -- no user trigger on the outbox runs as the owner for a caller with
    -- temporary tables: the check of every idem write (0A000)
    PERFORM @extschema@.idem_outbox_guard();
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

CREATE OR REPLACE FUNCTION @extschema@.idem_outbox_ack(message_ids bigint[])
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
    -- no user trigger on the outbox runs as the owner for a caller with
    -- temporary tables: the check of every idem write (0A000)
    PERFORM @extschema@.idem_outbox_guard();
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

-- ---------------------------------------------------------------------------
-- idem_stats: a row per (database, kind, name); kind is operation, topic or
-- consumer, so that a consumer, a topic and an operation of one name no
-- longer share a row.  The "(other)" row has kind NULL.
-- ---------------------------------------------------------------------------
DROP VIEW @extschema@.idem_stats;
DROP FUNCTION @extschema@.idem_stats_entries();

CREATE FUNCTION @extschema@.idem_stats_entries(
    OUT dbid oid, OUT operation text, OUT kind text,
    OUT calls bigint, OUT executed bigint, OUT replayed bigint, OUT conflicts bigint,
    OUT in_flight bigint, OUT waits bigint, OUT renewed bigint, OUT failed_final bigint,
    OUT leases bigint, OUT takeovers bigint, OUT stale_tokens bigint, OUT retries bigint,
    OUT outbox_emitted bigint, OUT outbox_acked bigint, OUT inbox_duplicates bigint,
    OUT cleanup_deleted bigint, OUT stats_reset timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats_entries'
LANGUAGE C VOLATILE STRICT;

CREATE VIEW @extschema@.idem_stats AS
SELECT e.dbid, d.datname, e.operation, e.kind,
       e.calls, e.executed, e.replayed, e.conflicts, e.in_flight, e.waits, e.renewed,
       e.failed_final, e.leases, e.takeovers, e.stale_tokens, e.retries,
       e.outbox_emitted, e.outbox_acked, e.inbox_duplicates, e.cleanup_deleted, e.stats_reset
  FROM @extschema@.idem_stats_entries() e
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) e.dbid;

COMMENT ON VIEW @extschema@.idem_stats IS
    'idem: counters per (database, kind, name) since the last idem_stats_reset(); kind is operation, topic or consumer; committed work only for what calls write';

REVOKE ALL ON FUNCTION @extschema@.idem_stats_entries() FROM PUBLIC;
REVOKE ALL ON @extschema@.idem_stats FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats_entries() TO pg_monitor;
GRANT SELECT ON @extschema@.idem_stats TO pg_monitor;
