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
 * Keyed fingerprints.  A low-entropy request (a PIN, an amount) could
 * be found again from its plain SHA-256 by trying values.  With
 * idem.fingerprint_keys_file naming a file of versioned secrets ("v2:..."
 * lines), a record stores HMAC-SHA-256(secret, plain hex fingerprint) under
 * the newest secret, and the secret's version with it; every secret of the
 * file verifies, and a record of version NULL (0 here) is the plain
 * SHA-256.  The file is read again when the setting changes or the file
 * does (looked at once a transaction); the secrets live in this backend's
 * memory only, never in a setting.
 *
 * Request digests.  A record also stores SipHash-2-4-128 of the
 * request's jsonb bytes with its numbers normalised (siphash.c,
 * jcs_normal.c), keyed with the database's own secret
 * (idem_internal.idem_digest_secret) or, for a record keyed with a file
 * secret, with a key derived from that secret.  A replay whose request has
 * the same normal bytes is recognised by it, without the canonical text
 * and SHA-256 (some 80,000 instructions for a 1 KB request); any other
 * request is compared by its fingerprint, as before.  Same normal bytes
 * are the same canonical text, so the digest never accepts what the
 * fingerprint would refuse; without the key no one can make two requests
 * share a digest (fingerprint_print.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "access/xact.h"
#include "common/cryptohash.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "fingerprint.h"
#include "jcs.h"
#include "keycheck.h"
#include "sha256.h"
#include "siphash.h"
#include "util.h"


/* GUC variable */
char	   *idem_fingerprint_keys_file = NULL;

/* A SHA-256 digest (or HMAC) as lowercase hex; hex holds IDEM_HASH_HEX_LEN + 1 bytes. */
static void
hex_of(const uint8 *digest, char *hex)
{
	static const char xdigits[] = "0123456789abcdef";

	for (int i = 0; i < PG_SHA256_DIGEST_LENGTH; i++)
	{
		hex[2 * i] = xdigits[digest[i] >> 4];
		hex[2 * i + 1] = xdigits[digest[i] & 0x0F];
	}
	hex[IDEM_HASH_HEX_LEN] = '\0';
}

/* The highest secret version a file may hold (fingerprint_version is a smallint). */
#define FP_MAX_VERSION	32767
/* The fewest bytes a secret may have. */
#define FP_MIN_SECRET	16

typedef struct FingerprintKey
{
	int			version;
	int			len;
	char	   *secret;
	bool		has_digest_key; /* digest_key is derived (idem_fingerprint_digest_key) */
	uint8		digest_key[IDEM_DIGEST_SECRET_LEN];
} FingerprintKey;

/* The file's secrets as last read, in keys_cxt; newest: the highest version. */
static MemoryContext keys_cxt = NULL;
static FingerprintKey *keys = NULL;
static int	nkeys = 0;
static int	newest = -1;		/* index of the newest, -1 if none */
static bool keys_stale = true;
static struct stat keys_stat;	/* of the file as read */
static TimestampTz keys_checked_xact = 0;	/* the transaction that last looked */
static pg_time_t keys_loaded_at = 0;	/* when the file was last read */

static void
assign_keys_file(const char *newval, void *extra)
{
	keys_stale = true;
}

/* Define idem.fingerprint_keys_file. */
void
idem_fingerprint_init(void)
{
	DefineCustomStringVariable("idem.fingerprint_keys_file",
							   "A file of versioned secrets (\"v2:<secret>\" lines) that key request fingerprints (HMAC-SHA-256).",
							   "Empty: fingerprints are plain SHA-256. The newest version signs new records; every version verifies. "
							   "The file must belong to the server's user and be readable by it alone.",
							   &idem_fingerprint_keys_file,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY,
							   NULL, assign_keys_file, NULL);
}

static void
keys_file_error(const char *path, int line, const char *why)
{
	ereport(ERROR,
			(errcode(ERRCODE_CONFIG_FILE_ERROR),
			 errmsg("idem.fingerprint_keys_file \"%s\" is not usable", path),
			 line > 0 ? errdetail("Line %d: %s.", line, why) : errdetail("%s.", why),
			 errhint("Each line is \"v<version>:<secret>\" (version 1 to %d, a secret of at least %d bytes); "
					 "the file belongs to the server's user, mode 0600 or 0400.",
					 FP_MAX_VERSION, FP_MIN_SECRET)));
}

/* Parse one "v<N>:<secret>" line into keys[nkeys] (keys_cxt is current). */
static void
parse_key_line(const char *path, int lineno, char *line)
{
	char	   *end;
	long		version;
	int			len = strlen(line);

	while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
		line[--len] = '\0';
	if (len == 0 || line[0] == '#')
		return;
	if (line[0] != 'v')
		keys_file_error(path, lineno, "it does not start with \"v<version>:\"");
	errno = 0;
	version = strtol(line + 1, &end, 10);
	if (end == line + 1 || *end != ':' || errno != 0 || version < 1 || version > FP_MAX_VERSION)
		keys_file_error(path, lineno, "its version is not a number from 1 to 32767 followed by \":\"");
	if (strlen(end + 1) < FP_MIN_SECRET)
		keys_file_error(path, lineno, "its secret is shorter than 16 bytes");
	for (int i = 0; i < nkeys; i++)
		if (keys[i].version == version)
			keys_file_error(path, lineno, "its version appears twice");
	keys = nkeys == 0 ? palloc(sizeof(FingerprintKey)) :
		repalloc(keys, sizeof(FingerprintKey) * (nkeys + 1));
	keys[nkeys].version = (int) version;
	keys[nkeys].secret = pstrdup(end + 1);
	keys[nkeys].len = strlen(end + 1);
	keys[nkeys].has_digest_key = false;
	if (newest < 0 || version > keys[newest].version)
		newest = nkeys;
	nkeys++;
}

/* The longest line a keys file may have, its newline not counted. */
#define FP_MAX_LINE		1023
/* The largest keys file read. */
#define FP_MAX_FILE		(1024 * 1024)

/* HMAC-SHA-256 of data under key's secret into mac (PG_SHA256_DIGEST_LENGTH bytes). */
static void
key_hmac(const FingerprintKey *key, const char *data, size_t len, uint8 *mac)
{
	pg_hmac_ctx *ctx = pg_hmac_create(PG_SHA256);

	if (ctx == NULL ||
		pg_hmac_init(ctx, (const uint8 *) key->secret, key->len) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) data, len) < 0 ||
		pg_hmac_final(ctx, mac, PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "idem: could not compute HMAC-SHA-256: %s",
			 ctx ? pg_hmac_error(ctx) : "out of memory");
	pg_hmac_free(ctx);
}

