-- Redaction reaches every stored copy of an answer, whatever its shape
-- (1.13): a pointer that does not apply is skipped (never an error), array
-- indices work, header names match in any case, a task's final failure and
-- its last error are redacted inside the {"error": ...} wrapper, and
-- idem_finish_stored returns the answer as stored.
SELECT operation, redact FROM idem_set_policy('REDACT',
    redact => ARRAY['/password', '/card/number', '/items/0/secret', '/0/token', '/Authorization', '/X-Api-Key']);

-- bodies of every shape: an array (the pointers through it apply by
-- index), a scalar, null, an object whose members are not what the
-- pointers go through
BEGIN;
SELECT replayed FROM idem_begin(9, 'REDACT', 'redact-shape-0000001', '{}');
SELECT idem_finish(9, 'REDACT', 'redact-shape-0000001', 200, '[{"token": "t0", "n": 1}, {"token": "t1"}]');
SELECT replayed FROM idem_begin(9, 'REDACT', 'redact-shape-0000002', '{}');
SELECT idem_finish(9, 'REDACT', 'redact-shape-0000002', 200, '"just a string"');
SELECT replayed FROM idem_begin(9, 'REDACT', 'redact-shape-0000003', '{}');
SELECT idem_finish(9, 'REDACT', 'redact-shape-0000003', 200, 'null');
SELECT replayed FROM idem_begin(9, 'REDACT', 'redact-shape-0000004', '{}');
SELECT idem_finish(9, 'REDACT', 'redact-shape-0000004', 200,
    '{"card": "4111 as a string", "items": {"0": {"secret": "an object, not an array"}}, "password": ["p"]}');
SELECT replayed FROM idem_begin(9, 'REDACT', 'redact-shape-0000005', '{}');
SELECT idem_finish(9, 'REDACT', 'redact-shape-0000005', 200,
    '{"items": [{"secret": "s", "keep": 1}, {"secret": "second stays"}], "card": {"number": "4111", "brand": "visa"}}');
SELECT replayed FROM idem_begin(9, 'REDACT', 'redact-shape-0000006', '{}');
SELECT idem_finish(9, 'REDACT', 'redact-shape-0000006', 200, '42');
COMMIT;
SELECT idempotency_key, response_body FROM idem_internal.idempotency_record
WHERE operation = 'REDACT' ORDER BY idempotency_key;

-- header names in any case, in the jsonb object and in the json form (an
-- object, or [name, value] pairs as the middlewares store them)
BEGIN;
SELECT replayed FROM idem_begin(9, 'REDACT', 'redact-header-000001', '{}');
SELECT idem_finish(9, 'REDACT', 'redact-header-000001', 201, '{}',
    headers => '{"authorization": "Bearer abc", "AUTHORIZATION": "Bearer def", "x-api-key": "k", "location": "/x"}');
SELECT replayed FROM idem_begin(9, 'REDACT', 'redact-header-000002', '{}');
SELECT idem_finish(9, 'REDACT', 'redact-header-000002', 201, '{}',
    header_list => '[["authorization", "Bearer abc"], ["set-cookie", "a=1"], ["X-API-KEY", "k"], ["set-cookie", "b=2"]]');
SELECT replayed FROM idem_begin(9, 'REDACT', 'redact-header-000003', '{}');
SELECT idem_finish(9, 'REDACT', 'redact-header-000003', 201, '{}',
    header_list => '{"Authorization": "Bearer abc", "Location": "/y"}');
COMMIT;
SELECT idempotency_key, response_headers, response_header_list FROM idem_internal.idempotency_record
WHERE idempotency_key LIKE 'redact-header-%' ORDER BY idempotency_key;

-- idem_finish_stored: what was stored, as a replay returns it
BEGIN;
SELECT replayed FROM idem_begin(9, 'REDACT', 'redact-stored-000001', '{}');
SELECT replayed, http_status, body, headers, header_list, resource_id, expires_at > now() AS expires
FROM idem_finish_stored(9, 'REDACT', 'redact-stored-000001', 201,
    '{"password": "p", "user": "ann"}', 5, header_list => '[["Authorization", "x"], ["location", "/u/5"]]');
