/*-------------------------------------------------------------------------
 *
 * task_holder.c
 *	  The calls of a lease's holder: idem_heartbeat, idem_complete,
 *	  idem_fail, idem_fail_unknown, idem_task_trace_context.
 *
 * Each locks the task's record and checks the fencing token under that
 * lock.  A stale token (the lease was taken over, or the task is finished)
 * raises IK004 and changes nothing, so a stale worker's business write in
 * the same transaction rolls back with it.  idem_complete stores the
 * result in the worker's transaction, next to its business write.
 * idem_fail schedules the next attempt after an exponential backoff with
 * full jitter, or ends the task FAILED_FINAL (HTTP 500).  idem_fail_unknown
 * marks the task of an operation that reconciles uncertain outcomes (its
 * holder does not know whether the provider acted), and is a retryable
 * failure for any other.  Each but idem_heartbeat ends the attempt, and
 * writes its row in idem_task_attempt; idem_task_trace_context only reads.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "citus.h"
#include "key.h"
#include "binding.h"
#include "stats.h"
#include "policy.h"
#include "redact.h"
#include "task_int.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_heartbeat);
PG_FUNCTION_INFO_V1(idem_complete);
PG_FUNCTION_INFO_V1(idem_fail);
PG_FUNCTION_INFO_V1(idem_fail_unknown);
PG_FUNCTION_INFO_V1(idem_task_trace_context);

/* One call of the holder of a lease, on its task locked. */
typedef struct HolderCall
{
	IdemCatalog cat;
	TaskRecord	rec;
	TupleTableSlot *locked;
	char	   *operation;		/* the task's */
	TimestampTz now;
	TaskAttempt attempt;		/* the lease the call ends */
} HolderCall;

/* Raise IK004 for task_id and token, counting it for operation (NULL: unknown). */
pg_noreturn static void
report_stale(int64 task_id, int64 token, const char *operation, const char *detail)
{
	if (operation)
		idem_stats_count(IDEM_KIND_OPERATION, operation, IDEM_STAT_STALE_TOKENS, 1);
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_STALE_TOKEN),
			 errmsg("fencing token " INT64_FORMAT " of task " INT64_FORMAT " is not current",
					token, task_id),
			 errdetail_internal("%s", detail),
			 errhint("This worker's lease is over: roll back its work and leave the task to its current holder.")));
}

/*
 * Lock task_id's row (waiting for a holder's short transaction) and check
 * that token is its current lease's; else IK004.  Under READ COMMITTED the
 * lock follows the row to its latest version, as an UPDATE would.
 */
static void
begin_holder_call(HolderCall *hc, FunctionCallInfo fcinfo, int64 task_id, int64 token)
{
	TaskRecord *tr = &hc->rec;
	TM_Result	tmres;
	IdemStatus	status;
	int32		attempts;
	char		detail[160];

	hc->cat = *idem_catalog(fcinfo);
	task_relations(&hc->cat);
	hc->now = GetCurrentTimestamp();
	tmres = task_record_lock(tr, &hc->cat, task_id, &hc->locked);
	if (tmres != TM_Ok)
	{
		snprintf(detail, sizeof(detail),
				 "Task " INT64_FORMAT " does not exist (never submitted, or finished and expired).",
				 task_id);
		report_stale(task_id, token, NULL, detail);
	}

	task_record_take(tr, hc->locked);
	hc->operation = TextDatumGetCString(TR_VALUE(tr, REC_OPERATION));
	/* the token fences; the operation list authorises */
	idem_check_operation_allowed(hc->operation);
	status = idem_status_from_name(TextDatumGetCString(TR_VALUE(tr, REC_STATUS)));
	attempts = TR_ISNULL(tr, REC_TASK_ATTEMPTS) ? 0 : DatumGetInt32(TR_VALUE(tr, REC_TASK_ATTEMPTS));
	if (TR_ISNULL(tr, REC_TASK_ATTEMPTS))
		snprintf(detail, sizeof(detail), "Record " INT64_FORMAT " is not a task.", task_id);
	else if (status != IDEM_STATUS_PROCESSING && status != IDEM_STATUS_FAILED_RETRYABLE)
		snprintf(detail, sizeof(detail), "The task is finished: %s.", idem_status_name(status));
	else if (TR_ISNULL(tr, REC_TASK_LEASE_EXPIRES))
		snprintf(detail, sizeof(detail), "The task is not leased (%s, attempt %d).",
				 idem_status_name(status), attempts);
	else if (DatumGetInt64(TR_VALUE(tr, REC_TASK_TOKEN)) != token)
		snprintf(detail, sizeof(detail), "The task was leased again, with token " INT64_FORMAT " (attempt %d).",
				 DatumGetInt64(TR_VALUE(tr, REC_TASK_TOKEN)), attempts);
	else
	{
		task_attempt_take(&hc->attempt, tr);
		return;
	}
	report_stale(task_id, token, hc->operation, detail);
}

