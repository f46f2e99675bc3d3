/*-------------------------------------------------------------------------
 *
 * task_attempt.c
 *	  idem_task_attempt: every ended attempt of a task.
 *
 * A lease ends by its holder's idem_complete, idem_fail or
 * idem_fail_unknown, or is found lapsed by the next lease; each writes one
 * row with the lease's worker, token and start as the locked record had
 * them, the outcome and the error (redacted by the caller).  A row expires
 * with its task's record: infinity while the task is unfinished, and when
 * it finishes every earlier row of the task takes the record's expiry.
 * All of a task's rows are written under its record's row lock.  Rows are
 * written as records are, without a statement (rowwrite.c); on Citus into
 * the shard co-located with the owner's records.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgroids.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "citus.h"
#include "task_int.h"
#include "util.h"

enum
{
	ATT_OWNER, ATT_TASK, ATT_TOKEN, ATT_ATTEMPT, ATT_RECONCILE, ATT_WORKER,
	ATT_STARTED, ATT_ENDED, ATT_OUTCOME, ATT_HTTP, ATT_ERROR, ATT_EXPIRES, ATT_NCOLS
};

static const IdemColumnSpec attempt_columns[ATT_NCOLS] = {
	[ATT_OWNER] = {"owner_id", INT8OID, 0, false, false},
	[ATT_TASK] = {"task_id", INT8OID, 0, false, false},
	[ATT_TOKEN] = {"token", INT8OID, 0, false, false},
	[ATT_ATTEMPT] = {"attempt", INT4OID, 0, false, false},
	[ATT_RECONCILE] = {"reconcile", BOOLOID, 0, false, false},
	[ATT_WORKER] = {"worker", VARCHAROID, IDEM_WORKER_MAX_LEN, false, false},
	[ATT_STARTED] = {"started_at", TIMESTAMPTZOID, 0, false, false},
	[ATT_ENDED] = {"ended_at", TIMESTAMPTZOID, 0, false, false},
	[ATT_OUTCOME] = {"outcome", VARCHAROID, 16, false, false},
	[ATT_HTTP] = {"http_status", INT4OID, 0, false, false},
	[ATT_ERROR] = {"error", JSONBOID, 0, false, false},
	[ATT_EXPIRES] = {"expires_at", TIMESTAMPTZOID, 0, false, false},
};

static const IdemTableSpec attempt_spec = {
	"idem_task_attempt", NULL, attempt_columns, ATT_NCOLS,
	"pk_idem_task_attempt", 3, true, {NULL}
};

static int	attempt_table = -1;

/* Register the table (absent before 1.16). */
void
idem_task_attempt_init(void)
{
	attempt_table = idem_catalog_register(&attempt_spec);
}

/* The attempts table of cat for owner (idem_citus_owner_table); NULL before 1.16. */
static const IdemTableLayout *
attempts_of(IdemCatalog *local, const IdemCatalog *cat, int64 owner)
{
	const IdemTableLayout *t = idem_citus_owner_table(local, cat, attempt_table, owner);

	return t && OidIsValid(t->keyindex) ? t : NULL;
}

/* The lease the locked record of tr holds (or held), before the call changes it. */
void
task_attempt_take(TaskAttempt *a, TaskRecord *tr)
{
	a->owner = DatumGetInt64(TR_VALUE(tr, REC_OWNER));
	a->task_id = DatumGetInt64(TR_VALUE(tr, REC_ID));
	a->token = TR_ISNULL(tr, REC_TASK_TOKEN) ? 0 : DatumGetInt64(TR_VALUE(tr, REC_TASK_TOKEN));
	a->attempt = TR_ISNULL(tr, REC_TASK_ATTEMPTS) ? 0 : DatumGetInt32(TR_VALUE(tr, REC_TASK_ATTEMPTS));
	a->reconcile = !TR_ISNULL(tr, REC_TASK_UNCERTAIN);
	a->worker = TR_ISNULL(tr, REC_TASK_WORKER) ? (Datum) 0 :
		PointerGetDatum(DatumGetTextPCopy(TR_VALUE(tr, REC_TASK_WORKER)));
	/* a lease handed out before 1.16 has no start: its first heartbeat is */
	if (!TR_ISNULL(tr, REC_TASK_LEASED))
		a->started = DatumGetTimestampTz(TR_VALUE(tr, REC_TASK_LEASED));
	else if (!TR_ISNULL(tr, REC_TASK_HEARTBEAT))
		a->started = DatumGetTimestampTz(TR_VALUE(tr, REC_TASK_HEARTBEAT));
	else
		a->started = 0;
}

