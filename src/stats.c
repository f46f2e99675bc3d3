/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Counters per (database, operation) in shared memory, read through the
 *	  idem_stats view, as pg_stat_statements keeps its counters.
 *
 * A fixed-size hash table of idem.stats_max entries, each a row of 64-bit
 * atomic counters, sized at server start (shared_preload_libraries).  A
 * backend finds an operation's entry once (shared lock; the exclusive lock
 * only to add an entry, never to evict one) and keeps the pointer: entries
 * live until the server stops, idem_stats_reset() only zeroes them.  When
 * the table is full, new operations count in one "(other)" row.
 *
 * Counters reflect committed work: what a call writes (executed, renewed,
 * failed_final, outbox_emitted, outbox_acked, cleanup_deleted) is kept in
 * the backend and added when its transaction commits, dropped when it (or
 * its savepoint) rolls back; what a call observes (calls, replayed,
 * conflicts, in_flight, waits, inbox_duplicates) is added at the call, even
 * if its transaction then fails, as a refused key's always does.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "stats.h"

PG_FUNCTION_INFO_V1(idem_stats_entries);
PG_FUNCTION_INFO_V1(idem_stats_reset);
PG_FUNCTION_INFO_V1(idem_stats_add);

#define STATS_NAME_SIZE		(IDEM_TOPIC_MAX_LEN + 1)
#define STATS_OTHER			"(other)"

typedef struct StatsKey
{
	Oid			dbid;			/* InvalidOid for "(other)" */
	char		name[STATS_NAME_SIZE];
} StatsKey;

typedef struct StatsEntry
{
	StatsKey	key;
	pg_atomic_uint64 counters[IDEM_STAT_NCOUNTERS];
} StatsEntry;

typedef struct StatsShared
{
	LWLock	   *lock;
	int			entries;		/* in the hash table, "(other)" included */
	TimestampTz reset_at;		/* under lock */
	StatsEntry *other;
} StatsShared;

/* GUC variables */
static int	idem_stats_max = 1000;
static bool idem_stats_track = true;

static StatsShared *shared = NULL;
static HTAB *shared_hash = NULL;


/* This backend's pointers to the entries it used. */
typedef struct LocalEntry
{
	StatsKey	key;
	StatsEntry *entry;
} LocalEntry;

static HTAB *local_hash = NULL;
static StatsEntry *last_entry = NULL;
static Oid	last_dbid = InvalidOid;

/* Counts waiting for the commit of the transaction. */
typedef struct PendingCount
{
	StatsEntry *entry;
	IdemCounter counter;
	int64		n;
	SubTransactionId subid;
} PendingCount;

static PendingCount *pending = NULL;
static int	npending = 0;
static int	maxpending = 0;

static Size
stats_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(StatsShared)),
					hash_estimate_size(idem_stats_max + 1, sizeof(StatsEntry)));
}

/* Reserve the table and its lock (from idem.c's shmem_request_hook). */
void
idem_stats_shmem_request(void)
{
	RequestAddinShmemSpace(stats_shmem_size());
	RequestNamedLWLockTranche("idem stats", 1);
}

/* Create or attach to the table (idem.c's shmem_startup_hook, under AddinShmemInitLock). */
void
idem_stats_shmem_startup(void)
{
	bool		found;
	HASHCTL		info;

	shared = ShmemInitStruct("idem stats", sizeof(StatsShared), &found);
	info.keysize = sizeof(StatsKey);
	info.entrysize = sizeof(StatsEntry);
	shared_hash = ShmemInitHash("idem stats entries", idem_stats_max + 1, idem_stats_max + 1,
								&info, HASH_ELEM | HASH_BLOBS);
	if (!found)
	{
		StatsKey	key = {0};
		StatsEntry *other;

		shared->lock = &(GetNamedLWLockTranche("idem stats"))->lock;
		shared->reset_at = GetCurrentTimestamp();
		strlcpy(key.name, STATS_OTHER, STATS_NAME_SIZE);
		other = hash_search(shared_hash, &key, HASH_ENTER, NULL);
		for (int i = 0; i < IDEM_STAT_NCOUNTERS; i++)
			pg_atomic_init_u64(&other->counters[i], 0);
		shared->other = other;
		shared->entries = 1;
	}
}

