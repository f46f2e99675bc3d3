/*-------------------------------------------------------------------------
 *
 * fingerprint.h
 *	  Request fingerprints.  SHA-256 of the canonical request, and the
 *	  keyed form records store once idem.fingerprint_keys_file is set.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_FINGERPRINT_H
#define IDEM_FINGERPRINT_H

#include "utils/jsonb.h"

#include "idem.h"

/* A lowercase hex SHA-256 digest, NUL-terminated. */
typedef char IdemFingerprint[IDEM_HASH_HEX_LEN + 1];

/*
 * A call's request as a claim compares it with a record.  The
 * fingerprint (SHA-256 of the canonical text), computed when first asked
 * for, and the digest of the request's bytes (its jsonb, or a canonical
 * text the caller built) under the secret of a record's fingerprint
 * version, which a replay of the very same bytes compares instead.
 * Settled (idem_print_settle), it no longer needs the request.  The
 * fingerprint and the digest for new records are computed.
 */
typedef struct IdemRequestPrint
{
	Jsonb	   *request;		/* NULL: given as text, or settled */
	Jsonb	   *normal;			/* request with its numbers normalised, once computed */
	const char *text;			/* the canonical text, when given as such */
	int			text_len;
	bool		has_fingerprint;
	IdemFingerprint fingerprint;
	int			digest_version; /* the secret version digest is keyed with; -1 for none */
	uint8		digest[IDEM_DIGEST_LEN];
} IdemRequestPrint;

extern void idem_sha256_hex(const char *data, size_t len, char *hex);
extern void idem_fingerprint_jsonb(Jsonb *request, char *hex);
extern bool idem_fingerprints_equal(const char *a, const char *b);
extern bool idem_equal_in_constant_time(const void *a, const void *b, size_t len);
extern const uint8 *idem_fingerprint_digest_key(const uint8 *db_secret, int version);

extern char *idem_fingerprint_keys_file;

extern void idem_fingerprint_init(void);
extern int	idem_fingerprint_sign_version(void);
extern void idem_fingerprint_keyed(const char *plain, int version, char *out);
extern bool idem_fingerprint_matches(const char *stored, int version, const char *plain);

extern void idem_print_of_request(IdemRequestPrint *p, Jsonb *request);
extern void idem_print_of_text(IdemRequestPrint *p, const char *text, int len);
extern const char *idem_print_fingerprint(IdemRequestPrint *p);
extern const uint8 *idem_print_digest(IdemRequestPrint *p, const uint8 *db_secret, int version);
extern void idem_print_settle(IdemRequestPrint *p, const uint8 *db_secret);
extern bool idem_print_matches(IdemRequestPrint *p, const uint8 *db_secret, const char *stored,
							   int version, const uint8 *stored_digest);

#endif							/* IDEM_FINGERPRINT_H */
