/*-------------------------------------------------------------------------
 *
 * canonical.c
 *	  The canonical form of a request and its fingerprint, from SQL:
 *	  idem_canonical_json and idem_request_hash (and, for the tests, the
 *	  SipHash of request digests and the bytes a digest is of).
 *
 * What a client library computes to check its own canonicalisation
 * against the server's (clients/CONTRACT.md); the claims compute the same
 * in fingerprint.c and jcs.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "idem.h"
#include "util.h"
#include "jcs.h"
#include "fingerprint.h"
#include "siphash.h"

PG_FUNCTION_INFO_V1(idem_request_hash);
PG_FUNCTION_INFO_V1(idem_canonical_json);
PG_FUNCTION_INFO_V1(idem_test_siphash128);
PG_FUNCTION_INFO_V1(idem_test_digest_input);

/* SQL: idem_canonical_json(jsonb) returns text */
Datum
idem_canonical_json(PG_FUNCTION_ARGS)
{
	Jsonb	   *jb;
	StringInfoData buf;

	idem_check_not_null(fcinfo, 0, "request");
	jb = PG_GETARG_JSONB_P(0);
	initStringInfo(&buf);
	idem_jcs_append_jsonb(&buf, jb);

	/* the canonical text is UTF-8; hand it back in the server encoding */
	PG_RETURN_TEXT_P(cstring_to_text(pg_any_to_server(buf.data, buf.len, PG_UTF8)));
}

/* SQL: idem_request_hash(jsonb) returns text */
Datum
idem_request_hash(PG_FUNCTION_ARGS)
{
	IdemFingerprint hex;

	idem_check_not_null(fcinfo, 0, "request");
	idem_fingerprint_jsonb(PG_GETARG_JSONB_P(0), hex);
	PG_RETURN_TEXT_P(cstring_to_text(hex));
}

/*
 * idem_test_siphash128(key bytea, data bytea) returns bytea.  SipHash-2-4-128
 * as request digests use it.  No function of the extension is declared on
 * it.  The regression suite declares one in pg_temp (a superuser may) to
 * check siphash.c against the reference implementation's test vectors.
 */
Datum
idem_test_siphash128(PG_FUNCTION_ARGS)
{
	bytea	   *key = PG_GETARG_BYTEA_PP(0);
	bytea	   *data = PG_GETARG_BYTEA_PP(1);
	bytea	   *out = palloc(VARHDRSZ + IDEM_SIPHASH_LEN);

	if (VARSIZE_ANY_EXHDR(key) != IDEM_SIPHASH_KEY_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a SipHash key has 16 bytes, not %d", (int) VARSIZE_ANY_EXHDR(key))));
	SET_VARSIZE(out, VARHDRSZ + IDEM_SIPHASH_LEN);
	idem_siphash128((const uint8 *) VARDATA_ANY(key), VARDATA_ANY(data), VARSIZE_ANY_EXHDR(data),
					(uint8 *) VARDATA(out));
	PG_RETURN_BYTEA_P(out);
}

/*
 * idem_test_digest_input(request jsonb) returns bytea.  The bytes a
 * request's digest is of: its jsonb with its numbers normalised
 * (jcs_normal.c).  Declared in pg_temp by the regression suite and the
 * fuzz, whose property is that two requests have the same bytes exactly
 * when they have the same fingerprint.
 */
Datum
idem_test_digest_input(PG_FUNCTION_ARGS)
{
	Jsonb	   *normal = idem_jcs_normal_numbers(PG_GETARG_JSONB_P(0));
	bytea	   *out = palloc(VARHDRSZ + VARSIZE_ANY_EXHDR(normal));

	SET_VARSIZE(out, VARHDRSZ + VARSIZE_ANY_EXHDR(normal));
	memcpy(VARDATA(out), VARDATA_ANY(normal), VARSIZE_ANY_EXHDR(normal));
	PG_RETURN_BYTEA_P(out);
}
