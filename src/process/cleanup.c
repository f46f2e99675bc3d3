/*-------------------------------------------------------------------------
 *
 * cleanup.c
 *	  Batch deletion of expired idempotency records, and of what else
 *	  idem keeps for a while.  Expired inbox entries, acknowledged outbox
 *	  messages, history past its audit period, tasks' attempts, operators'
 *	  actions past idem.operator_audit_ttl.
 *
 * One huge DELETE would hold many row locks and flood WAL at once, so
 * expired records go in batches of at most batch_size rows, oldest expiry
 * first.  Rows another transaction holds (a caller replacing an expired
 * record, say) are skipped, never waited for, and a row is deleted only
 * while its expires_at is in the past.  The row lock is taken on its newest
 * version and the expiry checked again there, as SELECT ... FOR UPDATE SKIP
 * LOCKED followed by a DELETE would.
 *
 * No statement is involved.  The table and its expires_at index are found
 * by OID in the extension's schema (found by OID too), scanned directly and
 * rows deleted through rowwrite.c (row triggers fire, statement triggers do
 * not).  A kept SQL statement would name the schema, and PostgreSQL parses
 * such a statement again after any schema change, by name.  Renaming
 * schemas could then point it at a look-alike table.
 *
 * On Citus, a distributed table's rows are in its shards.  Each shard placed
 * on this node is cleaned as a table of its own (citus.c lists them from
 * Citus's metadata), so that every node's worker cleans its own shards.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "cleanup.h"
#include "citus.h"
#include "stats.h"
#include "history.h"
#include "rowwrite.h"
#include "util.h"


/* What the cleanup deletes, the rows of a table whose cutoff column is past. */
typedef struct CleanupTarget
{
	const char *table;
	const char *column;			/* timestamptz; NULL is never deleted */
	const char *name_column;	/* the idem_stats row a deletion counts in
								 * (NULL: not counted) */
	IdemStatKind name_kind;		/* and that row's kind */
	bool		optional;		/* absent before some version */
	bool		partial_ok;		/* its index may be partial (rows rechecked) */
} CleanupTarget;

static const CleanupTarget targets[] = {
	{"idempotency_record", "expires_at", "operation", IDEM_KIND_OPERATION, false, false},
	{"idem_inbox", "expires_at", "consumer", IDEM_KIND_CONSUMER, true, false},
	{"idem_outbox", "acked_at", "topic", IDEM_KIND_TOPIC, true, true},
	{"idem_history", "audit_until", NULL, IDEM_KIND_OPERATION, true, false},
	{"idem_task_attempt", "expires_at", NULL, IDEM_KIND_OPERATION, true, false},
	{"idem_operator_audit", "expires_at", NULL, IDEM_KIND_OPERATION, true, false},
};

#define TARGET_RECORD	0
#define TARGET_HISTORY	3

#define NTARGETS lengthof(targets)

/*
 * Table name in schema nspid, checked to be a table and locked as the
 * delete locks it; 0 if optional and absent.  *dropped is set when it went
 * while we waited for the lock (a DROP EXTENSION committing).
 */
static Oid
target_relation(Oid nspid, const CleanupTarget *target, bool *dropped)
{
	Oid			relid = get_relname_relid(target->table, nspid);

	if (OidIsValid(relid))
	{
		LockRelationOid(relid, RowExclusiveLock);
		if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
		{
			UnlockRelationOid(relid, RowExclusiveLock);
			*dropped = true;
			return InvalidOid;
		}
	}
	if (!OidIsValid(relid) && target->optional)
		return InvalidOid;
	if (!OidIsValid(relid) || get_rel_relkind(relid) != RELKIND_RELATION)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's relation \"%s\" is missing from schema \"%s\"",
						target->table, get_namespace_name(nspid)),
				 errhint("Drop and re-create the extension idem.")));
	return relid;
}

/*
 * A valid B-tree index of heap whose first column is the target's column
 * (idx_idempotency_expire as installed, for records), opened; partial only
 * where the target allows it.  Every row found is checked again anyway.
 */
static Relation
open_expiry_index(Relation heap, AttrNumber expires, const CleanupTarget *target)
{
	List	   *indexes = RelationGetIndexList(heap);
	ListCell   *lc;

	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index ind = index->rd_index;

		if (index->rd_rel->relam == BTREE_AM_OID && ind->indisvalid &&
			ind->indkey.values[0] == expires &&
			(target->partial_ok || RelationGetIndexPredicate(index) == NIL))
		{
			list_free(indexes);
			return index;
		}
		index_close(index, AccessShareLock);
	}
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("idem's table \"%s\" has no B-tree index on %s",
					target->table, target->column),
			 errhint("CREATE INDEX ON %s (%s).", target->table, target->column)));
	return NULL;				/* keep compiler quiet */
}

/*
 * Delete at most batch_size rows of relid whose target column is before
 * now, oldest first, skipping rows other transactions hold.  Returns how
 * many.
 */
