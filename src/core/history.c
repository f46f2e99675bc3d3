/*-------------------------------------------------------------------------
 *
 * history.c
 *	  idem_history.  When a finished record expires, the audit fields
 *	  of its execution (owner, operation, key, request fingerprint, status,
 *	  HTTP status, resource id, times) outlive it for the operation's audit
 *	  period, its policy's audit_ttl or idem.audit_ttl.  They are moved here
 *	  by whichever comes first: the cleanup deleting the expired record
 *	  (cleanup.c), or the key executing afresh (claim.c).  Requests and
 *	  responses go with the record.
 *
 *	  A key whose operation refuses reuse (reuse_after_expiry 'refuse') is
 *	  refused with IK007 while its record, or a row here, is in its audit
 *	  period.  idem_history_in_audit looks it up.
 *
 *	  Rows are written as records are, without a statement (rowwrite.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"

#include "idem.h"
#include "compat.h"
#include "binding.h"
#include "citus.h"
#include "history.h"
#include "identity.h"
#include "policy.h"
#include "util.h"

static const IdemColumnSpec history_columns[HIST_NCOLS] = {
	[HIST_OWNER] = {"owner_id", INT8OID, 0, false, false},
	[HIST_OPERATION] = {"operation", VARCHAROID, IDEM_OPERATION_MAX_LEN, false, false},
	[HIST_KEY] = {"idempotency_key", VARCHAROID, IDEM_KEY_MAX_LEN, false, false},
	[HIST_RECORD] = {"record_id", INT8OID, 0, false, false},
	[HIST_HASH] = {"request_hash", BPCHAROID, IDEM_HASH_HEX_LEN, true, false},
	[HIST_FP_VERSION] = {"fingerprint_version", INT2OID, 0, false, false},
	[HIST_STATUS] = {"status", VARCHAROID, 16, false, false},
	[HIST_HTTP] = {"http_status", INT4OID, 0, false, false},
	[HIST_RESOURCE] = {"resource_id", INT8OID, 0, false, false},
	[HIST_CREATED] = {"created_at", TIMESTAMPTZOID, 0, false, false},
	[HIST_UPDATED] = {"updated_at", TIMESTAMPTZOID, 0, false, false},
	[HIST_EXPIRES] = {"expires_at", TIMESTAMPTZOID, 0, false, false},
	[HIST_ARCHIVED] = {"archived_at", TIMESTAMPTZOID, 0, false, false},
	[HIST_AUDIT_UNTIL] = {"audit_until", TIMESTAMPTZOID, 0, false, false},
};

#define HIST_INDEX_KEY 0		/* idem_history_key: (owner_id, operation, idempotency_key) */

static const IdemTableSpec history_spec = {
	"idem_history", NULL, history_columns, HIST_NCOLS,
	NULL, 0, true, {[HIST_INDEX_KEY] = "idem_history_key"}
};

int			idem_history_table = -1;


/* Register the table. */
void
idem_history_init(void)
{
	idem_history_table = idem_catalog_register(&history_spec);
}

/*
 * The record columns a history row copies, by name, in relation rel: 0
 * for those it lacks (fingerprint_version before 1.11), and for the
 * history's own (archived_at, audit_until).
 */
static void
map_record_columns(Oid rel, AttrNumber *att)
{
	for (int c = 0; c < HIST_NCOLS; c++)
	{
		const char *name = c == HIST_RECORD ? "id" : history_columns[c].name;

		att[c] = (c == HIST_ARCHIVED || c == HIST_AUDIT_UNTIL) ? InvalidAttrNumber :
			get_attnum(rel, name);
	}
}

/*
 * Open history (a table, or its shard placed here) for the rows archived
 * from record (the same) in one batch.  False, with nothing opened, if
 * history lacks a column this library writes.
 */
bool
idem_archive_begin(IdemArchive *a, Oid history, Oid record, TimestampTz now)
{
	Relation	rel;

	memset(a, 0, sizeof(IdemArchive));
	rel = table_open(history, AccessShareLock);
	a->layout.relid = history;
	a->layout.natts = RelationGetDescr(rel)->natts;
	a->layout.att = palloc0(sizeof(AttrNumber) * HIST_NCOLS);
	for (int c = 0; c < HIST_NCOLS; c++)
		if ((a->layout.att[c] = get_attnum(history, history_columns[c].name)) == InvalidAttrNumber)
		{
			table_close(rel, AccessShareLock);
			return false;
		}
	table_close(rel, NoLock);
	map_record_columns(record, a->rec_att);
	a->now = now;
	idem_rows_begin(&a->rows, &history, 1, CMD_INSERT);
	a->open = true;
	return true;
}

/*
 * Archive the record in slot (locked, about to be deleted), of operation.
 * A history row if the operation keeps an audit period that has not ended.
 */
