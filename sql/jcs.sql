--
-- idem_canonical_json / idem_request_hash: RFC 8785 (JCS) and SHA-256,
-- checked against the RFC's own vectors and pgcrypto's digest().
--
\set SHOW_CONTEXT never

-- RFC 8785 section 3.2.2: the sample object, with its expected canonical text.
CREATE TEMP TABLE rfc_sample AS SELECT
$${
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}$$::jsonb AS input,
$${"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}$$::text AS expected;
SELECT idem_canonical_json(input) = expected AS canonical_ok,
       idem_request_hash(input) = encode(digest(expected, 'sha256'), 'hex') AS hash_ok,
       idem_canonical_json(input)
FROM rfc_sample;

-- RFC 8785 section 3.2.3: member names sorted by UTF-16 code units (the
-- emoji, a surrogate pair, sorts before U+FB33).
CREATE TEMP TABLE rfc_sorting AS SELECT
$${
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}$$::jsonb AS input,
E'{"\\r":"Carriage Return","1":"One","\u0080":"Control","ö":"Latin Small Letter O With Diaeresis","€":"Euro Sign","\U0001F600":"Emoji: Grinning Face","\uFB33":"Hebrew Letter Dalet With Dagesh"}'::text AS expected;
SELECT idem_canonical_json(input) = expected AS canonical_ok,
       idem_request_hash(input) = encode(digest(expected, 'sha256'), 'hex') AS hash_ok
FROM rfc_sorting;
SELECT k FROM rfc_sorting, jsonb_object_keys(input) k;	-- jsonb's own order differs

-- RFC 8785 Appendix B: IEEE 754 doubles and their ECMAScript text.
CREATE TEMP TABLE rfc_numbers (input text, expected text);
INSERT INTO rfc_numbers VALUES
  ('0', '0'),
  ('-0', '0'),
  ('4.9406564584124654e-324', '5e-324'),
  ('-4.9406564584124654e-324', '-5e-324'),
  ('1.7976931348623157e308', '1.7976931348623157e+308'),
  ('-1.7976931348623157e308', '-1.7976931348623157e+308'),
  ('9007199254740992', '9007199254740992'),
  ('-9007199254740992', '-9007199254740992'),
  ('295147905179352825856', '295147905179352830000'),
  ('9.999999999999997e22', '9.999999999999997e+22'),
  ('1e23', '1e+23'),
  ('1.0000000000000001e23', '1.0000000000000001e+23'),
  ('999999999999999700000', '999999999999999700000'),
  ('999999999999999900000', '999999999999999900000'),
  ('1e21', '1e+21'),
  ('9.999999999999997e-7', '9.999999999999997e-7'),
  ('0.000001', '0.000001'),
  ('333333333.3333332', '333333333.3333332'),
  ('333333333.33333325', '333333333.33333325'),
  ('333333333.3333333', '333333333.3333333'),
  ('333333333.3333334', '333333333.3333334'),
  ('333333333.33333343', '333333333.33333343'),
  ('-0.0000033333333333333333', '-0.0000033333333333333333'),
  ('1424953923781206.2', '1424953923781206.2');
SELECT input, expected, idem_canonical_json(input::jsonb) AS got
FROM rfc_numbers WHERE idem_canonical_json(input::jsonb) <> expected;
SELECT count(*) AS checked,
       count(*) FILTER (WHERE idem_request_hash(input::jsonb) = encode(digest(expected, 'sha256'), 'hex')) AS hashes_ok
FROM rfc_numbers;

-- One number, many spellings: 1, 1.0 and 1e0 hash the same.
SELECT idem_canonical_json(v::jsonb) AS canonical, count(DISTINCT idem_request_hash(v::jsonb)) AS hashes
FROM (VALUES ('1'), ('1.0'), ('1e0'), ('10E-1'), ('1.000000000000000000001'), ('0.1e1')) AS t(v)
GROUP BY 1;
-- digits past double precision are rounded away, as every JCS parser does
SELECT idem_canonical_json('9007199254740993') AS beyond_2_53;
-- integers written without a fraction, at each base-10000 digit boundary
-- (read from the numeric's digits since 1.13), and beyond 2^53
SELECT v AS input, idem_canonical_json(v::jsonb) AS canonical
FROM (VALUES ('10000'), ('-10000'), ('99990000'), ('100000000'), ('-100020003'),
             ('123456789012345'), ('1234567890123456'), ('9007199254740991'),
             ('-9007199254740993'), ('9999999999999999'), ('10000000000000000'),
             ('1E+2'), ('0e5'), ('120000000000000000000')) AS t(v);
-- a number from a table's numeric column (to_jsonb), as the order functions build it
CREATE TEMP TABLE jcs_column (n numeric);
INSERT INTO jcs_column VALUES (7), (-25000), (1.50), (1e3);
SELECT n, idem_canonical_json(to_jsonb(n)) AS canonical FROM jcs_column;
-- a number outside the double range is an error (22003), not Infinity
SELECT idem_request_hash('{"amount": 1e400}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_request_hash('[-1e400]');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- underflow rounds to zero, as JSON.parse does
SELECT idem_canonical_json('[1e-400, -1e-400]');

-- Field order and whitespace never change the fingerprint.
SELECT count(DISTINCT idem_request_hash(v::jsonb)) AS hashes
FROM (VALUES ('{"sku":1001,"qty":2}'), ('{"qty":2,"sku":1001}'),
             (E'{ "qty" : 2 ,\n\t"sku" : 1001.0 }'), ('{"qty":2e0,"sku":1.001e3}')) AS t(v);
-- ... but every field does
SELECT count(DISTINCT idem_request_hash(v::jsonb)) AS hashes
FROM (VALUES ('{"sku":1001,"qty":2}'), ('{"sku":1001,"qty":3}'), ('{"sku":"1001","qty":2}'),
             ('{"sku":1001,"qty":2,"coupon":null}'), ('[1001,2]'), ('{"SKU":1001,"qty":2}')) AS t(v);

-- Strings: the minimal escaping of ECMAScript's JSON.stringify.
SELECT idem_canonical_json(to_jsonb(E'quote " backslash \\ slash / tab \t nl \n cr \r bs \b ff \f'::text));
SELECT idem_canonical_json(to_jsonb(E'\u0001\u001f\u007f\u2028 é 😀'::text));
-- Nesting, empty containers, scalars at top level.
SELECT idem_canonical_json('{"b":[{"z":1,"y":[]},{}],"a":{"d":{"c":[null,true,false,"x"]}}}');
SELECT idem_canonical_json(v::jsonb)
FROM (VALUES ('"text"'), ('null'), ('true'), ('-12.50'), ('[]'), ('{}')) AS t(v);
-- jsonb keeps the last of duplicate member names, so the canonical text does too
SELECT idem_canonical_json('{"a":1,"a":2}');

-- The digest is SHA-256 of the canonical text's UTF-8, lowercase hex.
SELECT idem_request_hash('{}') = encode(digest('{}', 'sha256'), 'hex') AS empty_object,
       idem_request_hash('"é😀"') = encode(digest(convert_to('"é😀"', 'UTF8'), 'sha256'), 'hex') AS utf8,
       idem_request_hash('{"sku":1001,"qty":2}');

-- NULL input: 22004
SELECT idem_request_hash(NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT idem_canonical_json(NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE

-- idem's own SHA-256 (1.13, sha256.c) against pgcrypto's digest(), over
-- every length of canonical text from 2 to 301 bytes (the padding's block
-- boundaries at 55/56 and 119/120 bytes, several blocks) and multibyte text
SELECT count(*) AS lengths,
       count(*) FILTER (WHERE idem_request_hash(to_jsonb(repeat('x', n))) =
                              encode(digest('"' || repeat('x', n) || '"', 'sha256'), 'hex')) AS equal
FROM generate_series(0, 299) AS n;
-- and around 512 bytes, where long texts go to pg_cryptohash instead
SELECT count(*) AS lengths,
       count(*) FILTER (WHERE idem_request_hash(to_jsonb(repeat('x', n))) =
                              encode(digest('"' || repeat('x', n) || '"', 'sha256'), 'hex')) AS equal
FROM generate_series(480, 560) AS n;
SELECT idem_request_hash(to_jsonb(repeat('é€😀', 50))) =
       encode(digest(convert_to('"' || repeat('é€😀', 50) || '"', 'UTF8'), 'sha256'), 'hex') AS multibyte_equal;
-- member order at a first difference inside common prefixes (1.13: the
-- comparison runs on UTF-8 bytes): U+E000..U+FFFF after the supplementary
-- planes, U+D7FF (lead byte 0xED) before both, a prefix before longer names
SELECT idem_canonical_json(jsonb_build_object(
    'a' || U&'\E000', 1, 'a' || U&'\+01F600', 2, 'a' || U&'\FFFF', 3, 'a' || U&'\D7FF', 4,
    'a', 5, 'ab', 6, 'a' || U&'\00E9', 7, 'a' || U&'\+010000', 8, 'a' || U&'\FB33' || 'x', 9));
-- more than 16 members (sorted by qsort, not insertion): the same order
SELECT idem_canonical_json(jsonb_object_agg(k, i))
  FROM unnest(ARRAY['zeta', 'a', 'ab', 'b', 'é', U&'\E000', U&'\+01F600', 'aa', 'ba', 'z', 'y', 'x1', 'x', 'Z', 'A',
                    '10', '9', '_', U&'\FFFF', 'abc']) WITH ORDINALITY AS t (k, i);
