/*-------------------------------------------------------------------------
 *
 * api.c
 *	  The generic API.  Any SQL the caller runs becomes idempotent under
 *	  (owner, operation, key).
 *
 * idem_begin claims a key for the caller's transaction (or replays, or
 * refuses); the caller does its work; idem_finish stores the result, so
 * that record and work commit or roll back together.  idem_run does the
 * three in one call, with the work in a handler function that runs as the
 * caller.  A transaction that claimed a key and did not finish it cannot
 * commit (IK005).  No business effect commits without its record.
 *
 * The unfinished claims of the current transaction are pending.c's list;
 * a claim finished in the subtransaction that made it leaves the list and
 * gives its key lock back (finish_claim).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/syscache.h"
#include "utils/typcache.h"
#include "utils/inval.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "call.h"
#include "citus.h"
#include "claim.h"
#include "pending.h"
#include "stats.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_begin);
PG_FUNCTION_INFO_V1(idem_finish);
PG_FUNCTION_INFO_V1(idem_finish_stored);
PG_FUNCTION_INFO_V1(idem_run);

/*
 * The columns of idem_outcome, what idem_begin and idem_run return
 * (HTTP..RESOURCE: idem_result_values()).  expires_at came with 1.9,
 * header_list with 1.11: a database still on an older version has the
 * first OUT_NCOLS_1_3 or OUT_NCOLS_1_9.
 */
enum
{
	OUT_REPLAYED, OUT_HTTP, OUT_BODY, OUT_HEADERS, OUT_RESOURCE, OUT_EXPIRES, OUT_HEADER_LIST,
	OUT_NCOLS
};
#define OUT_NCOLS_1_3 OUT_EXPIRES
#define OUT_NCOLS_1_9 OUT_HEADER_LIST

/* The attributes of idem_result, what a handler returns (1-based). */
enum
{
	RESULT_HTTP = 1, RESULT_BODY, RESULT_HEADERS, RESULT_RESOURCE
};

/*
 * The handlers idem_run checked, with their FmgrInfo, kept for the backend
 * (a prepared statement's own FmgrInfo lives for one execution, so PL/pgSQL
 * would look its compiled function up again on every call).  Entries are
 * never changed in place, since a call in progress may be using one.  A
 * pg_proc change, or a full cache, starts a new context, and the old one
 * goes with the transaction.
 */
#define HANDLER_CACHE_SIZE	16

typedef struct HandlerEntry
{
	Oid			handler;
	uint32		hash;			/* its pg_proc syscache hash */
	Oid			result_type;	/* the idem_result it was checked against */
	FmgrInfo	flinfo;
} HandlerEntry;

static HandlerEntry *handler_cache = NULL;	/* HANDLER_CACHE_SIZE entries */
static int	handler_count = 0;
static bool handler_cache_stale = false;
static MemoryContext handler_cxt = NULL;

/* ---------- the transaction's claims ---------- */

/*
 * Store the result of this transaction's claim p as the extension's owner:
 * the finished record, expiring as its status says, then mark p finished.
 * Made and finished in the same subtransaction, it is forgotten, and its
 * key lock given back.
 */
static TimestampTz
finish_claim(const IdemCatalog *cat, const IdemScope *scope, IdemPendingClaim *p,
			 IdemStatus status, IdemResult *res, TimestampTz now)
{
	IdemIdentity identity = {0};
	TimestampTz expires = idem_record_expiry(status, now, p->has_ttl ? &p->ttl : NULL,
											 scope->operation);

	idem_become_owner(&identity, cat->owner);
	idem_use_safe_search_path(&identity);
	idem_record_insert(cat, scope, &p->print, status, res, now, expires, NULL, NULL);
	idem_restore_caller(&identity);
	if (p->subid == GetCurrentSubTransactionId())
	{
		LOCKTAG		tag;

		/* claim and record can only roll back together, so both are done */
		idem_pending_forget(p);
		idem_key_locktag(&tag, scope);
		idem_unlock_key(&tag);
	}
	else
		p->finished_subid = GetCurrentSubTransactionId();
	idem_note_outcome(scope, IDEM_LOG_EXECUTED, !res->resource_isnull, res->resource_id);
	if (status == IDEM_STATUS_FAILED_FINAL)
		idem_stats_count_at_commit(IDEM_KIND_OPERATION, scope->operation, IDEM_STAT_FAILED_FINAL, 1);
	return expires;
}

/* ---------- results ---------- */

/*
 * The idem_outcome row of a call: res NULL for a claim (the caller
 * executes); expires, when the record expires (a claim: when it will if it
 * succeeds).
 */
