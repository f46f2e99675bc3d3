/* idem--1.12--1.13.sql */
\echo Use "ALTER EXTENSION idem UPDATE TO '1.13'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Security (CVE-class: a database owner could become superuser).  Up to 1.12
-- idem's SQL and PL/pgSQL functions named its tables and helpers as
-- "public.…", a name looked up again at every call in a schema the database
-- owner owns and may rename (PostgreSQL 15's public belongs to
-- pg_database_owner): renamed, and a look-alike idem_outbox_guard() planted
-- in a new "public", idem_outbox_fetch (SECURITY DEFINER) ran the plant as
-- idem's owner.  idem_health, idem_grant and idem_forget_owner did the same
-- for whoever called them, a superuser included.
--
-- From 1.13 idem's tables, sequences and internal helpers live in a schema
-- of their own, idem_internal, created here by a plain CREATE SCHEMA (never
-- IF NOT EXISTS, never the control file's "schema": either would take over a
-- schema some other role created first, and that role would own idem's
-- tables).  It belongs to the extension's owner, and PUBLIC has no privilege
-- on it: no other role can create in it, rename it or drop it.  Function
-- bodies name only pg_catalog and idem_internal; the SQL-language ones are
-- SQL-standard bodies (BEGIN ATOMIC), bound to their objects when created,
-- so they resolve no name at all when called.  The SQL API, the views
-- (idem_stats, idem_audit, idem_policies) and the types (idem_outcome,
-- idem_result, idem_response) stay in the extension's schema: applications
-- and handlers do not change.  The C code finds idem_internal as a member of
-- the extension (pg_depend), never by name.  docs/security.md.
-- ---------------------------------------------------------------------------
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_namespace n
                WHERE n.nspname OPERATOR(pg_catalog.=) 'idem_internal') THEN
        RAISE EXCEPTION 'schema "idem_internal" already exists'
            USING ERRCODE = '42P06',
                  DETAIL = 'idem keeps its tables and internal functions in a schema it creates itself; one made by another role beforehand would let that role reach them.',
                  HINT = 'Find out who created the schema "idem_internal" and why; drop it, then run the command again.';
    END IF;
END
$$;

CREATE SCHEMA idem_internal;

-- the extension's owner, whoever runs the script (a superuser may update an
-- extension another role owns)
DO $$
BEGIN
    EXECUTE pg_catalog.format('ALTER SCHEMA idem_internal OWNER TO %I',
        (SELECT r.rolname FROM pg_catalog.pg_roles r
           JOIN pg_catalog.pg_extension e ON e.extowner OPERATOR(pg_catalog.=) r.oid
          WHERE e.extname OPERATOR(pg_catalog.=) 'idem'));
END
$$;

REVOKE ALL ON SCHEMA idem_internal FROM PUBLIC;

COMMENT ON SCHEMA idem_internal IS
    'idem: its tables, sequences and internal functions (the API, views and types are in the extension''s schema)';

-- The record's new columns, added before the move: on a Citus cluster the
-- coordinator's ALTER TABLE reaches the shards on the workers by their
-- names, which are in the extension's schema until each worker's own
-- update moves them (IF NOT EXISTS: that update finds them added).
--
-- How often a task's lease lapsed, or its bound session ended, before its
-- worker ended the attempt (1.13): each counts as an attempt, so that a
-- task whose worker keeps dying ends FAILED_FINAL after max_attempts.
ALTER TABLE @extschema@.idempotency_record ADD COLUMN IF NOT EXISTS task_lapses integer;
COMMENT ON COLUMN @extschema@.idempotency_record.task_lapses IS
    'idem: how many of the task''s attempts ended by their lease lapsing (or their bound session ending), not by idem_complete or idem_fail';

-- The request's digest (1.13): SipHash-2-4-128 of its jsonb bytes, keyed
-- with idem_digest_secret (or, for a record keyed by a file secret, with a
-- key derived from that secret).  A replay that sends the very same bytes
-- is recognised by it without the canonical text and SHA-256; any other
-- request is compared by request_hash, as before.  NULL: not recorded
-- (idem_create_order, records from before 1.13); request_hash decides.
ALTER TABLE @extschema@.idempotency_record ADD COLUMN IF NOT EXISTS request_digest bytea;
COMMENT ON COLUMN @extschema@.idempotency_record.request_digest IS
    'idem: SipHash-2-4-128 of the request''s jsonb bytes under idem_digest_secret (or fingerprint_version''s file secret); a replay of the same bytes matches it without the canonical text; NULL: request_hash decides';

-- The tables (their indexes, triggers and owned sequences go with them) and
-- the other sequences; pg_dump's registrations (pg_extension_config_dump)
-- are by OID and stay.  On a Citus cluster every node runs this script
-- (the coordinator's update is propagated): each moves its own tables and
-- the shards placed on it (named after their table, in its schema), with
-- Citus's DDL propagation off, as a worker has no idem_internal before its
-- own update.
DO $move$
DECLARE
    citus boolean := pg_catalog.to_regclass('pg_catalog.pg_dist_shard') IS NOT NULL;
    propagation text := pg_catalog.current_setting('citus.enable_ddl_propagation', true);
    tables pg_catalog.oid[] := ARRAY['@extschema@.idempotency_record', '@extschema@.purchase_order',
        '@extschema@.idem_outbox', '@extschema@.idem_inbox', '@extschema@.idem_policy',
        '@extschema@.idem_history']::pg_catalog.regclass[]::pg_catalog.oid[];
    shards pg_catalog.oid[] := '{}';
    rel pg_catalog.oid;
BEGIN
    IF citus THEN
        PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);
        -- Citus hides shards from queries of pg_class: the coordinator's
        -- placement of idem_policy (a reference table) would stay behind
        PERFORM pg_catalog.set_config('citus.override_table_visibility', 'off', true);
        EXECUTE
            'SELECT COALESCE(pg_catalog.array_agg(c.oid), ''{}'') FROM pg_catalog.pg_dist_shard s
               JOIN pg_catalog.pg_class l ON l.oid OPERATOR(pg_catalog.=) s.logicalrelid
               JOIN pg_catalog.pg_class c ON c.relnamespace OPERATOR(pg_catalog.=) l.relnamespace
                AND c.relname OPERATOR(pg_catalog.=)
                    (l.relname::pg_catalog.text OPERATOR(pg_catalog.||) ''_'' OPERATOR(pg_catalog.||) s.shardid::pg_catalog.text)
              WHERE s.logicalrelid::pg_catalog.oid OPERATOR(pg_catalog.=) ANY ($1)'
            INTO shards USING tables;
    END IF;
    FOREACH rel IN ARRAY shards OPERATOR(pg_catalog.||) tables LOOP
        EXECUTE (SELECT pg_catalog.format('ALTER TABLE %I.%I SET SCHEMA idem_internal', n.nspname, c.relname)
                   FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                  WHERE c.oid OPERATOR(pg_catalog.=) rel);
    END LOOP;
    IF citus THEN
        PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', COALESCE(propagation, 'on'), true);
    END IF;
END
$move$;
ALTER SEQUENCE @extschema@.idem_task_token_seq SET SCHEMA idem_internal;
ALTER SEQUENCE @extschema@.idem_timeline_seq SET SCHEMA idem_internal;

-- the internal helpers (no caller names them; a default, a trigger or idem's
-- own code calls them by OID)
ALTER FUNCTION @extschema@.idem_outbox_guard() SET SCHEMA idem_internal;
ALTER FUNCTION @extschema@.idem_outbox_lock_keys(text[], text[]) SET SCHEMA idem_internal;
ALTER FUNCTION @extschema@.idem_stats_add(text, text, bigint) SET SCHEMA idem_internal;
ALTER FUNCTION @extschema@.idem_policy_changed() SET SCHEMA idem_internal;
ALTER FUNCTION @extschema@.idem_policy_unchanged_interval() SET SCHEMA idem_internal;
ALTER FUNCTION @extschema@.idem_policy_unchanged_integer() SET SCHEMA idem_internal;
ALTER FUNCTION @extschema@.idem_policy_unchanged_textarray() SET SCHEMA idem_internal;
ALTER FUNCTION @extschema@.idem_policy_unchanged_text() SET SCHEMA idem_internal;
ALTER FUNCTION @extschema@.idem_policy_unchanged_boolean() SET SCHEMA idem_internal;
ALTER FUNCTION @extschema@.idem_timeline_mark() SET SCHEMA idem_internal;
ALTER FUNCTION @extschema@.idem_distribute_node() SET SCHEMA idem_internal;
ALTER FUNCTION @extschema@.idem_grant_kind(regrole, text, boolean) SET SCHEMA idem_internal;

-- The cleanup of a Citus cluster runs on each worker node: there it calls
-- this one, in idem_internal, not the one in the extension's schema.
CREATE FUNCTION idem_internal.idem_cleanup_node(batch_size integer, max_batches integer)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_cleanup_expired'
LANGUAGE C VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON FUNCTION idem_internal.idem_cleanup_node(integer, integer) FROM PUBLIC;

COMMENT ON FUNCTION idem_internal.idem_cleanup_node(integer, integer) IS
    'idem: idem_cleanup_expired on one Citus worker node (the coordinator''s cleanup calls it there)';