COMMIT;
SELECT replayed, http_status, body, headers, header_list, resource_id
FROM idem_begin(9, 'REDACT', 'redact-stored-000001', '{}');
-- without a claim: IK003, nothing written
SELECT replayed FROM idem_finish_stored(9, 'REDACT', 'redact-stored-000002', 201, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- tasks: a result of any shape completes; a retryable failure's last error
-- and a final failure's body are redacted inside the wrapper
SELECT replayed FROM idem_submit(9, 'REDACT', 'redact-task-00000001', '{"password": "in the request while it runs"}');
SELECT idem_complete(task_id, token, 200, '["an", "array"]', headers => '{"Authorization": "t"}') FROM idem_lease('REDACT', 'w1');
SELECT http_status, body, headers FROM idem_submit(9, 'REDACT', 'redact-task-00000001', '{"password": "in the request while it runs"}');
SELECT replayed FROM idem_submit(9, 'REDACT', 'redact-task-00000002', '{}');
SELECT idem_fail(task_id, token, '{"password": "p1", "card": {"number": "4111"}, "reason": "declined"}', true) FROM idem_lease('REDACT', 'w1');
SELECT task_last_error FROM idem_internal.idempotency_record WHERE idempotency_key = 'redact-task-00000002';
UPDATE idem_internal.idempotency_record SET task_due_at = now() WHERE idempotency_key = 'redact-task-00000002';
SELECT idem_fail(task_id, token, '{"password": "p2", "card": {"number": "4111"}, "reason": "declined"}', false) FROM idem_lease('REDACT', 'w1');
SELECT status, http_status, response_body, task_last_error, task_request, task_payload
FROM idem_internal.idempotency_record WHERE idempotency_key = 'redact-task-00000002';
SELECT http_status, body FROM idem_submit(9, 'REDACT', 'redact-task-00000002', '{}');
-- a scalar error
SELECT replayed FROM idem_submit(9, 'REDACT', 'redact-task-00000003', '{}');
SELECT idem_fail(task_id, token, '"timeout"', false) FROM idem_lease('REDACT', 'w1');
SELECT http_status, body FROM idem_submit(9, 'REDACT', 'redact-task-00000003', '{}');

-- idem_run: a handler's scalar body
CREATE FUNCTION redact_scalar_handler(request jsonb) RETURNS idem_result
LANGUAGE sql AS $$ SELECT ROW(200, '"ok"'::json, '{"Authorization": "x", "Location": "/r"}'::jsonb, NULL)::idem_result $$;
SELECT replayed, body, headers FROM idem_run(9, 'REDACT', 'redact-run-000000001', '{}', 'redact_scalar_handler(jsonb)');
SELECT replayed, body, headers FROM idem_run(9, 'REDACT', 'redact-run-000000001', '{}', 'redact_scalar_handler(jsonb)');
DROP FUNCTION redact_scalar_handler(jsonb);
SELECT idem_drop_policy('REDACT');

-- a header name or value with a CR or an LF would split a replayed
-- response: 22023, and nothing is written (1.13)
BEGIN;
SELECT replayed FROM idem_begin(9, 'CRLF', 'crlf-header-00000001', '{}');
SELECT idem_finish(9, 'CRLF', 'crlf-header-00000001', 201, '{}', headers => jsonb_build_object('location', E'/x\r\nSet-Cookie: a=1'));
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT replayed FROM idem_begin(9, 'CRLF', 'crlf-header-00000001', '{}');
SELECT idem_finish(9, 'CRLF', 'crlf-header-00000001', 201, '{}', header_list => json_build_array(json_build_array(E'x-a\nb', 'v')));
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT replayed FROM idem_submit(9, 'CRLF', 'crlf-task-0000000001', '{}');
SELECT idem_complete(task_id, token, 200, '{}', header_list => '{"x-b": "v\nw"}') FROM idem_lease('CRLF', 'w1');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM idem_internal.idempotency_record
WHERE operation = 'CRLF' AND status <> 'PROCESSING';
