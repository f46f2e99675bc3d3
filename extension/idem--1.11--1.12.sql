/* idem--1.11--1.12.sql */
\echo Use "ALTER EXTENSION idem UPDATE TO '1.12'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- The outbox's drain, made cheaper without changing what it guarantees
-- (per-key commit order, leases, at-least-once delivery):
--
-- * An acknowledged message is deleted by idem_outbox_ack itself instead of
--   being marked (acked_at, ready = false) for the cleanup to delete later:
--   one write per message instead of two.  Messages acknowledged before the
--   update are still deleted by the cleanup (idem_outbox_acked).
-- * The lease of idem_outbox_fetch is a HOT update (it changes no indexed
--   column): with fillfactor 50 a page keeps room for a new version of each
--   of its rows, so a lease no longer moves a row to another page and adds
--   an entry to each index.  Pages written from now on; a table rewrite
--   (VACUUM FULL) applies it to the older ones.
-- * An acknowledgement of more than 16 keys took the outbox-wide key lock
--   in EXCLUSIVE mode, so that two such publishers' acknowledgements ran
--   one at a time; it now takes it in SHARE mode, which still excludes
--   every committing emitter and lets acknowledgements run together.  They
--   order themselves on the rows: every message an acknowledgement deletes
--   is its key's head (the one ready message of the key: all a fetch hands
--   out), and the key's next message is touched by nobody else meanwhile.
--   An acknowledgement of a message that is not its key's head (an id not
--   obtained from a fetch) takes the lock in EXCLUSIVE mode, as before.
--   The acknowledgement is C now (outbox.c), one pass over the messages
--   instead of four statements.
-- ---------------------------------------------------------------------------
ALTER TABLE @extschema@.idem_outbox SET (fillfactor = 50);

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

    -- the locked rows are updated where the lock found them (ctid): the
    -- lock holds them until the end of the transaction
    RETURN QUERY
    WITH due AS (
        SELECT o.ctid
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
         WHERE o.ctid OPERATOR(pg_catalog.=) due.ctid
        RETURNING o.message_id, o.msg_key, o.payload, o.headers, o.attempt,
                  o.emitted_at, o.commit_seq
    )
    SELECT l.message_id, l.msg_key::pg_catalog.text, l.payload, l.headers,
           l.attempt, l.emitted_at
      FROM leased l
     ORDER BY l.commit_seq;
END
$fetch$;

-- The acknowledgement is C (outbox.c): it writes as the extension's owner
-- like idem_outbox_emit, so it is no longer SECURITY DEFINER.
CREATE OR REPLACE FUNCTION @extschema@.idem_outbox_ack(message_ids bigint[])
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_ack'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.idem_outbox_ack(bigint[]) IS
    'idem: delete the acknowledged messages (the publisher has them confirmed by its broker) and make each key''s next message deliverable; returns how many were not already acknowledged';

-- ---------------------------------------------------------------------------
-- No sequence value twice across a promotion.  idem hands values of its
-- sequences out (message ids an inbox keeps, fencing tokens a cut-off
-- worker holds, order ids and numbers, task ids); a standby promoted after
-- asynchronous replication has only the values it replayed and would hand
-- out again those the old primary drew since.  So the first draw on a new
-- timeline moves each idem sequence 2^36 ahead, and idem_timeline_seq
-- records the timeline that was done for (sequence.c).  Marked now with the
-- current timeline: only a later one moves the sequences.
-- ---------------------------------------------------------------------------
CREATE SEQUENCE @extschema@.idem_timeline_seq MINVALUE 0 START 0;

COMMENT ON SEQUENCE @extschema@.idem_timeline_seq IS
    'idem: the timeline idem''s sequences were last moved ahead for (a new one moves them 2^36 on its first draw)';

REVOKE ALL ON SEQUENCE @extschema@.idem_timeline_seq FROM PUBLIC;

CREATE FUNCTION @extschema@.idem_timeline_mark()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_timeline_mark'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.idem_timeline_mark() IS
    'idem: record the current timeline in idem_timeline_seq without moving the sequences (CREATE EXTENSION, the update to 1.12)';

REVOKE ALL ON FUNCTION @extschema@.idem_timeline_mark() FROM PUBLIC;

SELECT @extschema@.idem_timeline_mark();
