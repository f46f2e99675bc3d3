--
-- Request digests (1.13): a record stores SipHash-2-4-128 of its request's
-- jsonb bytes under the database's secret, and a replay that sends the very
-- same bytes is recognised by it without the canonical text and SHA-256;
-- any other request is compared by its fingerprint (request_hash), as
-- before.  The digest never accepts a request the fingerprint refuses.
--
\set SHOW_CONTEXT never
SET idem.ttl = '24h';

-- SipHash-2-4-128 itself, against the reference implementation's test
-- vectors (key 00..0f, message 00..n-1): across the 8-byte word boundaries.
CREATE FUNCTION pg_temp.siphash128(bytea, bytea) RETURNS bytea
    AS '$libdir/idem', 'idem_test_siphash128' LANGUAGE C STRICT;
SELECT n, pg_temp.siphash128('\x000102030405060708090a0b0c0d0e0f',
                             decode(coalesce((SELECT string_agg(lpad(to_hex(i), 2, '0'), '' ORDER BY i)
                                                FROM generate_series(0, n - 1) i), ''), 'hex')) = v AS ok
  FROM (VALUES (0, '\xa3817f04ba25a8e66df67214c7550293'::bytea),
               (1, '\xda87c1d86b99af44347659119b22fc45'),
               (7, '\xa1f1ebbed8dbc153c0b84aa61ff08239'),
               (8, '\x3b62a9ba6258f5610f83e264f31497b4'),
               (15, '\x5493e99933b0a8117e08ec0f97cfc3d9'),
               (63, '\x5150d1772f50834a503e069a973fbd7c')) AS t (n, v)
 ORDER BY n;
SELECT pg_temp.siphash128('\x00', '\x00');

-- The secret: one row of 16 bytes, drawn at CREATE EXTENSION; PUBLIC has
-- no privilege on it.
SELECT count(*) AS rows, min(length(secret)) AS bytes FROM idem_internal.idem_digest_secret;
SELECT has_table_privilege('public', 'idem_internal.idem_digest_secret', 'SELECT') AS public_reads;

-- A generic call stores the digest of its request's jsonb bytes;
-- idem_create_order, which has no request document, the digest of the
-- canonical text of its two numbers.
BEGIN;
SELECT replayed FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"account": 1, "amount": 100}');
SELECT idem_finish(1, 'DIGEST', 'digest-key-00000001', 201, '{"ok": true}');
COMMIT;
SELECT order_id IS NOT NULL AS ordered FROM idem_create_order(1, 'digest-order-00000001', 1001, 2);
SELECT operation, length(request_digest) AS digest_bytes FROM idem_internal.idempotency_record
 WHERE idempotency_key IN ('digest-key-00000001', 'digest-order-00000001') ORDER BY operation;

-- The order's replay is decided by that digest: with its fingerprint
-- spoiled, the same sku and qty still replay, another qty is IK001; a
-- generic call of the same request under the order's operation is never
-- equal by digest (jsonb bytes are no JSON text), so its fingerprint
-- decides: refused while spoiled, replayed once restored.
UPDATE idem_internal.idempotency_record SET request_hash = repeat('0', 64)
 WHERE idempotency_key = 'digest-order-00000001';
SELECT replayed FROM idem_create_order(1, 'digest-order-00000001', 1001, 2);
SELECT replayed FROM idem_create_order(1, 'digest-order-00000001', 1001, 3);
SELECT replayed FROM idem_begin(1, 'CREATE_ORDER', 'digest-order-00000001', '{"qty": 2, "sku": 1001}');
UPDATE idem_internal.idempotency_record SET request_hash = idem_request_hash('{"qty": 2, "sku": 1001}')
 WHERE idempotency_key = 'digest-order-00000001';
SELECT replayed FROM idem_begin(1, 'CREATE_ORDER', 'digest-order-00000001', '{"qty": 2, "sku": 1001}');

-- The same bytes replay; so do the same request in other bytes (another
-- number spelling: 1.0 is another numeric, so another jsonb) and in another
-- field order and whitespace (jsonb sorts and strips them: the same
-- bytes); another request is IK001.
SELECT replayed, http_status FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"account": 1, "amount": 100}');
SELECT replayed, http_status FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"amount":100,   "account":1}');
SELECT replayed, http_status FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"account": 1.0, "amount": 100}');
SELECT replayed, http_status FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"account": 1, "amount": 101}');

-- Which comparison answered: with the stored fingerprint spoiled, the
-- same bytes still replay (the digest decided), and so do the same
-- numbers spelled otherwise (1.0, 1e0, 100.00: the digest is of the
-- request with its numbers normalised, 1.15), while another request is
-- refused (the fingerprint decided) ...
UPDATE idem_internal.idempotency_record SET request_hash = repeat('0', 64)
 WHERE idempotency_key = 'digest-key-00000001';
SELECT replayed FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"account": 1, "amount": 100}');
SELECT replayed FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"account": 1.0, "amount": 100}');
SELECT replayed FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"account": 1e0, "amount": 100.00}');
SELECT replayed FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"account": 1.5, "amount": 100}');

