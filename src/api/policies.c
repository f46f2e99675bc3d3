/*-------------------------------------------------------------------------
 *
 * policies.c
 *	  idem_set_policy and idem_drop_policy, the per-operation settings
 *	  kept in idem_policy, and the trigger that tells every backend the
 *	  table changed.  src/core/policy.c keeps each backend's copy.
 *
 *	  idem_set_policy tells an omitted argument (unchanged) from an
 *	  explicit NULL (back to the GUC).  An omitted argument is its default,
 *	  a call of a marker function (idem_policy_unchanged_*()), which the
 *	  call's expression still shows.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "catalog/dependency.h"
#include "catalog/pg_proc.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/primnodes.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "identity.h"
#include "key.h"
#include "policy.h"
#include "record.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_set_policy);
PG_FUNCTION_INFO_V1(idem_drop_policy);
PG_FUNCTION_INFO_V1(idem_policy_unchanged);
PG_FUNCTION_INFO_V1(idem_policy_changed);

/* The settings of idem_set_policy, in argument order after operation. */
#define POLICY_NARGS 13
enum
{
	SET_TTL, SET_FAILURE_TTL, SET_WAIT_TIMEOUT, SET_MAX_ATTEMPTS, SET_RETRY_BASE, SET_RETRY_MAX,
	SET_AUDIT_TTL, SET_REUSE, SET_REDACT, SET_KEY_FORMAT, SET_REJECT_WEAK,
	SET_UNCERTAIN, SET_RECONCILE_WITHIN
};
static const char *const setting_names[POLICY_NARGS] = {
	"ttl", "failure_ttl", "wait_timeout", "max_attempts", "retry_base", "retry_max",
	"audit_ttl", "reuse_after_expiry", "redact", "key_format", "reject_weak_keys",
	"uncertain", "reconcile_within"
};
static const Oid setting_types[POLICY_NARGS] = {
	INTERVALOID, INTERVALOID, INTERVALOID, INT4OID, INTERVALOID, INTERVALOID,
	INTERVALOID, TEXTOID, TEXTARRAYOID, TEXTOID, BOOLOID,
	TEXTOID, INTERVALOID
};

/*
 * The argument of setting i: its place in the 1.16 signature, or, while
 * the database has not been updated, in the 1.11 one (without uncertain
 * and reconcile_within: -1) or the 1.10 one (nor audit_ttl and
 * reuse_after_expiry).
 */
static int
setting_arg(FunctionCallInfo fcinfo, int i)
{
	if (PG_NARGS() > POLICY_NARGS)
		return i + 1;
	if (i == SET_UNCERTAIN || i == SET_RECONCILE_WITHIN)
		return -1;
	if (PG_NARGS() > POLICY_NARGS - 2)
		return i + 1;
	if (i == SET_AUDIT_TTL || i == SET_REUSE)
		return -1;
	return i < SET_AUDIT_TTL ? i + 1 : i - 1;
}

/* SQL: idem_policy_unchanged_*(): the default of an omitted argument (NULL). */
Datum
idem_policy_unchanged(PG_FUNCTION_ARGS)
{
	PG_RETURN_NULL();
}

/* SQL: the statement trigger of idem_policy, which makes every backend read it anew. */
Datum
idem_policy_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem_policy_changed() must be called as a trigger")));
	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	return PointerGetDatum(NULL);
}

/*
 * Only a superuser or the extension's owner (or a member of its role) sets
 * or drops policies: 42501.  Returns the schema of idem's tables; *owner
 * is the extension's owner.
 */
static Oid
check_policy_admin(const char *what, Oid *owner)
{
	Oid			nspid = InvalidOid;

	if (!idem_extension_row(&nspid, owner))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the extension idem is not installed in this database")));
	if (!superuser() && !has_privs_of_role(GetUserId(), *owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to %s an idem policy", what),
				 errhint("Only a superuser or the owner of the extension idem may.")));
	return nspid;
}

/* Was argument argno left out of the call (its default, the marker)? */
static bool
omitted(FunctionCallInfo fcinfo, int argno)
{
	FuncExpr   *call = (FuncExpr *) fcinfo->flinfo->fn_expr;
	Node	   *arg;
	char	   *name;

	if (call == NULL || !IsA(call, FuncExpr) || list_length(call->args) <= argno)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idem_set_policy must be called from SQL")));
	arg = (Node *) list_nth(call->args, argno);
	if (!IsA(arg, FuncExpr))
		return false;
	name = get_func_name(((FuncExpr *) arg)->funcid);
	return name != NULL && strncmp(name, "idem_policy_unchanged_", 22) == 0 &&
		getExtensionOfObject(ProcedureRelationId, ((FuncExpr *) arg)->funcid) ==
		getExtensionOfObject(ProcedureRelationId, fcinfo->flinfo->fn_oid);
}

