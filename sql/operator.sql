-- Operators (1.16): cancel, retry, resolve, settle, and the dead-letter
-- functions, by the operator kind, bound by idem.allowed_owners and
-- idem.allowed_operations; each action allowed from its states only
-- (IK008 otherwise), fencing a holder, written to an audit nobody but
-- idem's owner can change.
SELECT operation, uncertain FROM idem_set_policy('OPS_PAY', uncertain => 'reconcile',
                                                retry_base => '1 hour', retry_max => '1 hour');
CREATE ROLE regress_op;
CREATE ROLE regress_op_bound;
CREATE ROLE regress_op_none;
CREATE ROLE regress_op_su SUPERUSER;
SELECT count(*) > 0 FROM idem_grant('regress_op', 'operator');
SELECT count(*) > 0 FROM idem_grant('regress_op_bound', 'operator');
SELECT privilege, object FROM idem_privileges('operator') ORDER BY object;

-- a task of OPS_PAY in each state, keyed by it
CREATE FUNCTION make_task(state text, n int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    k text := 'ops-' || state || '-' || lpad(n::text, 8, '0');
    t bigint;
    tok bigint;
BEGIN
    SELECT task_id INTO t FROM idem_submit(7, 'OPS_PAY', k, jsonb_build_object('n', n));
    -- out of the way of the leases that make the next tasks
    IF state = 'due' THEN
        UPDATE idem_internal.idempotency_record SET task_due_at = now() + interval '1 day' WHERE id = t;
        RETURN t;
    END IF;
    UPDATE idem_internal.idempotency_record SET task_due_at = now() - interval '1 hour' WHERE id = t;
    SELECT l.token INTO tok FROM idem_lease('OPS_PAY', 'w-' || state, '1 hour', 1000) l WHERE l.task_id = t;
    IF state = 'leased' THEN RETURN t; END IF;
    IF state = 'retryable' THEN PERFORM idem_fail(t, tok, '{"e": "timeout"}'); RETURN t; END IF;
    IF state = 'succeeded' THEN PERFORM idem_complete(t, tok, 201, '{"ok": true}'); RETURN t; END IF;
    IF state = 'failed' THEN PERFORM idem_fail(t, tok, '{"e": "declined"}', false); RETURN t; END IF;
    PERFORM idem_fail_unknown(t, tok, '{"provider": "timeout"}');
    IF state = 'uncertain' THEN
        UPDATE idem_internal.idempotency_record SET task_reconcile_at = now() + interval '1 day' WHERE id = t;
        RETURN t;
    END IF;
    PERFORM 1 FROM idem_lease_reconcile('OPS_PAY', 'r-' || state, '1 hour', 1000) l WHERE l.task_id = t;
    RETURN t;                           -- reconciling
END $$;
CREATE FUNCTION try_action(action text, t bigint) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    CASE action
        WHEN 'cancel' THEN RETURN idem_task_cancel(t, 'the customer asked');
        WHEN 'retry' THEN RETURN idem_task_retry(t, 'the provider is back');
        WHEN 'resolve' THEN RETURN idem_task_resolve(t, 201, '{"charge": "ch_manual"}', 'settled by phone');
        WHEN 'settle' THEN RETURN idem_task_settle(t, true, 'found at the provider', 201, '{"charge": "ch_found"}');
        WHEN 'settle-not' THEN RETURN idem_task_settle(t, false, 'no charge at the provider');
    END CASE;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $$;

-- (a session with a temporary table: idem's own audit triggers still fire)
CREATE TEMP TABLE ops_session_temp (a int);

-- 1. every action from every state: its new status, or IK008
CREATE TABLE matrix AS
SELECT s.state, a.action, (s.i - 1) * 5 + a.j AS n, make_task(s.state, ((s.i - 1) * 5 + a.j)::int) AS task_id
FROM unnest(ARRAY['due', 'leased', 'retryable', 'uncertain', 'reconciling', 'succeeded', 'failed']) WITH ORDINALITY s (state, i),
     unnest(ARRAY['cancel', 'retry', 'resolve', 'settle', 'settle-not']) WITH ORDINALITY a (action, j)
ORDER BY s.i, a.j;
GRANT SELECT ON matrix TO regress_op;
SET ROLE regress_op;
SELECT state, string_agg(action || ': ' || try_action(action, task_id), ', ' ORDER BY action) AS outcomes
FROM matrix GROUP BY state ORDER BY min(n);
RESET ROLE;
-- the states after, and the answers the client's repeat gets
SELECT m.state, m.action, r.status, r.http_status, r.response_body, r.task_due_at <= now() AS due_now,
       r.task_lease_expires_at IS NULL AS not_leased, r.task_uncertain_since IS NULL AS not_marked
FROM matrix m JOIN idem_internal.idempotency_record r ON r.id = m.task_id
WHERE (m.state, m.action) IN (('due', 'cancel'), ('leased', 'resolve'), ('retryable', 'retry'),
                              ('uncertain', 'settle'), ('reconciling', 'settle-not'), ('uncertain', 'cancel'))
ORDER BY m.n;
SELECT s.replayed, s.status, s.http_status, s.body
FROM matrix m, idem_submit(7, 'OPS_PAY', 'ops-leased-' || lpad(m.n::text, 8, '0'), jsonb_build_object('n', m.n)) s
WHERE m.state = 'leased' AND m.action = 'resolve';

-- 2. one audit row per action taken, none for a refusal; who, what, why, before and after
SELECT count(*) AS audit_rows, count(*) FILTER (WHERE a.session_user_name = session_user) AS session_user_kept,
       count(*) FILTER (WHERE a.current_user_name = 'regress_op') AS current_user_kept
FROM idem_operator_actions a;
SELECT a.action, m.state, a.target, a.target_id = m.task_id AS its_task, a.operation, a.reason,
       a.state_before->>'state' AS before, a.state_after->>'state' AS after, a.state_after->>'status' AS status_after,
       a.arguments
FROM idem_operator_actions a JOIN matrix m ON m.task_id = a.target_id
ORDER BY m.n;

-- 3. the holder of a lease an operator acted on gets IK004; its write rolls back
CREATE TABLE ops_effect (task_id bigint);
SELECT make_task('leased', 100) AS t \gset
SELECT task_token AS tok FROM idem_internal.idempotency_record WHERE id = :t \gset
SET ROLE regress_op;
SELECT idem_task_cancel(:t, 'stuck worker');
RESET ROLE;
\set VERBOSITY sqlstate
BEGIN;
INSERT INTO ops_effect VALUES (:t);
SELECT idem_complete(:t, :tok, 201, '{"late": true}');
ROLLBACK;
\set VERBOSITY default
SELECT count(*) AS effects, (SELECT status FROM idem_internal.idempotency_record WHERE id = :t) FROM ops_effect;

-- 4. 42501: a role without the kind; an operator outside its owners or operations
SET ROLE regress_op_none;
\set VERBOSITY sqlstate
SELECT idem_task_cancel(:t, 'no right');
SELECT idem_outbox_discard(ARRAY[1]::bigint[], 'no right');
\set VERBOSITY default
RESET ROLE;
SELECT make_task('due', 101) AS t2 \gset
SET idem.allowed_owners = '8';
SET ROLE regress_op_bound;
SELECT idem_task_cancel(:t2, 'another owner''s');
RESET ROLE;
SET idem.allowed_owners = '7';
SET idem.allowed_operations = 'SHIP';
SET ROLE regress_op_bound;
SELECT idem_task_cancel(:t2, 'another operation''s');
RESET ROLE;
SET idem.allowed_operations = 'OPS_PAY, SHIP';
SET ROLE regress_op_bound;
SELECT idem_task_cancel(:t2, 'its own');
RESET ROLE;
RESET idem.allowed_owners;
RESET idem.allowed_operations;
-- bad arguments: 22004, 22023, nothing written
SELECT make_task('due', 102) AS t3 \gset
SET ROLE regress_op;
SELECT idem_task_cancel(:t2, NULL);
SELECT idem_task_cancel(:t2, '');
SELECT idem_task_cancel(999999999, 'no such task');
\set VERBOSITY sqlstate
SELECT idem_task_resolve(:t2, 201, '{}', 'finished already');
\set VERBOSITY default
SELECT idem_task_resolve(:t3, 500, '{}', 'a 5xx is no answer');
RESET ROLE;

-- 5. dead letters: the operator redrives and discards, audited; bound by owner
SELECT idem_outbox_set_topic('ops.topic', 1, 'skip') IS NULL AS set;
SELECT idem_outbox_emit('ops.topic', '{"n": 1}', 'k1', NULL, 7) > 0, idem_outbox_emit('ops.topic', '{"n": 2}', 'k2', NULL, 8) > 0;
SELECT count(*) FROM idem_outbox_fetch('ops.topic', 10);
SELECT idem_outbox_nack(ARRAY(SELECT message_id FROM idem_internal.idem_outbox WHERE topic = 'ops.topic'), 'refused', true);
SELECT (SELECT message_id FROM idem_internal.idem_outbox_dead WHERE owner_id = 7) AS dead7,
       (SELECT message_id FROM idem_internal.idem_outbox_dead WHERE owner_id = 8) AS dead8 \gset
SET idem.allowed_owners = '7';
SET ROLE regress_op_bound;
SELECT idem_outbox_redrive(ARRAY[:dead7]::bigint[], 'fixed the consumer');
\set VERBOSITY sqlstate
SELECT idem_outbox_discard(ARRAY[:dead8]::bigint[], 'another owner''s');
\set VERBOSITY default
RESET ROLE;
RESET idem.allowed_owners;
SET ROLE regress_op;
SELECT idem_outbox_discard(ARRAY[:dead8]::bigint[], 'poison');
RESET ROLE;
SELECT action, target, owner_id, operation, key, reason, state_before->>'last_reason' AS before, state_after
FROM idem_operator_actions WHERE target = 'message' ORDER BY id;

-- an operator bound by idem.allowed_owners reads only its owners' actions
SET idem.allowed_owners = '8';
SET ROLE regress_op_bound;
SELECT count(*) AS seen, min(owner_id), max(owner_id) FROM idem_operator_actions;
RESET ROLE;
RESET idem.allowed_owners;

-- 6. the audit: nobody but idem's owner changes or deletes a row
SET ROLE regress_op_su;
UPDATE idem_internal.idem_operator_audit SET reason = 'rewritten';
DELETE FROM idem_internal.idem_operator_audit;
TRUNCATE idem_internal.idem_operator_audit;
RESET ROLE;
SET ROLE regress_op;
UPDATE idem_internal.idem_operator_audit SET reason = 'rewritten';
RESET ROLE;
BEGIN;
UPDATE idem_internal.idem_operator_audit SET reason = 'the owner may' WHERE action = 'cancel';
ROLLBACK;
-- an erasure keeps the rows, without their arguments
SET ROLE regress_op_su;
SELECT idem_forget_owner(7) > 0 AS forgotten;
RESET ROLE;
SELECT count(*) > 0 AS kept, count(*) FILTER (WHERE arguments IS NOT NULL) AS with_arguments
FROM idem_internal.idem_operator_audit WHERE owner_id = 7;
-- rows past idem.operator_audit_ttl go with the cleanup
UPDATE idem_internal.idem_operator_audit SET expires_at = now() - interval '1 second' WHERE owner_id = 8;
SELECT idem_cleanup_expired() > 0 AS cleaned;
SELECT count(*) AS left FROM idem_internal.idem_operator_audit WHERE owner_id = 8;

SELECT count(*) > 0 FROM idem_revoke('regress_op', 'operator');
SELECT count(*) > 0 FROM idem_revoke('regress_op_bound', 'operator');
DROP OWNED BY regress_op, regress_op_bound;
DROP ROLE regress_op, regress_op_bound, regress_op_none, regress_op_su;
SELECT idem_drop_policy('OPS_PAY');
DELETE FROM idem_internal.idem_outbox WHERE topic = 'ops.topic';
DELETE FROM idem_internal.idem_outbox_topic WHERE topic = 'ops.topic';
