-- A key executes once whatever an operation's key_format and
-- reject_weak_keys say, before or after it changes (1.13): a record stored
-- under one spelling of a UUID or a ULID is found under the other, and a key
-- executed before a policy that refuses it replays (or IK007) instead of 22023.
SET client_min_messages = warning;
CREATE TABLE spell_effect (id bigserial PRIMARY KEY, op text NOT NULL, key text NOT NULL);
CREATE FUNCTION spell_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.spell_effect (op, key) VALUES ('PAYRUN', request->>'k');
    RETURN ROW(201, json_build_object('k', request->>'k'), NULL, NULL)::idem_result;
END $$;
-- one business effect per execution of the generic API
CREATE FUNCTION spell_begin(op text, k text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE r boolean;
BEGIN
    SELECT replayed INTO r FROM idem_begin(7713, op, k, '{"amount": 5}');
    IF NOT r THEN
        INSERT INTO public.spell_effect (op, key) VALUES (op, k);
        PERFORM idem_finish(7713, op, k, 201, '{"ok": true}');
    END IF;
    RETURN r;
END $$;
CREATE FUNCTION spell_run(k text) RETURNS boolean
LANGUAGE sql AS $$
    SELECT replayed FROM idem_run(7713, 'PAYRUN', k, jsonb_build_object('k', 'x'), 'spell_handler(jsonb)')
$$;
CREATE FUNCTION spell_submit(k text) RETURNS boolean
LANGUAGE sql AS $$
    SELECT replayed FROM idem_submit(7713, 'PAYTASK', k, '{"amount": 5}')
$$;
-- the executions of a client key, whatever the spelling stored
CREATE FUNCTION spell_records(op text, k text) RETURNS bigint
LANGUAGE sql AS $$
    SELECT count(*) FROM idem_internal.idempotency_record
    WHERE owner_id = 7713 AND operation = op AND lower(idempotency_key) = lower(k)
$$;

-- 1. stored in upper case with no policy, as 1.12 stored them (1.13 keeps
--    a UUID in lower case); retried once key_format 'uuid' (which keeps keys
--    in lower case) is set, changed to 'ulid', and dropped
SELECT spell_begin('PAYBEGIN', '3F2504E0-4F89-11D3-9A0C-0305E82C3301') AS begin_replayed,
       spell_run('3F2504E0-4F89-11D3-9A0C-0305E82C3302') AS run_replayed,
       spell_submit('3F2504E0-4F89-11D3-9A0C-0305E82C3303') AS submit_replayed,
       (SELECT replayed FROM idem_create_order(7713, '3F2504E0-4F89-11D3-9A0C-0305E82C3304', 10, 1)) AS order_replayed;
SELECT idempotency_key FROM idem_internal.idempotency_record WHERE owner_id = 7713 ORDER BY 1;
UPDATE idem_internal.idempotency_record SET idempotency_key = upper(idempotency_key) WHERE owner_id = 7713;
SELECT operation, key_format FROM idem_set_policy('PAYBEGIN', key_format => 'uuid');
SELECT operation, key_format FROM idem_set_policy('PAYRUN', key_format => 'uuid');
SELECT operation, key_format FROM idem_set_policy('PAYTASK', key_format => 'uuid');
SELECT operation, key_format FROM idem_set_policy('CREATE_ORDER', key_format => 'uuid');
SELECT spell_begin('PAYBEGIN', '3F2504E0-4F89-11D3-9A0C-0305E82C3301') AS begin_replayed,
       spell_run('3F2504E0-4F89-11D3-9A0C-0305E82C3302') AS run_replayed,
       spell_submit('3F2504E0-4F89-11D3-9A0C-0305E82C3303') AS submit_replayed,
       (SELECT replayed FROM idem_create_order(7713, '3F2504E0-4F89-11D3-9A0C-0305E82C3304', 10, 1)) AS order_replayed;
-- changed: key_format 'ulid' refuses new UUIDs, not the retries of old ones
SELECT operation, key_format FROM idem_set_policy('PAYBEGIN', key_format => 'ulid');
SELECT operation, key_format FROM idem_set_policy('PAYRUN', key_format => 'ulid');
SELECT operation, key_format FROM idem_set_policy('PAYTASK', key_format => 'ulid');
SELECT operation, key_format FROM idem_set_policy('CREATE_ORDER', key_format => 'ulid');
SELECT spell_begin('PAYBEGIN', '3F2504E0-4F89-11D3-9A0C-0305E82C3301') AS begin_replayed,
       spell_run('3F2504E0-4F89-11D3-9A0C-0305E82C3302') AS run_replayed,
       spell_submit('3F2504E0-4F89-11D3-9A0C-0305E82C3303') AS submit_replayed,
       (SELECT replayed FROM idem_create_order(7713, '3F2504E0-4F89-11D3-9A0C-0305E82C3304', 10, 1)) AS order_replayed;
SELECT spell_begin('PAYBEGIN', '3F2504E0-4F89-11D3-9A0C-0305E82C3399');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_drop_policy('PAYBEGIN'), idem_drop_policy('PAYRUN'), idem_drop_policy('PAYTASK'), idem_drop_policy('CREATE_ORDER');
SELECT spell_begin('PAYBEGIN', '3F2504E0-4F89-11D3-9A0C-0305E82C3301') AS begin_replayed,
       spell_run('3F2504E0-4F89-11D3-9A0C-0305E82C3302') AS run_replayed,
       spell_submit('3F2504E0-4F89-11D3-9A0C-0305E82C3303') AS submit_replayed,
       (SELECT replayed FROM idem_create_order(7713, '3F2504E0-4F89-11D3-9A0C-0305E82C3304', 10, 1)) AS order_replayed;
-- one execution each
SELECT spell_records('PAYBEGIN', '3F2504E0-4F89-11D3-9A0C-0305E82C3301') AS begin_records,
       spell_records('PAYRUN', '3F2504E0-4F89-11D3-9A0C-0305E82C3302') AS run_records,
       spell_records('PAYTASK', '3F2504E0-4F89-11D3-9A0C-0305E82C3303') AS task_records,
       spell_records('CREATE_ORDER', '3F2504E0-4F89-11D3-9A0C-0305E82C3304') AS order_records,
       (SELECT count(*) FROM spell_effect) AS effects,
       (SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id = 7713) AS orders;

-- 2. stored in lower case under key_format 'uuid'; retried in upper case
--    once the policy is dropped
SELECT operation, key_format FROM idem_set_policy('PAYBEGIN', key_format => 'uuid');
SELECT operation, key_format FROM idem_set_policy('PAYRUN', key_format => 'uuid');
SELECT operation, key_format FROM idem_set_policy('PAYTASK', key_format => 'uuid');
SELECT operation, key_format FROM idem_set_policy('CREATE_ORDER', key_format => 'uuid');
SELECT spell_begin('PAYBEGIN', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11') AS begin_replayed,
       spell_run('A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A12') AS run_replayed,
       spell_submit('A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A13') AS submit_replayed,
       (SELECT replayed FROM idem_create_order(7713, 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A14', 10, 1)) AS order_replayed;
SELECT idempotency_key FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'a0eebc99%' ORDER BY 1;
SELECT idem_drop_policy('PAYBEGIN'), idem_drop_policy('PAYRUN'), idem_drop_policy('PAYTASK'), idem_drop_policy('CREATE_ORDER');
SELECT spell_begin('PAYBEGIN', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11') AS begin_replayed,
       spell_run('A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A12') AS run_replayed,
       spell_submit('A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A13') AS submit_replayed,
       (SELECT replayed FROM idem_create_order(7713, 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A14', 10, 1)) AS order_replayed;
-- a ULID stored in upper case, retried in lower case without a policy
SELECT spell_begin('PAYBEGIN', '01JZ3K9V4S6T8W0XYZ12AB34CD') AS stored,
       spell_begin('PAYBEGIN', '01jz3k9v4s6t8w0xyz12ab34cd') AS lower_replayed;
SELECT spell_records('PAYBEGIN', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11') AS begin_records,
       spell_records('PAYRUN', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A12') AS run_records,
       spell_records('PAYTASK', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A13') AS task_records,
       spell_records('CREATE_ORDER', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A14') AS order_records,
       spell_records('PAYBEGIN', '01JZ3K9V4S6T8W0XYZ12AB34CD') AS ulid_records,
       (SELECT count(*) FROM spell_effect) AS effects,
       (SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id = 7713) AS orders;
-- a key stored by 1.13 is found under either spelling, with or without a policy
SELECT spell_begin('PAYBEGIN', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11') AS upper_replayed,
       spell_begin('PAYBEGIN', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11') AS lower_replayed,
       spell_begin('PAYBEGIN', 'A0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11') AS mixed_replayed;
-- a token key keeps its case: two spellings are two keys
SELECT spell_begin('PAYBEGIN', 'Token-Key-Case-00001') AS first, spell_begin('PAYBEGIN', 'token-key-case-00001') AS other_key;

-- 3. keys executed before reject_weak_keys / key_format refuse them replay;
--    a new such key is refused (22023) and nothing is written
SELECT spell_begin('PAYBEGIN', '1733059200123456') AS begin_replayed,
       spell_run('1733059200123457') AS run_replayed,
       spell_submit('1733059200123458') AS submit_replayed,
       (SELECT replayed FROM idem_create_order(7713, '1733059200123459', 10, 1)) AS order_replayed;
SELECT operation FROM idem_set_policy('PAYBEGIN', key_format => 'uuid', reject_weak_keys => true);
SELECT operation FROM idem_set_policy('PAYRUN', key_format => 'uuid', reject_weak_keys => true);
SELECT operation FROM idem_set_policy('PAYTASK', key_format => 'uuid', reject_weak_keys => true);
SELECT operation FROM idem_set_policy('CREATE_ORDER', reject_weak_keys => true);
SELECT spell_begin('PAYBEGIN', '1733059200123456') AS begin_replayed,
       spell_run('1733059200123457') AS run_replayed,
       spell_submit('1733059200123458') AS submit_replayed,
       (SELECT replayed FROM idem_create_order(7713, '1733059200123459', 10, 1)) AS order_replayed;
SELECT count(*) AS effects_before FROM spell_effect \gset
SELECT spell_begin('PAYBEGIN', '1733059200123460');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT spell_run('1733059200123461');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT spell_submit('1733059200123462');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT order_id FROM idem_create_order(7713, '1733059200123463', 10, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT (SELECT count(*) FROM spell_effect) - :effects_before AS effects_written,
       (SELECT count(*) FROM idem_internal.idempotency_record WHERE idempotency_key >= '1733059200123460' AND idempotency_key LIKE '17330592001234%') AS records_written;
SELECT idem_drop_policy('PAYBEGIN'), idem_drop_policy('PAYRUN'), idem_drop_policy('PAYTASK'), idem_drop_policy('CREATE_ORDER');

-- 4. a key whose audit row is under the other spelling is refused with IK007
SELECT operation FROM idem_set_policy('PAYBEGIN', audit_ttl => '30 days', reuse_after_expiry => 'refuse');
SELECT spell_begin('PAYBEGIN', 'C0FFEE00-1111-4222-8333-444455556666') AS stored;
-- (as 1.12 stored it, in upper case) and expired
UPDATE idem_internal.idempotency_record
SET idempotency_key = upper(idempotency_key), expires_at = now() - interval '1 minute'
WHERE idempotency_key = 'c0ffee00-1111-4222-8333-444455556666';
SELECT idem_cleanup_expired() >= 1 AS archived;
SELECT idempotency_key FROM idem_internal.idem_history WHERE lower(idempotency_key) LIKE 'c0ffee00%';
SELECT operation FROM idem_set_policy('PAYBEGIN', key_format => 'uuid');
\set VERBOSITY terse
SELECT spell_begin('PAYBEGIN', 'C0FFEE00-1111-4222-8333-444455556666');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT idem_drop_policy('PAYBEGIN');

-- 5. both spellings recorded (two executions under 1.12): the older answers,
--    with a WARNING naming both records
UPDATE idem_internal.idempotency_record SET id = 900001 WHERE idempotency_key = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12';
INSERT INTO idem_internal.idempotency_record (id, owner_id, operation, idempotency_key, request_hash, status, http_status, response_body, created_at, updated_at, expires_at)
SELECT 900000, owner_id, operation, upper(idempotency_key), request_hash, status, 200, '{"first": true}', created_at - interval '1 second', updated_at, expires_at
FROM idem_internal.idempotency_record WHERE idempotency_key = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12';
SELECT replayed, http_status, body FROM idem_begin(7713, 'PAYRUN', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A12', '{"k": "x"}');
-- and a different request is refused under either
SELECT replayed FROM idem_begin(7713, 'PAYRUN', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A12', '{"k": "y"}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET client_min_messages;
DROP FUNCTION spell_begin(text, text), spell_run(text), spell_submit(text), spell_records(text, text), spell_handler(jsonb);
DROP TABLE spell_effect;
