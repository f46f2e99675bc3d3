/*-------------------------------------------------------------------------
 *
 * audit.c
 *	  idem_audit_entries, the rows of the idem_audit view.  They are the
 *	  audit fields of the live records and of idem_history, one trail.
 *	  idem_task_attempt_entries, the rows of idem_task_attempts: every
 *	  ended attempt of a task, and the lease in progress.
 *
 * An operator or an application reads the view.  The function reads as
 * idem's owner, since the caller has no privilege on the tables.  It hands
 * back only the owners the caller may see.  A member of pg_monitor sees
 * every owner, any other role those of its idem.allowed_owners (binding.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/tuplestore.h"

#include "idem.h"
#include "util.h"
#include "identity.h"
#include "binding.h"

PG_FUNCTION_INFO_V1(idem_audit_entries);
PG_FUNCTION_INFO_V1(idem_task_attempt_entries);

/*
 * The query of idem_audit_entries.  The live records and the history, the
 * audit fields only, as the view's columns.  %2$s is the schema, quoted;
 * %1$s and %3$s the first part's owner condition (owner_cond), %4$s and
 * %5$s the second's.
 */
static const char audit_query[] =
	"SELECT r.owner_id, r.operation::pg_catalog.text, r.idempotency_key::pg_catalog.text, r.id,"
	"       r.status::pg_catalog.text, r.http_status, r.resource_id, r.request_hash::pg_catalog.text,"
	"       r.created_at, r.updated_at, r.expires_at, NULL::pg_catalog.timestamptz,"
	"       NULL::pg_catalog.timestamptz, true"
	"  FROM %1$s %2$s.idempotency_record r WHERE %3$s"
	" UNION ALL "
	"SELECT h.owner_id, h.operation::pg_catalog.text, h.idempotency_key::pg_catalog.text, h.record_id,"
	"       h.status::pg_catalog.text, h.http_status, h.resource_id, h.request_hash::pg_catalog.text,"
	"       h.created_at, h.updated_at, h.expires_at, h.archived_at, h.audit_until, false"
	"  FROM %4$s %2$s.idem_history h WHERE %5$s";

/* The query of idem_task_attempt_entries, as audit_query's. */
static const char attempt_query[] =
	"SELECT a.owner_id, a.task_id, r.operation::pg_catalog.text, r.idempotency_key::pg_catalog.text,"
	"       a.attempt, a.reconcile, a.worker::pg_catalog.text, a.token, a.started_at, a.ended_at,"
	"       a.outcome::pg_catalog.text, a.http_status, a.error"
	"  FROM %1$s %2$s.idem_task_attempt a JOIN %2$s.idempotency_record r"
	"    ON r.owner_id OPERATOR(pg_catalog.=) a.owner_id AND r.id OPERATOR(pg_catalog.=) a.task_id"
	" WHERE %3$s"
	" UNION ALL "
	"SELECT r.owner_id, r.id, r.operation::pg_catalog.text, r.idempotency_key::pg_catalog.text,"
	"       r.task_attempts, r.task_uncertain_since IS NOT NULL, r.task_worker::pg_catalog.text, r.task_token,"
	"       r.task_leased_at, NULL, NULL, NULL, NULL"
	"  FROM %4$s %2$s.idempotency_record r"
	" WHERE r.task_lease_expires_at IS NOT NULL AND (%5$s)"
	" ORDER BY 1, 2, 8";

/* Rows fetched from the query's cursor at a time. */
#define AUDIT_FETCH		1000

/*
 * The query's FROM prefix and its condition on alias's owner_id.  $1 is the
 * owner asked for, or NULL.  A role bound by idem.allowed_owners that is
 * not pg_monitor also has its ranges ($2, $3) joined, so that only those
 * owners' rows are read, through the owner's index.
 */
static void
owner_cond(bool bound, char alias, char **from, char **cond)
{
	*from = bound ? "ROWS FROM (pg_catalog.unnest($2::pg_catalog.int8[]), pg_catalog.unnest($3::pg_catalog.int8[])) AS b (lo, hi)," : "";
	*cond = bound ?
		psprintf("%c.owner_id OPERATOR(pg_catalog.>=) b.lo AND %c.owner_id OPERATOR(pg_catalog.<=) b.hi"
				 " AND ($1 IS NULL OR %c.owner_id OPERATOR(pg_catalog.=) $1)", alias, alias, alias) :
		psprintf("$1 IS NULL OR %c.owner_id OPERATOR(pg_catalog.=) $1", alias);
}