/*
 * Scan the rows of (owner, task) in t through its key, oldest token first,
 * with a snapshot that sees this transaction's own rows.
 */
static IndexScanDesc
scan_task(const IdemTableLayout *t, Relation heap, Relation index, Snapshot snapshot,
		  int64 owner, int64 task_id, ScanKeyData *skey)
{
	IndexScanDesc scan;

	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(owner));
	ScanKeyInit(&skey[1], 2, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(task_id));
	scan = idem_index_beginscan(heap, index, snapshot, 2, 0);
	index_rescan(scan, skey, 2, NULL, 0);
	return scan;
}

/* The task finished: its earlier rows expire with its record, at expires. */
static void
expire_earlier(const IdemTableLayout *t, const TaskAttempt *a, TimestampTz expires)
{
	IdemRows	rows;
	Relation	heap;
	Relation	index;
	ScanKeyData skey[2];
	IndexScanDesc scan;
	TupleTableSlot *found;
	TupleTableSlot *locked;
	Snapshot	snapshot;
	AttrNumber	att_expires = t->att[ATT_EXPIRES];

	idem_rows_begin(&rows, &t->relid, 1, CMD_UPDATE);
	heap = rows.rels[0]->ri_RelationDesc;
	index = index_open(t->keyindex, AccessShareLock);
	found = table_slot_create(heap, &rows.estate->es_tupleTable);
	locked = table_slot_create(heap, &rows.estate->es_tupleTable);
	CommandCounterIncrement();
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	scan = scan_task(t, heap, index, snapshot, a->owner, a->task_id, skey);
	while (index_getnext_slot(scan, ForwardScanDirection, found))
	{
		TM_FailureData tmfd;
		bool		isnull;
		Datum		d = slot_getattr(found, att_expires, &isnull);
		int			natts = RelationGetDescr(heap)->natts;
		Datum	   *values;
		bool	   *nulls;

		if (!isnull && !TIMESTAMP_NOT_FINITE(DatumGetTimestampTz(d)))
			continue;
		/* written under the record's lock: nobody else holds the row */
		if (table_tuple_lock(heap, &found->tts_tid, snapshot, locked, GetCurrentCommandId(false),
							 LockTupleNoKeyExclusive, LockWaitBlock, 0, &tmfd) != TM_Ok)
			continue;
		slot_getallattrs(locked);
		values = palloc(natts * sizeof(Datum));
		nulls = palloc(natts * sizeof(bool));
		memcpy(values, locked->tts_values, natts * sizeof(Datum));
		memcpy(nulls, locked->tts_isnull, natts * sizeof(bool));
		values[att_expires - 1] = TimestampTzGetDatum(expires);
		nulls[att_expires - 1] = false;
		idem_rows_update(&rows, 0, locked, values, nulls);
	}
	index_endscan(scan);
	UnregisterSnapshot(snapshot);
	index_close(index, NoLock);
	idem_rows_end(&rows);
}

/*
 * Write the row of attempt a, ended at now with outcome (http_status 0:
 * none; error 0: none), as idem's owner (the task call's TaskRecord is
 * open).  It expires with the record as tr now has it; if the task is
 * finished, so do its earlier rows.  Nothing before 1.16.
 */
void
task_attempt_write(const TaskAttempt *a, const IdemCatalog *cat, TaskRecord *tr,
				   const char *outcome, int32 http_status, Datum error, TimestampTz now)
{
	IdemCatalog local;
	const IdemTableLayout *t = attempts_of(&local, cat, a->owner);
	IdemRows	rows;
	IdemRow		row;
	TimestampTz expires = DatumGetTimestampTz(TR_VALUE(tr, REC_EXPIRES));

	if (t == NULL || a->token == 0 || a->worker == (Datum) 0)
		return;
	idem_rows_begin(&rows, &t->relid, 1, CMD_INSERT);
	idem_row_init(&row, t);
	idem_row_set(&row, ATT_OWNER, Int64GetDatum(a->owner));
	idem_row_set(&row, ATT_TASK, Int64GetDatum(a->task_id));
	idem_row_set(&row, ATT_TOKEN, Int64GetDatum(a->token));
	idem_row_set(&row, ATT_ATTEMPT, Int32GetDatum(a->attempt));
	idem_row_set(&row, ATT_RECONCILE, BoolGetDatum(a->reconcile));
	idem_row_set(&row, ATT_WORKER, a->worker);
	idem_row_set(&row, ATT_STARTED, TimestampTzGetDatum(a->started ? a->started : now));
	idem_row_set(&row, ATT_ENDED, TimestampTzGetDatum(now));
	idem_row_set(&row, ATT_OUTCOME, CStringGetTextDatum(outcome));
	if (http_status != 0)
		idem_row_set(&row, ATT_HTTP, Int32GetDatum(http_status));
	if (error != (Datum) 0)
		idem_row_set(&row, ATT_ERROR, error);
	idem_row_set(&row, ATT_EXPIRES, TimestampTzGetDatum(expires));
	idem_rows_insert(&rows, 0, row.values, row.nulls);
	idem_rows_end(&rows);
	/* the earlier leases of a finished task (this one was its first if none) */
	if (!TIMESTAMP_NOT_FINITE(expires) &&
		(a->attempt > 1 || !TR_ISNULL(tr, REC_TASK_RECONCILES) || !TR_ISNULL(tr, REC_TASK_LAPSES)))
		expire_earlier(t, a, expires);
}