/* A keyed check value of key, HMAC-SHA-256 of a constant under its secret. */
static void
key_check_value(const FingerprintKey *key, uint8 *check)
{
	static const char what[] = "idem fingerprint key check";

	StaticAssertStmt(IDEM_KEYCHECK_LEN == PG_SHA256_DIGEST_LENGTH, "a check value is an HMAC-SHA-256");
	key_hmac(key, what, sizeof(what) - 1, check);
}

/*
 * 55000 unless each version of the file has the secret it had the first
 * time this server saw it (keycheck.c).  A version's secret never changes.
 */
static void
check_versions_unchanged(const char *path)
{
	for (int i = 0; i < nkeys; i++)
	{
		uint8		check[IDEM_KEYCHECK_LEN];

		key_check_value(&keys[i], check);
		if (!idem_keycheck_verify(keys[i].version, check))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idem.fingerprint_keys_file \"%s\" changed the secret of version v%d", path, keys[i].version),
					 errdetail("This server read another secret for v%d before; records keyed with it would no longer match their retries.", keys[i].version),
					 errhint("A version's secret never changes: put v%d back as it was, and add a new version for a new secret.", keys[i].version)));
	}
}

/* The file's text, read from f, which is path, opened and fstat'ed. */
static char *
read_keys_text(const char *path, FILE *f, const struct stat *st)
{
	StringInfoData text;
	size_t		got;

	if (!S_ISREG(st->st_mode))
		keys_file_error(path, 0, "It is not a regular file");
	if (st->st_uid != geteuid())
		keys_file_error(path, 0, "It does not belong to the server's user");
	if (st->st_mode & (S_IRWXG | S_IRWXO))
		keys_file_error(path, 0, "Its group or others may access it");
	if (st->st_size > FP_MAX_FILE)
		keys_file_error(path, 0, "It is larger than 1 MB");
	initStringInfo(&text);
	enlargeStringInfo(&text, (int) st->st_size + 1);
	got = fread(text.data, 1, st->st_size + 1, f);
	if (ferror(f))
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not read idem.fingerprint_keys_file \"%s\": %m", path)));
	if (got > (size_t) st->st_size)
		keys_file_error(path, 0, "It changed while it was read");
	text.len = (int) got;
	text.data[got] = '\0';
	return text.data;
}

