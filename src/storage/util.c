/*-------------------------------------------------------------------------
 *
 * util.c
 *	  fmgr and SPI helpers shared by idem's modules.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "utils/fmgroids.h"

#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "idem.h"
#include "util.h"

/* Raise 22004 when a required argument is NULL. */
void
idem_check_not_null(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("argument \"%s\" must not be null", argname)));
}

/*
 * Prepare a statement and keep its plan for the life of the backend.
 * The SQL must be fully schema-qualified: it is parsed again, under the
 * search_path then in force, whenever the plan is invalidated.
 */
SPIPlanPtr
idem_prepare_kept(const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	plan = SPI_prepare(sql, nargs, argtypes);

	if (plan == NULL)
		elog(ERROR, "idem: could not prepare \"%s\": %s",
			 sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "idem: could not keep plan for \"%s\"", sql);
	return plan;
}

/* Free a kept plan, if there is one. */
void
idem_free_kept(SPIPlanPtr *plan)
{
	if (*plan != NULL)
		SPI_freeplan(*plan);
	*plan = NULL;
}

/*
 * The schema idem is installed in: the namespace of the SQL function being
 * called (the extension is not relocatable, so its objects stay together).
 */
Oid
idem_extension_schema(FunctionCallInfo fcinfo)
{
	Oid			nspid = get_func_namespace(fcinfo->flinfo->fn_oid);

	if (!OidIsValid(nspid))
		elog(ERROR, "idem: no schema for function %u", fcinfo->flinfo->fn_oid);
	return nspid;
}

/* The quoted name of a schema, ready to prefix a table name. */
char *
idem_quoted_schema(Oid nspid)
{
	char	   *name = get_namespace_name(nspid);

	if (name == NULL)
		elog(ERROR, "idem: schema %u does not exist", nspid);
	return pstrdup(quote_identifier(name));
}

/*
 * The schema and the owner of the extension idem in this database, from
 * its pg_extension row; false when it is not installed.
 */
bool
idem_extension_row(Oid *nspid, Oid *owner)
{
	Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		found;

	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("idem"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	found = HeapTupleIsValid(tuple);
	if (found)
	{
		*nspid = ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace;
		*owner = ((Form_pg_extension) GETSTRUCT(tuple))->extowner;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}