static Datum
outcome_datum(const IdemCatalog *cat, FunctionCallInfo fcinfo, bool replayed,
			  const IdemResult *res, TimestampTz expires)
{
	TupleDesc	desc = idem_catalog_result(cat, fcinfo);
	Datum		values[OUT_NCOLS] = {0};
	bool		nulls[OUT_NCOLS];

	if (desc->natts != OUT_NCOLS && desc->natts != OUT_NCOLS_1_9 && desc->natts != OUT_NCOLS_1_3)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's type idem_outcome was altered: it must have %d attributes",
						OUT_NCOLS),
				 errhint("Update the extension: ALTER EXTENSION idem UPDATE.")));
	values[OUT_REPLAYED] = BoolGetDatum(replayed);
	nulls[OUT_REPLAYED] = false;
	nulls[OUT_HEADER_LIST] = true;
	if (res == NULL)
	{
		for (int i = OUT_HTTP; i < OUT_EXPIRES; i++)
			nulls[i] = true;
	}
	else
	{
		idem_result_values(res, &values[OUT_HTTP], &nulls[OUT_HTTP]);
		values[OUT_HEADER_LIST] = idem_result_header_list(res, &nulls[OUT_HEADER_LIST]);
	}
	values[OUT_EXPIRES] = TimestampTzGetDatum(expires);
	nulls[OUT_EXPIRES] = false;
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

/* ---------- SQL functions ---------- */

/*
 * SQL: idem_begin(owner, operation, key, request, ttl) returns idem_outcome.
 * A new or expired key.  Claimed for this transaction, replayed = false.
 * A finished record with the same fingerprint.  Replayed.
 */
Datum
idem_begin(PG_FUNCTION_ARGS)
{
	IdemCall	call;
	IdemIdentity identity = {0};
	IdemClaim	claim = {0};
	IdemOutcome outcome;

	if (!idem_call_begin(&call, fcinfo, -1, NULL, 4))
		return idem_citus_redispatch(fcinfo);
	outcome = idem_claim(&claim, &call.cat, &call.scope, &call.print, call.now, &identity);
	idem_restore_caller(&identity);

	if (outcome == IDEM_EXECUTE)
	{
		idem_pending_add(&call.scope, &call.print, idem_catalog_digest_secret(&call.cat), call.ttl);
		PG_RETURN_DATUM(outcome_datum(&call.cat, fcinfo, false, NULL,
									  idem_record_expiry(IDEM_STATUS_SUCCEEDED, call.now, call.ttl,
														 call.scope.operation)));
	}
	PG_RETURN_DATUM(outcome_datum(&call.cat, fcinfo, true, &claim.rec.result,
								  claim.rec.expires_at));
}

/*
 * Has this transaction written the scope's record (finished its claim, and
 * forgotten it)?  Asked only to say why idem_finish has nothing to finish.
 */
static bool
finished_here(const IdemCatalog *cat, const IdemScope *scope, TimestampTz now)
{
	IdemRecord	rec;
	IdemIdentity identity = {0};
	bool		found;

	idem_become_owner(&identity, cat->owner);
	found = idem_record_read(cat, scope, now, &rec) && rec.written_here;
	idem_restore_caller(&identity);
	return found;
}

/*
 * idem_finish's work: store the result of this transaction's claim; *res
 * becomes what was stored (redacted), *cat the catalog, and the expiry is
 * returned.  header_list (json) keeps the headers as given; headers
 * is their jsonb form.  False when the owner's shard is on another node.
 */
static bool
finish_call(FunctionCallInfo fcinfo, IdemCatalog *catp, IdemResult *resp, TimestampTz *expires)
{
	IdemScope	scope;
	IdemCatalog cat;
	IdemResult	res;
	IdemStatus	status;
	IdemPendingClaim *p;
	TimestampTz now = GetCurrentTransactionStartTimestamp();

	idem_scope_from_args(fcinfo, &scope);
	idem_check_not_null(fcinfo, 3, "http_status");
	status = idem_result_make(&res, false, PG_GETARG_INT32(3),
						 PG_ARGISNULL(4), PG_GETARG_DATUM(4),
						 PG_ARGISNULL(6), PG_GETARG_DATUM(6),
						 PG_ARGISNULL(5), PG_ARGISNULL(5) ? 0 : PG_GETARG_INT64(5));
	if (PG_NARGS() > 7 && !PG_ARGISNULL(7))
		idem_result_set_header_list(&res, PG_GETARG_DATUM(7));
	/* on Citus, the claim is held where idem_begin ran, on the owner's node */
	cat = *idem_catalog(fcinfo);
	if (!idem_citus_route(&cat, IDEM_TABLE_RECORD, Int64GetDatum(scope.owner), INT8OID))
		return false;

	p = idem_pending_find(&scope);
	idem_pending_check_not_running(p, &scope);
	if (p == NULL || p->finished_subid != InvalidSubTransactionId)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_NO_CLAIM),
				 errmsg("this transaction holds no unfinished claim of the idempotency key"),
				 p == NULL && !finished_here(&cat, &scope, now) ?
				 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": idem_begin did not claim it in this transaction.",
						   scope.owner, scope.operation, scope.key) :
				 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": idem_finish was already called for it.",
						   scope.owner, scope.operation, scope.key),
				 errhint("Call idem_begin first, in the same transaction, and finish only when it returned replayed = false.")));

	*expires = finish_claim(&cat, &scope, p, status, &res, now);
	*catp = cat;
	*resp = res;
	return true;
}