/*
 * Write the new version built in hc->rec and, if the call ends the attempt
 * (outcome not NULL), its row; give the caller back its rights.
 */
static void
end_holder_call(HolderCall *hc, const char *outcome, int32 http_status, Datum error)
{
	task_record_write(&hc->rec, hc->locked);
	if (outcome)
		task_attempt_write(&hc->attempt, &hc->cat, &hc->rec, outcome, http_status, error, hc->now);
	task_record_close(&hc->rec);
}

/* SQL: idem_heartbeat(task_id, token, extend) returns the new lease_expires_at. */
Datum
idem_heartbeat(PG_FUNCTION_ARGS)
{
	HolderCall	hc = {0};
	TaskRecord *tr = &hc.rec;
	TimestampTz expires;

	idem_check_not_null(fcinfo, 0, "task_id");
	idem_check_not_null(fcinfo, 1, "token");
	begin_holder_call(&hc, fcinfo, PG_GETARG_INT64(0), PG_GETARG_INT64(1));
	if (PG_ARGISNULL(2))
	{
		/* the interval the lease was granted (or last extended) for */
		TimestampTz old_expires = DatumGetTimestampTz(TR_VALUE(tr, REC_TASK_LEASE_EXPIRES));
		TimestampTz old_beat = DatumGetTimestampTz(TR_VALUE(tr, REC_TASK_HEARTBEAT));

		expires = hc.now + Max(old_expires - old_beat, 1);
	}
	else
		expires = idem_plus_positive(hc.now, PG_GETARG_INTERVAL_P(2), "extend");
	TR_SET(tr, REC_TASK_LEASE_EXPIRES, TimestampTzGetDatum(expires));
	TR_SET(tr, REC_TASK_HEARTBEAT, TimestampTzGetDatum(hc.now));
	TR_SET(tr, REC_UPDATED, TimestampTzGetDatum(hc.now));
	end_holder_call(&hc, NULL, 0, (Datum) 0);
	PG_RETURN_TIMESTAMPTZ(expires);
}

/*
 * SQL: idem_task_trace_context(task_id, token) returns the W3C traceparent
 * the task was submitted under (idem.trace_context), or NULL; for the
 * lease's holder only.
 */