void
idem_archive_slot(IdemArchive *a, TupleTableSlot *record, const char *operation)
{
	IdemRow		row;
	TimestampTz until;
	bool		isnull;
	Datum		expires = slot_getattr(record, a->rec_att[HIST_EXPIRES], &isnull);

	if (isnull || !idem_audit_until(operation, DatumGetTimestampTz(expires), &until) ||
		until <= a->now)
		return;
	idem_row_init(&row, &a->layout);
	for (int c = 0; c < HIST_NCOLS; c++)
	{
		Datum		d;

		if (a->rec_att[c] == InvalidAttrNumber)
			continue;
		d = slot_getattr(record, a->rec_att[c], &isnull);
		if (!isnull)
			idem_row_set(&row, c, d);
	}
	idem_row_set(&row, HIST_ARCHIVED, TimestampTzGetDatum(a->now));
	idem_row_set(&row, HIST_AUDIT_UNTIL, TimestampTzGetDatum(until));
	idem_rows_insert(&a->rows, 0, row.values, row.nulls);
}

void
idem_archive_end(IdemArchive *a)
{
	if (a->open)
		idem_rows_end(&a->rows);
	a->open = false;
}

/* The history table of cat for owner (idem_citus_owner_table); NULL before 1.11. */
static const IdemTableLayout *
history_of(IdemCatalog *local, const IdemCatalog *cat, int64 owner)
{
	return idem_citus_owner_table(local, cat, idem_history_table, owner);
}

/*
 * The key's record rec expired and is being replaced (claim.c deleted it
 * under the key lock).  Keep its audit fields if its operation has an
 * audit period that has not ended.
 */
void
idem_history_archive(const IdemCatalog *cat, const IdemScope *scope,
					 const IdemRecord *rec, TimestampTz now)
{
	IdemCatalog local;
	const IdemTableLayout *t = history_of(&local, cat, scope->owner);
	TimestampTz until;
	IdemRows	rows;
	IdemRow		row;

	if (t == NULL || !idem_audit_until(scope->operation, rec->expires_at, &until) || until <= now)
		return;
	idem_rows_begin(&rows, &t->relid, 1, CMD_INSERT);
	idem_row_init(&row, t);
	idem_row_set(&row, HIST_OWNER, Int64GetDatum(scope->owner));
	idem_row_set(&row, HIST_OPERATION, scope->operation_text);
	idem_row_set(&row, HIST_KEY, scope->key_text);
	idem_row_set(&row, HIST_RECORD, Int64GetDatum(rec->id));
	idem_row_set(&row, HIST_HASH, CStringGetTextDatum(rec->request_hash));
	if (rec->fp_version > 0)
		idem_row_set(&row, HIST_FP_VERSION, Int16GetDatum((int16) rec->fp_version));
	idem_row_set(&row, HIST_STATUS, CStringGetTextDatum(idem_status_name(rec->status)));
	if (!rec->result.http_isnull)
		idem_row_set(&row, HIST_HTTP, Int32GetDatum(rec->result.http_status));
	if (!rec->result.resource_isnull)
		idem_row_set(&row, HIST_RESOURCE, Int64GetDatum(rec->result.resource_id));
	idem_row_set(&row, HIST_CREATED, TimestampTzGetDatum(rec->created_at));
	idem_row_set(&row, HIST_UPDATED, TimestampTzGetDatum(rec->updated_at));
	idem_row_set(&row, HIST_EXPIRES, TimestampTzGetDatum(rec->expires_at));
	idem_row_set(&row, HIST_ARCHIVED, TimestampTzGetDatum(now));
	idem_row_set(&row, HIST_AUDIT_UNTIL, TimestampTzGetDatum(until));
	idem_rows_insert(&rows, 0, row.values, row.nulls);
	idem_rows_end(&rows);
}

/*
 * Is an earlier execution of the key in its audit period (a history row
 * whose audit_until is after now)?  Read as the caller's statement would
 * (the snapshot idem_record_read used, or a later one); *until is the
 * latest such audit_until.
 */
bool
idem_history_in_audit(const IdemCatalog *cat, const IdemScope *scope, TimestampTz now,
					  TimestampTz *until)
{
	IdemCatalog local;
	const IdemTableLayout *t = history_of(&local, cat, scope->owner);
	Relation	heap;
	Relation	index;
	ScanKeyData skey[3];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	Snapshot	snapshot;
	bool		found = false;

	if (t == NULL || !OidIsValid(t->indexes[HIST_INDEX_KEY]))
		return false;
	heap = table_open(t->relid, AccessShareLock);
	index = index_open(t->indexes[HIST_INDEX_KEY], AccessShareLock);
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	idem_scope_scan_keys(skey, index, scope);
	scan = idem_index_beginscan(heap, index, snapshot, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	slot = table_slot_create(heap, NULL);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		d = slot_getattr(slot, t->att[HIST_AUDIT_UNTIL], &isnull);

		if (!isnull && DatumGetTimestampTz(d) > now &&
			(!found || DatumGetTimestampTz(d) > *until))
		{
			*until = DatumGetTimestampTz(d);
			found = true;
		}
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	index_close(index, NoLock);
	table_close(heap, NoLock);
	return found;
}
