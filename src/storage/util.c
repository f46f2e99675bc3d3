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
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/pg_depend.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
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
 * The SQL must be fully schema-qualified.  It is parsed again, under the
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
 * The schema of idem's tables and internal functions for the extension
 * extoid installed in extnspid.  It is the schema that is a member of the
 * extension (idem_internal), found by OID in pg_depend, never by name.  An
 * SQL version before 1.13, which this library still serves, has none, and
 * its tables are in the extension's own schema.
 */
static Oid
tables_schema(Oid extoid, Oid extnspid)
{
	Relation	rel = table_open(DependRelationId, AccessShareLock);
	ScanKeyData key[2];
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			nspid = extnspid;

	ScanKeyInit(&key[0], Anum_pg_depend_refclassid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(ExtensionRelationId));
	ScanKeyInit(&key[1], Anum_pg_depend_refobjid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(extoid));
	scan = systable_beginscan(rel, DependReferenceIndexId, true, NULL, 2, key);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		Form_pg_depend dep = (Form_pg_depend) GETSTRUCT(tuple);

		if (dep->classid == NamespaceRelationId && dep->deptype == DEPENDENCY_EXTENSION)
		{
			nspid = dep->objid;
			break;
		}
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return nspid;
}

/*
 * The schema of idem's tables for the SQL function being called: that of
 * the extension the function belongs to (the function's own schema if it
 * belongs to none; before 1.13 every function is in the extension's schema,
 * idem's tables too).
 */
Oid
idem_function_tables_schema(FunctionCallInfo fcinfo)
{
	Oid			fn_oid = fcinfo->flinfo->fn_oid;
	Oid			nspid = get_func_namespace(fn_oid);
	Oid			extoid = getExtensionOfObject(ProcedureRelationId, fn_oid);

	if (!OidIsValid(nspid))
		elog(ERROR, "idem: no schema for function %u", fn_oid);
	return OidIsValid(extoid) ? tables_schema(extoid, nspid) : nspid;
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
 * The schema of idem's tables (tables_schema) and the owner of the
 * extension idem in this database, from its pg_extension row; false when
 * it is not installed.
 */
bool
idem_extension_row(Oid *nspid, Oid *owner)
{
	Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		found;
	Oid			extoid = InvalidOid;

	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("idem"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	found = HeapTupleIsValid(tuple);
	if (found)
	{
		extoid = ((Form_pg_extension) GETSTRUCT(tuple))->oid;
		*nspid = ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace;
		*owner = ((Form_pg_extension) GETSTRUCT(tuple))->extowner;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (found)
		*nspid = tables_schema(extoid, *nspid);
	return found;
}