/* 22023 unless every element of redact is a JSON Pointer to a member. */
static void
check_redact(ArrayType *pointers)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	if (ARR_NDIM(pointers) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("redact must be a one-dimensional array of JSON Pointers")));
	deconstruct_array(pointers, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	for (int i = 0; i < n; i++)
	{
		const char *error = "a JSON Pointer must not be NULL";

		if (!nulls[i])
			(void) idem_json_pointer_path(TextDatumGetCString(elems[i]), &error);
		if (error != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("redact must hold JSON Pointers (RFC 6901) to members, such as '/card/number'"),
					 errdetail("Element %d: %s.", i + 1, error)));
	}
}

/* 22023 unless setting i's value is one idem can use. */
static void
check_setting(int i, Datum value)
{
	if (i == SET_REDACT)
	{
		check_redact(DatumGetArrayTypeP(value));
		return;
	}
	if (i == SET_REUSE || i == SET_UNCERTAIN)
	{
		char	   *name = TextDatumGetCString(value);
		const char *one = i == SET_REUSE ? "execute" : "retry";
		const char *other = i == SET_REUSE ? "refuse" : "reconcile";

		if (strcmp(name, one) != 0 && strcmp(name, other) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must be '%s' or '%s'", setting_names[i], one, other),
					 errdetail("The call has %s \"%s\".", setting_names[i], name)));
		return;
	}
	if (i == SET_AUDIT_TTL || i == SET_RECONCILE_WITHIN)
	{
		TimestampTz now = GetCurrentTransactionStartTimestamp();

		(void) idem_plus_positive(now, DatumGetIntervalP(value), setting_names[i]);
		return;
	}
	if (i == SET_KEY_FORMAT)
	{
		bool		ok;
		char	   *name = TextDatumGetCString(value);

		(void) idem_key_format_from_name(name, &ok);
		if (!ok)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("key_format must be 'token', 'uuid' or 'ulid'"),
					 errdetail("The call has key_format \"%s\".", name)));
		return;
	}
	if (i == SET_REJECT_WEAK)
		return;
	if (i == SET_MAX_ATTEMPTS)
	{
		if (DatumGetInt32(value) < 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_attempts must be at least 1"),
					 errdetail("The call has max_attempts %d.", DatumGetInt32(value))));
		return;
	}
	if (i == SET_TTL || i == SET_FAILURE_TTL)
	{
		TimestampTz now = GetCurrentTransactionStartTimestamp();

		if (idem_plus_positive(now, DatumGetIntervalP(value), setting_names[i]) - now >
			(int64) idem_max_ttl * USECS_PER_SEC)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must not exceed idem.max_ttl (%d seconds)", setting_names[i], idem_max_ttl),
					 errdetail("The call has %s %s.", setting_names[i],
							   DatumGetCString(DirectFunctionCall1(interval_out, value)))));
		return;
	}
	{
		Interval   *iv = DatumGetIntervalP(value);
		TimestampTz now = GetCurrentTransactionStartTimestamp();
		TimestampTz at = idem_timestamp_plus(now, iv);

		if (at < now || (i != SET_WAIT_TIMEOUT && at == now) || at - now > (int64) INT_MAX * 1000)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must be %s and under %d milliseconds", setting_names[i],
							i == SET_WAIT_TIMEOUT ? "zero or positive" : "positive", INT_MAX),
					 errdetail("The call has %s %s.", setting_names[i],
							   DatumGetCString(DirectFunctionCall1(interval_out, value)))));
	}
}

/*
 * A WARNING when the policy as stored (row) refuses reused keys, itself or
 * through idem.reuse_after_expiry, but keeps no audit period, its own or
 * idem.audit_ttl.  Its expired keys would execute again silently.
 */
static void
warn_if_unaudited(const char *operation, HeapTuple row, TupleDesc desc)
{
	bool		isnull;
	Datum		reuse = SPI_getbinval(row, desc, SPI_fnumber(desc, "reuse_after_expiry"), &isnull);
	bool		refuses = isnull ? idem_reuse_after_expiry == IDEM_REUSE_REFUSE :
		strcmp(TextDatumGetCString(reuse), "refuse") == 0;
	Datum		audit = SPI_getbinval(row, desc, SPI_fnumber(desc, "audit_ttl"), &isnull);
	bool		audited = isnull ? idem_audit_ttl > 0 : idem_interval_ms(DatumGetIntervalP(audit)) > 0;

	if (refuses && !audited)
		ereport(WARNING,
				(errcode(ERRCODE_WARNING),
				 errmsg("operation %s refuses reused keys but keeps no audit period", operation),
				 errdetail("reuse_after_expiry 'refuse' refuses a key while its audit fields are kept; with neither the policy's audit_ttl nor idem.audit_ttl, none are, and its expired keys execute again."),
				 errhint("Give it an audit period: idem_set_policy('%s', audit_ttl => '30 days').", operation)));
}

