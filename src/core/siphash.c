/*-------------------------------------------------------------------------
 *
 * siphash.c
 *	  SipHash-2-4 (Aumasson and Bernstein, 2012) with its 128-bit output.
 *	  A keyed pseudorandom function, the digest that lets a replay of the
 *	  very same request bytes skip the canonical text (fingerprint.c).
 *
 * Written from the paper; the regression suite checks it against the
 * reference implementation's 128-bit test vectors.  About four instructions
 * a byte, where SHA-256 of the canonical text costs some seventy.  Cheap
 * enough to compute on every call.  Without its key no one can find two
 * inputs with the same digest, which is all a replay relies on.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "siphash.h"

#define ROTL(x, b)	(((x) << (b)) | ((x) >> (64 - (b))))

#define SIPROUND \
	do { \
		v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32); \
		v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2; \
		v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0; \
		v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32); \
	} while (0)

/* A little-endian 64-bit word from p, whatever the platform's order. */
static inline uint64
load_le64(const uint8 *p)
{
#ifdef WORDS_BIGENDIAN
	return (uint64) p[0] | ((uint64) p[1] << 8) | ((uint64) p[2] << 16) |
		((uint64) p[3] << 24) | ((uint64) p[4] << 32) | ((uint64) p[5] << 40) |
		((uint64) p[6] << 48) | ((uint64) p[7] << 56);
#else
	uint64		w;

	memcpy(&w, p, sizeof(w));
	return w;
#endif
}

static inline void
store_le64(uint8 *p, uint64 w)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8) (w >> (8 * i));
}

/*
 * SipHash-2-4-128 of data under key (IDEM_SIPHASH_KEY_LEN bytes) into out
 * (IDEM_SIPHASH_LEN bytes).
 */
void
idem_siphash128(const uint8 *key, const void *data, size_t len, uint8 *out)
{
	const uint8 *in = data;
	const uint8 *end = in + (len & ~(size_t) 7);
	uint64		k0 = load_le64(key);
	uint64		k1 = load_le64(key + 8);
	uint64		v0 = UINT64CONST(0x736f6d6570736575) ^ k0;
	uint64		v1 = UINT64CONST(0x646f72616e646f6d) ^ k1 ^ 0xee;
	uint64		v2 = UINT64CONST(0x6c7967656e657261) ^ k0;
	uint64		v3 = UINT64CONST(0x7465646279746573) ^ k1;
	uint64		b = ((uint64) len) << 56;

	for (; in != end; in += 8)
	{
		uint64		m = load_le64(in);

		v3 ^= m;
		SIPROUND;
		SIPROUND;
		v0 ^= m;
	}
	for (int i = 0; i < (int) (len & 7); i++)
		b |= ((uint64) in[i]) << (8 * i);
	v3 ^= b;
	SIPROUND;
	SIPROUND;
	v0 ^= b;

	v2 ^= 0xee;
	for (int i = 0; i < 4; i++)
		SIPROUND;
	store_le64(out, v0 ^ v1 ^ v2 ^ v3);
	v1 ^= 0xdd;
	for (int i = 0; i < 4; i++)
		SIPROUND;
	store_le64(out + 8, v0 ^ v1 ^ v2 ^ v3);
}
