/*-------------------------------------------------------------------------
 *
 * record.c
 *	  The idempotency_record row, whatever the operation.  It is read
 *	  through the unique scope index and probed for rows committed since
 *	  the read.  It is written already finished, in the same IdemRows as
 *	  the business row of an operation that has one, and replaced when it
 *	  has expired.
 *
 * The read is the hot path of every call, replays above all.  It costs an
 * index probe, not an executor start-up.  It reads as a statement of the
 * caller's transaction would.  With a fresh snapshot under READ COMMITTED,
 * the transaction's under REPEATABLE READ and SERIALIZABLE (the index and
 * heap access methods take the predicate locks).
 *
 * An expired record is replaced, not updated.  Under the key lock it is
 * locked and deleted, and the new record is inserted when the caller
 * finishes.  So the renewal writes exactly the rows a new key writes, and
 * between idem_begin and idem_finish the cleanup worker cannot take the
 * old record away (it skips locked rows).
 *
 * The answer a record stores (status, body, headers) is built and checked
 * in record_result.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "commands/sequence.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/guc.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "sequence.h"
#include "policy.h"
#include "record.h"
#include "redact.h"
#include "keyxids.h"

/* GUC variables */
int			idem_ttl = 86400;
int			idem_failure_ttl = 600;
int			idem_max_ttl = 30 * 86400;

/* Define the GUCs of this module. */
void
idem_record_init(void)
{
	DefineCustomIntVariable("idem.ttl",
							"How long an idempotency record is kept before its key may be used afresh.",
							NULL,
							&idem_ttl,
							86400, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.failure_ttl",
							"How long a deterministic failure (a 4xx result) is replayed before its key may be used afresh.",
							NULL,
							&idem_failure_ttl,
							600, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.max_ttl",
							"The longest ttl a call may ask for.",
							"A longer ttl argument is refused with SQLSTATE 22023.",
							&idem_max_ttl,
							30 * 86400, 1, INT_MAX,
							PGC_SUSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);
}

/* now + ttl, with the interval's own calendar arithmetic. */
TimestampTz
idem_timestamp_plus(TimestampTz now, const Interval *ttl)
{
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												   TimestampTzGetDatum(now),
												   PointerGetDatum(ttl)));
}

/*
 * now + iv, refused (22023) unless it is later than now: what names the
 * interval argument in the error.
 */
TimestampTz
idem_plus_positive(TimestampTz now, const Interval *iv, const char *what)
{
	TimestampTz t = idem_timestamp_plus(now, iv);

	if (t <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be positive", what),
				 errdetail("The call has %s %s.", what,
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   PointerGetDatum(iv))))));
	return t;
}

/*
 * now + ttl, refused (22023) if the ttl is not positive or longer than
 * idem.max_ttl.
 */
