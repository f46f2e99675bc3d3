-- Dead letters (1.13): only a publisher's nack counts; a message refused for
-- good, or nacked max_deliveries times, becomes a dead letter; its topic's
-- on_dead says whether its key's later messages wait ('block', the default)
-- or go on ('skip'); redrive, discard, erasure; lapsed leases never count.
TRUNCATE idem_internal.idem_outbox;
SET idem.outbox_max_deliveries = 3;
CREATE FUNCTION dl_emit(topic text, key text, n int) RETURNS bigint
LANGUAGE sql AS $$ SELECT idem_outbox_emit(topic, jsonb_build_object('n', n), key) $$;
-- what a publisher can fetch now, as key:n
CREATE FUNCTION dl_fetch(topic text) RETURNS text
LANGUAGE sql AS $$
    SELECT coalesce(string_agg(coalesce(msg_key, '-') || ':' || (payload->>'n'), ' ' ORDER BY message_id), '(none)')
      FROM idem_outbox_fetch(topic, 100, interval '1 hour') $$;
CREATE FUNCTION dl_id(topic text, n int) RETURNS bigint
LANGUAGE sql AS $$
    SELECT message_id FROM idem_internal.idem_outbox WHERE topic = $1 AND (payload->>'n')::int = n
    UNION ALL
    SELECT message_id FROM idem_internal.idem_outbox_dead WHERE topic = $1 AND (payload->>'n')::int = n
    LIMIT 1 $$;
-- the messages left in the outbox and the dead letters, as key:n
CREATE FUNCTION dl_state(topic text) RETURNS TABLE (outbox text, dead text)
LANGUAGE sql AS $$
    SELECT (SELECT coalesce(string_agg(coalesce(msg_key, '-') || ':' || (payload->>'n')
                            || CASE WHEN dead_at IS NOT NULL THEN '(dead)' WHEN ready THEN '(head)' ELSE '' END,
                            ' ' ORDER BY commit_seq), '')
              FROM idem_internal.idem_outbox WHERE topic = $1),
           (SELECT coalesce(string_agg(coalesce(msg_key, '-') || ':' || (payload->>'n') || '/' || on_dead
                            || '/' || nacks || CASE WHEN permanent THEN '/permanent' ELSE '' END,
                            ' ' ORDER BY message_id), '')
              FROM idem_internal.idem_outbox_dead WHERE topic = $1) $$;

-- bad arguments: clear errors, nothing written
SELECT idem_outbox_nack(NULL, 'x');
SELECT idem_outbox_nack(ARRAY[1::bigint], NULL);
SELECT idem_outbox_nack(ARRAY[1::bigint], 'x', retry_after => interval '-1 second');
SELECT idem_outbox_set_topic('bad topic!', 3);
SELECT idem_outbox_set_topic('dl.block', 0);
SELECT idem_outbox_set_topic('dl.block', 3, 'drop');
SELECT idem_outbox_set_topic('dl.block', 3, NULL);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT idem_outbox_nack(ARRAY[1::bigint], 'x');
ROLLBACK;
SELECT count(*) AS topics FROM idem_internal.idem_outbox_topic;

-- 'block' (the default): a poison message nacked three times
SELECT dl_emit('dl.block', 'a', 1), dl_emit('dl.block', 'a', 2), dl_emit('dl.block', 'b', 3) \gset
SELECT dl_fetch('dl.block');
-- a nack of a message not handed out counts nothing
SELECT idem_outbox_nack(ARRAY[dl_id('dl.block', 2)], 'not fetched');
SELECT idem_outbox_ack(ARRAY[dl_id('dl.block', 3)]);
SELECT idem_outbox_nack(ARRAY[dl_id('dl.block', 1)], 'broker refused') AS dead;
SELECT dl_fetch('dl.block');
-- a nack with retry_after: not fetched before it
SELECT idem_outbox_nack(ARRAY[dl_id('dl.block', 1)], 'broker refused', retry_after => interval '1 hour') AS dead;
SELECT dl_fetch('dl.block');
UPDATE idem_internal.idem_outbox SET not_before = now() - interval '1 second' WHERE not_before IS NOT NULL;
SELECT dl_fetch('dl.block');
SELECT idem_outbox_nack(ARRAY[dl_id('dl.block', 1)], 'broker refused: 406') AS dead;
SELECT * FROM dl_state('dl.block');
SELECT last_reason, attempts, lapses FROM idem_internal.idem_outbox_dead;
-- the key waits; other keys go on; an ack of the dead letter changes nothing
SELECT dl_emit('dl.block', 'a', 4), dl_emit('dl.block', 'b', 5) \gset
SELECT dl_fetch('dl.block');
SELECT idem_outbox_ack(ARRAY[dl_id('dl.block', 5), dl_id('dl.block', 1)]) AS acked;
SELECT * FROM dl_state('dl.block');
SELECT outbox_unacked, outbox_dead, outbox_oldest_dead_age > '0' AS aged FROM idem_health();
SELECT operation, kind, dead_letters, oldest_dead_letter_age > '0' AS aged FROM idem_stats WHERE operation = 'dl.block' AND datname = current_database();
-- redrive: the head again, in its place; then its key in order
SELECT idem_outbox_redrive(ARRAY[dl_id('dl.block', 1)]) AS redriven;
SELECT * FROM dl_state('dl.block');
SELECT dl_fetch('dl.block');
SELECT idem_outbox_ack(ARRAY[dl_id('dl.block', 1)]) AS acked;
SELECT dl_fetch('dl.block');
-- permanent: dead at once; discard: its key goes on
SELECT idem_outbox_nack(ARRAY[dl_id('dl.block', 2)], 'message too large', permanent => true) AS dead;
SELECT * FROM dl_state('dl.block');
SELECT idem_outbox_discard(ARRAY[dl_id('dl.block', 2)]) AS discarded;
SELECT * FROM dl_state('dl.block');
SELECT dl_fetch('dl.block');

