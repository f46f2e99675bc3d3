/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Counters per (database, kind, name) in shared memory, read through the
 *	  idem_stats view, as pg_stat_statements keeps its counters.  The kind
 *	  is what the name is: an operation, a topic or a consumer.
 *
 * A fixed-size hash table of idem.stats_max entries, each a row of 64-bit
 * atomic counters, sized at server start (shared_preload_libraries).  A
 * backend finds an operation's entry once (shared lock; the exclusive lock
 * only to add an entry, never to evict one) and keeps the pointer.  Entries
 * live until the server stops, idem_stats_reset() only zeroes them.  When
 * the table is full, new operations count in one "(other)" row.
 *
 * Counters reflect committed work.  What a call writes (executed, renewed,
 * failed_final, outbox_emitted, outbox_acked, cleanup_deleted) is kept in
 * the backend.  It is added when the transaction commits and dropped when
 * the transaction (or its savepoint) rolls back.  What a call observes
 * (calls, replayed, conflicts, in_flight, waits, inbox_duplicates) is added
 * at the call, even if its transaction then fails, as a refused key's
 * always does.
 *
 * A prepared transaction's counts wait for its outcome.  PREPARE TRANSACTION
 * moves them into a shared slot named by the GID, COMMIT PREPARED adds
 * them, ROLLBACK PREPARED drops them, in whichever session runs it (a
 * ProcessUtility hook sees both).  The slots are in shared memory only.  A
 * restart between PREPARE and COMMIT PREPARED loses that transaction's
 * counts, and a transaction with more distinct counts than a slot holds
 * adds the rest at PREPARE.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/twophase.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "idem.h"
#include "compat.h"
#include "stats.h"


#define STATS_NAME_SIZE		(IDEM_TOPIC_MAX_LEN + 1)
#define STATS_OTHER			"(other)"

typedef struct StatsKey
{
	Oid			dbid;			/* InvalidOid for "(other)" */
	int			kind;			/* IdemStatKind; IDEM_KIND_NONE for "(other)" */
	char		name[STATS_NAME_SIZE];
} StatsKey;

static const char *const kind_names[] = {
	[IDEM_KIND_NONE] = NULL,
	[IDEM_KIND_OPERATION] = "operation",
	[IDEM_KIND_TOPIC] = "topic",
	[IDEM_KIND_CONSUMER] = "consumer",
};

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

/* The counts of a prepared transaction, until COMMIT or ROLLBACK PREPARED. */
#define PREPARED_COUNTS		64

typedef struct PreparedCounts
{
	bool		used;
	char		gid[GIDSIZE];
	int			n;
	struct
	{
		StatsEntry *entry;
		IdemCounter counter;
		int64		n;
	}			c[PREPARED_COUNTS];
} PreparedCounts;

static PreparedCounts *prepared = NULL;	/* max_prepared_xacts slots */
static char preparing_gid[GIDSIZE];		/* of the PREPARE TRANSACTION running */
static ProcessUtility_hook_type prev_process_utility = NULL;

