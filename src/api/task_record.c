/*-------------------------------------------------------------------------
 *
 * task_record.c
 *	  The record a task call rewrites: idempotency_record opened as idem's
 *	  owner for an update, a task's row locked by its id, its new version
 *	  built column by column and written; and what ends, marks or fails a
 *	  task in that version.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "citus.h"
#include "task_int.h"
#include "util.h"

void
task_record_open(TaskRecord *tr, const IdemCatalog *cat)
{
	const IdemTableLayout *rt = &cat->tables[IDEM_TABLE_RECORD];
	int			natts;

	tr->att = rt->att;
	idem_become_owner(&tr->identity, cat->owner);
	idem_use_safe_search_path(&tr->identity);
	idem_rows_begin(&tr->rows, &rt->relid, 1, CMD_UPDATE);
	if (idem_catalog_current(cat))
		idem_rows_set_checks(&tr->rows, 0, rt->checks, rt->ncheck);
	tr->heap = tr->rows.rels[0]->ri_RelationDesc;
	natts = RelationGetDescr(tr->heap)->natts;
	tr->values = palloc(natts * sizeof(Datum));
	tr->nulls = palloc(natts * sizeof(bool));
}

/*
 * Open idempotency_record as cat has it and lock task_id's row into
 * *locked, found through indexid (an index whose first column is id),
 * waiting for a holder's short transaction.  TM_Invisible if there is no
 * such row.
 */
static TM_Result
lock_by_id(TaskRecord *tr, const IdemCatalog *cat, Oid indexid, int64 task_id, TupleTableSlot **locked)
{
	Relation	index;
	ScanKeyData skey;
	IndexScanDesc scan;
	TupleTableSlot *found;
	Snapshot	snapshot;
	TM_FailureData tmfd;
	TM_Result	tmres = TM_Invisible;

	task_record_open(tr, cat);
	if (!OidIsValid(indexid))
		indexid = idem_primary_key_index(tr->heap);
	if (!OidIsValid(indexid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table idempotency_record has no primary key"),
				 errhint("Drop and re-create the extension idem.")));
	found = task_record_slot(tr);
	*locked = task_record_slot(tr);

	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	index = index_open(indexid, AccessShareLock);
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(task_id));
	scan = idem_index_beginscan(tr->heap, index, snapshot, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, found))
		tmres = table_tuple_lock(tr->heap, &found->tts_tid, snapshot, *locked,
								 GetCurrentCommandId(false), LockTupleNoKeyExclusive,
								 LockWaitBlock,
								 IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION,
								 &tmfd);
	index_endscan(scan);
	index_close(index, NoLock);
	UnregisterSnapshot(snapshot);
	return tmres;
}

/*
 * Lock task_id's row (waiting for a holder's short transaction) into
 * *locked, with tr open on its table: TM_Ok, or another result (no such
 * task, or gone since).  40001 under REPEATABLE READ for a row changed
 * since the snapshot; READ COMMITTED follows the row to its latest
 * version, as an UPDATE would.  On Citus the task is in one of this
 * node's shards, if here: *cat is pointed at it.
 */