-- 'skip': later messages of the key go on; a redriven one comes after them
SELECT idem_outbox_set_topic('dl.skip', 2, 'skip');
SELECT topic, max_deliveries, on_dead FROM idem_internal.idem_outbox_topic ORDER BY topic;
SELECT dl_emit('dl.skip', 'a', 1), dl_emit('dl.skip', 'a', 2), dl_emit('dl.skip', NULL, 3) \gset
SELECT dl_fetch('dl.skip');
SELECT idem_outbox_nack(ARRAY[dl_id('dl.skip', 1), dl_id('dl.skip', 3)], 'handler said no') AS dead;
SELECT dl_fetch('dl.skip');
SELECT idem_outbox_nack(ARRAY[dl_id('dl.skip', 1), dl_id('dl.skip', 3)], 'handler said no') AS dead;
SELECT * FROM dl_state('dl.skip');
SELECT dl_fetch('dl.skip');
SELECT dl_emit('dl.skip', 'a', 4) > 0 AS emitted;
SELECT idem_outbox_redrive(ARRAY[dl_id('dl.skip', 1), dl_id('dl.skip', 3)]) AS redriven;
SELECT * FROM dl_state('dl.skip');
SELECT msg_key, payload->>'n' AS n, headers FROM idem_internal.idem_outbox WHERE topic = 'dl.skip' ORDER BY commit_seq;
SELECT idem_outbox_ack(ARRAY[dl_id('dl.skip', 2)]) AS acked;
SELECT dl_fetch('dl.skip');
SELECT idem_outbox_ack(ARRAY[dl_id('dl.skip', 4), dl_id('dl.skip', 3)]) AS acked;
SELECT dl_fetch('dl.skip');

-- lapsed leases never dead-letter; idem_health counts them
SELECT idem_outbox_set_topic('dl.lapse', 1);
SELECT dl_emit('dl.lapse', 'a', 1) > 0 AS emitted;
SELECT count(*) FROM idem_outbox_fetch('dl.lapse', 10, interval '1 millisecond');
SELECT pg_sleep(0.01);
SELECT count(*) FROM idem_outbox_fetch('dl.lapse', 10, interval '1 millisecond');
SELECT pg_sleep(0.01);
SELECT count(*) FROM idem_outbox_fetch('dl.lapse', 10, interval '1 millisecond');
SELECT pg_sleep(0.01);
SELECT attempt, lapses, nacks, dead_at FROM idem_internal.idem_outbox WHERE topic = 'dl.lapse';
SELECT outbox_lease_lapses FROM idem_health();
SELECT count(*) AS dead FROM idem_internal.idem_outbox_dead WHERE topic = 'dl.lapse';

-- erasure reaches dead letters (both kinds) and consumers' failures
SELECT idem_outbox_emit('dl.erase', '{"n": 1}', 'a', owner => 801) AS e1,
       idem_outbox_emit('dl.erase', '{"n": 2}', 'a', owner => 801) AS e2 \gset
SELECT count(*) FROM idem_outbox_fetch('dl.erase', 10);
SELECT idem_outbox_nack(ARRAY[:e1::bigint], 'refused', true) AS dead;
SELECT * FROM idem_consume_failed('dl-consumer', 'm-801', 'boom', 'k', owner => 801);
SELECT idem_forget_owner(801) AS erased;
SELECT (SELECT count(*) FROM idem_internal.idem_outbox_dead WHERE owner_id = 801) AS dead,
       (SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = 'dl.erase' AND dead_at IS NOT NULL) AS blocked_heads,
       (SELECT count(*) FROM idem_internal.idem_inbox_failure WHERE owner_id = 801) AS failures;