/* The entry of (this database, name): found, added, or "(other)". */
static StatsEntry *
entry_for(const char *name)
{
	StatsKey	key;
	LocalEntry *local;
	StatsEntry *entry;
	bool		found;

	/* a call counts two or three times in one row: the last one, at once */
	if (last_entry != NULL && last_dbid == MyDatabaseId &&
		strcmp(last_entry->key.name, name) == 0)
		return last_entry;

	memset(&key, 0, sizeof(key));
	key.dbid = MyDatabaseId;
	strlcpy(key.name, name, STATS_NAME_SIZE);

	if (local_hash == NULL)
	{
		HASHCTL		info;

		info.keysize = sizeof(StatsKey);
		info.entrysize = sizeof(LocalEntry);
		info.hcxt = TopMemoryContext;
		local_hash = hash_create("idem stats, this backend's", 64, &info,
								 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	local = hash_search(local_hash, &key, HASH_FIND, NULL);
	if (local != NULL)
	{
		last_entry = local->entry;
		last_dbid = MyDatabaseId;
		return last_entry;
	}

	LWLockAcquire(shared->lock, LW_SHARED);
	entry = hash_search(shared_hash, &key, HASH_FIND, NULL);
	LWLockRelease(shared->lock);
	if (entry == NULL)
	{
		LWLockAcquire(shared->lock, LW_EXCLUSIVE);
		if (shared->entries < idem_stats_max + 1)
		{
			entry = hash_search(shared_hash, &key, HASH_ENTER_NULL, &found);
			if (entry != NULL && !found)
			{
				for (int i = 0; i < IDEM_STAT_NCOUNTERS; i++)
					pg_atomic_init_u64(&entry->counters[i], 0);
				shared->entries++;
			}
		}
		if (entry == NULL)
			entry = shared->other;
		LWLockRelease(shared->lock);
	}
	/* entries are never removed: the pointer stays good ("(other)" too) */
	local = hash_search(local_hash, &key, HASH_ENTER, NULL);
	local->entry = entry;
	/* "(other)" holds another name: not the last entry of this one */
	if (entry != shared->other)
	{
		last_entry = entry;
		last_dbid = MyDatabaseId;
	}
	return entry;
}

/* Count n at once (what a call observes). */
void
idem_stats_count(const char *operation, IdemCounter counter, int64 n)
{
	if (shared == NULL || n == 0 || !idem_stats_track)
		return;
	pg_atomic_fetch_add_u64(&entry_for(operation)->counters[counter], n);
}

/* Count n when the transaction commits (what a call writes). */
void
idem_stats_count_at_commit(const char *operation, IdemCounter counter, int64 n)
{
	PendingCount *p;
	StatsEntry *entry;

	if (shared == NULL || n == 0 || !idem_stats_track)
		return;
	entry = entry_for(operation);
	/* the same count again (a cleanup batch's rows): add to it */
	if (npending > 0)
	{
		p = &pending[npending - 1];
		if (p->entry == entry && p->counter == counter &&
			p->subid == GetCurrentSubTransactionId())
		{
			p->n += n;
			return;
		}
	}
	if (npending == maxpending)
	{
		maxpending = Max(16, maxpending * 2);
		pending = pending == NULL ?
			MemoryContextAlloc(TopMemoryContext, maxpending * sizeof(PendingCount)) :
			repalloc(pending, maxpending * sizeof(PendingCount));
	}
	p = &pending[npending++];
	p->entry = entry;
	p->counter = counter;
	p->n = n;
	p->subid = GetCurrentSubTransactionId();
}

static void
stats_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PREPARE:
			for (int i = 0; i < npending; i++)
				pg_atomic_fetch_add_u64(&pending[i].entry->counters[pending[i].counter],
										pending[i].n);
			npending = 0;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PARALLEL_COMMIT:
			npending = 0;
			break;
		default:
			break;
	}
}

