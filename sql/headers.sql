--
-- Headers kept as given (1.11): header_list json, an object or an array of
-- [name, value] pairs, replayed byte for byte next to the jsonb form.
--
\set SHOW_CONTEXT never
TRUNCATE idem_internal.idempotency_record;

-- an object, spacing and order as given
BEGIN;
SELECT replayed FROM idem_begin(41, 'PAY', 'headers-key-00000001', '{}');
SELECT idem_finish(41, 'PAY', 'headers-key-00000001', 201, '{"id": 1}',
                   header_list => '{"Location":  "/orders/1", "Content-Type": "application/json"}');
COMMIT;
SELECT replayed, header_list::text, headers FROM idem_begin(41, 'PAY', 'headers-key-00000001', '{}');

-- pairs: a repeated header (two Set-Cookie) is kept; the jsonb form joins
-- the values of a repeated name
BEGIN;
SELECT replayed FROM idem_begin(41, 'PAY', 'headers-key-00000002', '{}');
SELECT idem_finish(41, 'PAY', 'headers-key-00000002', 200, '{}',
                   header_list => '[["Set-Cookie", "a=1; Path=/"], ["Set-Cookie", "b=2"],  ["X-Trace", "t1"]]');
COMMIT;
SELECT replayed, header_list::text, headers FROM idem_begin(41, 'PAY', 'headers-key-00000002', '{}');
SELECT response_headers, response_header_list::text FROM idem_internal.idempotency_record
WHERE idempotency_key = 'headers-key-00000002';

-- the jsonb form works as before, positionally too; header_list is then
-- its text
BEGIN;
SELECT replayed FROM idem_begin(41, 'PAY', 'headers-key-00000003', '{}');
SELECT idem_finish(41, 'PAY', 'headers-key-00000003', 201, '{}', NULL, '{"X-A":  "1"}');
COMMIT;
SELECT headers, header_list::text FROM idem_begin(41, 'PAY', 'headers-key-00000003', '{}');

-- bad input: 22023, nothing written
BEGIN;
SELECT replayed FROM idem_begin(41, 'PAY', 'headers-key-00000004', '{}');
SAVEPOINT s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000004', 201, '{}', NULL, '{"X-A": "1"}', '{"X-A": "1"}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000004', 201, '{}', header_list => '"text"');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000004', 201, '{}', header_list => '[["A", "1", "2"]]');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000004', 201, '{}', header_list => '[["A"]]');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000004', 201, '{}', header_list => '[["A", 1]]');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000004', 201, '{}', header_list => '["A", "1"]');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000004', 201, '{}', header_list => '[[["A", "1"]]]');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000004', 201, '{}', header_list => '{"A": {"b": "c"}}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK TO s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000004', 201, '{}', header_list => '[{"A": "1"}]');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT count(*) AS written FROM idem_internal.idempotency_record WHERE idempotency_key = 'headers-key-00000004';
-- an empty list is headers too
BEGIN;
SELECT replayed FROM idem_begin(41, 'PAY', 'headers-key-00000005', '{}');
SELECT idem_finish(41, 'PAY', 'headers-key-00000005', 201, '{}', header_list => '[]');
COMMIT;
SELECT headers, header_list::text FROM idem_begin(41, 'PAY', 'headers-key-00000005', '{}');

-- a handler returns idem_response: its headers in json form
CREATE FUNCTION cookie_handler(request jsonb) RETURNS idem_response
LANGUAGE sql AS $$
    SELECT (201, '{"ok": true}'::json, '[["Set-Cookie", "s=1"], ["Set-Cookie", "t=2"]]'::json, 5)::idem_response
