-- Erasure is complete (1.13): idem_forget_owner removes the owner's
-- records, idem_create_order's orders, history, inbox entries and tasks;
-- outbox messages carry their owner (given, or the owner of the emitting
-- transaction's unfinished claims) and are erased once delivered ('keep',
-- the default) or at once (undelivered => 'delete').
TRUNCATE idem_internal.idem_outbox;
SELECT order_no IS NOT NULL AS ordered FROM idem_create_order(501, 'erase-order-00000001', 7, 1);
SELECT order_no IS NOT NULL AS ordered FROM idem_create_order(502, 'erase-order-00000002', 7, 1);
BEGIN;
SELECT replayed FROM idem_begin(501, 'ERASE', 'erase-begin-00000001', '{"a": 1}');
-- in the middle of the claim: the claim's owner
SELECT idem_outbox_emit('erase.topic', '{"n": "claimed"}', 'k1') > 0 AS emitted;
SELECT idem_finish(501, 'ERASE', 'erase-begin-00000001', 201, '{"ok": true}');
-- after it: no claim left, no owner unless given
SELECT idem_outbox_emit('erase.topic', '{"n": "after the claim"}') > 0 AS emitted;
SELECT idem_outbox_emit('erase.topic', '{"n": "given"}', owner => 501) > 0 AS emitted;
SELECT idem_outbox_emit('erase.topic', '{"n": "another owner"}', owner => 502) > 0 AS emitted;
COMMIT;
-- claims of two owners open: none
BEGIN;
SELECT replayed FROM idem_begin(501, 'ERASE', 'erase-begin-00000002', '{}');
SELECT replayed FROM idem_begin(502, 'ERASE', 'erase-begin-00000003', '{}');
SELECT idem_outbox_emit('erase.topic', '{"n": "two owners"}') > 0 AS emitted;
ROLLBACK;
SELECT payload->>'n' AS message, owner_id FROM idem_internal.idem_outbox ORDER BY message_id;
SELECT idem_consume('erase-consumer', 'erase-message-1', owner => 501);
SELECT replayed FROM idem_submit(501, 'ERASE', 'erase-task-000000001', '{}');

-- bad arguments: nothing erased
SELECT idem_forget_owner(501, undelivered => 'drop');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_forget_owner(501, undelivered => NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT (SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id = 501) AS orders,
       (SELECT count(*) FROM idem_internal.idempotency_record WHERE owner_id = 501) AS records;

-- 'keep': everything but the undelivered messages, which go at their acknowledgement
SELECT idem_forget_owner(501) AS erased;
SELECT (SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id = 501) AS orders,
       (SELECT count(*) FROM idem_internal.idempotency_record WHERE owner_id = 501) AS records,
       (SELECT count(*) FROM idem_internal.idem_inbox WHERE owner_id = 501) AS inbox,
       (SELECT count(*) FROM idem_internal.idem_outbox WHERE owner_id = 501) AS undelivered,
       (SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id = 502) AS other_owners_orders;
-- delivered: acknowledged, the messages are gone
SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_outbox_fetch('erase.topic', 10))) AS acked;
SELECT count(*) AS left_of_501 FROM idem_internal.idem_outbox WHERE owner_id = 501;

-- 'delete': the undelivered messages too, never delivered
SELECT idem_outbox_emit('erase.topic', '{"n": "later"}', owner => 502) > 0 AS emitted;
SELECT idem_forget_owner(502, undelivered => 'delete') AS erased;
SELECT (SELECT count(*) FROM idem_internal.idem_outbox WHERE owner_id = 502) AS undelivered,
       (SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id = 502) AS orders;

-- a role bound to owners emits only for them
SET idem.allowed_owners = '501';
SELECT idem_outbox_emit('erase.topic', '{"n": "not mine"}', owner => 502);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET idem.allowed_owners;