/* A savepoint rolled back drops its counts; one released hands them up. */
static void
stats_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	int			kept = 0;

	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;
	for (int i = 0; i < npending; i++)
	{
		if (pending[i].subid == mySubid)
		{
			if (event == SUBXACT_EVENT_ABORT_SUB)
				continue;
			pending[i].subid = parentSubid;
		}
		pending[kept++] = pending[i];
	}
	npending = kept;
}

/* Define the GUCs; from _PG_init, preloaded or not (idem.stats_max only when preloaded). */
void
idem_stats_define_gucs(void)
{
	/* a server-start setting can only be defined while preloading */
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("idem.stats_max",
								"How many (database, operation) rows idem_stats keeps.",
								"Operations beyond it count in one \"(other)\" row. Needs a restart.",
								&idem_stats_max,
								1000, 1, INT_MAX / 2,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);

	DefineCustomBoolVariable("idem.stats_track",
							 "Whether calls count in idem_stats.",
							 "Off, nothing is counted (for measuring what counting costs).",
							 &idem_stats_track,
							 true,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);
}

/* Count at commit; from _PG_init under shared_preload_libraries. */
void
idem_stats_init(void)
{
	RegisterXactCallback(stats_xact_callback, NULL);
	RegisterSubXactCallback(stats_subxact_callback, NULL);
}

static void
check_preloaded(void)
{
	if (shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's statistics need idem in shared_preload_libraries"),
				 errhint("Add idem to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/* SQL: idem_stats_entries() returns setof record (the idem_stats view's rows) */
Datum
idem_stats_entries(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;
	TimestampTz reset_at;

	check_preloaded();
	InitMaterializedSRF(fcinfo, 0);
	LWLockAcquire(shared->lock, LW_SHARED);
	reset_at = shared->reset_at;
	hash_seq_init(&scan, shared_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		Datum		values[IDEM_STAT_NCOUNTERS + 3];
		bool		nulls[IDEM_STAT_NCOUNTERS + 3] = {false};
		int			col = 0;

		values[col] = ObjectIdGetDatum(entry->key.dbid);
		nulls[col++] = !OidIsValid(entry->key.dbid);
		values[col++] = CStringGetTextDatum(entry->key.name);
		for (int i = 0; i < IDEM_STAT_NCOUNTERS; i++)
			values[col++] = Int64GetDatum((int64) pg_atomic_read_u64(&entry->counters[i]));
		values[col++] = TimestampTzGetDatum(reset_at);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	LWLockRelease(shared->lock);
	return (Datum) 0;
}

/* SQL: idem_stats_reset() returns void: every counter back to 0 */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;

	check_preloaded();
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&scan, shared_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
		for (int i = 0; i < IDEM_STAT_NCOUNTERS; i++)
			pg_atomic_write_u64(&entry->counters[i], 0);
	shared->reset_at = GetCurrentTimestamp();
	LWLockRelease(shared->lock);
	PG_RETURN_VOID();
}

/*
 * SQL: idem_stats_add(name text, counter text, n bigint) returns bigint (n),
 * counted at commit: for idem's PL/pgSQL functions (idem_outbox_ack).
 */
Datum
idem_stats_add(PG_FUNCTION_ARGS)
{
	char	   *name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *counter = text_to_cstring(PG_GETARG_TEXT_PP(1));

	if (strcmp(counter, "outbox_acked") != 0)
		elog(ERROR, "idem: idem_stats_add counts only outbox_acked");
	idem_stats_count_at_commit(name, IDEM_STAT_OUTBOX_ACKED, PG_GETARG_INT64(2));
	PG_RETURN_INT64(PG_GETARG_INT64(2));
}
