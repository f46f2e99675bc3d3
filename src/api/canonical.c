/*-------------------------------------------------------------------------
 *
 * canonical.c
 *	  The canonical form of a request and its fingerprint, from SQL:
 *	  idem_canonical_json and idem_request_hash.
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

PG_FUNCTION_INFO_V1(idem_request_hash);
PG_FUNCTION_INFO_V1(idem_canonical_json);

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
