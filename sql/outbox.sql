--
-- The transactional outbox: idem_outbox_emit, idem_outbox_fetch,
-- idem_outbox_ack.  A message exists if and only if its transaction
-- commits; per key, delivery follows commit order and waits for the
-- acknowledgement of the message before it; input rules; replays emit
-- nothing; an acknowledgement deletes its messages (1.12).
--
\set SHOW_CONTEXT never
TRUNCATE idem_internal.idem_outbox;

-- Emitted in a transaction: invisible until it commits, then one row.
BEGIN;
SELECT idem_outbox_emit('orders', '{"order": 1}', 'customer-1', '{"type": "created"}') > 0 AS emitted;
SELECT count(*) AS visible_before_commit FROM idem_internal.idem_outbox;
COMMIT;
SELECT topic, msg_key, payload, headers, attempt, leased_until, acked_at,
       commit_seq > message_id AS keyed_seq_drawn_at_commit
FROM idem_internal.idem_outbox;

-- Rolled back: nothing.
BEGIN;
SELECT idem_outbox_emit('orders', '{"order": 2}', 'customer-2') > 0 AS emitted;
ROLLBACK;
SELECT count(*) AS after_rollback FROM idem_internal.idem_outbox WHERE payload = '{"order": 2}';

-- A savepoint rolled back takes its messages; the others commit.
BEGIN;
SELECT idem_outbox_emit('orders', '{"order": 3}') > 0 AS kept;
SAVEPOINT s1;
SELECT idem_outbox_emit('orders', '{"order": 4}', 'customer-4') > 0 AS undone;
SAVEPOINT s2;
SELECT idem_outbox_emit('orders', '{"order": 5}', 'customer-5') > 0 AS undone_too;
ROLLBACK TO s1;
SAVEPOINT s3;
SELECT idem_outbox_emit('orders', '{"order": 6}', 'customer-6') > 0 AS released;
RELEASE s3;
COMMIT;
SELECT payload FROM idem_internal.idem_outbox ORDER BY message_id;

-- A keyless message's commit_seq is its id.
SELECT payload, commit_seq = message_id AS seq_is_id FROM idem_internal.idem_outbox WHERE msg_key IS NULL;

-- Fetch: leased (attempt 1), in commit order; a second fetch gets nothing
-- while the leases hold.
SELECT msg_key, payload, headers, attempt FROM idem_outbox_fetch('orders');
SELECT count(*) AS leased_elsewhere FROM idem_outbox_fetch('orders');
SELECT count(*) AS other_topic FROM idem_outbox_fetch('payments');
-- Ack: counted once; unknown ids and repeats count 0; acked are never fetched again.
SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_internal.idem_outbox WHERE payload = '{"order": 1}'));
SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_internal.idem_outbox WHERE payload = '{"order": 1}'));
SELECT idem_outbox_ack(ARRAY[-1, -2]::bigint[]);
SELECT idem_outbox_ack('{}');
UPDATE idem_internal.idem_outbox SET leased_until = NULL WHERE acked_at IS NULL;
SELECT payload FROM idem_outbox_fetch('orders');

-- Per key: one message at a time, in commit order, each after the ack of
-- the one before; keyless messages flow freely.
TRUNCATE idem_internal.idem_outbox;
SELECT idem_outbox_emit('shipments', '{"step": 1}', 'order-7') > 0 AS emitted;
SELECT idem_outbox_emit('shipments', '{"step": 2}', 'order-7') > 0 AS emitted;
SELECT idem_outbox_emit('shipments', '{"step": 3}', 'order-7') > 0 AS emitted;
SELECT idem_outbox_emit('shipments', '{"other": 1}', 'order-8') > 0 AS emitted;
SELECT idem_outbox_emit('shipments', '{"free": 1}') > 0 AS emitted;
SELECT idem_outbox_emit('shipments', '{"free": 2}') > 0 AS emitted;
CREATE TEMP TABLE delivered (round int, msg_key text, payload jsonb);
DO $$
DECLARE
    r int := 0;
    ids bigint[];
BEGIN
    LOOP
        r := r + 1;
        WITH f AS (SELECT * FROM idem_outbox_fetch('shipments', 10)),
             d AS (INSERT INTO delivered SELECT r, f.msg_key, f.payload FROM f)
        SELECT array_agg(message_id) INTO ids FROM f;
        EXIT WHEN ids IS NULL;
        PERFORM idem_outbox_ack(ids);
    END LOOP;
END $$;
SELECT round, msg_key, payload FROM delivered ORDER BY round, msg_key NULLS LAST, payload::text;
-- within one transaction, one key's messages keep their emit order
BEGIN;
SELECT idem_outbox_emit('shipments', jsonb_build_object('n', n), 'order-9') > 0 AS emitted
FROM generate_series(1, 3) n;
COMMIT;
SELECT payload, ready FROM idem_internal.idem_outbox WHERE msg_key = 'order-9' ORDER BY commit_seq;
-- an acknowledgement of a message behind its key's head (an id no fetch
-- handed out): it goes, the head stays the one deliverable message, and
-- the head's acknowledgement passes over the gap
SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_internal.idem_outbox WHERE payload = '{"n": 2}')) AS behind_acked;
SELECT payload, ready FROM idem_internal.idem_outbox WHERE msg_key = 'order-9' ORDER BY commit_seq;
SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_internal.idem_outbox WHERE payload = '{"n": 1}')) AS head_acked;
SELECT payload, ready FROM idem_internal.idem_outbox WHERE msg_key = 'order-9' ORDER BY commit_seq;
-- an acknowledgement of more than 16 keys' heads at once (the all-keys
-- lock), some keys with messages behind: each key's next one is its head
TRUNCATE idem_internal.idem_outbox;
SELECT count(idem_outbox_emit('many', jsonb_build_object('n', n), 'key-' || k)) AS emitted
FROM generate_series(1, 3) n, generate_series(1, 30) k WHERE n = 1 OR k % 3 = 0;
SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_outbox_fetch('many', 100))) AS acked;
SELECT count(*) AS keys_left, count(*) FILTER (WHERE ready) AS ready,
       bool_and(ready = (payload->>'n' = '2')) AS each_next_ready