/*
 * SQL: idem_set_policy(operation, ttl, failure_ttl, wait_timeout,
 * max_attempts, retry_base, retry_max, audit_ttl, reuse_after_expiry,
 * redact, key_format, reject_weak_keys) returns idem_policy.  The
 * operation's policy after the change.
 */
Datum
idem_set_policy(PG_FUNCTION_ARGS)
{
	Oid			owner;
	Oid			nsp = check_policy_admin("set", &owner);
	IdemIdentity identity = {0};
	char	   *operation;
	StringInfoData sql;
	StringInfoData update;
	Oid			types[2 + 2 * POLICY_NARGS];
	Datum		values[2 + 2 * POLICY_NARGS];
	char		nulls[2 + 2 * POLICY_NARGS];
	int			nparams = 1;
	HeapTupleHeader result;

	idem_check_not_null(fcinfo, 0, "operation");
	operation = TextDatumGetCString(PG_GETARG_DATUM(0));
	idem_check_operation(operation, strlen(operation));
	types[0] = TEXTOID;
	values[0] = PG_GETARG_DATUM(0);
	nulls[0] = ' ';
	initStringInfo(&sql);
	initStringInfo(&update);
	appendStringInfo(&sql, "INSERT INTO %s.idem_policy AS p (operation", idem_quoted_schema(nsp));
	for (int i = 0; i < POLICY_NARGS; i++)
	{
		int			arg = setting_arg(fcinfo, i);
		bool		keep;

		if (arg < 0)
			continue;
		keep = omitted(fcinfo, arg);
		/* $n: the value; $(n+1): keep the stored one */
		types[nparams] = setting_types[i];
		nulls[nparams] = (keep || PG_ARGISNULL(arg)) ? 'n' : ' ';
		values[nparams] = nulls[nparams] == 'n' ? (Datum) 0 : PG_GETARG_DATUM(arg);
		if (nulls[nparams] == ' ')
			check_setting(i, values[nparams]);
		types[nparams + 1] = BOOLOID;
		values[nparams + 1] = BoolGetDatum(keep);
		nulls[nparams + 1] = ' ';
		appendStringInfo(&sql, ", %s", setting_names[i]);
		appendStringInfo(&update, ", %s = CASE WHEN $%d THEN p.%s ELSE excluded.%s END",
						 setting_names[i], nparams + 2, setting_names[i], setting_names[i]);
		nparams += 2;
	}
	/* the time a parameter, since Citus plans ON CONFLICT with no volatile function */
	types[nparams] = TIMESTAMPTZOID;
	values[nparams] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	nulls[nparams] = ' ';
	appendStringInfoString(&sql, ", updated_at) VALUES ($1");
	for (int n = 1; n < nparams; n += 2)
		appendStringInfo(&sql, ", $%d", n + 1);
	appendStringInfo(&sql, ", $%d) ON CONFLICT (operation) DO UPDATE SET updated_at = excluded.updated_at%s RETURNING p.*",
					 nparams + 1, update.data);
	nparams++;

	/* as idem's owner, under pg_catalog, pg_temp (the text names idem's table) */
	idem_become_owner(&identity, owner);
	idem_use_safe_search_path(&identity);
	SPI_connect();
	if (SPI_execute_with_args(sql.data, nparams, types, values, nulls, false, 0) != SPI_OK_INSERT_RETURNING ||
		SPI_processed != 1)
		elog(ERROR, "idem: could not write the policy of operation %s", operation);
	result = SPI_returntuple(SPI_tuptable->vals[0], SPI_tuptable->tupdesc);
	warn_if_unaudited(operation, SPI_tuptable->vals[0], SPI_tuptable->tupdesc);
	SPI_finish();
	idem_restore_caller(&identity);
	PG_RETURN_HEAPTUPLEHEADER(result);
}

/* SQL: idem_drop_policy(operation) returns whether it had one. */
Datum
idem_drop_policy(PG_FUNCTION_ARGS)
{
	Oid			owner;
	Oid			nsp = check_policy_admin("drop", &owner);
	IdemIdentity identity = {0};
	StringInfoData sql;
	Oid			types[1] = {TEXTOID};
	Datum		values[1] = {PG_GETARG_DATUM(0)};
	bool		dropped;

	initStringInfo(&sql);
	appendStringInfo(&sql, "DELETE FROM %s.idem_policy WHERE operation OPERATOR(pg_catalog.=) $1",
					 idem_quoted_schema(nsp));
	idem_become_owner(&identity, owner);
	idem_use_safe_search_path(&identity);
	SPI_connect();
	if (SPI_execute_with_args(sql.data, 1, types, values, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "idem: could not drop the policy");
	dropped = SPI_processed > 0;
	SPI_finish();
	idem_restore_caller(&identity);
	PG_RETURN_BOOL(dropped);
}
