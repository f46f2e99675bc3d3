/*-------------------------------------------------------------------------
 *
 * fingerprint.h
 *	  Request fingerprints: SHA-256 of the canonical request, and the
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

extern void idem_sha256_hex(const char *data, size_t len, char *hex);
extern void idem_fingerprint_jsonb(Jsonb *request, char *hex);
extern bool idem_fingerprints_equal(const char *a, const char *b);

extern char *idem_fingerprint_keys_file;

extern void idem_fingerprint_init(void);
extern int	idem_fingerprint_sign_version(void);
extern void idem_fingerprint_keyed(const char *plain, int version, char *out);
extern bool idem_fingerprint_matches(const char *stored, int version, const char *plain);

#endif							/* IDEM_FINGERPRINT_H */