/*
 * SQL: idem_finish(owner, operation, key, http_status, body, resource_id,
 * headers, header_list) returns void.  Stores the result of this
 * transaction's claim.
 */
Datum
idem_finish(PG_FUNCTION_ARGS)
{
	IdemCatalog cat;
	IdemResult	res;
	TimestampTz expires;

	if (!finish_call(fcinfo, &cat, &res, &expires))
		return idem_citus_redispatch(fcinfo);
	PG_RETURN_VOID();
}

/*
 * SQL: idem_finish_stored(the arguments of idem_finish) returns
 * idem_outcome: idem_finish, returning the answer as stored, after
 * the operation's policy redacted it, as a replay will return it
 * (replayed = false).  What a copy kept elsewhere (a fast layer) must hold.
 */
Datum
idem_finish_stored(PG_FUNCTION_ARGS)
{
	IdemCatalog cat;
	IdemResult	res;
	TimestampTz expires;

	if (!finish_call(fcinfo, &cat, &res, &expires))
		return idem_citus_redispatch(fcinfo);
	PG_RETURN_DATUM(outcome_datum(&cat, fcinfo, false, &res, expires));
}

/*
 * idem_response, the type a handler returns for headers in json
 * form, in the schema of idem_result; InvalidOid before 1.11.
 */
static Oid
response_type(Oid result_type)
{
	HeapTuple	tup = SearchSysCache1(TYPEOID, ObjectIdGetDatum(result_type));
	Oid			nspid;

	if (!HeapTupleIsValid(tup))
		return InvalidOid;
	nspid = ((Form_pg_type) GETSTRUCT(tup))->typnamespace;
	ReleaseSysCache(tup);
	return GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid, CStringGetDatum("idem_response"),
						   ObjectIdGetDatum(nspid));
}

/*
 * Check that handler is handler(jsonb) returns idem_result (or
 * idem_response): 42883 for another signature, 42804 for another return
 * type.
 */
static void
check_handler(Oid handler, Oid result_type)
{
	HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(handler));
	Form_pg_proc proc;

	if (!HeapTupleIsValid(tup))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("handler function with OID %u does not exist", handler)));
	proc = (Form_pg_proc) GETSTRUCT(tup);
	if (proc->prokind != PROKIND_FUNCTION || proc->pronargs != 1 ||
		proc->proargtypes.values[0] != JSONBOID)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("handler %s must be a function of one argument of type jsonb",
						format_procedure(handler)),
				 errhint("Declare it as FUNCTION name(request jsonb) RETURNS idem_result.")));
	if ((proc->prorettype != result_type && proc->prorettype != response_type(result_type)) ||
		proc->proretset)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("handler %s must return idem_result or idem_response, not %s",
						format_procedure(handler),
						proc->proretset ? "a set" : format_type_be(proc->prorettype)),
				 errhint("Declare it as FUNCTION name(request jsonb) RETURNS idem_result.")));
	ReleaseSysCache(tup);
}

/* Forget the cached handlers when one of them changes (or all did). */
static void
handler_cache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	for (int i = 0; i < handler_count; i++)
		if (hashvalue == 0 || handler_cache[i].hash == hashvalue)
			handler_cache_stale = true;
}

/* The FmgrInfo of handler, checked (check_handler) when it is not cached. */
static FmgrInfo *
handler_fmgr(Oid handler, Oid result_type)
{
	HandlerEntry *e;

	if (!handler_cache_stale)
		for (int i = 0; i < handler_count; i++)
			if (handler_cache[i].handler == handler &&
				handler_cache[i].result_type == result_type)
				return &handler_cache[i].flinfo;

	check_handler(handler, result_type);
	if (handler_cxt == NULL)
		CacheRegisterSyscacheCallback(PROCOID, handler_cache_callback, (Datum) 0);
	if (handler_cxt == NULL || handler_cache_stale || handler_count == HANDLER_CACHE_SIZE)
	{
		if (handler_cxt != NULL)
			MemoryContextSetParent(handler_cxt, TopTransactionContext);
		handler_cxt = AllocSetContextCreate(TopMemoryContext, "idem handlers",
											ALLOCSET_SMALL_SIZES);
		handler_cache = MemoryContextAllocZero(handler_cxt,
											   HANDLER_CACHE_SIZE * sizeof(HandlerEntry));
		handler_count = 0;
		handler_cache_stale = false;
	}
	e = &handler_cache[handler_count];
	fmgr_info_cxt(handler, &e->flinfo, handler_cxt);
	e->handler = handler;
	e->hash = GetSysCacheHashValue1(PROCOID, ObjectIdGetDatum(handler));
	e->result_type = result_type;
	handler_count++;
	return &e->flinfo;
}

