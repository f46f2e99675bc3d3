/*-------------------------------------------------------------------------
 *
 * fingerprint_print.c
 *	  A call's request as a claim compares it with a record: its
 *	  fingerprint, computed when first needed, and its digest.  Part of the
 *	  module fingerprint.
 *
 * The digest is of the request's jsonb with its numbers in their normal
 * spelling (jcs_normal.c), so a retry that spells a number otherwise (1.0
 * for 1) still matches by digest, and two requests share normal bytes
 * exactly when they share the canonical text.  A request of integers
 * written plainly is hashed as it is stored.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fingerprint.h"
#include "jcs.h"
#include "siphash.h"

/* p is request, nothing computed yet. */
void
idem_print_of_request(IdemRequestPrint *p, Jsonb *request)
{
	p->request = request;
	p->normal = NULL;
	p->text = NULL;
	p->has_fingerprint = false;
	p->digest_version = -1;
}

/*
 * p is the canonical text of a request, which outlives the call's claim.
 * Its digest is of the text's bytes: never a valid jsonb's, whose header's
 * flags never read as the opening of a JSON object ("{\"" and a letter),
 * so it matches no digest of a request given as jsonb.
 */
void
idem_print_of_text(IdemRequestPrint *p, const char *text, int len)
{
	p->request = NULL;
	p->normal = NULL;
	p->text = text;
	p->text_len = len;
	p->has_fingerprint = false;
	p->digest_version = -1;
}

/* p's fingerprint, computed the first time it is asked for. */
const char *
idem_print_fingerprint(IdemRequestPrint *p)
{
	if (!p->has_fingerprint)
	{
		if (p->text != NULL)
			idem_sha256_hex(p->text, p->text_len, p->fingerprint);
		else
		{
			Assert(p->request != NULL);
			idem_fingerprint_jsonb(p->request, p->fingerprint);
		}
		p->has_fingerprint = true;
	}
	return p->fingerprint;
}

/*
 * p's digest under secret version (IDEM_DIGEST_LEN bytes, p's own); NULL
 * when there is none.  No key for the version, or p settled under another
 * version.
 */
const uint8 *
idem_print_digest(IdemRequestPrint *p, const uint8 *db_secret, int version)
{
	if (p->digest_version != version)
	{
		const uint8 *key;

		if ((p->request == NULL && p->text == NULL) ||
			(key = idem_fingerprint_digest_key(db_secret, version)) == NULL)
			return NULL;
		if (p->request != NULL)
		{
			if (p->normal == NULL)
				p->normal = idem_jcs_normal_numbers(p->request);
			idem_siphash128(key, VARDATA_ANY(p->normal), VARSIZE_ANY_EXHDR(p->normal), p->digest);
		}
		else
			idem_siphash128(key, p->text, p->text_len, p->digest);
		p->digest_version = version;
	}
	return p->digest;
}

/*
 * Compute what a record written later needs, the fingerprint and the digest
 * under the version new records are keyed with, and let go of the request
 * (which lives no longer than the call).
 */
void
idem_print_settle(IdemRequestPrint *p, const uint8 *db_secret)
{
	(void) idem_print_fingerprint(p);
	if (p->request != NULL || p->text != NULL)
		(void) idem_print_digest(p, db_secret, idem_fingerprint_sign_version());
	p->request = NULL;
	p->normal = NULL;
	p->text = NULL;
}

/*
 * Does the digest of p's jsonb bytes as sent, not normalised, match
 * stored_digest?  A retry of the very same request whose numbers are
 * written plainly (most), or of one stored before 1.15 as it was sent,
 * is recognised without reading its numbers.  Equal to a normal digest, the
 * bytes are normal, so they are the stored request's.  Otherwise p is
 * normalised, and where that leaves the request as it was, the digest just
 * computed is p's normal one (idem_print_digest need not compute it again).
 */
static bool
sent_bytes_match(IdemRequestPrint *p, const uint8 *db_secret, int version,
				 const uint8 *stored_digest)
{
	const uint8 *key;
	uint8		digest[IDEM_DIGEST_LEN];

	if (p->request == NULL || p->normal != NULL ||
		(key = idem_fingerprint_digest_key(db_secret, version)) == NULL)
		return false;
	idem_siphash128(key, VARDATA_ANY(p->request), VARSIZE_ANY_EXHDR(p->request), digest);
	if (idem_equal_in_constant_time(digest, stored_digest, IDEM_DIGEST_LEN))
		return true;
	p->normal = idem_jcs_normal_numbers(p->request);
	if (p->normal == p->request)
	{
		memcpy(p->digest, digest, IDEM_DIGEST_LEN);
		p->digest_version = version;
	}
	return false;
}

/*
 * Is p the request of a record that stores fingerprint stored and digest
 * stored_digest (NULL: none), both keyed with version?  The same digest is
 * the same normal bytes, so the same request; otherwise the fingerprints
 * decide, compared in constant time.
 */
bool
idem_print_matches(IdemRequestPrint *p, const uint8 *db_secret, const char *stored,
				   int version, const uint8 *stored_digest)
{
	const uint8 *digest;

	if (stored_digest != NULL &&
		(sent_bytes_match(p, db_secret, version, stored_digest) ||
		 ((digest = idem_print_digest(p, db_secret, version)) != NULL &&
		  idem_equal_in_constant_time(digest, stored_digest, IDEM_DIGEST_LEN))))
		return true;
	return idem_fingerprint_matches(stored, version, idem_print_fingerprint(p));
}
