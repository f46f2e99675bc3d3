/*-------------------------------------------------------------------------
 *
 * fingerprint.c
 *	  Request fingerprints: lowercase hex SHA-256 of the RFC 8785 text of
 *	  the request (jcs.c), compared in constant time; and the SQL functions
 *	  idem_request_hash and idem_canonical_json.
 *
 * A fingerprint must not change with field order, whitespace or number
 * spelling, so the raw JSON text is never hashed.  The digest is
 * PostgreSQL's own (pg_cryptohash), the one pgcrypto's digest() computes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/cryptohash.h"
#include "common/sha2.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"

#include "fingerprint.h"
#include "jcs.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_request_hash);
PG_FUNCTION_INFO_V1(idem_canonical_json);

/* Lowercase hex SHA-256 of data; hex must hold IDEM_HASH_HEX_LEN + 1 bytes. */
void
idem_sha256_hex(const char *data, size_t len, char *hex)
{
	static const char xdigits[] = "0123456789abcdef";
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);

	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) data, len) < 0 ||
		pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0)
		elog(ERROR, "idem: could not compute SHA-256 digest: %s",
			 pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);

	for (int i = 0; i < PG_SHA256_DIGEST_LENGTH; i++)
	{
		hex[2 * i] = xdigits[digest[i] >> 4];
		hex[2 * i + 1] = xdigits[digest[i] & 0x0F];
	}
	hex[IDEM_HASH_HEX_LEN] = '\0';
}

/* The fingerprint of a request: SHA-256 of its canonical text. */
void
idem_fingerprint_jsonb(Jsonb *request, char *hex)
{
	StringInfoData buf;

	initStringInfo(&buf);
	idem_jcs_append_jsonb(&buf, request);
	idem_sha256_hex(buf.data, buf.len, hex);
	pfree(buf.data);
}

/* Compare two hex fingerprints in time independent of where they differ. */
bool
idem_fingerprints_equal(const char *a, const char *b)
{
	unsigned char diff = 0;

	if (strlen(a) != IDEM_HASH_HEX_LEN || strlen(b) != IDEM_HASH_HEX_LEN)
		return false;
	for (int i = 0; i < IDEM_HASH_HEX_LEN; i++)
		diff |= (unsigned char) (a[i] ^ b[i]);
	return diff == 0;
}

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