/* Append "name": the JSON of timestamptz ts. */
static void
append_time(StringInfo out, const char *name, Datum ts)
{
	char		buf[MAXDATELEN + 1];

	appendStringInfo(out, ", \"%s\": \"%s\"", name, JsonEncodeDateTime(buf, ts, TIMESTAMPTZOID, NULL));
}

/*
 * The ended attempts of (owner, task_id) as a JSON array, oldest first:
 * [{"attempt", "reconcile", "worker", "token", "started_at", "ended_at",
 * "outcome", "http_status", "error"}, ...].  [] before 1.16.
 */
Datum
task_attempts_json(const IdemCatalog *cat, int64 owner, int64 task_id)
{
	IdemCatalog local;
	const IdemTableLayout *t = attempts_of(&local, cat, owner);
	StringInfoData out;
	Relation	heap;
	Relation	index;
	ScanKeyData skey[2];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	Snapshot	snapshot;
	bool		first = true;

	initStringInfo(&out);
	appendStringInfoChar(&out, '[');
	if (t != NULL)
	{
		heap = table_open(t->relid, AccessShareLock);
		index = index_open(t->keyindex, AccessShareLock);
		slot = table_slot_create(heap, NULL);
		CommandCounterIncrement();
		snapshot = RegisterSnapshot(GetLatestSnapshot());
		scan = scan_task(t, heap, index, snapshot, owner, task_id, skey);
		while (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			Datum		d;

			slot_getallattrs(slot);
			appendStringInfo(&out, "%s{\"attempt\": %d, \"reconcile\": %s, \"worker\": ", first ? "" : ", ",
							 DatumGetInt32(slot_getattr(slot, t->att[ATT_ATTEMPT], &isnull)),
							 DatumGetBool(slot_getattr(slot, t->att[ATT_RECONCILE], &isnull)) ? "true" : "false");
			escape_json(&out, TextDatumGetCString(slot_getattr(slot, t->att[ATT_WORKER], &isnull)));
			appendStringInfo(&out, ", \"token\": " INT64_FORMAT,
							 DatumGetInt64(slot_getattr(slot, t->att[ATT_TOKEN], &isnull)));
			append_time(&out, "started_at", slot_getattr(slot, t->att[ATT_STARTED], &isnull));
			append_time(&out, "ended_at", slot_getattr(slot, t->att[ATT_ENDED], &isnull));
			appendStringInfo(&out, ", \"outcome\": \"%s\"",
							 TextDatumGetCString(slot_getattr(slot, t->att[ATT_OUTCOME], &isnull)));
			d = slot_getattr(slot, t->att[ATT_HTTP], &isnull);
			if (isnull)
				appendStringInfoString(&out, ", \"http_status\": null");
			else
				appendStringInfo(&out, ", \"http_status\": %d", DatumGetInt32(d));
			appendStringInfoString(&out, ", \"error\": ");
			d = slot_getattr(slot, t->att[ATT_ERROR], &isnull);
			if (isnull)
				appendStringInfoString(&out, "null");
			else
			{
				Jsonb	   *error = DatumGetJsonbP(d);

				(void) JsonbToCString(&out, &error->root, VARSIZE(error));
			}
			appendStringInfoChar(&out, '}');
			first = false;
		}
		index_endscan(scan);
		UnregisterSnapshot(snapshot);
		ExecDropSingleTupleTableSlot(slot);
		index_close(index, NoLock);
		table_close(heap, NoLock);
	}
	appendStringInfoChar(&out, ']');
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(out.data));
}