$$;
SELECT replayed, http_status, header_list::text, headers, resource_id
FROM idem_run(41, 'PAY', 'headers-key-00000006', '{}', 'cookie_handler(jsonb)');
SELECT replayed, http_status, header_list::text, headers, resource_id
FROM idem_run(41, 'PAY', 'headers-key-00000006', '{}', 'cookie_handler(jsonb)');
CREATE FUNCTION bad_cookie_handler(request jsonb) RETURNS idem_response
LANGUAGE sql AS $$ SELECT (201, NULL::json, '[["Set-Cookie"]]'::json, NULL::bigint)::idem_response $$;
SELECT replayed FROM idem_run(41, 'PAY', 'headers-key-00000007', '{}', 'bad_cookie_handler(jsonb)');
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- a task's result, through idem_complete
SELECT replayed FROM idem_submit(41, 'PAY', 'headers-task-0000001', '{}');
SELECT task_id, token FROM idem_lease('PAY', 'w1') \gset
SELECT idem_complete(:task_id, :token, 200, '{}', header_list => '[["Link", "<a>"], ["Link", "<b>"]]');
SELECT replayed, http_status, header_list::text FROM idem_begin(41, 'PAY', 'headers-task-0000001', '{}');

-- redaction: a one-member pointer removes the pairs of that name; an
-- object loses the member; nothing named: kept byte for byte
SELECT operation, redact FROM idem_set_policy('PAY', redact => ARRAY['/Authorization', '/missing']);
BEGIN;
SELECT replayed FROM idem_begin(41, 'PAY', 'headers-key-00000008', '{}');
SELECT idem_finish(41, 'PAY', 'headers-key-00000008', 200, '{}',
                   header_list => '[["Authorization", "Bearer x"], ["X-A",  "1"], ["Authorization", "Bearer y"]]');
SELECT replayed FROM idem_begin(41, 'PAY', 'headers-key-00000009', '{}');
SELECT idem_finish(41, 'PAY', 'headers-key-00000009', 200, '{}',
                   header_list => '{"Authorization": "Bearer x",  "X-A": "1"}');
SELECT replayed FROM idem_begin(41, 'PAY', 'headers-key-00000010', '{}');
SELECT idem_finish(41, 'PAY', 'headers-key-00000010', 200, '{}',
                   header_list => '[["X-A",  "1"]]');
COMMIT;
SELECT idempotency_key, response_header_list::text FROM idem_internal.idempotency_record
WHERE idempotency_key IN ('headers-key-00000008', 'headers-key-00000009', 'headers-key-00000010')
ORDER BY 1;
SELECT idem_drop_policy('PAY');

-- a stored header is one a server could send (1.14): a name is an RFC
-- 9110 token (a value holds no CR or LF, as before); 22023 from
-- idem_finish, idem_finish_stored and idem_complete, in either form, and
-- nothing written
\set VERBOSITY default
BEGIN;
SELECT replayed FROM idem_begin(41, 'PAY', 'headers-key-00000011', '{}');
SAVEPOINT s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000011', 200, '{}', header_list => '[["Set-Cookie: pwned=1; x", "y"]]');
ROLLBACK TO s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000011', 200, '{}', headers => '{"X A": "1"}');
ROLLBACK TO s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000011', 200, '{}', header_list => '[["", "1"]]');
ROLLBACK TO s;
SELECT idem_finish(41, 'PAY', 'headers-key-00000011', 200, '{}', header_list => '{"X-\u0001": "1"}');
ROLLBACK TO s;
SELECT idem_finish_stored(41, 'PAY', 'headers-key-00000011', 200, '{}', headers => '{"X-A": "a\rb"}');
ROLLBACK TO s;
-- every tchar in a name is kept, and a value with a tab or the libraries'
-- Set-Cookie separator (0x1f)
SELECT http_status, header_list::text FROM idem_finish_stored(41, 'PAY', 'headers-key-00000011', 200, '{}',
       header_list => '[["!#$%&''*+-.^_`|~0aZ", "a\tb"], ["set-cookie", "a=1\u001fb=2"]]');
COMMIT;
SELECT replayed FROM idem_submit(41, 'PAY', 'headers-task-0000002', '{}');
SELECT task_id, token FROM idem_lease('PAY', 'w1') \gset
SELECT idem_complete(:task_id, :token, 200, '{}', header_list => '[["Location:", "/x"]]');
SELECT status FROM idem_internal.idempotency_record WHERE idempotency_key = 'headers-task-0000002';
\set VERBOSITY terse

DROP FUNCTION cookie_handler(jsonb), bad_cookie_handler(jsonb);
TRUNCATE idem_internal.idempotency_record;
