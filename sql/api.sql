--
-- The generic API: idem_begin / idem_finish / idem_run on an operation that
-- is not an order (an account debited by 100), every argument check and
-- SQLSTATE, byte-identical bodies, headers, the failure TTL, IK003, IK005.
--
\set SHOW_CONTEXT never
SET idem.ttl = '24h';

CREATE TABLE account (id bigint PRIMARY KEY, balance numeric NOT NULL);
CREATE TABLE debit (id bigserial PRIMARY KEY, account_id bigint NOT NULL, amount numeric NOT NULL);
INSERT INTO account VALUES (1, 1000), (2, 1000), (3, 50);

-- The business work of one debit; a deterministic failure is a returned
-- 4xx result, never an exception.
CREATE FUNCTION debit_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
DECLARE
    acct bigint := (request->>'account')::bigint;
    amt numeric := (request->>'amount')::numeric;
    debit_id bigint;
BEGIN
    UPDATE public.account SET balance = balance - amt WHERE id = acct AND balance >= amt;
    IF NOT FOUND THEN
        RETURN ROW(422, '{"error": "insufficient funds"}', NULL, NULL)::idem_result;
    END IF;
    INSERT INTO public.debit (account_id, amount) VALUES (acct, amt) RETURNING id INTO debit_id;
    RETURN ROW(201, json_build_object('debitId', debit_id, 'amount', amt),
               '{"Location": "/debits"}', debit_id)::idem_result;
END $$;

-- idem_begin on a new key claims it; the caller works, then finishes.
BEGIN;
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'begin-finish-key-0001', '{"account": 1, "amount": 100}');
UPDATE account SET balance = balance - 100 WHERE id = 1;
SELECT idem_finish(1, 'DEBIT', 'begin-finish-key-0001', 201, '{"b":1,  "a":2}', 7,
                   '{"Location": "/debits/7", "X-Request-Id": "r1"}');
COMMIT;
-- a repeat replays: the body byte for byte, the headers, the resource id;
-- the same request in another spelling is the same fingerprint
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'begin-finish-key-0001', '{"amount":100,"account":1.0}');
SELECT body::text = '{"b":1,  "a":2}' AS byte_identical
FROM idem_begin(1, 'DEBIT', 'begin-finish-key-0001', '{"account": 1, "amount": 100}');
SELECT balance FROM account WHERE id = 1;
SELECT operation, status, http_status, response_body::text, response_headers, resource_id,
       response_json IS NULL AS no_jsonb_snapshot,
       request_hash = idem_request_hash('{"account": 1, "amount": 100}') AS hash_ok,
       expires_at - created_at AS ttl
FROM idem_internal.idempotency_record WHERE idempotency_key = 'begin-finish-key-0001';

-- the same key with another request: IK001; under another operation, or
-- another owner, an independent record
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'begin-finish-key-0001', '{"account": 1, "amount": 101}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
BEGIN;
SELECT replayed FROM idem_begin(1, 'REFUND', 'begin-finish-key-0001', '{"account": 1, "amount": 101}');
SELECT idem_finish(1, 'REFUND', 'begin-finish-key-0001', 200, '{}');
SELECT replayed FROM idem_begin(2, 'DEBIT', 'begin-finish-key-0001', '{"account": 1, "amount": 101}');
SELECT idem_finish(2, 'DEBIT', 'begin-finish-key-0001', 200, '{}');
COMMIT;
SELECT owner_id, operation, status FROM idem_internal.idempotency_record
WHERE idempotency_key = 'begin-finish-key-0001' ORDER BY owner_id, operation;

-- a record of the order demo replays through idem_begin, its response as body
SELECT replayed FROM idem_create_order(5, 'order-via-begin-00001', 9, 2);
SELECT replayed, http_status, body->>'status' AS status,
       body->>'orderNo' = 'ORD-' || lpad(resource_id::text, 12, '0') AS order_no_ok,
       resource_id = (body->>'orderId')::bigint AS resource_ok
FROM idem_begin(5, 'CREATE_ORDER', 'order-via-begin-00001', '{"sku": 9, "qty": 2}');

