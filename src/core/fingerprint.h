/*-------------------------------------------------------------------------
 *
 * fingerprint.h
 *	  Request fingerprints: SHA-256 of the canonical request.
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

#endif							/* IDEM_FINGERPRINT_H */
