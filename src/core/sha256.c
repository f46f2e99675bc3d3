/*-------------------------------------------------------------------------
 *
 * sha256.c
 *	  SHA-256 (FIPS 180-4) of a request's canonical text, computed here
 *	  rather than through pg_cryptohash.
 *
 * A request fingerprint is the SHA-256 of a short text (tens to a few
 * thousand bytes), once per call.  With PostgreSQL built against OpenSSL,
 * pg_cryptohash sets up and frees an OpenSSL context and a resource owner
 * entry each time, which costs more instructions than hashing the text
 * (about 7,400 of a replay's, issue 40); this is the plain algorithm, no
 * allocation.  The digest is the same bytes (the regression suite compares
 * it with pgcrypto's digest() over lengths across the block boundaries,
 * and the fuzz stage with npm's over 20,000 documents).  Keyed
 * fingerprints (HMAC) still go through pg_hmac.
 *
 * A long text (SHA256_LIBRARY_MIN bytes and more) goes to pg_cryptohash
 * after all.  There the library's block function (OpenSSL's, with the
 * CPU's SHA or vector instructions) outweighs its set-up.  Without
 * OpenSSL, pg_cryptohash is PostgreSQL's own sha2.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/cryptohash.h"

#include "sha256.h"

/* From this length on, the library's SHA-256 (measured: test/bench/instructions.sh) */
#define SHA256_LIBRARY_MIN	512

static const uint32 K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2
};

#define ROTR(x, n)	(((x) >> (n)) | ((x) << (32 - (n))))

/* One 64-byte block into the state h. */
static void
compress(uint32 *h, const uint8 *block)
{
	uint32		w[64];
	uint32		a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];

	for (int t = 0; t < 16; t++)
		w[t] = ((uint32) block[4 * t] << 24) | ((uint32) block[4 * t + 1] << 16) |
			((uint32) block[4 * t + 2] << 8) | (uint32) block[4 * t + 3];
	for (int t = 16; t < 64; t++)
	{
		uint32		s0 = ROTR(w[t - 15], 7) ^ ROTR(w[t - 15], 18) ^ (w[t - 15] >> 3);
		uint32		s1 = ROTR(w[t - 2], 17) ^ ROTR(w[t - 2], 19) ^ (w[t - 2] >> 10);

		w[t] = w[t - 16] + s0 + w[t - 7] + s1;
	}
	for (int t = 0; t < 64; t++)
	{
		uint32		t1 = k + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
		uint32		t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));

		k = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + t2;
	}
	h[0] += a;
	h[1] += b;
	h[2] += c;
	h[3] += d;
	h[4] += e;
	h[5] += f;
	h[6] += g;
	h[7] += k;
}

/* The SHA-256 digest of data[0 .. len - 1] into digest[0 .. 31]. */
/* SHA-256 through pg_cryptohash. */
static void
library_sha256(const char *data, size_t len, uint8 *digest)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);

	if (ctx == NULL || pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) data, len) < 0 ||
		pg_cryptohash_final(ctx, digest, IDEM_SHA256_LEN) < 0)
	{
		const char *why = ctx ? pg_cryptohash_error(ctx) : "out of memory";

		pg_cryptohash_free(ctx);
		elog(ERROR, "idem: could not compute SHA-256: %s", why);
	}
	pg_cryptohash_free(ctx);
}

void
idem_sha256(const char *data, size_t len, uint8 *digest)
{
	uint32		h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
	0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
	uint8		tail[128];
	size_t		full = len - len % 64;
	size_t		rest = len % 64;
	size_t		tail_len = rest < 56 ? 64 : 128;
	uint64		bits = (uint64) len * 8;

	if (len >= SHA256_LIBRARY_MIN)
	{
		library_sha256(data, len, digest);
		return;
	}

	for (size_t off = 0; off < full; off += 64)
		compress(h, (const uint8 *) data + off);
	memset(tail, 0, sizeof(tail));
	memcpy(tail, data + full, rest);
	tail[rest] = 0x80;
	for (int i = 0; i < 8; i++)
		tail[tail_len - 1 - i] = (uint8) (bits >> (8 * i));
	compress(h, tail);
	if (tail_len == 128)
		compress(h, tail + 64);
	for (int i = 0; i < 8; i++)
	{
		digest[4 * i] = (uint8) (h[i] >> 24);
		digest[4 * i + 1] = (uint8) (h[i] >> 16);
		digest[4 * i + 2] = (uint8) (h[i] >> 8);
		digest[4 * i + 3] = (uint8) h[i];
	}
}