static Size
stats_shmem_size(void)
{
	return add_size(add_size(MAXALIGN(sizeof(StatsShared)),
							 hash_estimate_size(idem_stats_max + 1, sizeof(StatsEntry))),
					mul_size(Max(max_prepared_xacts, 1), sizeof(PreparedCounts)));
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

	prepared = ShmemInitStruct("idem stats of prepared transactions",
							   Max(max_prepared_xacts, 1) * sizeof(PreparedCounts), &found);
	if (!found)
		memset(prepared, 0, Max(max_prepared_xacts, 1) * sizeof(PreparedCounts));
	shared = ShmemInitStruct("idem stats", sizeof(StatsShared), &found);
	info.keysize = sizeof(StatsKey);
	info.entrysize = sizeof(StatsEntry);
	shared_hash = idem_shmem_init_hash("idem stats entries", idem_stats_max + 1,
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

/* The entry of (this database, kind, name): found, added, or "(other)". */
static StatsEntry *
entry_for(IdemStatKind kind, const char *name)
{
	StatsKey	key;
	LocalEntry *local;
	StatsEntry *entry;
	bool		found;

	/* a call counts two or three times in one row, the last one at once */
	if (last_entry != NULL && last_dbid == MyDatabaseId &&
		last_entry->key.kind == (int) kind && strcmp(last_entry->key.name, name) == 0)
		return last_entry;

	memset(&key, 0, sizeof(key));
	key.dbid = MyDatabaseId;
	key.kind = kind;
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
	/* entries are never removed, so the pointer stays good ("(other)" too) */
	local = hash_search(local_hash, &key, HASH_ENTER, NULL);
	local->entry = entry;
	/* "(other)" holds another name, so it is not the last entry of this one */
	if (entry != shared->other)
	{
		last_entry = entry;
		last_dbid = MyDatabaseId;
	}
	return entry;
}

/* Count n at once (what a call observes). */
void
idem_stats_count(IdemStatKind kind, const char *name, IdemCounter counter, int64 n)
{
	if (shared == NULL || n == 0 || !idem_stats_track)
		return;
	pg_atomic_fetch_add_u64(&entry_for(kind, name)->counters[counter], n);
}

/* Count n when the transaction commits (what a call writes). */
void
idem_stats_count_at_commit(IdemStatKind kind, const char *name, IdemCounter counter, int64 n)
{
	PendingCount *p;
	StatsEntry *entry;

	if (shared == NULL || n == 0 || !idem_stats_track)
		return;
	entry = entry_for(kind, name);
	/* the same count again (a cleanup batch's rows), so add to it */
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

/* Add the pending counts from index from on. */
static void
apply_pending(int from)
{
	for (int i = from; i < npending; i++)
		pg_atomic_fetch_add_u64(&pending[i].entry->counters[pending[i].counter],
								pending[i].n);
}

/*
 * PREPARE TRANSACTION preparing_gid: keep the pending counts in a free slot
 * under the GID (as many as it holds; the rest are added now).
 */
static void
keep_prepared(void)
{
	PreparedCounts *slot = NULL;
	int			kept = 0;

	if (npending == 0)
		return;
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < max_prepared_xacts && slot == NULL; i++)
		if (!prepared[i].used)
			slot = &prepared[i];
	if (slot != NULL && preparing_gid[0] != '\0')
	{
		slot->used = true;
		strlcpy(slot->gid, preparing_gid, GIDSIZE);
		slot->n = 0;
		for (; kept < npending; kept++)
		{
			int			j = 0;

			while (j < slot->n && !(slot->c[j].entry == pending[kept].entry &&
									slot->c[j].counter == pending[kept].counter))
				j++;
			if (j == slot->n)
			{
				if (slot->n == PREPARED_COUNTS)
					break;
				slot->c[j].entry = pending[kept].entry;
				slot->c[j].counter = pending[kept].counter;
				slot->c[j].n = 0;
				slot->n++;
			}
			slot->c[j].n += pending[kept].n;
		}
	}
	LWLockRelease(shared->lock);
	apply_pending(kept);
}

/* COMMIT PREPARED (apply) or ROLLBACK PREPARED of gid: its counts' end. */
static void
end_prepared(const char *gid, bool commit)
{
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < max_prepared_xacts; i++)
	{
		PreparedCounts *slot = &prepared[i];

		if (!slot->used || strcmp(slot->gid, gid) != 0)
			continue;
		if (commit)
			for (int j = 0; j < slot->n; j++)
				pg_atomic_fetch_add_u64(&slot->c[j].entry->counters[slot->c[j].counter],
										slot->c[j].n);
		slot->used = false;
		break;
	}
	LWLockRelease(shared->lock);
}

/*
 * Note the GID of PREPARE TRANSACTION for the callback; settle a prepared
 * transaction's counts once COMMIT PREPARED or ROLLBACK PREPARED succeeded.
 */
static void
stats_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
					  ProcessUtilityContext context, ParamListInfo params,
					  QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *parsetree = pstmt->utilityStmt;
	TransactionStmt *stmt = IsA(parsetree, TransactionStmt) ? (TransactionStmt *) parsetree : NULL;
	char		gid[GIDSIZE] = "";

	if (stmt != NULL && stmt->gid != NULL)
		strlcpy(gid, stmt->gid, GIDSIZE);
	if (stmt != NULL && stmt->kind == TRANS_STMT_PREPARE)
		strlcpy(preparing_gid, gid, GIDSIZE);

	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context, params,
							 queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
								queryEnv, dest, qc);

	if (stmt != NULL && (stmt->kind == TRANS_STMT_COMMIT_PREPARED ||
						 stmt->kind == TRANS_STMT_ROLLBACK_PREPARED))
		end_prepared(gid, stmt->kind == TRANS_STMT_COMMIT_PREPARED);
}

static void
stats_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
			apply_pending(0);
			npending = 0;
			break;
		case XACT_EVENT_PREPARE:
			keep_prepared();
			preparing_gid[0] = '\0';
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
								"How many (database, kind, name) rows idem_stats keeps.",
								"Names beyond it count in one \"(other)\" row. Needs a restart.",
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
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = stats_process_utility;
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

/*
 * Call visit for each entry's key and counters (IDEM_STAT_NCOUNTERS of them,
 * read now) and the time of the last reset, under the table's lock
 * (shared).  visit should only form its row.  ERROR when idem is not
 * preloaded.
 */
void
idem_stats_visit(IdemStatsVisit visit, void *arg)
{
	HASH_SEQ_STATUS scan;
	StatsEntry *entry;
	uint64		counters[IDEM_STAT_NCOUNTERS];

	check_preloaded();
	LWLockAcquire(shared->lock, LW_SHARED);
	hash_seq_init(&scan, shared_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		for (int i = 0; i < IDEM_STAT_NCOUNTERS; i++)
			counters[i] = pg_atomic_read_u64(&entry->counters[i]);
		visit(entry->key.dbid, entry->key.name, kind_names[entry->key.kind], counters,
			  shared->reset_at, arg);
	}
	LWLockRelease(shared->lock);
}

/* Every counter back to 0.  ERROR when idem is not preloaded. */
void
idem_stats_reset_all(void)
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
}