TimestampTz
idem_check_ttl(const Interval *ttl, TimestampTz now)
{
	TimestampTz expires = idem_plus_positive(now, ttl, "ttl");

	if (expires - now > (int64) idem_max_ttl * USECS_PER_SEC)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must not exceed idem.max_ttl (%d seconds)", idem_max_ttl),
				 errdetail("The call has ttl %s.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   PointerGetDatum(ttl))))));
	return expires;
}

/* The ttl argument argno of a call, NULL for the default, else checked. */
Interval *
idem_ttl_arg(FunctionCallInfo fcinfo, int argno, TimestampTz now)
{
	Interval   *ttl;

	if (PG_ARGISNULL(argno))
		return NULL;
	ttl = PG_GETARG_INTERVAL_P(argno);
	(void) idem_check_ttl(ttl, now);
	return ttl;
}

/*
 * When a record of operation finished now with status expires: a success
 * after the call's ttl, else the operation's policy's, else idem.ttl; a
 * deterministic failure after the policy's failure_ttl, else
 * idem.failure_ttl.
 */
TimestampTz
idem_record_expiry(IdemStatus status, TimestampTz now, const Interval *ttl,
				   const char *operation)
{
	const IdemPolicy *policy = idem_policy_of(operation);

	if (status == IDEM_STATUS_FAILED_FINAL)
	{
		if (policy && policy->has_failure_ttl)
			return idem_timestamp_plus(now, &policy->failure_ttl);
		return now + (TimestampTz) idem_failure_ttl * USECS_PER_SEC;
	}
	if (ttl != NULL)
		return idem_timestamp_plus(now, ttl);
	if (policy && policy->has_ttl)
		return idem_timestamp_plus(now, &policy->ttl);
	return now + (TimestampTz) idem_ttl * USECS_PER_SEC;
}

/*
 * The scan keys of scope on an index whose first columns are (owner_id,
 * operation, idempotency_key).  uk_idempotency_scope, idem_history_key.
 */
void
idem_scope_scan_keys(ScanKey skey, Relation index, const IdemScope *scope)
{
	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(scope->owner));
	ScanKeyEntryInitialize(&skey[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[1], F_TEXTEQ, scope->operation_text);
	ScanKeyEntryInitialize(&skey[2], 0, 3, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[2], F_TEXTEQ, scope->key_text);
}

/*
 * Begin a scan of the unique index for the scope under snapshot; the
 * relations stay locked until the end of the transaction, as a statement's
 * do.  key_scan_end closes the scan and the index.
 */
static IndexScanDesc
key_scan_begin(const IdemCatalog *cat, const IdemScope *scope, Snapshot snapshot,
			   Relation *heapp, Relation *indexp, TupleTableSlot **slotp)
{
	Relation	heap = table_open(cat->tables[IDEM_TABLE_RECORD].relid, AccessShareLock);
	Relation	index = index_open(cat->scopeid, AccessShareLock);
	ScanKeyData skey[3];
	IndexScanDesc scan;

	idem_scope_scan_keys(skey, index, scope);
	scan = idem_index_beginscan(heap, index, snapshot, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	*heapp = heap;
	*indexp = index;
	*slotp = table_slot_create(heap, NULL);
	return scan;
}

static void
key_scan_end(IndexScanDesc scan, Relation index)
{
	index_endscan(scan);
	index_close(index, NoLock);
}

/*
 * Scan the unique index for the scope under an MVCC snapshot and return
 * the first row it gives in slot; false if none.  *met: the index had an
 * entry of the key, visible or not (index_getnext_slot, counting).
 */
static bool
scan_key(const IdemCatalog *cat, const IdemScope *scope, Snapshot snapshot,
		 TupleTableSlot **slotp, Relation *heapp, bool *met)
{
	Relation	index;
	IndexScanDesc scan = key_scan_begin(cat, scope, snapshot, heapp, &index, slotp);
	bool		found = false;

	*met = false;
	while (!found && index_getnext_tid(scan, ForwardScanDirection) != NULL)
	{
		*met = true;
		found = index_fetch_heap(scan, *slotp);
	}
	key_scan_end(scan, index);
	return found;
}

/* A varlena column of slot, detoasted and copied into the current context. */
static Datum
copy_column(TupleTableSlot *slot, AttrNumber attnum, bool *isnull)
{
	Datum		d;

	if (attnum == InvalidAttrNumber)
	{
		*isnull = true;
		return (Datum) 0;
	}
	d = slot_getattr(slot, attnum, isnull);
	return *isnull ? (Datum) 0 : PointerGetDatum(PG_DETOAST_DATUM_COPY(d));
}

/*
 * Read the scope's record through the unique index, under the snapshot a
 * statement of the caller's transaction would use.  Returns false when the
 * snapshot sees no record.
 */
bool
idem_record_read(const IdemCatalog *cat, const IdemScope *scope, TimestampTz now,
				 IdemRecord *rec)
{
	const AttrNumber *att = cat->tables[IDEM_TABLE_RECORD].att;
	Snapshot	current = GetTransactionSnapshot();
	Snapshot	snapshot;
	TupleTableSlot *slot;
	Relation	heap;
	bool		found;
	bool		met;

	snapshot = RegisterSnapshot(current);
	rec->read_xmin = snapshot->xmin;
	found = scan_key(cat, scope, snapshot, &slot, &heap, &met);
	rec->read_clean = !met;
	if (found)
	{
		IdemResult *r = &rec->result;
		bool		isnull;
		char	   *status;
		Datum		d;

		rec->tid = slot->tts_tid;
		rec->written_here = TransactionIdIsCurrentTransactionId(
			DatumGetTransactionId(slot_getsysattr(slot, MinTransactionIdAttributeNumber, &isnull)));
		rec->id = DatumGetInt64(slot_getattr(slot, att[REC_ID], &isnull));
		d = slot_getattr(slot, att[REC_HASH], &isnull);
		text_to_cstring_buffer(DatumGetTextPP(d), rec->request_hash, sizeof(IdemFingerprint));
		rec->fp_version = 0;
		if (att[REC_FP_VERSION] != InvalidAttrNumber)
		{
			d = slot_getattr(slot, att[REC_FP_VERSION], &isnull);
			rec->fp_version = isnull ? 0 : DatumGetInt16(d);
		}
		rec->has_digest = false;
		if (att[REC_DIGEST] != InvalidAttrNumber)
		{
			d = slot_getattr(slot, att[REC_DIGEST], &isnull);
			if (!isnull && VARSIZE_ANY_EXHDR(DatumGetPointer(d)) == IDEM_DIGEST_LEN)
			{
				memcpy(rec->digest, VARDATA_ANY(DatumGetPointer(d)), IDEM_DIGEST_LEN);
				rec->has_digest = true;
			}
		}
		rec->created_at = DatumGetTimestampTz(slot_getattr(slot, att[REC_CREATED], &isnull));
		rec->updated_at = DatumGetTimestampTz(slot_getattr(slot, att[REC_UPDATED], &isnull));
		status = TextDatumGetCString(slot_getattr(slot, att[REC_STATUS], &isnull));
		rec->status = idem_status_from_name(status);
		rec->expires_at = DatumGetTimestampTz(slot_getattr(slot, att[REC_EXPIRES], &isnull));
		rec->expired = rec->expires_at < now;

		d = slot_getattr(slot, att[REC_HTTP], &r->http_isnull);
		r->http_status = r->http_isnull ? 0 : DatumGetInt32(d);
		d = slot_getattr(slot, att[REC_RESOURCE], &r->resource_isnull);
		r->resource_id = r->resource_isnull ? 0 : DatumGetInt64(d);
		r->snapshot = copy_column(slot, att[REC_RESPONSE], &r->snapshot_isnull);
		r->body = copy_column(slot, att[REC_BODY], &r->body_isnull);
		r->headers = copy_column(slot, att[REC_HEADERS], &r->headers_isnull);
		r->header_list = copy_column(slot, att[REC_HEADER_LIST], &isnull);
		r->has_header_list = !isnull;
		rec->is_task = false;
		if (att[REC_TASK_ATTEMPTS] != InvalidAttrNumber)
		{
			(void) slot_getattr(slot, att[REC_TASK_ATTEMPTS], &isnull);
			rec->is_task = !isnull;
		}
		rec->uncertain = false;
		if (rec->is_task && att[REC_TASK_UNCERTAIN] != InvalidAttrNumber)
		{
			(void) slot_getattr(slot, att[REC_TASK_UNCERTAIN], &isnull);
			rec->uncertain = !isnull;
		}
	}
	ExecDropSingleTupleTableSlot(slot);
	table_close(heap, NoLock);
	UnregisterSnapshot(snapshot);
	return found;
}

/*
 * Look at the scope's rows with a dirty snapshot, which sees every row not
 * known dead, whatever the caller's snapshot.  Rows committed since it was
 * taken, and rows of transactions still running.  Asked under the key
 * lock, before writing the key.  A row another transaction is still
 * inserting or deleting means that transaction wrote the key (a claim that
 * has given its key lock back, idem_unlock_key, or a writer around idem).
 * IDEM_PROBE_BUSY, with *busy the transaction to wait for.  A row none is
 * writing.  IDEM_PROBE_FOUND (the caller's read may not have seen it).
 */
IdemProbe
idem_record_probe(const IdemCatalog *cat, const IdemScope *scope, TransactionId *busy)
{
	SnapshotData dirty;
	TupleTableSlot *slot;
	Relation	heap;
	Relation	index;
	IndexScanDesc scan;
	IdemProbe	probe = IDEM_PROBE_NONE;

	InitDirtySnapshot(dirty);
	scan = key_scan_begin(cat, scope, &dirty, &heap, &index, &slot);
	while (probe != IDEM_PROBE_BUSY &&
		   index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		*busy = idem_dirty_writer(&dirty);
		probe = TransactionIdIsValid(*busy) ? IDEM_PROBE_BUSY : IDEM_PROBE_FOUND;
	}
	key_scan_end(scan, index);
	ExecDropSingleTupleTableSlot(slot);
	table_close(heap, NoLock);
	return probe;
}

/*
 * Delete the expired record rec, under the key lock, so that a new one can
 * be inserted in its place (see idem_rows_delete_read).
 */
IdemRowDeletion
idem_record_delete_expired(const IdemCatalog *cat, const IdemRecord *rec)
{
	ItemPointerData tid = rec->tid;

	return idem_rows_delete_read(cat->tables[IDEM_TABLE_RECORD].relid, &tid,
								 "an expired record");
}

/*
 * The columns of record that store res, without what the operation's
 * policy redacts.  res is changed to what is stored, so that the
 * caller can return it (idem_finish_stored).  Headers in json form
 * where the table has the column, else as their jsonb object.
 */
static void
set_result(IdemRow *record, const char *operation, IdemResult *res)
{
	if (!res->http_isnull)
		idem_row_set(record, REC_HTTP, Int32GetDatum(res->http_status));
	if (!res->snapshot_isnull)
		idem_row_set(record, REC_RESPONSE, res->snapshot = idem_redact_jsonb(operation, res->snapshot));
	if (!res->body_isnull)
		idem_row_set(record, REC_BODY, res->body = idem_redact_json(operation, res->body));
	if (!res->headers_isnull)
		idem_row_set(record, REC_HEADERS, res->headers = idem_redact_headers(operation, res->headers));
	if (res->has_header_list)
	{
		res->header_list = idem_redact_header_list(operation, res->header_list);
		if (record->table->att[REC_HEADER_LIST] != InvalidAttrNumber)
			idem_row_set(record, REC_HEADER_LIST, res->header_list);
		else
			idem_row_set(record, REC_HEADERS, idem_result_headers_of_list(res->header_list));
	}
	if (!res->resource_isnull)
		idem_row_set(record, REC_RESOURCE, Int64GetDatum(res->resource_id));
}

/*
 * The record's request: its fingerprint, keyed where
 * idem.fingerprint_keys_file has a secret, and its digest under the same
 * version's secret.
 */
static void
set_request(IdemRow *record, const IdemCatalog *cat, IdemRequestPrint *print)
{
	const IdemTableLayout *rt = &cat->tables[IDEM_TABLE_RECORD];
	int			fp_version = 0;
	IdemFingerprint stored;
	const uint8 *digest;

	if (rt->att[REC_FP_VERSION] != InvalidAttrNumber)
		fp_version = idem_fingerprint_sign_version();
	idem_fingerprint_keyed(idem_print_fingerprint(print), fp_version, stored);
	idem_row_set(record, REC_HASH, CStringGetTextDatum(stored));
	if (fp_version > 0)
		idem_row_set(record, REC_FP_VERSION, Int16GetDatum((int16) fp_version));
	if (rt->att[REC_DIGEST] != InvalidAttrNumber &&
		(digest = idem_print_digest(print, idem_catalog_digest_secret(cat), fp_version)) != NULL)
	{
		bytea	   *stored_digest = palloc(VARHDRSZ + IDEM_DIGEST_LEN);

		SET_VARSIZE(stored_digest, VARHDRSZ + IDEM_DIGEST_LEN);
		memcpy(VARDATA(stored_digest), digest, IDEM_DIGEST_LEN);
		idem_row_set(record, REC_DIGEST, PointerGetDatum(stored_digest));
	}
}

/*
 * Claim a key by inserting its record, already finished and holding res
 * (or, for idem_submit, PROCESSING with its task), and return its id.  The
 * business row biz writes (if any) goes into the same IdemRows, first, so
 * that biz can complete res from the row as stored.  The key lock is held
 * and the last probe found no row; once this returns, the caller may give
 * the lock back (idem_unlock_key).  Whatever else writes
 * the table, the unique index stays the arbiter.  A duplicate raises 23505.
 */
int64
idem_record_insert(const IdemCatalog *cat, const IdemScope *scope,
				   IdemRequestPrint *print, IdemStatus status, IdemResult *res,
				   TimestampTz now, TimestampTz expires, const IdemBusinessWrite *biz,
				   const IdemTaskNew *task)
{
	const IdemTableLayout *rt = &cat->tables[IDEM_TABLE_RECORD];
	Oid			relids[IDEM_ROWS_MAX_RELS];
	int			nrels = 0;
	IdemRows	rows;
	IdemRow		record;
	int64		id;
	LOCKTAG		tag;

	relids[nrels++] = rt->relid;
	if (biz)
		relids[nrels++] = cat->tables[biz->table].relid;
	idem_rows_begin(&rows, relids, nrels, CMD_INSERT);
	/* the tables are locked now, so if the catalog is still current, so are its constraints */
	if (idem_catalog_current(cat))
	{
		idem_rows_set_checks(&rows, 0, rt->checks, rt->ncheck);
		if (biz)
			idem_rows_set_checks(&rows, 1, cat->tables[biz->table].checks,
								 cat->tables[biz->table].ncheck);
	}

	if (biz)
		biz->write(&rows, biz->arg, res);

	idem_row_init(&record, rt);
	id = idem_nextval(rt->seq, true);
	idem_row_set(&record, REC_ID, Int64GetDatum(id));
	idem_row_set(&record, REC_OWNER, Int64GetDatum(scope->owner));
	idem_row_set(&record, REC_OPERATION, scope->operation_text);
	idem_row_set(&record, REC_KEY, scope->key_text);
	idem_key_locktag(&tag, scope);
	set_request(&record, cat, print);
	idem_row_set(&record, REC_STATUS, CStringGetTextDatum(idem_status_name(status)));
	set_result(&record, scope->operation, res);
	idem_row_set(&record, REC_CREATED, TimestampTzGetDatum(now));
	idem_row_set(&record, REC_UPDATED, TimestampTzGetDatum(now));
	idem_row_set(&record, REC_EXPIRES, TimestampTzGetDatum(expires));
	if (task)
	{
		if (rt->att[REC_TASK_DUE] == InvalidAttrNumber)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idem's table idempotency_record has no task columns"),
					 errhint("ALTER EXTENSION idem UPDATE.")));
		idem_row_set(&record, REC_TASK_REQUEST, task->request);
		if (task->payload != (Datum) 0)
			idem_row_set(&record, REC_TASK_PAYLOAD, task->payload);
		idem_row_set(&record, REC_TASK_ATTEMPTS, Int32GetDatum(0));
		idem_row_set(&record, REC_TASK_DUE, TimestampTzGetDatum(now));
		if (task->ttl)
			idem_row_set(&record, REC_TASK_TTL, IntervalPGetDatum(task->ttl));
		if (task->trace_context)
			idem_row_set(&record, REC_TASK_TRACE, CStringGetTextDatum(task->trace_context));
	}
	idem_keyxids_note(&tag);
	idem_rows_insert(&rows, 0, record.values, record.nulls);
	idem_rows_end(&rows);
	return id;
}
