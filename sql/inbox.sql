--
-- The consumer inbox: idem_consume is true the first time a consumer
-- takes a message in a committed transaction, false for every redelivery;
-- rollbacks, scopes, expiry, input rules.
--
\set SHOW_CONTEXT never
TRUNCATE idem_internal.idem_inbox;
CREATE TABLE effect (consumer text, message_id text);

-- The consumer's transaction: the check and the effect commit together.
BEGIN;
SELECT idem_consume('billing', 'orders/3/1234567') AS first_time;
INSERT INTO effect VALUES ('billing', 'orders/3/1234567');
COMMIT;
SELECT idem_consume('billing', 'orders/3/1234567') AS redelivered;
SELECT idem_consume('billing', 'orders/3/1234567') AS redelivered_again;
-- another consumer group takes it once too
SELECT idem_consume('shipping', 'orders/3/1234567') AS other_group;
SELECT idem_consume('shipping', 'orders/3/1234567') AS other_group_again;
-- twice in one transaction: the second is a redelivery
BEGIN;
SELECT idem_consume('billing', '6f1c0d52-3c1e-4f9e-9f57-3a0b8c1e2d4f') AS first_time,
       idem_consume('billing', '6f1c0d52-3c1e-4f9e-9f57-3a0b8c1e2d4f') AS same_transaction;
COMMIT;

-- Rolled back: the redelivery takes effect.
BEGIN;
SELECT idem_consume('billing', 'msg-rolled-back') AS first_time;
INSERT INTO effect VALUES ('billing', 'msg-rolled-back');
ROLLBACK;
SELECT idem_consume('billing', 'msg-rolled-back') AS after_rollback;
-- a savepoint rolled back undoes the consumption too
BEGIN;
SAVEPOINT s;
SELECT idem_consume('billing', 'msg-savepoint') AS first_time;
ROLLBACK TO s;
SELECT idem_consume('billing', 'msg-savepoint') AS after_rollback_to_savepoint;
COMMIT;
SELECT consumer, message_id FROM idem_internal.idem_inbox ORDER BY 1, 2;
SELECT * FROM effect;

-- Expiry: idem.inbox_ttl, or ttl per call; an expired entry is taken
-- afresh (and the cleanup deletes it).
SHOW idem.inbox_ttl;
SELECT expires_at - consumed_at AS default_ttl FROM idem_internal.idem_inbox WHERE message_id = 'msg-rolled-back';
SET idem.inbox_ttl = '1h';
SELECT idem_consume('billing', 'msg-guc-ttl');
RESET idem.inbox_ttl;
SELECT idem_consume('billing', 'msg-call-ttl', '2 days');
SELECT message_id, expires_at - consumed_at AS ttl FROM idem_internal.idem_inbox
WHERE message_id IN ('msg-guc-ttl', 'msg-call-ttl') ORDER BY 1;
UPDATE idem_internal.idem_inbox SET expires_at = now() - interval '1 second' WHERE message_id = 'msg-call-ttl';
SELECT idem_consume('billing', 'msg-call-ttl') AS after_expiry;
SELECT count(*) AS entries, min(expires_at) > now() AS renewed FROM idem_internal.idem_inbox WHERE message_id = 'msg-call-ttl';
UPDATE idem_internal.idem_inbox SET expires_at = now() - interval '1 second' WHERE message_id = 'msg-guc-ttl';
SELECT idem_cleanup_expired() AS deleted;
SELECT count(*) AS left_after_cleanup FROM idem_internal.idem_inbox WHERE message_id = 'msg-guc-ttl';

-- Message ids: any printable text up to 512 characters.
SELECT idem_consume('c', 'projects/p/subscriptions/s:7') AS pubsub,
       idem_consume('c', 'AQEBzbVv+3WoU/5fTfE=') AS sqs,
       idem_consume('c', 'ünïcødé ✓ id') AS unicode,
       idem_consume('c', repeat('x', 512)) AS longest;

-- Input rules: 22004 for NULLs, 22023 otherwise; nothing written.
\set VERBOSITY terse
TRUNCATE idem_internal.idem_inbox;
SELECT idem_consume(NULL, 'm');
SELECT idem_consume('c', NULL);
SELECT idem_consume('', 'm');
SELECT idem_consume('bad consumer', 'm');
SELECT idem_consume(repeat('c', 65), 'm');
SELECT idem_consume('c', '');
SELECT idem_consume('c', repeat('x', 513));
SELECT idem_consume('c', E'line\nbreak');
SELECT idem_consume('c', E'tab\there');
SELECT idem_consume('c', 'del' || chr(127));
SELECT idem_consume('c', 'c1' || chr(133));
SELECT idem_consume('c', 'm', '0 seconds');
SELECT idem_consume('c', 'm', '-1 day');
SELECT idem_consume('c', 'm', '100 years');
BEGIN READ ONLY;
SELECT idem_consume('c', 'm');
ROLLBACK;
\set VERBOSITY default
SELECT count(*) AS rows_written FROM idem_internal.idem_inbox;
-- the message id is never echoed in an error
SELECT idem_consume('c', E'secret\u0001token');

-- A trigger an administrator puts on idem_internal.idem_inbox runs as the extension's
-- owner under search_path = pg_catalog, pg_temp, whatever the caller's.
CREATE TABLE inbox_trigger_log (who text, path text);
CREATE FUNCTION inbox_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.inbox_trigger_log VALUES (current_user, current_setting('search_path'));
    RETURN NEW;
END $$;
CREATE TRIGGER inbox_audit AFTER INSERT ON idem_internal.idem_inbox FOR EACH ROW EXECUTE FUNCTION inbox_trigger();
SET search_path = public, pg_temp;
SELECT idem_consume('c', 'with-trigger');
RESET search_path;
SELECT who = (SELECT extowner::regrole::text FROM pg_extension WHERE extname = 'idem') AS as_owner, path
FROM inbox_trigger_log;
SHOW search_path;
DROP TRIGGER inbox_audit ON idem_internal.idem_inbox;
DROP TABLE inbox_trigger_log;
DROP FUNCTION inbox_trigger();

-- Not for PUBLIC: granted by the administrator.
SELECT has_function_privilege('public', 'idem_consume(text, text, interval, bigint)', 'EXECUTE') AS public_may,
       has_table_privilege('public', 'idem_internal.idem_inbox', 'SELECT') AS public_reads_inbox;

DROP TABLE effect;
TRUNCATE idem_internal.idem_inbox;
