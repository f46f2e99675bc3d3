/*-------------------------------------------------------------------------
 *
 * siphash.h
 *	  SipHash-2-4 with a 128-bit output (siphash.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_SIPHASH_H
#define IDEM_SIPHASH_H

#define IDEM_SIPHASH_KEY_LEN	16
#define IDEM_SIPHASH_LEN		16

extern void idem_siphash128(const uint8 *key, const void *data, size_t len, uint8 *out);

#endif							/* IDEM_SIPHASH_H */