-- A deterministic failure (4xx) is finished too: FAILED_FINAL, replayed like
-- a success, for idem.failure_ttl (10 minutes); then the key runs anew.
BEGIN;
SELECT replayed FROM idem_begin(1, 'DEBIT', 'failure-ttl-key-00001', '{"account": 3, "amount": 100}');
SELECT idem_finish(1, 'DEBIT', 'failure-ttl-key-00001', 409, '{"error":"out of stock"}');
COMMIT;
SELECT status, http_status, expires_at - created_at AS ttl FROM idem_internal.idempotency_record
WHERE idempotency_key = 'failure-ttl-key-00001';
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'failure-ttl-key-00001', '{"account": 3, "amount": 100}');
UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 second'
WHERE idempotency_key = 'failure-ttl-key-00001';
BEGIN;
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'failure-ttl-key-00001', '{"account": 3, "amount": 100}');
SELECT idem_finish(1, 'DEBIT', 'failure-ttl-key-00001', 201, '{"ok":true}');
COMMIT;
SELECT count(*) AS records, min(status) AS status, min(http_status) AS http_status
FROM idem_internal.idempotency_record WHERE idempotency_key = 'failure-ttl-key-00001';
SET idem.failure_ttl = '1min';
BEGIN;
SELECT replayed FROM idem_begin(1, 'DEBIT', 'failure-ttl-key-00002', '{}');
SELECT idem_finish(1, 'DEBIT', 'failure-ttl-key-00002', 400, NULL);
COMMIT;
RESET idem.failure_ttl;
SELECT status, response_body IS NULL AS no_body, expires_at - created_at AS ttl
FROM idem_internal.idempotency_record WHERE idempotency_key = 'failure-ttl-key-00002';

-- ttl: per call, positive, at most idem.max_ttl (30 days)
BEGIN;
SELECT replayed FROM idem_begin(1, 'DEBIT', 'ttl-per-call-key-0001', '{}', '90 minutes');
SELECT idem_finish(1, 'DEBIT', 'ttl-per-call-key-0001', 204, NULL);
COMMIT;
SELECT expires_at - created_at AS ttl FROM idem_internal.idempotency_record
WHERE idempotency_key = 'ttl-per-call-key-0001';
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'ttl-per-call-key-0002', '{}', '0 seconds');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'ttl-per-call-key-0002', '{}', '-1 hour');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'ttl-per-call-key-0002', '{}', '31 days');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'ttl-per-call-key-0002', '{}', '1 mon 2 days');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SET idem.max_ttl = '1h';
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'ttl-per-call-key-0002', '{}', '2 hours');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET idem.max_ttl;
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE idempotency_key = 'ttl-per-call-key-0002';

-- expires_at (1.9): when the key's record expires.  A claim: what a
-- success will get (now() + ttl); a replay and idem_run's first execution:
-- what is stored; a 4xx: now() + idem.failure_ttl, read by a begin after
-- the finish, in the same transaction (a replay of what it just stored).
BEGIN;
SELECT replayed, expires_at = now() + interval '1 day' AS success_expiry
FROM idem_begin(1, 'DEBIT', 'expires-at-key-00001', '{}');
SELECT idem_finish(1, 'DEBIT', 'expires-at-key-00001', 201, '{}');
SELECT replayed, expires_at = now() + interval '1 day' AS stored_expiry
FROM idem_begin(1, 'DEBIT', 'expires-at-key-00001', '{}');
SELECT replayed, expires_at = now() + interval '90 minutes' AS ttl_argument
FROM idem_begin(1, 'DEBIT', 'expires-at-key-00002', '{}', '90 minutes');
SELECT idem_finish(1, 'DEBIT', 'expires-at-key-00002', 422, '{"error": "no"}');
SELECT replayed, http_status, expires_at = now() + interval '10 minutes' AS failure_expiry
FROM idem_begin(1, 'DEBIT', 'expires-at-key-00002', '{}', '90 minutes');
COMMIT;
SELECT o.replayed, o.expires_at = r.expires_at AS as_stored, r.expires_at - r.created_at AS ttl
FROM idem_begin(1, 'DEBIT', 'expires-at-key-00001', '{}') o, idem_internal.idempotency_record r
WHERE r.idempotency_key = 'expires-at-key-00001';
SELECT o.replayed, o.http_status, o.expires_at = r.expires_at AS as_stored, r.expires_at - r.created_at AS ttl
FROM idem_begin(1, 'DEBIT', 'expires-at-key-00002', '{}') o, idem_internal.idempotency_record r
WHERE r.idempotency_key = 'expires-at-key-00002';