-- The key of request digests (1.13): 16 random bytes (gen_random_uuid, from
-- the server's strong random source), one row, never changed.  Only idem's
-- owner reads it.  Not dumped: a database restored from a dump draws a
-- secret of its own, and its restored records are compared by request_hash.
CREATE TABLE idem_internal.idem_digest_secret (
    secret bytea NOT NULL
        CHECK (pg_catalog.length(secret) OPERATOR(pg_catalog.=) 16)
);
INSERT INTO idem_internal.idem_digest_secret (secret)
    SELECT pg_catalog.uuid_send(pg_catalog.gen_random_uuid());
REVOKE ALL ON TABLE idem_internal.idem_digest_secret FROM PUBLIC;
COMMENT ON TABLE idem_internal.idem_digest_secret IS
    'idem: the key of request digests (idempotency_record.request_digest); one row, never changed';

-- Whose a message is (1.13): the owner given to idem_outbox_emit, or the
-- owner of the emitting transaction's unfinished claims; idem_forget_owner
-- finds it.
ALTER TABLE idem_internal.idem_outbox ADD COLUMN owner_id bigint;
COMMENT ON COLUMN idem_internal.idem_outbox.owner_id IS
    'idem: the owner the message is about (idem_outbox_emit''s owner, or the owner of the emitting transaction''s claims), for idem_forget_owner';
CREATE INDEX idem_outbox_owner ON idem_internal.idem_outbox (owner_id) WHERE owner_id IS NOT NULL;

-- idem_outbox_emit takes the message's owner, idem_health has a new column,
-- and idem_finish_stored is new (1.13).  The first two are replaced (the
-- old ones dropped); as in 1.11, EXECUTE granted on an old function does
-- not pass to the new one (granted in this script it would be recorded as
-- the extension's initial privileges, which pg_dump leaves out), and the
-- roles of the app kind have no EXECUTE on idem_finish_stored: the update
-- warns which roles had what, to grant it again (idem_grant) in the same
-- transaction.  pg_monitor gets idem_health again from this script, as a
-- fresh install gives it.
DO $replace$
DECLARE
    f record;
    roles text;
BEGIN
    FOR f IN
        SELECT * FROM (VALUES
            ('@extschema@.idem_outbox_emit(text, jsonb, text, jsonb)', 'idem_outbox_emit(text, jsonb, text, jsonb, bigint)', 'app', 'replaced'),
            ('@extschema@.idem_health()', 'idem_health() (a new column)', 'monitor', 'replaced'),
            ('@extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json)', 'idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json)', 'app', 'added'),
            ('@extschema@.idem_outbox_ack(bigint[])', 'idem_outbox_nack(bigint[], text, boolean, interval)', 'publisher', 'added'),
            ('@extschema@.idem_consume(text, text, interval, bigint)', 'idem_consume_check(text, text, text, bigint) and idem_consume_failed(text, text, text, text, text, integer, bigint)', 'consumer', 'added'))
        AS v (old, new, kind, how)
    LOOP
        SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)), ', ')
          INTO roles
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid OPERATOR(pg_catalog.=) f.old::pg_catalog.regprocedure
           AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) 0
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 'pg_monitor'::pg_catalog.regrole;
        IF roles IS NOT NULL THEN
            RAISE WARNING 'idem 1.13 % %: roles %, granted EXECUTE on %, do not have it on the new function', f.how, f.new, roles, f.old
                USING HINT = pg_catalog.format('Grant it in the same transaction as the update: SELECT idem_grant(role, %L) for each of %s.',
                                               f.kind, roles);
        END IF;
    END LOOP;