/*
 * The rows of query (audit_query's shape, ncols columns, owner_id first)
 * for the owner argument of fcinfo.  A member of pg_monitor gets every
 * owner's (or owner's only), any other role those of the owners its
 * idem.allowed_owners names.  The rows are read as idem's owner, since the
 * caller has no privilege on the tables.  A cursor reads them a batch at a
 * time into the result's tuplestore, which keeps work_mem and spills the
 * rest to disk.  So the backend's memory does not grow with the trail.
 */
static Datum
entries(FunctionCallInfo fcinfo, const char *query, char alias1, char alias2, int ncols)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		every_owner = has_privs_of_role(GetUserId(), ROLE_PG_MONITOR);
	Oid			nspid = InvalidOid;
	Oid			owner = InvalidOid;
	IdemIdentity identity = {0};
	char	   *schema;
	Oid			argtypes[3] = {INT8OID, INT8ARRAYOID, INT8ARRAYOID};
	Datum		args[3] = {PG_NARGS() > 0 && !PG_ARGISNULL(0) ? PG_GETARG_DATUM(0) : (Datum) 0};
	char		nulls[3] = {PG_NARGS() > 0 && !PG_ARGISNULL(0) ? ' ' : 'n', ' ', ' '};
	int64	   *lo = NULL;
	int64	   *hi = NULL;
	int			nranges = every_owner ? -1 : idem_owner_ranges(&lo, &hi);
	char	   *rfrom,
			   *rcond,
			   *hfrom,
			   *hcond;
	Portal		portal;

	Assert(ncols <= 16);
	InitMaterializedSRF(fcinfo, 0);
	if (!idem_extension_row(&nspid, &owner) || nranges == 0)
		return (Datum) 0;
	if (nranges > 0)
	{
		Datum	   *los = palloc(sizeof(Datum) * nranges);
		Datum	   *his = palloc(sizeof(Datum) * nranges);

		for (int i = 0; i < nranges; i++)
		{
			los[i] = Int64GetDatum(lo[i]);
			his[i] = Int64GetDatum(hi[i]);
		}
		args[1] = PointerGetDatum(construct_array(los, nranges, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		args[2] = PointerGetDatum(construct_array(his, nranges, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	}
	owner_cond(nranges > 0, alias1, &rfrom, &rcond);
	owner_cond(nranges > 0, alias2, &hfrom, &hcond);
	schema = idem_quoted_schema(nspid);
	idem_become_owner(&identity, owner);
	idem_use_safe_search_path(&identity);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idem: SPI_connect failed");
	portal = SPI_cursor_open_with_args(NULL, psprintf(query, rfrom, schema, rcond, hfrom, hcond),
									   nranges > 0 ? 3 : 1, argtypes, args, nulls, true,
									   CURSOR_OPT_NO_SCROLL);
	for (;;)
	{
		SPI_cursor_fetch(portal, true, AUDIT_FETCH);
		if (SPI_processed == 0)
			break;
		for (uint64 i = 0; i < SPI_processed; i++)
		{
			Datum		values[16];
			bool		isnull[16];

			heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, values, isnull);
			if (every_owner || idem_owner_allowed(DatumGetInt64(values[0])))
				tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
		}
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_cursor_close(portal);
	SPI_finish();
	idem_restore_caller(&identity);
	return (Datum) 0;
}

/* SQL: idem_audit_entries(owner bigint DEFAULT NULL) returns the rows of idem_audit. */
Datum
idem_audit_entries(PG_FUNCTION_ARGS)
{
	return entries(fcinfo, audit_query, 'r', 'h', 14);
}

/*
 * SQL: idem_task_attempt_entries(owner bigint DEFAULT NULL) returns the rows
 * of idem_task_attempts, oldest token first per task.
 */
Datum
idem_task_attempt_entries(PG_FUNCTION_ARGS)
{
	return entries(fcinfo, attempt_query, 'a', 'r', 13);
}
