/*-------------------------------------------------------------------------
 *
 * util.c
 *	  fmgr and SPI helpers shared by idem's modules.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

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
