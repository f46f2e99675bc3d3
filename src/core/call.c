/*-------------------------------------------------------------------------
 *
 * call.c
 *	  The start of a call that claims a key.  Its scope from the arguments,
 *	  its copy of the catalog pointed at the owner's shard, counted, its
 *	  request ready to be fingerprinted, and the transaction's own claims
 *	  asked first.
 *
 * idem_begin, idem_run and idem_submit open alike; here once, so that they
 * check their arguments in the same order (owner, operation, key, request,
 * what else must not be NULL, ttl) and give the same errors.  On Citus a
 * call made on a node without its owner's shard is sent on to that node.
 * The caller sees false and returns idem_citus_redispatch(fcinfo), in
 * plain sight.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"

#include "idem.h"
#include "call.h"
#include "citus.h"
#include "pending.h"
#include "record.h"
#include "stats.h"
#include "util.h"

/*
 * Start a call of fcinfo: owner, operation and key are its arguments 0 to
 * 2, the request argument 3; argument required_argno (unless -1) must not
 * be NULL either; argument ttl_argno is the call's ttl (NULL: idem.ttl).
 * Returns false when the owner's shard is on another node (Citus).
 */
bool
idem_call_begin(IdemCall *call, FunctionCallInfo fcinfo, int required_argno,
				const char *required_name, int ttl_argno)
{
	idem_scope_from_args(fcinfo, &call->scope);
	call->cat = *idem_catalog(fcinfo);
	if (!idem_citus_route(&call->cat, IDEM_TABLE_RECORD, Int64GetDatum(call->scope.owner), INT8OID))
		return false;
	idem_stats_count(IDEM_KIND_OPERATION, call->scope.operation, IDEM_STAT_CALLS, 1);
	idem_check_not_null(fcinfo, IDEM_CALL_REQUEST_ARG, "request");
	if (required_argno >= 0)
		idem_check_not_null(fcinfo, required_argno, required_name);
	call->now = GetCurrentTransactionStartTimestamp();
	call->ttl = idem_ttl_arg(fcinfo, ttl_argno, call->now);
	call->request = PG_GETARG_JSONB_P(IDEM_CALL_REQUEST_ARG);
	idem_print_of_request(&call->print, call->request);
	idem_pending_check_unclaimed(&call->scope, &call->print);
	return true;
}
