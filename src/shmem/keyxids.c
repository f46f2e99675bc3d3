/*-------------------------------------------------------------------------
 *
 * keyxids.c
 *	  The newest transaction to write a record under each bucket of keys
 *	  (keys hashed as their key locks are), in shared memory.
 *
 * A claim whose read of the key found nothing takes the key lock and then
 * probes the key with a dirty snapshot, for rows its read could not see:
 * written by a transaction still running, or committed after the read's
 * snapshot.  When the read met no index entry of the key at all, only a
 * row written since can be there, and a claim writes one only under the
 * key lock, noting its transaction's xid in the key's bucket first (the
 * newest is kept).  Every transaction the read could not see has an xid
 * at or above its snapshot's xmin; so when the bucket holds nothing that
 * new (and nothing of the caller's own transaction), the probe would find
 * nothing, and is skipped.  Other keys of the bucket only make a claim
 * probe when it need not.  A writer around idem (a plain INSERT) is not
 * noted: its row is probed for when the read met its entry, and refused
 * by the unique index (23505, never a second execution) when it was
 * written between the read and the key lock.  Without
 * shared_preload_libraries every claim probes.
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "port/atomics.h"
#include "storage/shmem.h"

#include "keyxids.h"

#define KEYXIDS_BUCKETS		16384

typedef struct KeyXids
{
	pg_atomic_uint32 xid[KEYXIDS_BUCKETS];
} KeyXids;

static KeyXids *shared = NULL;

/* Reserve the table (from idem.c's shmem_request_hook). */
void
idem_keyxids_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(KeyXids)));
}

/* Create or attach to it (shmem_startup_hook, under AddinShmemInitLock). */
void
idem_keyxids_shmem_startup(void)
{
	bool		found;

	shared = ShmemInitStruct("idem record writers by key", sizeof(KeyXids), &found);
	if (!found)
		for (int i = 0; i < KEYXIDS_BUCKETS; i++)
			pg_atomic_init_u32(&shared->xid[i], InvalidTransactionId);
}

static pg_atomic_uint32 *
bucket(const LOCKTAG *key)
{
	uint32		h = key->locktag_field3 ^ (key->locktag_field2 * 0x9E3779B1u) ^ key->locktag_field1;

	return &shared->xid[h % KEYXIDS_BUCKETS];
}

/*
 * The current transaction writes a record of key (which it has locked):
 * its xid goes into the key's bucket unless a newer one is there.
 */
void
idem_keyxids_note(const LOCKTAG *key)
{
	TransactionId xid;
	pg_atomic_uint32 *b;
	uint32		old;

	if (shared == NULL)
		return;
	xid = GetCurrentTransactionId();
	b = bucket(key);
	old = pg_atomic_read_u32(b);
	while (!TransactionIdIsValid(old) || TransactionIdPrecedes(old, xid))
		if (pg_atomic_compare_exchange_u32(b, &old, xid))
			break;
}

/*
 * Has every transaction that wrote a record under key's bucket ended
 * before a snapshot whose xmin is xmin was taken?  Asked under the key
 * lock.  False when unknown (not preloaded).
 */
bool
idem_keyxids_settled(const LOCKTAG *key, TransactionId xmin)
{
	TransactionId xid;

	if (shared == NULL)
		return false;
	xid = pg_atomic_read_u32(bucket(key));
	return !TransactionIdIsValid(xid) ||
		(TransactionIdPrecedes(xid, xmin) && !TransactionIdIsCurrentTransactionId(xid));
}