/*
 * Call handler(request) as the current user, who must be allowed to
 * execute it, and read its idem_result into res.
 */
static IdemStatus
call_handler(FmgrInfo *flinfo, Jsonb *request, IdemResult *res)
{
	Oid			handler = flinfo->fn_oid;
	LOCAL_FCINFO(hfcinfo, 1);
	AclResult	aclresult;
	Datum		result;
	HeapTupleHeader th;
	HeapTupleData tuple;
	TupleDesc	desc;
	bool		isnull[4];
	Datum		values[4];
	bool		as_list;
	IdemStatus	status;

	aclresult = idem_proc_aclcheck(handler, GetUserId(), ACL_EXECUTE);
	if (aclresult != ACLCHECK_OK)
		aclcheck_error(aclresult, OBJECT_FUNCTION, get_func_name(handler));

	InitFunctionCallInfoData(*hfcinfo, flinfo, 1, InvalidOid, NULL, NULL);
	hfcinfo->args[0].value = JsonbPGetDatum(request);
	hfcinfo->args[0].isnull = false;
	result = FunctionCallInvoke(hfcinfo);
	if (hfcinfo->isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("handler %s returned null", format_procedure(handler)),
				 errhint("Return an idem_result: a 4xx http_status for a deterministic failure.")));

	th = DatumGetHeapTupleHeader(result);
	desc = lookup_rowtype_tupdesc(HeapTupleHeaderGetTypeId(th), HeapTupleHeaderGetTypMod(th));
	if (desc->natts != 4)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's type %s was altered: it must have 4 attributes",
						format_type_be(HeapTupleHeaderGetTypeId(th))),
				 errhint("Drop and re-create the extension idem.")));
	tuple.t_len = HeapTupleHeaderGetDatumLength(th);
	ItemPointerSetInvalid(&tuple.t_self);
	tuple.t_tableOid = InvalidOid;
	tuple.t_data = th;
	heap_deform_tuple(&tuple, desc, values, isnull);
	/* idem_response has its headers in json form */
	as_list = TupleDescAttr(desc, RESULT_HEADERS - 1)->atttypid == JSONOID;
	ReleaseTupleDesc(desc);
	status = idem_result_make(res, isnull[RESULT_HTTP - 1], DatumGetInt32(values[RESULT_HTTP - 1]),
							  isnull[RESULT_BODY - 1], values[RESULT_BODY - 1],
							  isnull[RESULT_HEADERS - 1] || as_list, values[RESULT_HEADERS - 1],
							  isnull[RESULT_RESOURCE - 1],
							  isnull[RESULT_RESOURCE - 1] ? 0 : DatumGetInt64(values[RESULT_RESOURCE - 1]));
	if (as_list && !isnull[RESULT_HEADERS - 1])
		idem_result_set_header_list(res, values[RESULT_HEADERS - 1]);
	return status;
}

/*
 * SQL: idem_run(owner, operation, key, request, handler, ttl) returns
 * idem_outcome.  A new key: calls handler(request) as the caller and
 * stores its result; a repeat replays without calling it.
 */
Datum
idem_run(PG_FUNCTION_ARGS)
{
	IdemCall	call;
	IdemIdentity identity = {0};
	IdemClaim	claim = {0};
	IdemResult	res;
	IdemStatus	status;
	IdemPendingClaim *p;
	FmgrInfo   *hflinfo;

	if (!idem_call_begin(&call, fcinfo, 4, "handler", 5))
		return idem_citus_redispatch(fcinfo);
	hflinfo = handler_fmgr(PG_GETARG_OID(4), call.cat.result_type);

	if (idem_claim(&claim, &call.cat, &call.scope, &call.print, call.now, &identity) == IDEM_REPLAY)
	{
		idem_restore_caller(&identity);
		PG_RETURN_DATUM(outcome_datum(&call.cat, fcinfo, true, &claim.rec.result,
									  claim.rec.expires_at));
	}
	idem_restore_caller(&identity);

	/* the handler runs as the caller; a nested call of the key is IK006 */
	p = idem_pending_add(&call.scope, &call.print, idem_catalog_digest_secret(&call.cat), call.ttl);
	p->running = true;
	status = call_handler(hflinfo, call.request, &res);
	p->running = false;

	PG_RETURN_DATUM(outcome_datum(&call.cat, fcinfo, false, &res,
								  finish_claim(&call.cat, &call.scope, p, status, &res, call.now)));
}
