/*-------------------------------------------------------------------------
 *
 * keycheck.c
 *	  A keyed check value of each fingerprint secret version, recorded the
 *	  first time a backend of this server reads the version from
 *	  idem.fingerprint_keys_file.
 *
 * Each backend reads the file on its own.  Were a version's secret
 * rewritten, a backend that read it before would keep the old secret while
 * another used the new one, and a retry would be told IK001.  The check
 * value (an HMAC of a constant under the secret: it tells nothing of the
 * secret) is recorded here once per version; a file whose version N no
 * longer matches is refused by every backend.  Kept for the server's
 * lifetime; without shared_preload_libraries there is nothing to compare
 * against, and a version beyond the table's room is not checked.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "storage/shmem.h"
#include "storage/spin.h"

#include "idem.h"
#include "keycheck.h"

#define KEYCHECK_MAX	256

typedef struct KeyCheck
{
	int			version;
	uint8		check[IDEM_KEYCHECK_LEN];
} KeyCheck;

typedef struct KeyCheckShared
{
	slock_t		mutex;
	int			n;
	KeyCheck	entries[KEYCHECK_MAX];
} KeyCheckShared;

static KeyCheckShared *shared = NULL;

/* Reserve the table (from idem.c's shmem_request_hook). */
void
idem_keycheck_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(KeyCheckShared)));
}

/* Create or attach to it (shmem_startup_hook, under AddinShmemInitLock). */
void
idem_keycheck_shmem_startup(void)
{
	bool		found;

	shared = ShmemInitStruct("idem fingerprint key checks", sizeof(KeyCheckShared), &found);
	if (!found)
	{
		SpinLockInit(&shared->mutex);
		shared->n = 0;
	}
}

/*
 * Does check match what the server recorded for version?  Recorded now if
 * the version is new.  True too when nothing can be compared (not
 * preloaded, or the table full).
 */
bool
idem_keycheck_verify(int version, const uint8 *check)
{
	bool		ok = true;
	int			i;

	if (shared == NULL)
		return true;
	SpinLockAcquire(&shared->mutex);
	for (i = 0; i < shared->n; i++)
		if (shared->entries[i].version == version)
			break;
	if (i < shared->n)
		ok = memcmp(shared->entries[i].check, check, IDEM_KEYCHECK_LEN) == 0;
	else if (shared->n < KEYCHECK_MAX)
	{
		shared->entries[i].version = version;
		memcpy(shared->entries[i].check, check, IDEM_KEYCHECK_LEN);
		shared->n++;
	}
	SpinLockRelease(&shared->mutex);
	return ok;
}