-- Arguments: NULL is 22004, a bad key or operation 22023; nothing written.
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(NULL, 'DEBIT', 'null-argument-key-001', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, NULL, 'null-argument-key-001', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', NULL, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'null-argument-key-001', NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'short', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', E'bad-key\n-injected-line', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, '', 'bad-operation-key-001', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, repeat('A', 65), 'bad-operation-key-001', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT ACCOUNT', 'bad-operation-key-001', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
BEGIN;
SELECT replayed FROM idem_begin(1, repeat('a', 64), 'long-operation-key-01', '{}');
SELECT replayed FROM idem_begin(1, 'billing.v2:debit-Account_1', 'punct-operation-key-1', '{}');
ROLLBACK;
SELECT idem_finish(NULL, 'DEBIT', 'null-argument-key-001', 200, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_finish(1, 'DEBIT', 'null-argument-key-001', NULL, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_finish(1, 'DEBIT', 'null-argument-key-001', 500, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_finish(1, 'DEBIT', 'null-argument-key-001', 199, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_finish(1, 'DEBIT', 'null-argument-key-001', 200, '{}', NULL, '["a"]');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_finish(1, 'DEBIT', 'null-argument-key-001', 200, '{}', NULL, '{"Retry": 1}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_finish(1, 'DEBIT', 'null-argument-key-001', 200, '{}', NULL, '{"A": {"b": "c"}}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE idempotency_key = 'null-argument-key-001';

-- IK003: nothing claimed by this transaction, or already finished.
SELECT idem_finish(1, 'DEBIT', 'never-claimed-key-001', 200, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
BEGIN;
SELECT replayed FROM idem_begin(1, 'DEBIT', 'finished-twice-key-01', '{}');
SELECT idem_finish(1, 'DEBIT', 'finished-twice-key-01', 200, '{}');
SELECT idem_finish(1, 'DEBIT', 'finished-twice-key-01', 200, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK;
-- a claim of another transaction is not this one's
BEGIN;
SELECT replayed FROM idem_begin(1, 'DEBIT', 'other-xact-claim-key1', '{}');
ROLLBACK;
SELECT idem_finish(1, 'DEBIT', 'other-xact-claim-key1', 200, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- In one transaction: a second begin before finish is IK002 (IK001 if the
-- request differs); after finish, it replays.
BEGIN;
SELECT replayed FROM idem_begin(1, 'DEBIT', 'same-xact-begin-key01', '{"n": 1}');
SAVEPOINT s;
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'same-xact-begin-key01', '{"n": 1}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'DEBIT', 'same-xact-begin-key01', '{"n": 2}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
SELECT idem_finish(1, 'DEBIT', 'same-xact-begin-key01', 200, '{"done":1}');
SELECT replayed, body FROM idem_begin(1, 'DEBIT', 'same-xact-begin-key01', '{"n": 1}');
COMMIT;

-- IK005: a claim not finished cannot commit; the work rolls back with it.
BEGIN;
SELECT replayed FROM idem_begin(1, 'DEBIT', 'unfinished-key-000001', '{"account": 2, "amount": 100}');
UPDATE account SET balance = balance - 100 WHERE id = 2;
COMMIT;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT balance FROM account WHERE id = 2;
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE idempotency_key = 'unfinished-key-000001';
-- ... nor be prepared
BEGIN;
SELECT replayed FROM idem_begin(1, 'DEBIT', 'unfinished-key-000002', '{}');
PREPARE TRANSACTION 'idem_unfinished';
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'idem_unfinished';
-- a finish rolled back to a savepoint leaves the claim unfinished
BEGIN;
SELECT replayed FROM idem_begin(1, 'DEBIT', 'unfinished-key-000003', '{}');
SAVEPOINT s;
SELECT idem_finish(1, 'DEBIT', 'unfinished-key-000003', 200, '{}');
ROLLBACK TO s;
COMMIT;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- a claim rolled back to a savepoint is gone, with its key lock
BEGIN;
SAVEPOINT s;
SELECT replayed FROM idem_begin(1, 'DEBIT', 'unfinished-key-000004', '{}');
ROLLBACK TO s;
SELECT count(*) AS key_locks FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 478 AND pid = pg_backend_pid();
COMMIT;
-- a claim finished inside a released savepoint is finished
BEGIN;
SELECT replayed FROM idem_begin(1, 'DEBIT', 'unfinished-key-000005', '{}');
SAVEPOINT s;
SELECT idem_finish(1, 'DEBIT', 'unfinished-key-000005', 200, '{}');
RELEASE s;
COMMIT;
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'unfinished-key-%';

-- idem_run: the handler runs once; a repeat replays without calling it.
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'DEBIT', 'run-debit-key-0000001', '{"account": 2, "amount": 100}',
                       'debit_handler(jsonb)');
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'DEBIT', 'run-debit-key-0000001', '{"account": 2, "amount": 100}',
                       'debit_handler(jsonb)');
SELECT balance FROM account WHERE id = 2;
SELECT count(*) AS debits FROM debit WHERE account_id = 2;
-- a returned 4xx is a deterministic failure, replayed
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'DEBIT', 'run-debit-key-0000002', '{"account": 3, "amount": 100}',
                       'debit_handler(jsonb)');
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'DEBIT', 'run-debit-key-0000002', '{"account": 3, "amount": 100}',
                       'debit_handler(jsonb)');
SELECT status FROM idem_internal.idempotency_record WHERE idempotency_key = 'run-debit-key-0000002';
-- idem_begin and idem_run share the record
SELECT replayed, http_status FROM idem_begin(1, 'DEBIT', 'run-debit-key-0000001', '{"account": 2, "amount": 100}');
-- ttl per call
SELECT replayed FROM idem_run(1, 'DEBIT', 'run-debit-key-0000003', '{"account": 2, "amount": 1}',
                              'debit_handler(jsonb)', '2 hours');
SELECT expires_at - created_at AS ttl FROM idem_internal.idempotency_record WHERE idempotency_key = 'run-debit-key-0000003';

-- A handler that raises: the error unchanged, nothing of the call remains,
-- the key stays retryable.
CREATE TABLE flaky (fail boolean);
INSERT INTO flaky VALUES (true);
CREATE FUNCTION flaky_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.debit (account_id, amount) VALUES (2, 1);
    IF (SELECT fail FROM public.flaky) THEN
        RAISE EXCEPTION 'payment gateway timed out' USING ERRCODE = '08006';
    END IF;
    RETURN ROW(200, '{"ok": true}', NULL, NULL)::idem_result;
END $$;
SELECT count(*) AS debits_before FROM debit;
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'flaky-handler-key-001', '{}', 'flaky_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS debits_after FROM debit;
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE idempotency_key = 'flaky-handler-key-001';
-- caught in a savepoint (a PL/pgSQL block): the claim and its lock go too
DO $$
BEGIN
    PERFORM idem_run(1, 'PAY', 'flaky-handler-key-001', '{}', 'flaky_handler(jsonb)');
EXCEPTION WHEN connection_failure THEN
    RAISE NOTICE 'caught: %', SQLERRM;
END $$;
UPDATE flaky SET fail = false;
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'flaky-handler-key-001', '{}', 'flaky_handler(jsonb)');
SELECT replayed FROM idem_run(1, 'PAY', 'flaky-handler-key-001', '{}', 'flaky_handler(jsonb)');

-- What a handler returns is checked like idem_finish's arguments; its work
-- rolls back with the error.
CREATE FUNCTION status_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.debit (account_id, amount) VALUES (2, 2);
    RETURN ROW((request->>'status')::int, NULL, request->'headers', NULL)::idem_result;
END $$;
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'status-handler-key-01', '{"status": 503}', 'status_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'status-handler-key-01', '{"status": null}', 'status_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'status-handler-key-01', '{"status": 200, "headers": {"A": 1}}', 'status_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS debits_of_2 FROM debit WHERE amount = 2;
CREATE FUNCTION null_handler(request jsonb) RETURNS idem_result
LANGUAGE sql AS $$ SELECT NULL::idem_result $$;
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'null-handler-key-0001', '{}', 'null_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- The handler's signature: one jsonb argument (42883), idem_result (42804).
CREATE FUNCTION text_handler(request text) RETURNS idem_result
LANGUAGE sql AS $$ SELECT ROW(200, NULL, NULL, NULL)::idem_result $$;
CREATE FUNCTION two_arg_handler(request jsonb, extra int) RETURNS idem_result
LANGUAGE sql AS $$ SELECT ROW(200, NULL, NULL, NULL)::idem_result $$;
CREATE FUNCTION int_handler(request jsonb) RETURNS integer
LANGUAGE sql AS $$ SELECT 200 $$;
CREATE FUNCTION set_handler(request jsonb) RETURNS SETOF idem_result
LANGUAGE sql AS $$ SELECT ROW(200, NULL, NULL, NULL)::idem_result $$;
CREATE PROCEDURE proc_handler(request jsonb) LANGUAGE sql AS $$ SELECT 1 $$;
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'signature-key-0000001', '{}', 'text_handler(text)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'signature-key-0000001', '{}', 'two_arg_handler(jsonb, int)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'signature-key-0000001', '{}', 'int_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'signature-key-0000001', '{}', 'set_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'signature-key-0000001', '{}', 'proc_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'signature-key-0000001', '{}', 'missing_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'signature-key-0000001', '{}', NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE idempotency_key = 'signature-key-0000001';

-- A handler that calls idem for the key being run (idem_run, idem_finish,
-- idem_begin, idem_submit): IK006, before anything is written.
CREATE FUNCTION nested_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.idem_run(1, 'PAY', 'nested-handler-key-01', request, 'public.nested_handler(jsonb)');
    RETURN ROW(200, NULL, NULL, NULL)::idem_result;
END $$;
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'nested-handler-key-01', '{}', 'nested_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
CREATE FUNCTION nested_finish_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.idem_finish(1, 'PAY', 'nested-handler-key-02', 201, '{"inner": true}');
    RETURN ROW(200, NULL, NULL, NULL)::idem_result;
END $$;
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'nested-handler-key-02', '{}', 'nested_finish_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
CREATE FUNCTION nested_begin_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.idem_begin(1, 'PAY', 'nested-handler-key-03', request);
    RETURN ROW(200, NULL, NULL, NULL)::idem_result;
END $$;
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'nested-handler-key-03', '{}', 'nested_begin_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
CREATE FUNCTION nested_submit_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.idem_submit(1, 'PAY', 'nested-handler-key-04', request);
    RETURN ROW(200, NULL, NULL, NULL)::idem_result;
END $$;
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'PAY', 'nested-handler-key-04', '{}', 'nested_submit_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS records FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'nested-handler-key-%';
-- the handler may call idem for other keys; the key is its own again after the run
CREATE FUNCTION other_key_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.idem_run(1, 'PAY', 'nested-other-key-0001', request, 'public.debit_handler(jsonb)');
    RETURN ROW(200, NULL, NULL, NULL)::idem_result;
END $$;
BEGIN;
SELECT replayed, http_status FROM idem_run(1, 'PAY', 'nested-outer-key-0001', '{"account": 1, "amount": 1}', 'other_key_handler(jsonb)');
SELECT replayed, http_status FROM idem_run(1, 'PAY', 'nested-outer-key-0001', '{"account": 1, "amount": 1}', 'other_key_handler(jsonb)');
ROLLBACK;

-- The handler runs as the caller: its user, its search_path, its rights.
CREATE ROLE regress_idem_caller;
CREATE SCHEMA caller_schema AUTHORIZATION regress_idem_caller;
CREATE TABLE handler_seen (who name, path text);
GRANT INSERT ON handler_seen TO regress_idem_caller;
CREATE FUNCTION whoami_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.handler_seen VALUES (current_user, current_setting('search_path'));
    RETURN ROW(200, '{}', NULL, NULL)::idem_result;
END $$;
REVOKE EXECUTE ON FUNCTION whoami_handler(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_run(bigint, text, text, jsonb, regprocedure, interval) TO regress_idem_caller;
SET ROLE regress_idem_caller;
SET search_path = caller_schema, public;
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(1, 'WHOAMI', 'handler-identity-key1', '{}', 'whoami_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;
GRANT EXECUTE ON FUNCTION whoami_handler(jsonb) TO regress_idem_caller;
SET ROLE regress_idem_caller;
SELECT replayed FROM idem_run(1, 'WHOAMI', 'handler-identity-key1', '{}', 'whoami_handler(jsonb)');
SELECT current_user, current_setting('search_path') AS path_after;
-- the caller needs no right on idem's tables
SELECT count(*) FROM idem_internal.idempotency_record;
RESET ROLE;
RESET search_path;
SELECT * FROM handler_seen;
-- the caller may not begin or finish without a grant
SET ROLE regress_idem_caller;
SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'WHOAMI', 'handler-identity-key2', '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;
REVOKE ALL ON handler_seen FROM regress_idem_caller;
REVOKE EXECUTE ON FUNCTION idem_run(bigint, text, text, jsonb, regprocedure, interval) FROM regress_idem_caller;
REVOKE EXECUTE ON FUNCTION whoami_handler(jsonb) FROM regress_idem_caller;
DROP SCHEMA caller_schema;
DROP ROLE regress_idem_caller;

--
-- The article's tests, on the debit operation (2, concurrency, is in the
-- isolation and load suites).
--
UPDATE account SET balance = 1000;
TRUNCATE debit;
-- 1. Same key and request twice, serially: one debit.
SELECT replayed, http_status FROM idem_run(10, 'DEBIT', 'article-1-key-0000001', '{"account": 1, "amount": 100}', 'debit_handler(jsonb)');
SELECT replayed, http_status FROM idem_run(10, 'DEBIT', 'article-1-key-0000001', '{"account": 1, "amount": 100}', 'debit_handler(jsonb)');
SELECT count(*) AS debits, (SELECT balance FROM account WHERE id = 1) AS balance FROM debit;
-- 3. Same key, different request: IK001, nothing debited.
SELECT replayed, http_status, body, headers, resource_id FROM idem_run(10, 'DEBIT', 'article-1-key-0000001', '{"account": 1, "amount": 200}', 'debit_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS debits, (SELECT balance FROM account WHERE id = 1) AS balance FROM debit;
-- 4. The first transaction fails: the retry debits once.
BEGIN;
SELECT replayed FROM idem_run(10, 'DEBIT', 'article-4-key-0000001', '{"account": 1, "amount": 100}', 'debit_handler(jsonb)');
SELECT 1 / 0;
ROLLBACK;
SELECT count(*) AS debits, (SELECT balance FROM account WHERE id = 1) AS balance FROM debit;
SELECT replayed FROM idem_run(10, 'DEBIT', 'article-4-key-0000001', '{"account": 1, "amount": 100}', 'debit_handler(jsonb)');
SELECT replayed FROM idem_run(10, 'DEBIT', 'article-4-key-0000001', '{"account": 1, "amount": 100}', 'debit_handler(jsonb)');
SELECT count(*) AS debits, (SELECT balance FROM account WHERE id = 1) AS balance FROM debit;
-- 5. No cache decides anything: the unique index refuses a second record
-- of a scope, whoever writes it.
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
VALUES (10, 'DEBIT', 'article-1-key-0000001', repeat('0', 64), 'SUCCEEDED', now() + interval '1 day');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- 6. The replay has the first call's status and body.
SELECT a.http_status = b.http_status AND a.body::text = b.body::text AND a.headers = b.headers
       AND a.resource_id = b.resource_id AS same_answer, a.replayed, b.replayed
FROM idem_run(10, 'DEBIT', 'article-6-key-0000001', '{"account": 1, "amount": 100}', 'debit_handler(jsonb)') a,
     LATERAL idem_run(10, 'DEBIT', 'article-6-key-0000001', '{"account": 1, "amount": 100}', 'debit_handler(jsonb)') b;
-- 7. Two owners, one key: independent.
SELECT replayed FROM idem_run(11, 'DEBIT', 'article-1-key-0000001', '{"account": 2, "amount": 100}', 'debit_handler(jsonb)');
SELECT replayed FROM idem_run(12, 'DEBIT', 'article-1-key-0000001', '{"account": 2, "amount": 100}', 'debit_handler(jsonb)');
SELECT account_id, count(*) AS debits, sum(amount) FROM debit GROUP BY account_id ORDER BY account_id;

-- idem_run's expires_at: its first execution's is what it stored
SELECT replayed, expires_at = now() + interval '1 day' AS stored_expiry
FROM idem_run(10, 'DEBIT', 'article-exp-key-000001', '{"account": 1, "amount": 1}', 'debit_handler(jsonb)');
SELECT o.replayed, o.expires_at = r.expires_at AS as_stored
FROM idem_run(10, 'DEBIT', 'article-exp-key-000001', '{"account": 1, "amount": 1}', 'debit_handler(jsonb)') o,
     idem_internal.idempotency_record r WHERE r.idempotency_key = 'article-exp-key-000001';

-- The handlers depend on idem_result: drop them with their tables.
DROP FUNCTION debit_handler(jsonb), flaky_handler(jsonb), status_handler(jsonb),
    null_handler(jsonb), text_handler(text), two_arg_handler(jsonb, int),
    int_handler(jsonb), set_handler(jsonb), nested_handler(jsonb), whoami_handler(jsonb),
    nested_finish_handler(jsonb), nested_begin_handler(jsonb), nested_submit_handler(jsonb),
    other_key_handler(jsonb);
DROP PROCEDURE proc_handler(jsonb);
DROP TABLE account, debit, flaky, handler_seen;