static int64
delete_batch(Oid relid, const CleanupTarget *target, TimestampTz now, int batch_size,
			 Oid history)
{
	IdemArchive archive = {0};
	IdemRows	rows;
	Relation	heap;
	Relation	index;
	AttrNumber	expires;
	AttrNumber	name_att;
	ScanKeyData skey;
	IndexScanDesc scan;
	TupleTableSlot *found;
	TupleTableSlot *locked;
	Snapshot	snapshot;
	int64		deleted = 0;

	idem_rows_begin(&rows, &relid, 1, CMD_DELETE);
	heap = rows.rels[0]->ri_RelationDesc;
	locked = rows.slots[0];
	expires = get_attnum(relid, target->column);
	name_att = target->name_column ? get_attnum(relid, target->name_column) : InvalidAttrNumber;
	if (expires == InvalidAttrNumber ||
		TupleDescAttr(RelationGetDescr(heap), expires - 1)->atttypid != TIMESTAMPTZOID)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table \"%s\" was altered: column \"%s\" is missing or of another type",
						target->table, target->column),
				 errhint("Undo the change, or drop and re-create the extension idem.")));
	index = open_expiry_index(heap, expires, target);
	/* a record's audit fields outlive it in idem_history */
	if (OidIsValid(history))
		(void) idem_archive_begin(&archive, history, relid, now);

	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	found = table_slot_create(heap, NULL);
	ScanKeyInit(&skey, 1, BTLessStrategyNumber, F_TIMESTAMPTZ_LT, TimestampTzGetDatum(now));
	scan = idem_index_beginscan(heap, index, snapshot, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	while (deleted < batch_size && index_getnext_slot(scan, ForwardScanDirection, found))
	{
		ItemPointerData tid = found->tts_tid;
		TM_FailureData tmfd;
		bool		isnull;
		Datum		d;

		CHECK_FOR_INTERRUPTS();
		if (table_tuple_lock(heap, &tid, snapshot, locked, GetCurrentCommandId(false),
							 LockTupleExclusive, LockWaitSkip,
							 TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd) != TM_Ok)
			continue;			/* held by another, or gone */
		d = slot_getattr(locked, expires, &isnull);
		if (isnull || DatumGetTimestampTz(d) >= now)
			continue;			/* renewed meanwhile, so it stays */
		d = name_att ? slot_getattr(locked, name_att, &isnull) : (Datum) 0;
		if (name_att && !isnull)
		{
			char	   *name = TextDatumGetCString(d);

			idem_stats_count_at_commit(target->name_kind, name, IDEM_STAT_CLEANUP_DELETED, 1);
			if (archive.open)
				idem_archive_slot(&archive, locked, name);
			pfree(name);
		}
		idem_rows_delete(&rows, 0, locked);
		deleted++;
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(found);
	UnregisterSnapshot(snapshot);
	index_close(index, NoLock);
	idem_archive_end(&archive);
	idem_rows_end(&rows);
	return deleted;
}

/*
 * Delete expired records (and expired inbox entries, acknowledged outbox
 * messages) of the extension in schema nspid in batches of at most
 * batch_size rows per table (per shard on Citus), at most max_batches batches (all of them if
 * max_batches < 0), all in the current transaction.  Returns how many rows
 * were deleted.  idem_cleanup_expired() and the cleanup worker both come
 * here.
 */
int64
idem_cleanup_batches(Oid nspid, int batch_size, int max_batches)
{
	List	   *relids[NTARGETS];
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	int64		total = 0;
	bool		dropped = false;

	/* on Citus, a distributed table's rows are in its shards on this node */
	for (int i = 0; i < (int) NTARGETS; i++)
	{
		Oid			relid = target_relation(nspid, &targets[i], &dropped);

		if (dropped)
			return 0;			/* the extension is gone, so nothing to clean */
		relids[i] = OidIsValid(relid) ? idem_citus_local_relations(relid) : NIL;
	}
	for (int batch = 0; max_batches < 0 || batch < max_batches; batch++)
	{
		bool		full = false;

		for (int i = 0; i < (int) NTARGETS; i++)
		{
			ListCell   *lc;

			foreach(lc, relids[i])
			{
				int64		n;
				Oid			history = InvalidOid;

				/* a record shard's history is the co-located shard, in the same place in the list */
				if (i == TARGET_RECORD &&
					list_length(relids[TARGET_HISTORY]) == list_length(relids[TARGET_RECORD]))
					history = list_nth_oid(relids[TARGET_HISTORY], foreach_current_index(lc));
				CHECK_FOR_INTERRUPTS();
				n = delete_batch(lfirst_oid(lc), &targets[i], now, batch_size, history);
				total += n;
				/* a short batch, so nothing is left, or only rows others hold */
				if (n == batch_size)
					full = true;
			}
		}
		if (!full)
			break;
	}
	return total;
}