/*
 * Read the file the setting names (none: no keys).  Opened first, and its
 * open descriptor's status is what is checked and remembered, so that what
 * is read is the file that was checked.  Errors are 58P01/F0000; a line
 * longer than FP_MAX_LINE bytes refuses the file (it would be split, its
 * tail read as another line); 55000 for a version whose secret
 * changed.
 */
static void
load_keys(void)
{
	const char *path = idem_fingerprint_keys_file;
	struct stat st;
	FILE	   *f;
	char	   *text;
	char	   *line;
	int			lineno = 0;
	MemoryContext old;

	if (keys_cxt == NULL)
		keys_cxt = AllocSetContextCreate(TopMemoryContext, "idem fingerprint keys", ALLOCSET_SMALL_SIZES);
	MemoryContextReset(keys_cxt);
	keys = NULL;
	nkeys = 0;
	newest = -1;
	keys_stale = true;
	if (path == NULL || path[0] == '\0')
	{
		keys_stale = false;
		return;
	}
	f = AllocateFile(path, "r");
	if (f == NULL)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not read idem.fingerprint_keys_file \"%s\": %m", path)));
	/* on an error the transaction's end closes f (AllocateFile) */
	if (fstat(fileno(f), &st) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not read idem.fingerprint_keys_file \"%s\": %m", path)));
	text = read_keys_text(path, f, &st);
	FreeFile(f);
	old = MemoryContextSwitchTo(keys_cxt);
	for (line = text; *line != '\0' || line == text;)
	{
		char	   *nl = strchr(line, '\n');
		size_t		len = nl ? (size_t) (nl - line) : strlen(line);

		lineno++;
		if (len > FP_MAX_LINE)
			keys_file_error(path, lineno, "it is longer than 1023 bytes");
		if (nl)
			*nl = '\0';
		parse_key_line(path, lineno, line);
		if (nl == NULL)
			break;
		line = nl + 1;
	}
	MemoryContextSwitchTo(old);
	pfree(text);
	if (nkeys == 0)
		keys_file_error(path, 0, "It holds no secret");
	check_versions_unchanged(path);
	keys_stat = st;
	keys_loaded_at = (pg_time_t) time(NULL);
	keys_stale = false;
}

/*
 * The keys, read again if the setting changed or, looked at once a
 * transaction, the file did: another device, inode, size, mtime or ctime
 * (a rotation needs no reload).  A file modified within 2 s of when it was
 * last read is read again at each look, whatever its status says.  A
 * rewrite of the same size within the clock's resolution leaves the status
 * as it was.
 */
static void
current_keys(void)
{
	const char *path = idem_fingerprint_keys_file;
	TimestampTz xact = GetCurrentTransactionStartTimestamp();

	if (!keys_stale && path != NULL && path[0] != '\0' && xact != keys_checked_xact)
	{
		struct stat st;

		if (stat(path, &st) != 0 || st.st_dev != keys_stat.st_dev || st.st_ino != keys_stat.st_ino ||
			st.st_size != keys_stat.st_size || st.st_mtime != keys_stat.st_mtime ||
			st.st_ctime != keys_stat.st_ctime ||
			st.st_mtim.tv_nsec != keys_stat.st_mtim.tv_nsec ||
			st.st_ctim.tv_nsec != keys_stat.st_ctim.tv_nsec ||
			(pg_time_t) st.st_mtime + 2 >= keys_loaded_at)
			keys_stale = true;
	}
	keys_checked_xact = xact;
	if (keys_stale)
		load_keys();
}

/* The version new records are signed with: the file's newest; 0: plain SHA-256. */
int
idem_fingerprint_sign_version(void)
{
	if ((idem_fingerprint_keys_file == NULL || idem_fingerprint_keys_file[0] == '\0') && !keys_stale)
		return 0;
	current_keys();
	return newest < 0 ? 0 : keys[newest].version;
}

/*
 * The stored form of the plain fingerprint under secret version (0: plain
 * itself).  Lowercase hex HMAC-SHA-256 of the plain hex text.  55000 when
 * the file no longer holds that version.
 */