FROM idem_internal.idem_outbox WHERE topic = 'many';
SELECT count(*) AS fetched, bool_and(payload->>'n' = '2') AS all_second FROM idem_outbox_fetch('many', 100);

-- A lease that lapses: the message is fetched again, attempt 2.
TRUNCATE idem_internal.idem_outbox;
SELECT idem_outbox_emit('retry', '{"n": 1}', 'k') > 0 AS emitted;
SELECT attempt FROM idem_outbox_fetch('retry', 1, '1 second');
SELECT count(*) AS while_leased FROM idem_outbox_fetch('retry');
SELECT pg_sleep(1.1);
SELECT attempt FROM idem_outbox_fetch('retry');

-- A replayed request emits nothing: emit between begin and finish, or in
-- the handler of idem_run.
CREATE FUNCTION ship_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_outbox_emit('ship', request, request->>'order');
    RETURN ROW(202, '{"queued": true}', NULL, NULL)::idem_result;
END $$;
SELECT replayed FROM idem_run(1, 'SHIP', 'outbox-replay-key-01', '{"order": "o-1"}', 'ship_handler(jsonb)');
SELECT replayed FROM idem_run(1, 'SHIP', 'outbox-replay-key-01', '{"order": "o-1"}', 'ship_handler(jsonb)');
BEGIN;
SELECT replayed FROM idem_begin(1, 'SHIP', 'outbox-replay-key-02', '{"order": "o-2"}');
SELECT idem_outbox_emit('ship', '{"order": "o-2"}', 'o-2') > 0 AS emitted;
SELECT idem_finish(1, 'SHIP', 'outbox-replay-key-02', 202, '{"queued": true}');
COMMIT;
SELECT replayed FROM idem_begin(1, 'SHIP', 'outbox-replay-key-02', '{"order": "o-2"}');
SELECT msg_key, payload FROM idem_internal.idem_outbox WHERE topic = 'ship' ORDER BY message_id;

-- An acknowledgement deletes its messages at once (1.12): the cleanup has
-- none of the outbox's left to delete.
SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_internal.idem_outbox WHERE topic = 'ship' AND msg_key = 'o-1'));
SELECT idem_cleanup_expired() AS deleted;
SELECT topic, msg_key FROM idem_internal.idem_outbox ORDER BY message_id;

-- Input rules: 22004 for NULLs, 22023 otherwise; nothing written.
\set VERBOSITY terse
TRUNCATE idem_internal.idem_outbox;
SELECT idem_outbox_emit(NULL, '{}');
SELECT idem_outbox_emit('t', NULL);
SELECT idem_outbox_emit('', '{}');
SELECT idem_outbox_emit('bad topic', '{}');
SELECT idem_outbox_emit(repeat('t', 129), '{}');
SELECT idem_outbox_emit('t', '{}', repeat('k', 257));
-- msg_key is printable text, as message_id and worker are
SELECT idem_outbox_emit('t', '{}', E'k\n\u0001');
SELECT idem_outbox_emit('t', '{}', E'k\u0085');
SELECT idem_outbox_emit('t', '{}', '');
SELECT idem_outbox_emit('t', '{}', NULL, '[1]');
SELECT idem_outbox_emit(repeat('t', 128), '{}', repeat('é', 256), '{"h": "v"}') > 0 AS longest_ok;
BEGIN READ ONLY;
SELECT idem_outbox_emit('t', '{}');
ROLLBACK;
SELECT idem_outbox_fetch(NULL);
SELECT idem_outbox_fetch('t', NULL);
SELECT idem_outbox_fetch('t', 1, NULL);
SELECT idem_outbox_fetch('a/b');
SELECT idem_outbox_fetch('t', 0);
SELECT idem_outbox_fetch('t', 10001);
SELECT idem_outbox_fetch('t', 1, '0 seconds');
SELECT idem_outbox_fetch('t', 1, '-1 second');
SELECT idem_outbox_ack(NULL);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT idem_outbox_ack('{1}');
ROLLBACK;
\set VERBOSITY default
SELECT count(*) AS rows_written FROM idem_internal.idem_outbox WHERE topic <> repeat('t', 128);

-- Not for PUBLIC: granted by the administrator.
SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_may,
       p.prosecdef AS definer, p.proconfig
FROM pg_proc p WHERE p.proname LIKE 'idem_outbox%' ORDER BY 1;
SELECT has_table_privilege('public', 'idem_internal.idem_outbox', 'SELECT') AS public_reads_outbox;

DROP FUNCTION ship_handler(jsonb);
TRUNCATE idem_internal.idem_outbox;
