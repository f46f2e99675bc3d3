/*-------------------------------------------------------------------------
 *
 * audit.c
 *	  idem_audit_entries, the rows of the idem_audit view: the audit fields
 *	  of the live records and of idem_history (history.c), one trail.
 *
 * The view is what an operator or an application reads; the function reads
 * as idem's owner, since the caller has no privilege on the tables, and
 * hands back only the owners the caller may see (pg_monitor: every owner;
 * else those of its idem.allowed_owners, binding.c).
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
#include "utils/tuplestore.h"

#include "idem.h"
#include "util.h"
#include "identity.h"
#include "binding.h"

PG_FUNCTION_INFO_V1(idem_audit_entries);

/*
 * The query of idem_audit_entries: the live records and the history, the
 * audit fields only, as the view's columns.  %s is the schema, quoted.
 */
static const char audit_query[] =
	"SELECT r.owner_id, r.operation::pg_catalog.text, r.idempotency_key::pg_catalog.text, r.id,"
	"       r.status::pg_catalog.text, r.http_status, r.resource_id, r.request_hash::pg_catalog.text,"
	"       r.created_at, r.updated_at, r.expires_at, NULL::pg_catalog.timestamptz,"
	"       NULL::pg_catalog.timestamptz, true"
	"  FROM %s.idempotency_record r WHERE $1 IS NULL OR r.owner_id OPERATOR(pg_catalog.=) $1"
	" UNION ALL "
	"SELECT h.owner_id, h.operation::pg_catalog.text, h.idempotency_key::pg_catalog.text, h.record_id,"
	"       h.status::pg_catalog.text, h.http_status, h.resource_id, h.request_hash::pg_catalog.text,"
	"       h.created_at, h.updated_at, h.expires_at, h.archived_at, h.audit_until, false"
	"  FROM %s.idem_history h WHERE $1 IS NULL OR h.owner_id OPERATOR(pg_catalog.=) $1";

/*
 * SQL: idem_audit_entries(owner bigint DEFAULT NULL) returns the rows of
 * idem_audit: every owner's (or owner's only) for a member of pg_monitor,
 * else those of the owners the caller's idem.allowed_owners names.  Read
 * as idem's owner (the caller has no privilege on the tables).
 */
Datum
idem_audit_entries(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		every_owner = has_privs_of_role(GetUserId(), ROLE_PG_MONITOR);
	Oid			nspid = InvalidOid;
	Oid			owner = InvalidOid;
	IdemIdentity identity = {0};
	char	   *schema;
	Oid			argtypes[1] = {INT8OID};
	Datum		args[1] = {PG_NARGS() > 0 && !PG_ARGISNULL(0) ? PG_GETARG_DATUM(0) : (Datum) 0};

	InitMaterializedSRF(fcinfo, 0);
	if (!idem_extension_row(&nspid, &owner))
		return (Datum) 0;
	schema = idem_quoted_schema(nspid);
	idem_become_owner(&identity, owner);
	idem_use_safe_search_path(&identity);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idem: SPI_connect failed");
	if (SPI_execute_with_args(psprintf(audit_query, schema, schema), 1, argtypes, args,
							  PG_ARGISNULL(0) ? "n" : " ", true, 0) != SPI_OK_SELECT)
		elog(ERROR, "idem: reading the audit trail failed");
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		Datum		values[14];
		bool		nulls[14];

		heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, values, nulls);
		if (every_owner || idem_owner_allowed(DatumGetInt64(values[0])))
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	SPI_finish();
	idem_restore_caller(&identity);
	return (Datum) 0;
}