void
idem_fingerprint_keyed(const char *plain, int version, char *out)
{
	uint8		mac[PG_SHA256_DIGEST_LENGTH];
	const FingerprintKey *key = NULL;

	if (version == 0)
	{
		strlcpy(out, plain, IDEM_HASH_HEX_LEN + 1);
		return;
	}
	current_keys();
	for (int i = 0; i < nkeys; i++)
		if (keys[i].version == version)
			key = &keys[i];
	if (key == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the request fingerprint of this record is keyed with secret v%d, which idem.fingerprint_keys_file does not hold", version),
				 errhint("Keep every secret version in the file while records keyed with it live (idem.ttl, idem.audit_ttl).")));
	key_hmac(key, plain, IDEM_HASH_HEX_LEN, mac);
	hex_of(mac, out);
}

/* Is stored (keyed with version) the fingerprint plain? In constant time. */
bool
idem_fingerprint_matches(const char *stored, int version, const char *plain)
{
	IdemFingerprint keyed;

	idem_fingerprint_keyed(plain, version, keyed);
	return idem_fingerprints_equal(stored, keyed);
}

/*
 * Lowercase hex SHA-256 of data; hex must hold IDEM_HASH_HEX_LEN + 1
 * bytes.  sha256.c's, not pg_cryptohash's.  See there why.
 */
void
idem_sha256_hex(const char *data, size_t len, char *hex)
{
	uint8		digest[IDEM_SHA256_LEN];

	idem_sha256(data, len, digest);
	hex_of(digest, hex);
}

/* The fingerprint of a request, the SHA-256 of its canonical text. */
void
idem_fingerprint_jsonb(Jsonb *request, char *hex)
{
	StringInfoData buf;

	initStringInfo(&buf);
	idem_jcs_append_jsonb(&buf, request);
	idem_sha256_hex(buf.data, buf.len, hex);
	pfree(buf.data);
}

/*
 * Are len bytes of a and b equal? In time independent of where they differ.
 * Not PostgreSQL's timingsafe_bcmp.  Built with OpenSSL it calls
 * CRYPTO_memcmp, some 450 instructions for 64 bytes on every replay under
 * callgrind (test/bench/instructions.sh), where this loop costs about 75.
 */
bool
idem_equal_in_constant_time(const void *a, const void *b, size_t len)
{
	const unsigned char *x = a;
	const unsigned char *y = b;
	unsigned char diff = 0;

	for (size_t i = 0; i < len; i++)
		diff |= x[i] ^ y[i];
	return diff == 0;
}

/* Compare two hex fingerprints in time independent of where they differ. */
bool
idem_fingerprints_equal(const char *a, const char *b)
{
	if (strlen(a) != IDEM_HASH_HEX_LEN || strlen(b) != IDEM_HASH_HEX_LEN)
		return false;
	return idem_equal_in_constant_time(a, b, IDEM_HASH_HEX_LEN);
}

/* ---------- a call's request, its fingerprint and its digest ---------- */

/*
 * The key of request digests under secret version.  For version 0 it is
 * the database's own secret (NULL on an SQL version before 1.13).  For a
 * file secret it is the first bytes of HMAC-SHA-256 of a constant under
 * that secret.  So a copy of the database without the file tells no more
 * of a keyed record's request by its digest than by its fingerprint.
 * NULL: no key, for a version the file no longer holds.
 */
const uint8 *
idem_fingerprint_digest_key(const uint8 *db_secret, int version)
{
	static const char what[] = "idem request digest key";
	FingerprintKey *key = NULL;
	uint8		mac[PG_SHA256_DIGEST_LENGTH];

	StaticAssertStmt(IDEM_DIGEST_SECRET_LEN == IDEM_SIPHASH_KEY_LEN, "a digest secret is a SipHash key");
	StaticAssertStmt(IDEM_DIGEST_LEN == IDEM_SIPHASH_LEN, "a digest is a SipHash-2-4-128");
	if (version == 0)
		return db_secret;
	current_keys();
	for (int i = 0; i < nkeys; i++)
		if (keys[i].version == version)
			key = &keys[i];
	if (key == NULL)
		return NULL;
	if (!key->has_digest_key)
	{
		key_hmac(key, what, sizeof(what) - 1, mac);
		memcpy(key->digest_key, mac, IDEM_DIGEST_SECRET_LEN);
		key->has_digest_key = true;
	}
	return key->digest_key;
}