-- The normal bytes: two requests share them exactly when they share the
-- canonical text (numbers read as IEEE doubles, as RFC 8785 says): 2^53 + 1
-- is 2^53, -0 is 0, 5e-324 the least subnormal; 0.1 and 0.2 differ;
-- 1e400 has no double (22003, as for the canonical text).
CREATE FUNCTION pg_temp.digest_input(jsonb) RETURNS bytea
    AS 'idem', 'idem_test_digest_input' LANGUAGE C STRICT;
SELECT a, b, pg_temp.digest_input(a::jsonb) = pg_temp.digest_input(b::jsonb) AS same_bytes,
       idem_request_hash(a::jsonb) = idem_request_hash(b::jsonb) AS same_fingerprint
FROM (VALUES ('1', '1.0'), ('{"a": 1}', '{"a": 1e0}'), ('9007199254740993', '9007199254740992'),
             ('-0', '0'), ('0.1', '0.10'), ('1e21', '1000000000000000000000'),
             ('[1.5, 2]', '[1.50, 2.0]'), ('5e-324', '4.9406564584124654e-324'), ('0.1', '0.2'),
             ('123456789012', '123456789012.0'), ('12345678901234567', '12345678901234568'),
             ('1e-7', '0.0000001'), ('{"a": [1, {"b": 2.50}]}', '{"a": [1.0, {"b": 2.5}]}')) v (a, b);
SELECT pg_temp.digest_input('1e400');
-- ... and with the digest spoiled instead, the fingerprint decides alone.
UPDATE idem_internal.idempotency_record
   SET request_hash = idem_request_hash('{"account": 1, "amount": 100}'),
       request_digest = '\x00000000000000000000000000000000'
 WHERE idempotency_key = 'digest-key-00000001';
SELECT replayed FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"account": 1, "amount": 100}');
SELECT replayed FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"account": 1.0, "amount": 100}');
SELECT replayed FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"account": 2, "amount": 100}');

-- idem_run and idem_submit store it too; idem_run's replay matches by it.
CREATE FUNCTION digest_handler(request jsonb) RETURNS idem_result LANGUAGE sql
    AS $$ SELECT ROW(201, '{"ran": true}', NULL, NULL)::idem_result $$;
SELECT replayed FROM idem_run(1, 'DIGEST_RUN', 'digest-run-00000001', '{"n": 1}', 'digest_handler(jsonb)');
SELECT replayed FROM idem_run(1, 'DIGEST_RUN', 'digest-run-00000001', '{"n": 1}', 'digest_handler(jsonb)');
SELECT replayed FROM idem_submit(1, 'DIGEST_TASK', 'digest-task-0000001', '{"n": 1}');
SELECT operation, length(request_digest) AS digest_bytes FROM idem_internal.idempotency_record
 WHERE operation IN ('DIGEST_RUN', 'DIGEST_TASK') ORDER BY operation;

-- Another database's digests (a restored dump draws a new secret) do not
-- match here: the fingerprint decides, and the call replays all the same.
UPDATE idem_internal.idempotency_record SET request_digest = '\x0123456789abcdef0123456789abcdef'
 WHERE idempotency_key = 'digest-run-00000001';
SELECT replayed FROM idem_run(1, 'DIGEST_RUN', 'digest-run-00000001', '{"n": 1}', 'digest_handler(jsonb)');

-- Without a secret (the row deleted), new records store no digest and
-- every record is compared by its fingerprint; records keep their digest.
CREATE TABLE digest_saved AS SELECT secret FROM idem_internal.idem_digest_secret;
DELETE FROM idem_internal.idem_digest_secret;
\c
SET idem.ttl = '24h';
SELECT replayed FROM idem_begin(1, 'DIGEST', 'digest-key-00000001', '{"account": 1, "amount": 100}');
SELECT replayed FROM idem_run(1, 'DIGEST_RUN', 'digest-run-00000002', '{"n": 2}', 'digest_handler(jsonb)');
SELECT replayed FROM idem_run(1, 'DIGEST_RUN', 'digest-run-00000002', '{"n": 2}', 'digest_handler(jsonb)');
SELECT request_digest IS NULL AS no_digest FROM idem_internal.idempotency_record
 WHERE idempotency_key = 'digest-run-00000002';
INSERT INTO idem_internal.idem_digest_secret SELECT secret FROM digest_saved;
DROP TABLE digest_saved;
\c
SET idem.ttl = '24h';
-- the secret back: the task's record replays by its digest again
UPDATE idem_internal.idempotency_record SET request_hash = repeat('0', 64)
 WHERE idempotency_key = 'digest-task-0000001';
SELECT replayed FROM idem_submit(1, 'DIGEST_TASK', 'digest-task-0000001', '{"n": 1}');

-- leave no unfinished task to the suites after this one
DELETE FROM idem_internal.idempotency_record WHERE operation LIKE 'DIGEST%';
DROP FUNCTION digest_handler(jsonb);