-- a consumer's side: attempts counted outside the effect's transaction
-- (the check runs in it: its rollback keeps the row), dead past the
-- limit, the key's later messages set aside ('block')
BEGIN;
SELECT * FROM idem_consume_check('dl-c', 'm1', 'k1');
ROLLBACK;
SELECT * FROM idem_consume_failed('dl-c', 'm1', 'ValueError: boom', 'k1', 'dl.block');
BEGIN;
SELECT * FROM idem_consume_check('dl-c', 'm1', 'k1');
ROLLBACK;
SELECT * FROM idem_consume_failed('dl-c', 'm1', 'ValueError: boom', 'k1', 'dl.block');
SELECT * FROM idem_consume_failed('dl-c', 'm1', 'ValueError: boom', 'k1', 'dl.block');
SELECT * FROM idem_consume_check('dl-c', 'm1', 'k1');
SELECT * FROM idem_consume_check('dl-c', 'm2', 'k1');
SELECT * FROM idem_consume_check('dl-c', 'm2', 'k1');
SELECT * FROM idem_consume_check('dl-c', 'm3', 'k2');
SELECT message_id, attempts, dead_at IS NOT NULL AS dead, blocks, behind, last_reason
  FROM idem_internal.idem_inbox_failure WHERE consumer = 'dl-c' ORDER BY message_id;
SELECT inbox_dead, inbox_oldest_dead_age > '0' AS aged FROM idem_health();
SELECT operation, kind, dead_letters FROM idem_stats WHERE operation = 'dl-c' AND datname = current_database();
-- a message that failed, then succeeded: its row goes with the commit
SELECT * FROM idem_consume_failed('dl-c', 'm4', 'timeout', 'k3', max_attempts => 5);
SELECT * FROM idem_consume_check('dl-c', 'm4', 'k3');
SELECT count(*) FROM idem_internal.idem_inbox_failure WHERE message_id = 'm4';
-- redrive: applied in the order delivered again; a new message of the key
-- arriving before them is set aside behind them
SELECT idem_inbox_redrive('dl-c') AS redriven;
SELECT * FROM idem_consume_check('dl-c', 'm5', 'k1');
SELECT * FROM idem_consume_check('dl-c', 'm1', 'k1');
SELECT * FROM idem_consume_check('dl-c', 'm2', 'k1');
SELECT * FROM idem_consume_check('dl-c', 'm5', 'k1');
SELECT idem_inbox_redrive('dl-c', ARRAY['m5'], discard => true) AS discarded;
SELECT * FROM idem_consume_check('dl-c', 'm6', 'k1');
SELECT count(*) AS failures FROM idem_internal.idem_inbox_failure WHERE consumer = 'dl-c';
-- 'skip' topics: a dead message holds nothing back
SELECT * FROM idem_consume_failed('dl-c', 'm7', 'boom', 'k9', 'dl.skip', max_attempts => 1);
SELECT * FROM idem_consume_check('dl-c', 'm8', 'k9');
SELECT idem_consume_failed('dl-c', NULL, 'x');
SELECT idem_consume_failed('dl-c', 'm9', 'x', max_attempts => 0);
-- idem_consume's rules for the consumer and the message id (22023), and
-- the caller's idem.allowed_owners (42501); nothing written
SELECT count(*) AS failures_before FROM idem_internal.idem_inbox_failure \gset
SELECT idem_consume_failed(E'dl-c\nlabel="x"', 'm10', 'x');
SELECT idem_consume_failed('dl-c"', 'm10', 'x');
SELECT idem_consume_failed('dl-c', '', 'x');
SELECT idem_consume_failed('dl-c', repeat('m', 513), 'x');
SELECT idem_consume_failed('dl-c', E'm\t10', 'x');
SELECT * FROM idem_consume_check(E'dl-c\n', 'm10');
SELECT * FROM idem_consume_check('dl-c', '');
SET idem.allowed_owners = '7';
SELECT idem_consume_failed('dl-c', 'm10', 'x', owner => 8);
SELECT * FROM idem_consume_check('dl-c', 'm10', 'k', owner => 8);
SELECT attempts, dead FROM idem_consume_failed('dl-c', 'm10', 'x', owner => 7);
RESET idem.allowed_owners;
SELECT count(*) - :failures_before AS failures_written FROM idem_internal.idem_inbox_failure;
-- the reason is kept to its first 1000 characters
SELECT attempts FROM idem_consume_failed('dl-c', 'm11', repeat('r', 5000));
SELECT length(last_reason) FROM idem_internal.idem_inbox_failure WHERE message_id = 'm11';

-- who may call what
SELECT object FROM idem_privileges('publisher') ORDER BY 1;
SELECT object FROM idem_privileges('consumer') ORDER BY 1;
SELECT p.proname, p.prosecdef,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_may
  FROM pg_proc p
 WHERE p.proname IN ('idem_outbox_nack', 'idem_outbox_redrive', 'idem_outbox_discard', 'idem_outbox_set_topic',
                     'idem_consume_check', 'idem_consume_failed', 'idem_inbox_redrive', 'idem_outbox_promote')
 ORDER BY 1;

DELETE FROM idem_internal.idem_inbox_failure;
DELETE FROM idem_internal.idem_outbox_dead;
DELETE FROM idem_internal.idem_outbox_topic;
TRUNCATE idem_internal.idem_outbox;
RESET idem.outbox_max_deliveries;
DROP FUNCTION dl_emit, dl_fetch, dl_id, dl_state;