TM_Result
task_record_lock(TaskRecord *tr, IdemCatalog *cat, int64 task_id, TupleTableSlot **locked)
{
	TM_Result	tmres;

	if (cat->tables[IDEM_TABLE_RECORD].distributed)
	{
		IdemCatalog all = *cat;
		int			n = idem_citus_local_shards(&all, IDEM_TABLE_RECORD);

		no_local_shards(n);
		tmres = TM_Invisible;
		for (int i = 0; i < n && tmres == TM_Invisible; i++)
		{
			*cat = all;
			idem_citus_use_local_shard(cat, IDEM_TABLE_RECORD, i);
			tmres = lock_by_id(tr, cat, cat->tables[IDEM_TABLE_RECORD].indexes[REC_INDEX_TASK_ID],
							   task_id, locked);
			if (tmres == TM_Invisible)
				task_record_close(tr);
		}
	}
	else
		tmres = lock_by_id(tr, cat, InvalidOid, task_id, locked);
	if (tmres == TM_Updated && IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update")));
	return tmres;
}

/* A slot for tr's table, kept until task_record_close. */
TupleTableSlot *
task_record_slot(TaskRecord *tr)
{
	return table_slot_create(tr->heap, &tr->rows.estate->es_tupleTable);
}

/* Start the new version from the locked one's columns. */
void
task_record_take(TaskRecord *tr, TupleTableSlot *locked)
{
	int			natts = locked->tts_tupleDescriptor->natts;

	slot_getallattrs(locked);
	memcpy(tr->values, locked->tts_values, natts * sizeof(Datum));
	memcpy(tr->nulls, locked->tts_isnull, natts * sizeof(bool));
}

/* Column col of the new version: d, or NULL. */
void
task_record_put(TaskRecord *tr, int col, Datum d, bool isnull)
{
	if (tr->att[col] == InvalidAttrNumber)
		return;					/* a column of a later version */
	tr->values[tr->att[col] - 1] = d;
	tr->nulls[tr->att[col] - 1] = isnull;
}

/* Replace the locked version by the new one. */
void
task_record_write(TaskRecord *tr, TupleTableSlot *locked)
{
	idem_rows_update(&tr->rows, 0, locked, tr->values, tr->nulls);
}

/* Fire what the updates queued, and give the caller back its rights. */
void
task_record_close(TaskRecord *tr)
{
	idem_rows_end(&tr->rows);
	idem_restore_caller(&tr->identity);
}

/*
 * End the task of tr with status (SUCCEEDED or FAILED_FINAL) at now.  Its
 * record expires after its ttl (or its operation's), and no worker leases
 * it again.  Its request and payload, which only a worker needed, are
 * cleared; the request's fingerprint stays.
 */
void
task_record_end(TaskRecord *tr, IdemStatus status, TimestampTz now, const char *operation)
{
	const Interval *ttl = NULL;

	if (!TR_ISNULL(tr, REC_TASK_TTL))
		ttl = DatumGetIntervalP(TR_VALUE(tr, REC_TASK_TTL));
	TR_SET(tr, REC_STATUS, CStringGetTextDatum(idem_status_name(status)));
	TR_SET(tr, REC_UPDATED, TimestampTzGetDatum(now));
	TR_SET(tr, REC_EXPIRES, TimestampTzGetDatum(idem_record_expiry(status, now, ttl, operation)));
	TR_CLEAR(tr, REC_TASK_DUE);
	TR_CLEAR(tr, REC_TASK_LEASE_EXPIRES);
	TR_CLEAR(tr, REC_TASK_SESSION);
	TR_CLEAR(tr, REC_TASK_REQUEST);
	TR_CLEAR(tr, REC_TASK_PAYLOAD);
	TR_CLEAR(tr, REC_TASK_TRACE);
	task_record_unmark(tr);
}

/*
 * Mark the task of tr uncertain at now: PROCESSING, not leased, out of
 * every plain lease's reach (task_due_at NULL), handed to a reconcile
 * lease from reconcile_at.  Marked since the first time.
 */
void
task_record_mark(TaskRecord *tr, TimestampTz now, TimestampTz reconcile_at)
{
	TR_SET(tr, REC_STATUS, CStringGetTextDatum(idem_status_name(IDEM_STATUS_PROCESSING)));
	TR_SET(tr, REC_UPDATED, TimestampTzGetDatum(now));
	TR_CLEAR(tr, REC_TASK_DUE);
	TR_CLEAR(tr, REC_TASK_LEASE_EXPIRES);
	TR_CLEAR(tr, REC_TASK_SESSION);
	if (TR_ISNULL(tr, REC_TASK_UNCERTAIN))
		TR_SET(tr, REC_TASK_UNCERTAIN, TimestampTzGetDatum(now));
	TR_SET(tr, REC_TASK_RECONCILE_AT, TimestampTzGetDatum(reconcile_at));
}

/* The task of tr is no longer uncertain. */
void
task_record_unmark(TaskRecord *tr)
{
	TR_CLEAR(tr, REC_TASK_UNCERTAIN);
	TR_CLEAR(tr, REC_TASK_RECONCILE_AT);
}

/*
 * End the task of tr as a final failure (task_record_end): HTTP 500 and the
 * body {"error": error}, no headers, no resource.  What the client's repeat
 * gets.
 */
void
task_record_fail(TaskRecord *tr, Jsonb *error, TimestampTz now, const char *operation)
{
	StringInfoData body;

	task_record_end(tr, IDEM_STATUS_FAILED_FINAL, now, operation);
	TR_SET(tr, REC_HTTP, Int32GetDatum(TASK_HTTP_FAILED));
	initStringInfo(&body);
	appendStringInfoString(&body, "{\"error\": ");
	(void) JsonbToCString(&body, &error->root, VARSIZE(error));
	appendStringInfoChar(&body, '}');
	TR_SET(tr, REC_BODY, PointerGetDatum(cstring_to_text_with_len(body.data, body.len)));
	TR_CLEAR(tr, REC_HEADERS);
	TR_CLEAR(tr, REC_RESOURCE);
}
