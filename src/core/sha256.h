/*-------------------------------------------------------------------------
 *
 * sha256.h
 *	  SHA-256 of a short text, without an allocation (sha256.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_SHA256_H
#define IDEM_SHA256_H

#define IDEM_SHA256_LEN		32

extern void idem_sha256(const char *data, size_t len, uint8 *digest);

#endif							/* IDEM_SHA256_H */