END
$replace$;
DROP FUNCTION @extschema@.idem_outbox_emit(text, jsonb, text, jsonb);
CREATE FUNCTION @extschema@.idem_outbox_emit(
    topic text, payload jsonb, msg_key text DEFAULT NULL, headers jsonb DEFAULT NULL,
    owner bigint DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_emit'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_outbox_emit(text, jsonb, text, jsonb, bigint) IS
    'idem: emit a message that exists if and only if the calling transaction commits; returns its id';
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_emit(text, jsonb, text, jsonb, bigint) FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- Dead letters (1.13): one message that can never be delivered or applied
-- no longer stops a topic.  docs/dead-letters.md.
--
-- Only a publisher's explicit report counts: idem_outbox_nack.  A lease that
-- lapses (a relay that died, a broker down for a while) is never a reason
-- to give a message up; it is counted (lapses) and shown by idem_health().
-- A message refused for good (permanent), or nacked max_deliveries times
-- (its topic's setting, else idem.outbox_max_deliveries), is a dead letter:
-- a copy goes to idem_outbox_dead with its attempts and last reason, and
-- its topic's on_dead says what its key's later messages do:
--   'block' (the default: per-key order is a promise): the message stays
--           in idem_outbox as its key's head, marked dead (dead_at) and not
--           deliverable, so the key's later messages wait behind it;
--           idem_outbox_redrive makes it deliverable again, in its place;
--   'skip':  it leaves idem_outbox and its key's next message becomes the
--           head; a redriven message is appended after the key's messages
--           of the moment, with the header "idem-redriven".
-- A dead letter stays until an operator redrives it (idem_outbox_redrive)
-- or discards it (idem_outbox_discard), or idem_forget_owner erases it: the
-- cleanup never deletes one (it is a committed message nobody received).
-- ---------------------------------------------------------------------------
ALTER TABLE idem_internal.idem_outbox
    ADD COLUMN nacks integer,
    ADD COLUMN lapses integer,
    ADD COLUMN last_reason text,
    ADD COLUMN not_before timestamptz,
    ADD COLUMN dead_at timestamptz;
COMMENT ON COLUMN idem_internal.idem_outbox.nacks IS
    'idem: how many times a publisher reported the message not delivered (idem_outbox_nack); NULL: never';
COMMENT ON COLUMN idem_internal.idem_outbox.lapses IS
    'idem: how many of its leases lapsed without an ack or a nack (a publisher gone, a broker down); never a reason to dead-letter it';
COMMENT ON COLUMN idem_internal.idem_outbox.last_reason IS
    'idem: the reason of its last nack';
COMMENT ON COLUMN idem_internal.idem_outbox.not_before IS
    'idem: not fetched before this time (a nack''s retry_after)';
COMMENT ON COLUMN idem_internal.idem_outbox.dead_at IS
    'idem: when it became a dead letter of a topic whose on_dead is ''block'': its key''s head, not deliverable until redriven';

CREATE TABLE idem_internal.idem_outbox_topic (
    topic          varchar(128) PRIMARY KEY,
    max_deliveries integer,
    on_dead        text NOT NULL,
    updated_at     timestamptz NOT NULL,
    CONSTRAINT idem_outbox_topic_name CHECK (topic OPERATOR(pg_catalog.~) '^[A-Za-z0-9_.:-]{1,128}$'),
    CONSTRAINT idem_outbox_topic_max_deliveries CHECK (max_deliveries OPERATOR(pg_catalog.>=) 1
                                                        AND max_deliveries OPERATOR(pg_catalog.<=) 1000),
    CONSTRAINT idem_outbox_topic_on_dead CHECK (on_dead OPERATOR(pg_catalog.=) ANY (ARRAY['block', 'skip']))
);
COMMENT ON TABLE idem_internal.idem_outbox_topic IS
    'idem: per-topic dead-letter settings (idem_outbox_set_topic): max_deliveries (NULL: idem.outbox_max_deliveries) and on_dead';

CREATE TABLE idem_internal.idem_outbox_dead (
    message_id  bigint PRIMARY KEY,
    topic       varchar(128) NOT NULL,
    msg_key     varchar(256),
    payload     jsonb NOT NULL,
    headers     jsonb,
    emitted_at  timestamptz NOT NULL,
    owner_id    bigint,
    attempts    integer NOT NULL,
    nacks       integer NOT NULL,
    lapses      integer NOT NULL,
    permanent   boolean NOT NULL,
    last_reason text,
    on_dead     text NOT NULL,
    dead_at     timestamptz NOT NULL
);
CREATE INDEX idem_outbox_dead_topic ON idem_internal.idem_outbox_dead (topic, dead_at);
CREATE INDEX idem_outbox_dead_owner ON idem_internal.idem_outbox_dead (owner_id) WHERE owner_id IS NOT NULL;
COMMENT ON TABLE idem_internal.idem_outbox_dead IS
    'idem: outbox messages given up (refused for good, or nacked max_deliveries times), with their attempts and last reason, until redriven, discarded or erased';

-- A consumer's failures: a message whose effect failed (an undecodable
-- payload, a handler that raised) has a row here, written outside the
-- effect's transaction (idem_consume_failed), so that its attempts survive
-- restarts; past the limit it is dead (dead_at).  A dead message of a topic
-- whose on_dead is 'block' holds its key back for that consumer: the key's
-- later messages are set aside (behind names the dead one) until the
-- operator redrives them (idem_inbox_redrive) and the broker delivers them
-- again.  A row goes when its message is applied (idem_consume_check, in
-- the effect's transaction), or when discarded or erased; never by age.
CREATE TABLE idem_internal.idem_inbox_failure (
    consumer        varchar(64) NOT NULL,
    message_id      varchar(512) NOT NULL,
    msg_key         varchar(256),
    owner_id        bigint,
    attempts        integer NOT NULL,
    last_reason     text,
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    dead_at         timestamptz,
    blocks          boolean NOT NULL,
    behind          varchar(512),
    redriven        boolean NOT NULL,
    CONSTRAINT pk_idem_inbox_failure PRIMARY KEY (consumer, message_id)
);
CREATE INDEX idem_inbox_failure_blocking ON idem_internal.idem_inbox_failure (consumer, msg_key)
    WHERE dead_at IS NOT NULL AND blocks;
CREATE INDEX idem_inbox_failure_owner ON idem_internal.idem_inbox_failure (owner_id) WHERE owner_id IS NOT NULL;
COMMENT ON TABLE idem_internal.idem_inbox_failure IS
    'idem: messages a consumer failed to apply: attempts, last reason, dead letters and the messages set aside behind them';

SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_outbox_topic', '');
SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_outbox_dead', '');
SELECT pg_catalog.pg_extension_config_dump('idem_internal.idem_inbox_failure', '');
REVOKE ALL ON TABLE idem_internal.idem_outbox_topic, idem_internal.idem_outbox_dead,
                    idem_internal.idem_inbox_failure FROM PUBLIC;

-- Make each key's first undelivered message its head (ready), unless it is
-- already or a dead letter is first: after a head left the outbox (a
-- dead letter of a 'skip' topic, a discarded one).  Called under the keys'
-- locks (idem_outbox_lock_keys), as a statement of its own: in READ
-- COMMITTED it sees the messages of every emitter the locks waited for.
CREATE FUNCTION idem_internal.idem_outbox_promote(topics text[], keys text[])
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    UPDATE idem_internal.idem_outbox o
       SET ready = true
      FROM (SELECT DISTINCT ON (h.topic, h.msg_key) h.message_id, h.ready, h.dead_at
              FROM ROWS FROM (pg_catalog.unnest(topics), pg_catalog.unnest(keys)) AS k (topic, msg_key)
              JOIN idem_internal.idem_outbox h
                ON h.topic::pg_catalog.text OPERATOR(pg_catalog.=) k.topic
               AND h.msg_key::pg_catalog.text OPERATOR(pg_catalog.=) k.msg_key
             WHERE h.acked_at IS NULL
             ORDER BY h.topic, h.msg_key, h.commit_seq) AS head
     WHERE o.message_id OPERATOR(pg_catalog.=) head.message_id
       AND NOT head.ready AND head.dead_at IS NULL;
END;
REVOKE ALL ON FUNCTION idem_internal.idem_outbox_promote(text[], text[]) FROM PUBLIC;

-- What the dead-letter functions check first: no NULL argument (22004), the
-- outbox's guard, READ COMMITTED (0A000: after taking its keys' locks a call
-- must see what committed before them).
CREATE FUNCTION idem_internal.idem_outbox_dead_letter_check(fn text, args text[], nulls boolean[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    FOR i IN 1 .. pg_catalog.cardinality(args) LOOP
        IF nulls[i] THEN
            RAISE EXCEPTION 'argument "%" of % must not be null', args[i], fn USING ERRCODE = '22004';
        END IF;
    END LOOP;
    PERFORM idem_internal.idem_outbox_guard();
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RAISE EXCEPTION '% must run in a READ COMMITTED transaction', fn USING ERRCODE = '0A000',
            DETAIL = 'After taking its keys'' locks it must see what committed before them.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION idem_internal.idem_outbox_dead_letter_check(text, text[], boolean[]) FROM PUBLIC;

-- The checks of idem_outbox_redrive and idem_outbox_discard, then the
-- commit-order locks of their dead letters' keys; the keys locked.
CREATE FUNCTION idem_internal.idem_outbox_lock_dead(fn text, message_ids bigint[],
                                                    OUT topics text[], OUT keys text[])
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idem_internal.idem_outbox_dead_letter_check(fn, ARRAY['message_ids'], ARRAY[message_ids IS NULL]);
    SELECT pg_catalog.array_agg(d.topic::pg_catalog.text), pg_catalog.array_agg(d.msg_key::pg_catalog.text)
      INTO topics, keys
      FROM idem_internal.idem_outbox_dead d
     WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids) AND d.msg_key IS NOT NULL;
    PERFORM idem_internal.idem_outbox_lock_keys(topics, keys);
END
$$;
REVOKE ALL ON FUNCTION idem_internal.idem_outbox_lock_dead(text, bigint[]) FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- idem_outbox_set_topic: a topic's dead-letter settings.  Superuser or the
-- extension's owner.  max_deliveries NULL: idem.outbox_max_deliveries.
-- ---------------------------------------------------------------------------
CREATE FUNCTION @extschema@.idem_outbox_set_topic(
    topic text, max_deliveries integer DEFAULT NULL, on_dead text DEFAULT 'block')
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF topic IS NULL OR on_dead IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null', CASE WHEN topic IS NULL THEN 'topic' ELSE 'on_dead' END
            USING ERRCODE = '22004';
    END IF;
    IF topic OPERATOR(pg_catalog.!~) '^[A-Za-z0-9_.:-]{1,128}$' THEN
        RAISE EXCEPTION 'topic must be 1 to 128 characters from A-Z, a-z, 0-9, "_", ".", ":" and "-"'
            USING ERRCODE = '22023';
    END IF;
    IF max_deliveries OPERATOR(pg_catalog.<) 1 OR max_deliveries OPERATOR(pg_catalog.>) 1000 THEN
        RAISE EXCEPTION 'max_deliveries must be between 1 and 1000, or NULL for idem.outbox_max_deliveries'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has max_deliveries %s.', max_deliveries);
    END IF;
    IF on_dead OPERATOR(pg_catalog.<>) ALL (ARRAY['block', 'skip']) THEN
        RAISE EXCEPTION 'on_dead must be ''block'' or ''skip''' USING ERRCODE = '22023',
            DETAIL = pg_catalog.format('The call has on_dead %L.', on_dead),
            HINT = '''block'': a dead letter holds its key''s later messages back until redriven (per-key order kept); ''skip'': they go on.';
    END IF;
    INSERT INTO idem_internal.idem_outbox_topic AS s (topic, max_deliveries, on_dead, updated_at)
    VALUES (topic, max_deliveries, on_dead, pg_catalog.now())
    ON CONFLICT ON CONSTRAINT idem_outbox_topic_pkey DO UPDATE
       SET max_deliveries = excluded.max_deliveries, on_dead = excluded.on_dead, updated_at = excluded.updated_at;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_set_topic(text, integer, text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_outbox_set_topic(text, integer, text) IS
    'idem: a topic''s dead-letter settings: max_deliveries (NULL: idem.outbox_max_deliveries) and on_dead (''block'' or ''skip'')';

-- ---------------------------------------------------------------------------
-- idem_outbox_nack (SECURITY DEFINER, a publisher's): the broker did not
-- take these messages.  Counted only for a message handed out and still
-- undelivered; its lease ends (fetched again at once, or after retry_after).
-- permanent, or max_deliveries nacks: a dead letter.  Returns how many
-- became dead letters.
-- ---------------------------------------------------------------------------
CREATE FUNCTION @extschema@.idem_outbox_nack(
    message_ids bigint[], reason text, permanent boolean DEFAULT false,
    retry_after interval DEFAULT interval '0')
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t timestamptz := pg_catalog.clock_timestamp();
    fallback integer;
    ktopics text[];
    kkeys text[];
    dead bigint;
BEGIN
    PERFORM idem_internal.idem_outbox_dead_letter_check('idem_outbox_nack',
        ARRAY['message_ids', 'reason', 'permanent', 'retry_after'],
        ARRAY[message_ids IS NULL, reason IS NULL, permanent IS NULL, retry_after IS NULL]);
    IF retry_after OPERATOR(pg_catalog.<) interval '0' THEN
        RAISE EXCEPTION 'retry_after must not be negative'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has retry_after %s.', retry_after);
    END IF;
    -- the library is loaded by the guard: its GUC is defined
    fallback := COALESCE(pg_catalog.current_setting('idem.outbox_max_deliveries', true), '5')::pg_catalog.int4;

    -- the keys' locks first, before any row is written (as idem_outbox_ack)
    SELECT pg_catalog.array_agg(o.topic::pg_catalog.text), pg_catalog.array_agg(o.msg_key::pg_catalog.text)
      INTO ktopics, kkeys
      FROM idem_internal.idem_outbox o
     WHERE o.message_id OPERATOR(pg_catalog.=) ANY (message_ids) AND o.msg_key IS NOT NULL
       AND o.acked_at IS NULL AND o.dead_at IS NULL AND o.leased_until IS NOT NULL;
    PERFORM idem_internal.idem_outbox_lock_keys(ktopics, kkeys);

    WITH nacked AS (
        UPDATE idem_internal.idem_outbox o
           SET nacks = COALESCE(o.nacks, 0) OPERATOR(pg_catalog.+) 1,
               last_reason = pg_catalog.left(reason, 1000),
               leased_until = NULL,
               not_before = CASE WHEN retry_after OPERATOR(pg_catalog.>) interval '0'
                                 THEN t OPERATOR(pg_catalog.+) retry_after END
         WHERE o.message_id OPERATOR(pg_catalog.=) ANY (message_ids)
           AND o.acked_at IS NULL AND o.dead_at IS NULL AND o.leased_until IS NOT NULL
        RETURNING o.*
    )
    INSERT INTO idem_internal.idem_outbox_dead
        (message_id, topic, msg_key, payload, headers, emitted_at, owner_id, attempts, nacks, lapses,
         permanent, last_reason, on_dead, dead_at)
    SELECT n.message_id, n.topic, n.msg_key, n.payload, n.headers, n.emitted_at, n.owner_id, n.attempt,
           n.nacks, COALESCE(n.lapses, 0), permanent, n.last_reason,
           CASE WHEN n.msg_key IS NULL THEN 'skip' ELSE COALESCE(s.on_dead, 'block') END, t
      FROM nacked n
      LEFT JOIN idem_internal.idem_outbox_topic s ON s.topic OPERATOR(pg_catalog.=) n.topic
     WHERE permanent OR n.nacks OPERATOR(pg_catalog.>=) COALESCE(s.max_deliveries, fallback);
    GET DIAGNOSTICS dead = ROW_COUNT;
    IF dead OPERATOR(pg_catalog.=) 0 THEN
        RETURN 0;
    END IF;

    -- 'block': the dead letter stays its key's head, not deliverable
    UPDATE idem_internal.idem_outbox o
       SET dead_at = t, ready = false, not_before = NULL
      FROM idem_internal.idem_outbox_dead d
     WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids) AND d.dead_at OPERATOR(pg_catalog.=) t
       AND d.on_dead OPERATOR(pg_catalog.=) 'block'
       AND o.message_id OPERATOR(pg_catalog.=) d.message_id;
    -- 'skip' (and keyless): it leaves the outbox, its key's next message is the head
    WITH gone AS (
        DELETE FROM idem_internal.idem_outbox o
         USING idem_internal.idem_outbox_dead d
         WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids) AND d.dead_at OPERATOR(pg_catalog.=) t
           AND d.on_dead OPERATOR(pg_catalog.=) 'skip'
           AND o.message_id OPERATOR(pg_catalog.=) d.message_id
        RETURNING o.topic, o.msg_key)
    SELECT pg_catalog.array_agg(g.topic::pg_catalog.text), pg_catalog.array_agg(g.msg_key::pg_catalog.text)
      INTO ktopics, kkeys
      FROM gone g WHERE g.msg_key IS NOT NULL;
    PERFORM idem_internal.idem_outbox_promote(ktopics, kkeys);
    RETURN dead;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_nack(bigint[], text, boolean, interval) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_outbox_nack(bigint[], text, boolean, interval) IS
    'idem: a publisher''s report that its broker did not take these fetched messages (permanent: never will); returns how many became dead letters';

-- ---------------------------------------------------------------------------
-- idem_outbox_redrive: dead letters delivered again.  Of a 'block' topic:
-- the message is its key's head again, in its place; of a 'skip' topic (or
-- keyless): appended after its key's messages of the moment, with the
-- header "idem-redriven".  Superuser or the extension's owner.  Returns how
-- many.
-- ---------------------------------------------------------------------------
CREATE FUNCTION @extschema@.idem_outbox_redrive(message_ids bigint[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ktopics text[];
    kkeys text[];
    n bigint;
    m bigint;
    topic text;
BEGIN
    SELECT l.topics, l.keys INTO ktopics, kkeys
      FROM idem_internal.idem_outbox_lock_dead('idem_outbox_redrive', message_ids) l;

    -- 'block': in place
    WITH back AS (
        DELETE FROM idem_internal.idem_outbox_dead d
         USING idem_internal.idem_outbox o
         WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids)
           AND o.message_id OPERATOR(pg_catalog.=) d.message_id AND o.dead_at IS NOT NULL
        RETURNING d.message_id)
    UPDATE idem_internal.idem_outbox o
       SET dead_at = NULL, ready = true, nacks = NULL, not_before = NULL, leased_until = NULL
      FROM back
     WHERE o.message_id OPERATOR(pg_catalog.=) back.message_id;
    GET DIAGNOSTICS n = ROW_COUNT;

    -- the others: appended, in their first order
    WITH back AS (
        DELETE FROM idem_internal.idem_outbox_dead d
         WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids)
        RETURNING d.*),
    ordered AS (
        SELECT b.*, pg_catalog.row_number() OVER (PARTITION BY b.topic, b.msg_key ORDER BY b.message_id) AS nth
          FROM back b ORDER BY b.message_id)
    INSERT INTO idem_internal.idem_outbox
        (message_id, topic, msg_key, payload, headers, emitted_at, commit_seq, attempt, ready, owner_id)
    SELECT b.message_id, b.topic, b.msg_key, b.payload,
           COALESCE(b.headers, '{}'::pg_catalog.jsonb) OPERATOR(pg_catalog.||)
               pg_catalog.jsonb_build_object('idem-redriven', 'true'),
           b.emitted_at, pg_catalog.nextval('idem_internal.idem_outbox_message_id_seq'::pg_catalog.regclass), 0,
           b.msg_key IS NULL OR (b.nth OPERATOR(pg_catalog.=) 1 AND NOT EXISTS (
               SELECT FROM idem_internal.idem_outbox h
                WHERE h.topic OPERATOR(pg_catalog.=) b.topic AND h.msg_key OPERATOR(pg_catalog.=) b.msg_key
                  AND h.acked_at IS NULL)),
           b.owner_id
      FROM ordered b;
    GET DIAGNOSTICS m = ROW_COUNT;

    FOR topic IN SELECT DISTINCT t.topic FROM pg_catalog.unnest(ktopics) AS t (topic) LOOP
        PERFORM pg_catalog.pg_notify('idem_outbox', topic);
    END LOOP;
    IF m OPERATOR(pg_catalog.>) 0 THEN
        PERFORM pg_catalog.pg_notify('idem_outbox', o.topic) FROM idem_internal.idem_outbox o
          WHERE o.message_id OPERATOR(pg_catalog.=) ANY (message_ids) AND o.msg_key IS NULL;
    END IF;
    RETURN n OPERATOR(pg_catalog.+) m;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_redrive(bigint[]) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_outbox_redrive(bigint[]) IS
    'idem: deliver dead letters again: in their key''s place (on_dead ''block'') or after its messages with the header idem-redriven (''skip''); returns how many';

-- ---------------------------------------------------------------------------
-- idem_outbox_discard: dead letters given up for good; a blocked key's next
-- message becomes its head.  Superuser or the extension's owner.
-- ---------------------------------------------------------------------------
CREATE FUNCTION @extschema@.idem_outbox_discard(message_ids bigint[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ktopics text[];
    kkeys text[];
    n bigint;
BEGIN
    SELECT l.topics, l.keys INTO ktopics, kkeys
      FROM idem_internal.idem_outbox_lock_dead('idem_outbox_discard', message_ids) l;
    DELETE FROM idem_internal.idem_outbox o
     USING idem_internal.idem_outbox_dead d
     WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids)
       AND o.message_id OPERATOR(pg_catalog.=) d.message_id AND o.dead_at IS NOT NULL;
    DELETE FROM idem_internal.idem_outbox_dead d WHERE d.message_id OPERATOR(pg_catalog.=) ANY (message_ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM idem_internal.idem_outbox_promote(ktopics, kkeys);
    RETURN n;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_discard(bigint[]) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_outbox_discard(bigint[]) IS
    'idem: give dead letters up for good (their blocked keys go on); returns how many';

-- ---------------------------------------------------------------------------
-- A consumer's side (SECURITY DEFINER, a consumer's).
--
-- idem_consume_check, in the effect's transaction before idem_consume:
--   'apply'     go on (a failure row of this message goes with the commit);
--   'dead'      this message is a dead letter (not redriven): set it aside again;
--   'set_aside' its key is held back behind a dead letter (blocked_by) of a
--               'block' topic: recorded here, set it aside (commit, then the
--               broker's dead-lettering).
-- ---------------------------------------------------------------------------
CREATE FUNCTION @extschema@.idem_consume_check(
    consumer text, message_id text, msg_key text DEFAULT NULL, owner bigint DEFAULT NULL,
    OUT verdict text, OUT blocked_by text, OUT attempts integer)
RETURNS record
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    IF idem_consume_check.consumer IS NULL OR idem_consume_check.message_id IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null',
            CASE WHEN idem_consume_check.consumer IS NULL THEN 'consumer' ELSE 'message_id' END
            USING ERRCODE = '22004';
    END IF;
    attempts := 0;
    SELECT f.* INTO r FROM idem_internal.idem_inbox_failure f
     WHERE f.consumer OPERATOR(pg_catalog.=) idem_consume_check.consumer
       AND f.message_id OPERATOR(pg_catalog.=) idem_consume_check.message_id
       FOR UPDATE;
    IF FOUND THEN
        attempts := r.attempts;
        IF r.dead_at IS NOT NULL AND NOT r.redriven THEN
            verdict := 'dead';
            blocked_by := r.behind;
            RETURN;
        END IF;
        DELETE FROM idem_internal.idem_inbox_failure f
         WHERE f.consumer OPERATOR(pg_catalog.=) idem_consume_check.consumer
           AND f.message_id OPERATOR(pg_catalog.=) idem_consume_check.message_id;
        IF r.redriven THEN
            verdict := 'apply';     -- redriven: in the order the operator delivers them again
            RETURN;
        END IF;
    END IF;
    IF idem_consume_check.msg_key IS NOT NULL THEN
        SELECT f.message_id INTO blocked_by FROM idem_internal.idem_inbox_failure f
         WHERE f.consumer OPERATOR(pg_catalog.=) idem_consume_check.consumer
           AND f.msg_key OPERATOR(pg_catalog.=) idem_consume_check.msg_key
           AND f.dead_at IS NOT NULL AND f.blocks
           AND f.message_id OPERATOR(pg_catalog.<>) idem_consume_check.message_id
         ORDER BY f.dead_at, f.message_id LIMIT 1;
        IF blocked_by IS NOT NULL THEN
            INSERT INTO idem_internal.idem_inbox_failure AS f
                (consumer, message_id, msg_key, owner_id, attempts, last_reason, first_failed_at,
                 last_failed_at, dead_at, blocks, behind, redriven)
            VALUES (idem_consume_check.consumer, idem_consume_check.message_id, idem_consume_check.msg_key,
                    owner, 0, pg_catalog.format('set aside behind the dead letter %s of its key', blocked_by),
                    pg_catalog.now(), pg_catalog.now(), pg_catalog.now(), true, blocked_by, false);
            verdict := 'set_aside';
            RETURN;
        END IF;
    END IF;
    verdict := 'apply';
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_consume_check(text, text, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_consume_check(text, text, text, bigint) IS
    'idem: before applying a message: ''apply'', ''dead'' (a dead letter) or ''set_aside'' (its key waits behind a dead letter); for consumers';

-- idem_consume_failed, in a transaction of its own after the effect's
-- rolled back: one more attempt; dead past the limit (max_attempts, else
-- the topic's max_deliveries, else idem.outbox_max_deliveries).
CREATE FUNCTION @extschema@.idem_consume_failed(
    consumer text, message_id text, reason text, msg_key text DEFAULT NULL, topic text DEFAULT NULL,
    max_attempts integer DEFAULT NULL, owner bigint DEFAULT NULL,
    OUT attempts integer, OUT dead boolean)
RETURNS record
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    lim integer;
    on_dead text;
    holds boolean;
BEGIN
    IF idem_consume_failed.consumer IS NULL OR idem_consume_failed.message_id IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null',
            CASE WHEN idem_consume_failed.consumer IS NULL THEN 'consumer' ELSE 'message_id' END
            USING ERRCODE = '22004';
    END IF;
    IF max_attempts OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'max_attempts must be at least 1, or NULL for the topic''s max_deliveries'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has max_attempts %s.', max_attempts);
    END IF;
    PERFORM idem_internal.idem_outbox_guard();      -- loads the library: its GUC
    SELECT s.max_deliveries, s.on_dead INTO lim, on_dead
      FROM idem_internal.idem_outbox_topic s WHERE s.topic OPERATOR(pg_catalog.=) idem_consume_failed.topic;
    lim := COALESCE(max_attempts, lim,
                    COALESCE(pg_catalog.current_setting('idem.outbox_max_deliveries', true), '5')::pg_catalog.int4);
    holds := idem_consume_failed.msg_key IS NOT NULL AND COALESCE(on_dead, 'block') OPERATOR(pg_catalog.=) 'block';
    INSERT INTO idem_internal.idem_inbox_failure AS f
        (consumer, message_id, msg_key, owner_id, attempts, last_reason, first_failed_at, last_failed_at,
         dead_at, blocks, behind, redriven)
    VALUES (idem_consume_failed.consumer, idem_consume_failed.message_id, idem_consume_failed.msg_key, owner, 1,
            pg_catalog.left(reason, 1000), pg_catalog.now(), pg_catalog.now(),
            CASE WHEN lim OPERATOR(pg_catalog.<=) 1 THEN pg_catalog.now() END, holds, NULL, false)
    ON CONFLICT ON CONSTRAINT pk_idem_inbox_failure DO UPDATE
       SET attempts = f.attempts OPERATOR(pg_catalog.+) 1,
           last_reason = excluded.last_reason,
           last_failed_at = excluded.last_failed_at,
           dead_at = CASE WHEN f.attempts OPERATOR(pg_catalog.+) 1 OPERATOR(pg_catalog.>=) lim
                          THEN pg_catalog.now() END,
           blocks = excluded.blocks, behind = NULL, redriven = false
    RETURNING f.attempts, f.dead_at IS NOT NULL INTO attempts, dead;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_consume_failed(text, text, text, text, text, integer, bigint) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_consume_failed(text, text, text, text, text, integer, bigint) IS
    'idem: count a failed attempt to apply a message (outside the effect''s transaction); dead past the limit; for consumers';

-- idem_inbox_redrive: a consumer's dead letters (and what was set aside
-- behind them) applied again when the broker delivers them again (the
-- operator moves them back from the broker's dead-letter queue or stream);
-- discard: given up for good, their keys go on.  All of the consumer's
-- when message_ids is NULL.  Superuser or the extension's owner.
CREATE FUNCTION @extschema@.idem_inbox_redrive(
    consumer text, message_ids text[] DEFAULT NULL, discard boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n bigint;
BEGIN
    IF consumer IS NULL OR discard IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null', CASE WHEN consumer IS NULL THEN 'consumer' ELSE 'discard' END
            USING ERRCODE = '22004';
    END IF;
    IF discard THEN
        DELETE FROM idem_internal.idem_inbox_failure f
         WHERE f.consumer OPERATOR(pg_catalog.=) idem_inbox_redrive.consumer AND f.dead_at IS NOT NULL
           AND (message_ids IS NULL OR f.message_id OPERATOR(pg_catalog.=) ANY (message_ids));
    ELSE
        UPDATE idem_internal.idem_inbox_failure f SET redriven = true, attempts = 0
         WHERE f.consumer OPERATOR(pg_catalog.=) idem_inbox_redrive.consumer AND f.dead_at IS NOT NULL
           AND (message_ids IS NULL OR f.message_id OPERATOR(pg_catalog.=) ANY (message_ids));
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_inbox_redrive(text, text[], boolean) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.idem_inbox_redrive(text, text[], boolean) IS
    'idem: let a consumer apply its dead letters when delivered again (or discard them: their keys go on); returns how many';

-- idem_stats (since 1.7; 1.13: each topic's and consumer's dead letters
-- and the oldest one's age, read from the tables, beside the counters:
-- a topic or consumer with dead letters has a row even with no counters
-- since the last reset or restart, its counters NULL).
CREATE OR REPLACE VIEW @extschema@.idem_stats AS
SELECT COALESCE(e.dbid, dl.dbid) AS dbid, d.datname,
       COALESCE(e.operation, dl.name) AS operation, COALESCE(e.kind, dl.kind) AS kind,
       e.calls, e.executed, e.replayed, e.conflicts, e.in_flight, e.waits, e.renewed,
       e.failed_final, e.leases, e.takeovers, e.stale_tokens, e.retries,
       e.outbox_emitted, e.outbox_acked, e.inbox_duplicates, e.cleanup_deleted, e.stats_reset,
       COALESCE(dl.dead_letters, 0) AS dead_letters, dl.oldest_age AS oldest_dead_letter_age
  FROM @extschema@.idem_stats_entries() e
  FULL JOIN (
        SELECT db.oid AS dbid, x.kind, x.name, x.dead_letters, x.oldest_age
          FROM pg_catalog.pg_database db,
               (SELECT 'topic'::pg_catalog.text AS kind, o.topic::pg_catalog.text AS name,
                       pg_catalog.count(*) AS dead_letters,
                       pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(o.dead_at) AS oldest_age
                  FROM idem_internal.idem_outbox_dead o GROUP BY o.topic
                UNION ALL
                SELECT 'consumer', f.consumer::pg_catalog.text, pg_catalog.count(*),
                       pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(f.dead_at)
                  FROM idem_internal.idem_inbox_failure f WHERE f.dead_at IS NOT NULL GROUP BY f.consumer) x
         WHERE db.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) dl
    ON dl.dbid OPERATOR(pg_catalog.=) e.dbid AND dl.kind OPERATOR(pg_catalog.=) e.kind
   AND dl.name OPERATOR(pg_catalog.=) e.operation
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) COALESCE(e.dbid, dl.dbid);

COMMENT ON VIEW @extschema@.idem_stats IS
    'idem: counters per (database, kind, name) since the last idem_stats_reset(); kind is operation, topic or consumer; committed work only for what calls write; dead letters of this database''s topics and consumers';

REVOKE ALL ON @extschema@.idem_stats FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_stats TO pg_monitor;

-- ---------------------------------------------------------------------------
-- idem_health (SECURITY DEFINER, called by monitors): a SQL-standard body.
-- ---------------------------------------------------------------------------
DROP FUNCTION @extschema@.idem_health();
CREATE FUNCTION @extschema@.idem_health(
    OUT records bigint,
    OUT expired_backlog bigint,
    OUT oldest_expires_at timestamptz,
    OUT processing bigint,
    OUT oldest_processing_age interval,
    OUT outbox_unacked bigint,
    OUT outbox_oldest_unacked_age interval,
    OUT outbox_acked_backlog bigint,
    OUT outbox_lease_lapses bigint,
    OUT outbox_dead bigint,
    OUT outbox_oldest_dead_age interval,
    OUT inbox_entries bigint,
    OUT inbox_expired_backlog bigint,
    OUT inbox_dead bigint,
    OUT inbox_oldest_dead_age interval,
    OUT table_bytes bigint,
    OUT index_bytes bigint,
    OUT worker_last_run_started timestamptz,
    OUT worker_last_run_finished timestamptz,
    OUT worker_last_run_deleted bigint,
    OUT worker_last_error text,
    OUT worker_last_error_at timestamptz,
    OUT refuse_without_audit text[])
RETURNS record
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
SELECT
    (SELECT pg_catalog.count(*) FROM idem_internal.idempotency_record),
    (SELECT pg_catalog.count(*) FROM idem_internal.idempotency_record r
      WHERE r.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()),
    (SELECT pg_catalog.min(r.expires_at) FROM idem_internal.idempotency_record r),
    (SELECT pg_catalog.count(*) FROM idem_internal.idempotency_record r
      WHERE r.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PROCESSING'),
    (SELECT pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(r.created_at)
       FROM idem_internal.idempotency_record r
      WHERE r.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PROCESSING'),
    (SELECT pg_catalog.count(*) FROM idem_internal.idem_outbox o WHERE o.acked_at IS NULL),
    (SELECT pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(o.emitted_at)
       FROM idem_internal.idem_outbox o WHERE o.acked_at IS NULL),
    (SELECT pg_catalog.count(*) FROM idem_internal.idem_outbox o WHERE o.acked_at IS NOT NULL),
    (SELECT COALESCE(pg_catalog.sum(COALESCE(o.lapses, 0) OPERATOR(pg_catalog.+)
                (o.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now())::pg_catalog.int4), 0)::pg_catalog.int8
       FROM idem_internal.idem_outbox o WHERE o.acked_at IS NULL AND o.dead_at IS NULL),
    (SELECT pg_catalog.count(*) FROM idem_internal.idem_outbox_dead d),
    (SELECT pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(d.dead_at) FROM idem_internal.idem_outbox_dead d),
    (SELECT pg_catalog.count(*) FROM idem_internal.idem_inbox i),
    (SELECT pg_catalog.count(*) FROM idem_internal.idem_inbox i
      WHERE i.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()),
    (SELECT pg_catalog.count(*) FROM idem_internal.idem_inbox_failure f WHERE f.dead_at IS NOT NULL),
    (SELECT pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(f.dead_at)
       FROM idem_internal.idem_inbox_failure f WHERE f.dead_at IS NOT NULL),
    sizes.table_bytes, sizes.index_bytes,
    w.last_run_started, w.last_run_finished, w.last_run_deleted, w.last_error, w.last_error_at,
    (SELECT pg_catalog.array_agg(u.operation ORDER BY u.operation) FROM (
        SELECT p.operation::pg_catalog.text AS operation FROM idem_internal.idem_policy p
         WHERE COALESCE(p.reuse_after_expiry,
                                   pg_catalog.current_setting('idem.reuse_after_expiry', true)) OPERATOR(pg_catalog.=) 'refuse'
           AND COALESCE(p.audit_ttl, COALESCE(pg_catalog.current_setting('idem.audit_ttl', true), '0')::pg_catalog.interval)
               OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval
        UNION ALL
        SELECT '*' WHERE pg_catalog.current_setting('idem.reuse_after_expiry', true) OPERATOR(pg_catalog.=) 'refuse'
           AND COALESCE(pg_catalog.current_setting('idem.audit_ttl', true), '0')::pg_catalog.interval
               OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval) u)
FROM (SELECT pg_catalog.sum(pg_catalog.pg_table_size(t.rel))::pg_catalog.int8 AS table_bytes,
             pg_catalog.sum(pg_catalog.pg_indexes_size(t.rel))::pg_catalog.int8 AS index_bytes
        FROM pg_catalog.unnest(ARRAY['idem_internal.idempotency_record'::pg_catalog.regclass,
                                     'idem_internal.purchase_order'::pg_catalog.regclass,
                                     'idem_internal.idem_outbox'::pg_catalog.regclass,
                                     'idem_internal.idem_inbox'::pg_catalog.regclass,
                                     'idem_internal.idem_outbox_dead'::pg_catalog.regclass,
                                     'idem_internal.idem_inbox_failure'::pg_catalog.regclass]) AS t(rel)) sizes
LEFT JOIN @extschema@.idem_cleanup_status() w
       ON w.datid OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                          WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database());
END;
COMMENT ON FUNCTION @extschema@.idem_health() IS
    'idem: backlog, PROCESSING records, outbox and inbox (lease lapses, dead letters), disk use, the cleanup worker''s last round, and operations refusing reuse without an audit period, for this database';
REVOKE ALL ON FUNCTION @extschema@.idem_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_health() TO pg_monitor;

-- idem_finish, returning what idem stored: the answer as a replay returns
-- it, after the operation's policy redacted it (for a copy kept elsewhere,
-- such as a fast layer in Redis, that must hold the same bytes).
CREATE FUNCTION @extschema@.idem_finish_stored(
    owner bigint, operation text, key text, http_status integer, body json,
    resource_id bigint DEFAULT NULL, headers jsonb DEFAULT NULL,
    header_list json DEFAULT NULL)
RETURNS @extschema@.idem_outcome
AS 'MODULE_PATHNAME', 'idem_finish_stored'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION @extschema@.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json) IS
    'idem: idem_finish, returning the answer as stored (redacted) and as a replay will return it';
REVOKE ALL ON FUNCTION @extschema@.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json) FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- The privileges of each kind of user, as OIDs bound when this script runs.
-- ---------------------------------------------------------------------------
CREATE FUNCTION idem_internal.idem_privileges(kind text)
RETURNS TABLE (privilege text, object text, fn pg_catalog.regprocedure, rel pg_catalog.regclass)
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT p.privilege,
           -- spelled as before 1.13: "(bigint, text)"
           CASE WHEN p.fn IS NOT NULL THEN pg_catalog.format('FUNCTION %s', pg_catalog.replace(p.fn::pg_catalog.text, ',', ', '))
                ELSE pg_catalog.format('TABLE %s', p.rel) END,
           p.fn, p.rel
    FROM (VALUES
        ('app', 'EXECUTE', '@extschema@.idem_create_order(bigint, text, bigint, integer)'::pg_catalog.regprocedure, NULL::pg_catalog.regclass),
        ('app', 'EXECUTE', '@extschema@.idem_begin(bigint, text, text, jsonb, interval)'::pg_catalog.regprocedure, NULL),
        ('app', 'EXECUTE', '@extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json)'::pg_catalog.regprocedure, NULL),
        ('app', 'EXECUTE', '@extschema@.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json)'::pg_catalog.regprocedure, NULL),
        ('app', 'EXECUTE', '@extschema@.idem_run(bigint, text, text, jsonb, regprocedure, interval)'::pg_catalog.regprocedure, NULL),
        ('app', 'EXECUTE', '@extschema@.idem_submit(bigint, text, text, jsonb, jsonb, interval)'::pg_catalog.regprocedure, NULL),
        ('app', 'EXECUTE', '@extschema@.idem_outbox_emit(text, jsonb, text, jsonb, bigint)'::pg_catalog.regprocedure, NULL),
        ('worker', 'EXECUTE', '@extschema@.idem_lease(text, text, interval, integer, boolean)'::pg_catalog.regprocedure, NULL),
        ('worker', 'EXECUTE', '@extschema@.idem_heartbeat(bigint, bigint, interval)'::pg_catalog.regprocedure, NULL),
        ('worker', 'EXECUTE', '@extschema@.idem_complete(bigint, bigint, integer, json, bigint, jsonb, json)'::pg_catalog.regprocedure, NULL),
        ('worker', 'EXECUTE', '@extschema@.idem_fail(bigint, bigint, jsonb, boolean)'::pg_catalog.regprocedure, NULL),
        ('publisher', 'EXECUTE', '@extschema@.idem_outbox_fetch(text, integer, interval)'::pg_catalog.regprocedure, NULL),
        ('publisher', 'EXECUTE', '@extschema@.idem_outbox_ack(bigint[])'::pg_catalog.regprocedure, NULL),
        ('publisher', 'EXECUTE', '@extschema@.idem_outbox_nack(bigint[], text, boolean, interval)'::pg_catalog.regprocedure, NULL),
        ('consumer', 'EXECUTE', '@extschema@.idem_consume(text, text, interval, bigint)'::pg_catalog.regprocedure, NULL),
        ('consumer', 'EXECUTE', '@extschema@.idem_consume_check(text, text, text, bigint)'::pg_catalog.regprocedure, NULL),
        ('consumer', 'EXECUTE', '@extschema@.idem_consume_failed(text, text, text, text, text, integer, bigint)'::pg_catalog.regprocedure, NULL),
        ('monitor', 'SELECT', NULL, '@extschema@.idem_stats'::pg_catalog.regclass),
        ('monitor', 'SELECT', NULL, '@extschema@.idem_audit'::pg_catalog.regclass),
        ('monitor', 'EXECUTE', '@extschema@.idem_audit_entries(bigint)'::pg_catalog.regprocedure, NULL),
        ('monitor', 'EXECUTE', '@extschema@.idem_stats_entries()'::pg_catalog.regprocedure, NULL),
        ('monitor', 'EXECUTE', '@extschema@.idem_health()'::pg_catalog.regprocedure, NULL),
        ('monitor', 'EXECUTE', '@extschema@.idem_cleanup_status()'::pg_catalog.regprocedure, NULL)
    ) AS p (kind, privilege, fn, rel)
    WHERE p.kind OPERATOR(pg_catalog.=) idem_privileges.kind;
END;

COMMENT ON FUNCTION idem_internal.idem_privileges(text) IS
    'idem: the privileges of one kind of user, with the objects'' OIDs (idem_privileges, idem_grant)';

CREATE OR REPLACE FUNCTION @extschema@.idem_privileges(kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT p.privilege, p.object FROM idem_internal.idem_privileges(idem_privileges.kind) p;
END;

-- Grant or revoke a kind's privileges; the checks by OID.  The GRANT itself
-- names the object as it is called now (a GRANT runs nothing).
CREATE OR REPLACE FUNCTION idem_internal.idem_grant_kind(role regrole, kind text, grant_them boolean)
RETURNS TABLE (privilege text, object text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p record;
    can boolean;
    schema_name name := (SELECT n.nspname FROM pg_catalog.pg_extension e
                         JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
                         WHERE e.extname OPERATOR(pg_catalog.=) 'idem');
    needs_usage boolean;
BEGIN
    IF role IS NULL OR kind IS NULL THEN
        RAISE EXCEPTION 'idem_%: role and kind must not be NULL', CASE WHEN grant_them THEN 'grant' ELSE 'revoke' END
            USING ERRCODE = '22004';
    END IF;
    IF NOT EXISTS (SELECT FROM idem_internal.idem_privileges(kind)) THEN
        RAISE EXCEPTION 'unknown kind of idem user: "%"', kind
            USING ERRCODE = '22023',
                  HINT = 'The kinds are app, worker, publisher, consumer and monitor.';
    END IF;
    -- every privilege is checked first: nothing is granted unless all can be
    FOR p IN SELECT * FROM idem_internal.idem_privileges(kind) LOOP
        IF p.fn IS NOT NULL THEN
            can := pg_catalog.has_function_privilege(p.fn::pg_catalog.oid, 'EXECUTE WITH GRANT OPTION');
        ELSE
            can := pg_catalog.has_table_privilege(p.rel::pg_catalog.oid, 'SELECT WITH GRANT OPTION');
        END IF;
        IF NOT can THEN
            RAISE EXCEPTION 'permission denied to % idem''s "%" privileges', CASE WHEN grant_them THEN 'grant' ELSE 'revoke' END, kind
                USING ERRCODE = '42501',
                      DETAIL = pg_catalog.format('%I cannot grant %s ON %s.', current_user, p.privilege, p.object),
                      HINT = 'Run it as idem''s owner or as a superuser.';
        END IF;
    END LOOP;
    needs_usage := grant_them AND NOT pg_catalog.has_schema_privilege(role, schema_name, 'USAGE');
    IF needs_usage AND NOT pg_catalog.has_schema_privilege(schema_name, 'USAGE WITH GRANT OPTION') THEN
        RAISE EXCEPTION 'permission denied to grant idem''s "%" privileges', kind
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('%I cannot grant USAGE ON SCHEMA %I.', current_user, schema_name),
                  HINT = 'Run it as idem''s owner or as a superuser.';
    END IF;
    IF needs_usage THEN
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA %I TO %s', schema_name, role);
        privilege := 'USAGE';
        object := pg_catalog.format('SCHEMA %I', schema_name);
        RETURN NEXT;
    END IF;
    FOR p IN SELECT * FROM idem_internal.idem_privileges(kind) LOOP
        IF grant_them THEN
            EXECUTE pg_catalog.format('GRANT %s ON %s TO %s', p.privilege, p.object, role);
        ELSE
            EXECUTE pg_catalog.format('REVOKE %s ON %s FROM %s', p.privilege, p.object, role);
        END IF;
        privilege := p.privilege;
        object := p.object;
        RETURN NEXT;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION @extschema@.idem_grant(role regrole, kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT g.privilege, g.object FROM idem_internal.idem_grant_kind(role, kind, true) g;
END;

CREATE OR REPLACE FUNCTION @extschema@.idem_revoke(role regrole, kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT g.privilege, g.object FROM idem_internal.idem_grant_kind(role, kind, false) g;
END;

-- ---------------------------------------------------------------------------
-- The outbox's fetch (SECURITY DEFINER): its table and guard in idem_internal.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION @extschema@.idem_outbox_fetch(
    topic text,
    batch integer DEFAULT 100,
    lease interval DEFAULT interval '30 seconds')
RETURNS TABLE (message_id bigint, msg_key text, payload jsonb, headers jsonb,
               attempt integer, emitted_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
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
    PERFORM idem_internal.idem_outbox_guard();
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
          FROM idem_internal.idem_outbox o
         WHERE o.topic OPERATOR(pg_catalog.=) idem_outbox_fetch.topic
           AND o.acked_at IS NULL AND o.ready
           AND (o.leased_until IS NULL OR o.leased_until OPERATOR(pg_catalog.<=) t)
           AND (o.not_before IS NULL OR o.not_before OPERATOR(pg_catalog.<=) t)
         ORDER BY o.commit_seq
         LIMIT batch
           FOR UPDATE OF o SKIP LOCKED
    ), leased AS (
        UPDATE idem_internal.idem_outbox o
           SET attempt = o.attempt OPERATOR(pg_catalog.+) 1,
               -- a lease still set lapsed: neither acked nor nacked (1.13)
               lapses = CASE WHEN o.leased_until IS NULL THEN o.lapses
                             ELSE COALESCE(o.lapses, 0) OPERATOR(pg_catalog.+) 1 END,
               not_before = NULL,
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
$$;


-- ---------------------------------------------------------------------------
-- idem_forget_owner (a superuser's): its tables in idem_internal.
-- ---------------------------------------------------------------------------
DROP FUNCTION @extschema@.idem_forget_owner(bigint, integer, integer);
CREATE FUNCTION @extschema@.idem_forget_owner(
    owner bigint,
    batch_size integer DEFAULT 10000,
    max_batches integer DEFAULT NULL,
    undelivered text DEFAULT 'keep')
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    total bigint := 0;
    n bigint;
    batches integer;
    tbl text;
    keys text;
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER) THEN
        RAISE EXCEPTION 'permission denied to forget an owner'
            USING ERRCODE = '42501', HINT = 'Only a superuser may call idem_forget_owner.';
    END IF;
    IF owner IS NULL OR batch_size IS NULL OR undelivered IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null',
            CASE WHEN owner IS NULL THEN 'owner' WHEN batch_size IS NULL THEN 'batch_size' ELSE 'undelivered' END
            USING ERRCODE = '22004';
    END IF;
    IF batch_size OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'batch_size must be at least 1' USING ERRCODE = '22023',
            DETAIL = pg_catalog.format('The call has batch_size %s.', batch_size);
    END IF;
    IF max_batches OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'max_batches must be at least 1, or NULL for no limit' USING ERRCODE = '22023',
            DETAIL = pg_catalog.format('The call has max_batches %s.', max_batches);
    END IF;
    IF undelivered OPERATOR(pg_catalog.<>) ALL (ARRAY['keep', 'delete']) THEN
        RAISE EXCEPTION 'undelivered must be ''keep'' or ''delete''' USING ERRCODE = '22023',
            DETAIL = pg_catalog.format('The call has undelivered %L.', undelivered),
            HINT = '''keep'': the owner''s messages not yet delivered are delivered, then erased at their acknowledgement; ''delete'': they are erased now and never delivered.';
    END IF;

    -- the owner's outbox dead letters (1.13), whatever undelivered says: a
    -- dead letter is delivered only if redriven; its blocked key goes on
    IF EXISTS (SELECT FROM idem_internal.idem_outbox_dead d WHERE d.owner_id OPERATOR(pg_catalog.=) owner) THEN
        total := @extschema@.idem_outbox_discard(ARRAY(
            SELECT d.message_id FROM idem_internal.idem_outbox_dead d WHERE d.owner_id OPERATOR(pg_catalog.=) owner));
    END IF;

    -- each table in statements of batch_size rows, at most max_batches
    FOR tbl, keys IN SELECT t.tbl, t.keys FROM (VALUES
        ('idem_internal.idempotency_record', 'id', true),
        ('idem_internal.purchase_order', 'id', true),
        ('idem_internal.idem_history', 'record_id', true),
        ('idem_internal.idem_inbox', 'consumer, message_id', true),
        ('idem_internal.idem_inbox_failure', 'consumer, message_id', true),
        ('idem_internal.idem_outbox', 'message_id', undelivered OPERATOR(pg_catalog.=) 'delete')) AS t (tbl, keys, wanted)
        WHERE t.wanted
    LOOP
        batches := 0;
        LOOP
            EXECUTE pg_catalog.format(
                'DELETE FROM %1$s WHERE owner_id OPERATOR(pg_catalog.=) $1 AND (%2$s) IN'
                ' (SELECT %2$s FROM %1$s WHERE owner_id OPERATOR(pg_catalog.=) $1 LIMIT $2)', tbl, keys)
                USING owner, batch_size;
            GET DIAGNOSTICS n = ROW_COUNT;
            total := total OPERATOR(pg_catalog.+) n;
            batches := batches OPERATOR(pg_catalog.+) 1;
            EXIT WHEN n OPERATOR(pg_catalog.<) batch_size OR batches OPERATOR(pg_catalog.>=) max_batches;
        END LOOP;
    END LOOP;
    RETURN total;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_forget_owner(bigint, integer, integer, text) FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.idem_forget_owner(bigint, integer, integer, text) IS
    'idem: an erasure request: remove every record, order, history row, inbox entry and failure, outbox dead letter and (undelivered => ''delete'') outbox message of owner (superuser only)';

-- ---------------------------------------------------------------------------
-- Citus: idem_distribute() and its per-node part on the new layout.
-- ---------------------------------------------------------------------------

-- the entry points delegated to the node of their first argument's shard,
-- with the table they go with: OIDs bound here
CREATE FUNCTION idem_internal.idem_delegated_functions()
RETURNS TABLE (fn pg_catalog.regprocedure, tbl pg_catalog.regclass)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT f.fn, f.tbl FROM (VALUES
        ('@extschema@.idem_create_order(bigint, text, bigint, integer)'::pg_catalog.regprocedure, 'idem_internal.idempotency_record'::pg_catalog.regclass),
        ('@extschema@.idem_begin(bigint, text, text, jsonb, interval)'::pg_catalog.regprocedure, 'idem_internal.idempotency_record'::pg_catalog.regclass),
        ('@extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json)'::pg_catalog.regprocedure, 'idem_internal.idempotency_record'::pg_catalog.regclass),
        ('@extschema@.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json)'::pg_catalog.regprocedure, 'idem_internal.idempotency_record'::pg_catalog.regclass),
        ('@extschema@.idem_run(bigint, text, text, jsonb, regprocedure, interval)'::pg_catalog.regprocedure, 'idem_internal.idempotency_record'::pg_catalog.regclass),
        ('@extschema@.idem_submit(bigint, text, text, jsonb, jsonb, interval)'::pg_catalog.regprocedure, 'idem_internal.idempotency_record'::pg_catalog.regclass),
        ('@extschema@.idem_consume(text, text, interval, bigint)'::pg_catalog.regprocedure, 'idem_internal.idem_inbox'::pg_catalog.regclass)
    ) AS f (fn, tbl);
END;

REVOKE ALL ON FUNCTION idem_internal.idem_delegated_functions() FROM PUBLIC;

CREATE OR REPLACE FUNCTION idem_internal.idem_distribute_node()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET citus.enable_ddl_propagation = off
AS $$
DECLARE
    grp integer;
    lo bigint;
    seq text;
BEGIN
    IF (SELECT pg_catalog.array_length(c.conkey, 1) FROM pg_catalog.pg_constraint c
         WHERE c.conrelid OPERATOR(pg_catalog.=) 'idem_internal.idempotency_record'::pg_catalog.regclass
           AND c.contype OPERATOR(pg_catalog.=) 'p') OPERATOR(pg_catalog.=) 1 THEN
        ALTER TABLE idem_internal.idempotency_record
            DROP CONSTRAINT idempotency_record_pkey,
            ADD CONSTRAINT idempotency_record_pkey PRIMARY KEY (owner_id, id);
    END IF;
    IF (SELECT pg_catalog.array_length(c.conkey, 1) FROM pg_catalog.pg_constraint c
         WHERE c.conrelid OPERATOR(pg_catalog.=) 'idem_internal.purchase_order'::pg_catalog.regclass
           AND c.contype OPERATOR(pg_catalog.=) 'p') OPERATOR(pg_catalog.=) 1 THEN
        ALTER TABLE idem_internal.purchase_order
            DROP CONSTRAINT purchase_order_pkey,
            ADD CONSTRAINT purchase_order_pkey PRIMARY KEY (owner_id, id),
            DROP CONSTRAINT purchase_order_order_no_key,
            ADD CONSTRAINT purchase_order_order_no_key UNIQUE (owner_id, order_no);
    END IF;
    -- a task's holder knows its id, not its owner: its calls find it by id
    -- in the shards of the node it leased from
    IF pg_catalog.to_regclass('idem_internal.idem_task_id') IS NULL THEN
        CREATE INDEX idem_task_id ON idem_internal.idempotency_record (id)
            WHERE task_attempts IS NOT NULL;
    END IF;

    EXECUTE 'SELECT groupid FROM pg_catalog.pg_dist_local_group' INTO grp;
    IF grp OPERATOR(pg_catalog.>) 0 THEN
        lo := grp::pg_catalog.int8 OPERATOR(pg_catalog.*) 281474976710656 OPERATOR(pg_catalog.+) 1;
        FOREACH seq IN ARRAY ARRAY['idempotency_record_id_seq', 'purchase_order_id_seq',
                                   'idem_outbox_message_id_seq', 'idem_task_token_seq'] LOOP
            IF (SELECT s.seqmin FROM pg_catalog.pg_sequence s
                 WHERE s.seqrelid OPERATOR(pg_catalog.=)
                       pg_catalog.format('idem_internal.%I', seq)::pg_catalog.regclass)
               OPERATOR(pg_catalog.<) lo THEN
                EXECUTE pg_catalog.format('ALTER SEQUENCE idem_internal.%I MINVALUE %s MAXVALUE %s START %s RESTART %s',
                                          seq, lo, lo OPERATOR(pg_catalog.+) 281474976710654, lo, lo);
            END IF;
        END LOOP;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION @extschema@.idem_distribute()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
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
    PERFORM idem_internal.idem_distribute_node();

    SELECT e.extversion INTO version FROM pg_catalog.pg_extension e
     WHERE e.extname OPERATOR(pg_catalog.=) 'idem';
    FOR r IN SELECT w.nodename, w.nodeport, w.success, w.result
               FROM pg_catalog.run_command_on_workers(
                    'SELECT extversion FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) ''idem''') w LOOP
        IF NOT r.success OR r.result IS DISTINCT FROM version THEN
            RAISE EXCEPTION 'idem % is not installed on worker node %:%', version, r.nodename, r.nodeport
                USING ERRCODE = '55000',
                      DETAIL = pg_catalog.format('The node answered: %s', r.result),
                      HINT = 'Citus creates an extension on every node when it is created on the coordinator: install idem''s files on every node, then ALTER EXTENSION idem UPDATE.';
        END IF;
    END LOOP;
    FOR r IN SELECT w.nodename, w.nodeport, w.success, w.result
               FROM pg_catalog.run_command_on_workers(
                    'SELECT idem_internal.idem_distribute_node()') w LOOP
        IF NOT r.success THEN
            RAISE EXCEPTION 'idem_distribute() failed on worker node %:%', r.nodename, r.nodeport
                USING ERRCODE = '55000', DETAIL = r.result;
        END IF;
    END LOOP;

    -- the distributed tables, each once: records and orders by owner,
    -- co-located; the inbox by consumer; an owner's history with its records
    FOR r IN SELECT * FROM (VALUES
                 ('idem_internal.idempotency_record', 'owner_id', 'default'),
                 ('idem_internal.purchase_order', 'owner_id', 'idem_internal.idempotency_record'),
                 ('idem_internal.idem_inbox', 'consumer', 'default'),
                 ('idem_internal.idem_history', 'owner_id', 'idem_internal.idempotency_record')) AS v (tbl, col, colocate)
    LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                        WHERE p.logicalrelid OPERATOR(pg_catalog.=) r.tbl::pg_catalog.regclass) THEN
            PERFORM pg_catalog.create_distributed_table(r.tbl::pg_catalog.regclass, r.col,
                                                        colocate_with => r.colocate);
        END IF;
    END LOOP;
    -- the inbox by owner (on a cluster distributed before 1.11)
    IF pg_catalog.to_regclass('idem_internal.idem_inbox_owner') IS NULL THEN
        CREATE INDEX idem_inbox_owner ON idem_internal.idem_inbox (owner_id) WHERE owner_id IS NOT NULL;
    END IF;
    -- the policies on every node
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                    WHERE p.logicalrelid OPERATOR(pg_catalog.=) 'idem_internal.idem_policy'::pg_catalog.regclass) THEN
        -- its statement trigger only tells the node's backends that the
        -- policies changed: Citus puts it on every placement
        PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM pg_catalog.create_reference_table('idem_internal.idem_policy');
    END IF;

    -- force_delegation: delegated inside a transaction block too, as part of
    -- the distributed transaction
    FOR r IN SELECT f.fn, f.tbl FROM idem_internal.idem_delegated_functions() f LOOP
        PERFORM pg_catalog.create_distributed_function(r.fn, '$1', colocate_with => r.tbl::pg_catalog.text,
                                                       force_delegation => true);
    END LOOP;
END
$$;

-- The NOTICE CREATE EXTENSION gives when idem is not preloaded: a fresh
-- install keeps the function in idem_internal instead of creating and
-- dropping one in the extension's schema (1.0 to 1.12 did).
CREATE FUNCTION idem_internal.idem_cleanup_worker_notice() RETURNS void
AS 'MODULE_PATHNAME', 'idem_cleanup_worker_notice'
LANGUAGE C;
COMMENT ON FUNCTION idem_internal.idem_cleanup_worker_notice() IS
    'idem: the NOTICE CREATE EXTENSION gives when idem is not in shared_preload_libraries';
REVOKE ALL ON FUNCTION idem_internal.idem_cleanup_worker_notice() FROM PUBLIC;