Datum
idem_task_trace_context(PG_FUNCTION_ARGS)
{
	HolderCall	hc = {0};
	text	   *trace = NULL;

	idem_check_not_null(fcinfo, 0, "task_id");
	idem_check_not_null(fcinfo, 1, "token");
	begin_holder_call(&hc, fcinfo, PG_GETARG_INT64(0), PG_GETARG_INT64(1));
	if (!TR_ISNULL(&hc.rec, REC_TASK_TRACE))
		trace = DatumGetTextPCopy(TR_VALUE(&hc.rec, REC_TASK_TRACE));
	task_record_close(&hc.rec);
	if (trace == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(trace);
}

/*
 * SQL: idem_complete(task_id, token, http_status, body, resource_id,
 * headers, header_list).  The task's result, stored in the worker's
 * transaction.
 */
Datum
idem_complete(PG_FUNCTION_ARGS)
{
	HolderCall	hc = {0};
	TaskRecord *tr = &hc.rec;
	IdemResult	res;
	IdemStatus	status;

	idem_check_not_null(fcinfo, 0, "task_id");
	idem_check_not_null(fcinfo, 1, "token");
	idem_check_not_null(fcinfo, 2, "http_status");
	status = idem_result_make(&res, false, PG_GETARG_INT32(2),
							  PG_ARGISNULL(3), PG_GETARG_DATUM(3),
							  PG_ARGISNULL(5), PG_GETARG_DATUM(5),
							  PG_ARGISNULL(4), PG_ARGISNULL(4) ? 0 : PG_GETARG_INT64(4));
	if (PG_NARGS() > 6 && !PG_ARGISNULL(6))
		idem_result_set_header_list(&res, PG_GETARG_DATUM(6));
	begin_holder_call(&hc, fcinfo, PG_GETARG_INT64(0), PG_GETARG_INT64(1));
	task_record_end(&hc.rec, status, hc.now, hc.operation);
	TR_SET(tr, REC_HTTP, Int32GetDatum(res.http_status));
	task_record_put(tr, REC_BODY, res.body_isnull ? res.body : idem_redact_json(hc.operation, res.body),
					res.body_isnull);
	task_record_put(tr, REC_HEADERS, res.headers_isnull ? res.headers : idem_redact_headers(hc.operation, res.headers),
					res.headers_isnull);
	if (res.has_header_list)
		task_record_put(tr, REC_HEADER_LIST, idem_redact_header_list(hc.operation, res.header_list), false);
	task_record_put(tr, REC_RESOURCE, Int64GetDatum(res.resource_id), res.resource_isnull);
	end_holder_call(&hc, status == IDEM_STATUS_SUCCEEDED ? ATTEMPT_SUCCEEDED : ATTEMPT_FAILED,
					res.http_status, (Datum) 0);
	if (status == IDEM_STATUS_FAILED_FINAL)
		idem_stats_count_at_commit(IDEM_KIND_OPERATION, hc.operation, IDEM_STAT_FAILED_FINAL, 1);
	PG_RETURN_VOID();
}


/* A retryable failure of attempt attempts, due again after its backoff. */
static IdemStatus
fail_retryable(HolderCall *hc, int32 attempts)
{
	TaskRecord *tr = &hc->rec;

	TR_SET(tr, REC_STATUS, CStringGetTextDatum(idem_status_name(IDEM_STATUS_FAILED_RETRYABLE)));
	TR_SET(tr, REC_UPDATED, TimestampTzGetDatum(hc->now));
	TR_SET(tr, REC_TASK_DUE, TimestampTzGetDatum(hc->now + idem_task_backoff_usecs(attempts, hc->operation)));
	TR_CLEAR(tr, REC_TASK_LEASE_EXPIRES);
	TR_CLEAR(tr, REC_TASK_SESSION);
	task_record_unmark(tr);
	return IDEM_STATUS_FAILED_RETRYABLE;
}

/*
 * A final failure: FAILED_FINAL, HTTP 500, body {"error": error}.  Only what
 * the caller passed, without what the policy redacts from it.
 */
static IdemStatus
fail_final(HolderCall *hc, Jsonb *error)
{
	task_record_fail(&hc->rec, DatumGetJsonbP(idem_redact_jsonb(hc->operation, JsonbPGetDatum(error))),
					 hc->now, hc->operation);
	return IDEM_STATUS_FAILED_FINAL;
}

/*
 * SQL: idem_fail(task_id, token, error, retryable) returns the new status:
 * FAILED_RETRYABLE, due again after a backoff, while attempts are left;
 * else FAILED_FINAL, replayed as HTTP 500 with {"error": error}.
 */
Datum
idem_fail(PG_FUNCTION_ARGS)
{
	HolderCall	hc = {0};
	TaskRecord *tr = &hc.rec;
	Jsonb	   *error;
	Datum		redacted;
	bool		retryable;
	int32		attempts;
	IdemStatus	status;

	for (int i = 0; i < 4; i++)
		idem_check_not_null(fcinfo, i, (const char *[]) {"task_id", "token", "error", "retryable"}[i]);
	error = PG_GETARG_JSONB_P(2);
	retryable = PG_GETARG_BOOL(3);
	begin_holder_call(&hc, fcinfo, PG_GETARG_INT64(0), PG_GETARG_INT64(1));
	attempts = DatumGetInt32(TR_VALUE(tr, REC_TASK_ATTEMPTS));
	redacted = idem_redact_jsonb(hc.operation, JsonbPGetDatum(error));
	TR_SET(tr, REC_TASK_LAST_ERROR, redacted);
	if (retryable && attempts < idem_task_max_attempts(hc.operation))
		status = fail_retryable(&hc, attempts);
	else
		status = fail_final(&hc, error);
	end_holder_call(&hc, status == IDEM_STATUS_FAILED_FINAL ? ATTEMPT_FAILED : ATTEMPT_RETRYABLE, 0, redacted);
	idem_stats_count_at_commit(IDEM_KIND_OPERATION, hc.operation,
							   status == IDEM_STATUS_FAILED_FINAL ? IDEM_STAT_FAILED_FINAL : IDEM_STAT_RETRIES,
							   1);
	PG_RETURN_TEXT_P(cstring_to_text(idem_status_name(status)));
}

/*
 * SQL: idem_fail_unknown(task_id, token, error) returns the new status.  The
 * attempt's outcome is unknown (the provider may or may not have acted).
 * A task of an operation with uncertain => 'reconcile' (or already marked)
 * is marked: PROCESSING, handed only to idem_lease_reconcile, at once after
 * a plain lease, after a backoff after a reconcile lease.  Any other is
 * idem_fail's retryable failure.
 */
Datum
idem_fail_unknown(PG_FUNCTION_ARGS)
{
	HolderCall	hc = {0};
	TaskRecord *tr = &hc.rec;
	Datum		redacted;
	int32		attempts;
	IdemStatus	status;

	for (int i = 0; i < 3; i++)
		idem_check_not_null(fcinfo, i, (const char *[]) {"task_id", "token", "error"}[i]);
	begin_holder_call(&hc, fcinfo, PG_GETARG_INT64(0), PG_GETARG_INT64(1));
	attempts = DatumGetInt32(TR_VALUE(tr, REC_TASK_ATTEMPTS));
	redacted = idem_redact_jsonb(hc.operation, PG_GETARG_DATUM(2));
	TR_SET(tr, REC_TASK_LAST_ERROR, redacted);
	if (TR_CAN_MARK(tr) && (idem_task_reconciles(hc.operation) || hc.attempt.reconcile))
	{
		TimestampTz at = hc.now;

		if (hc.attempt.reconcile)
			at += idem_task_backoff_usecs(TR_ISNULL(tr, REC_TASK_RECONCILES) ? 1 :
										  DatumGetInt32(TR_VALUE(tr, REC_TASK_RECONCILES)),
										  hc.operation);
		task_record_mark(tr, hc.now, at);
		status = IDEM_STATUS_PROCESSING;
	}
	else if (attempts < idem_task_max_attempts(hc.operation))
		status = fail_retryable(&hc, attempts);
	else
		status = fail_final(&hc, DatumGetJsonbP(redacted));
	end_holder_call(&hc, ATTEMPT_UNKNOWN, 0, redacted);
	if (status != IDEM_STATUS_PROCESSING)
		idem_stats_count_at_commit(IDEM_KIND_OPERATION, hc.operation,
								   status == IDEM_STATUS_FAILED_FINAL ? IDEM_STAT_FAILED_FINAL : IDEM_STAT_RETRIES,
								   1);
	PG_RETURN_TEXT_P(cstring_to_text(idem_status_name(status)));
}
