/*-------------------------------------------------------------------------
 *
 * task.c
 *	  Long flows.  A record committed PROCESSING with a task, leased to
 *	  workers with fencing tokens and heartbeats, retried with backoff,
 *	  taken over when a lease lapses or its session ends.
 *
 * A call that must not hold a transaction open across an external system
 * commits its record at once with idem_submit.  The record is PROCESSING,
 * with the request and a task due now.  Repeats report the current state
 * (202) and never start a second task.
 *
 * Workers take due tasks with idem_lease, each with a new fencing token
 * from one sequence, so every token of a task is greater than the ones
 * before.  idem_heartbeat, idem_complete and idem_fail lock the record and
 * check the token under that lock.  A stale token (the lease was taken
 * over, or the task is finished) raises IK004 and changes nothing, so a
 * stale worker's business write in the same transaction rolls back with
 * it.  idem_complete stores the result in the worker's transaction, next
 * to its business write.  idem_fail schedules the next attempt after an
 * exponential backoff with full jitter, or ends the task FAILED_FINAL
 * (HTTP 500).
 *
 * This file holds the submit, the GUCs, the record a task call rewrites
 * (TaskRecord) and the transaction callback that sends NOTIFY idem_tasks
 * after a commit that submitted.  The lease is task_lease.c, the holder's
 * calls task_holder.c, the bound sessions task_sessions.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>
#include <math.h>

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "commands/async.h"
#include "common/pg_prng.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "call.h"
#include "trace.h"
#include "citus.h"
#include "pending.h"
#include "claim.h"
#include "notify.h"
#include "policy.h"
#include "stats.h"
#include "task.h"
#include "task_int.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_submit);


/* The columns of what idem_submit returns (HTTP..RESOURCE: idem_result_values()). */
enum
{
	SUB_REPLAYED, SUB_STATUS, SUB_HTTP, SUB_BODY, SUB_HEADERS, SUB_RESOURCE,
	SUB_TASK, SUB_NCOLS
};

/* GUC variables */
static int	idem_retry_base = 1000;		/* ms */
static int	idem_retry_max = 3600 * 1000;	/* ms */
static int	idem_max_attempts = 10;

/* The operations this transaction submitted tasks of, for NOTIFY idem_tasks. */
#define SUBMITTED_OPS 16

static char *submitted[SUBMITTED_OPS];	/* in TopTransactionContext */
static int	nsubmitted = 0;
static bool submitted_overflow = false;
static bool submitted_deferred = false;

/* The relations a task call needs besides the catalog's, per catalog build. */
static uint64 rels_generation = 0;
Oid			idem_task_token_seq = InvalidOid;

/* ---------- transaction callbacks ---------- */

static void
forget_submitted(void)
{
	nsubmitted = 0;				/* the names go with TopTransactionContext */
	submitted_overflow = false;
	submitted_deferred = false;
}

/* Remember an operation this transaction submitted a task of. */
static void
note_submitted(const char *operation)
{
	for (int i = 0; i < nsubmitted; i++)
		if (strcmp(submitted[i], operation) == 0)
			return;
	if (nsubmitted == SUBMITTED_OPS)
	{
		submitted_overflow = true;
		return;
	}
	submitted[nsubmitted++] = MemoryContextStrdup(TopTransactionContext, operation);
}

/*
 * After a commit that submitted tasks, NOTIFY idem_tasks, '<operation>' for
 * each of its operations (or '' for more than SUBMITTED_OPS of them), through
 * the notifier when it can (see notify.c), else by the transaction's own
 * NOTIFY.  A prepared transaction notifies nobody (PostgreSQL cannot prepare
 * a NOTIFY).  Workers that also poll find its tasks.
 */
static void
task_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			if (nsubmitted > 0)
			{
				if (submitted_overflow)
				{
					submitted[0] = MemoryContextStrdup(TopTransactionContext, "");
					nsubmitted = 1;
				}
				if (idem_notify_defer(nsubmitted))
					submitted_deferred = true;
				else
					for (int i = 0; i < nsubmitted; i++)
						Async_Notify(IDEM_TASKS_CHANNEL, submitted[i]);
			}
			break;
		case XACT_EVENT_COMMIT:
			if (submitted_deferred)
				idem_notify_committed(IDEM_NOTIFY_TASKS, (const char *const *) submitted,
									  nsubmitted);
			idem_task_apply_checked();
			forget_submitted();
			break;
		case XACT_EVENT_ABORT:
			if (submitted_deferred)
				idem_notify_aborted(nsubmitted);
			idem_task_discard_checked();
			forget_submitted();
			break;
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			idem_task_discard_checked();
			forget_submitted();
			break;
		default:
			break;
	}
}

/* Define the GUCs and register the transaction callback. */
void
idem_task_init(void)
{
	DefineCustomIntVariable("idem.retry_base",
							"The backoff before a task's second attempt after a retryable failure.",
							"Attempt n waits a random time up to idem.retry_base * 2^(n-1), at most idem.retry_max.",
							&idem_retry_base,
							1000, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.retry_max",
							"The longest backoff between two attempts of a task.",
							NULL,
							&idem_retry_max,
							3600 * 1000, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.max_attempts",
							"How many attempts a task gets before idem_fail ends it FAILED_FINAL.",
							NULL,
							&idem_max_attempts,
							10, 1, INT_MAX,
							PGC_USERSET,
							0,
							NULL, NULL, NULL);

	RegisterXactCallback(task_xact_callback, NULL);
	idem_task_attempt_init();
	idem_operator_init();
}

/* ---------- helpers ---------- */

/*
 * Check that this database's idem has tasks and the indexes they are
 * found through (the catalog's), and look up the token sequence once per
 * catalog build.
 */
void
task_relations(const IdemCatalog *cat)
{
	if (cat->tables[IDEM_TABLE_RECORD].att[REC_TASK_DUE] == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("this database's idem has no tasks"),
				 errhint("ALTER EXTENSION idem UPDATE.")));
	if (!OidIsValid(cat->tables[IDEM_TABLE_RECORD].indexes[REC_INDEX_TASK_DUE]))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's index idem_task_due is missing"),
				 errhint("Drop and re-create the extension idem.")));
	/* on Citus the holder finds its task by id alone, though the key is (owner_id, id) */
	if (cat->tables[IDEM_TABLE_RECORD].distributed &&
		!OidIsValid(cat->tables[IDEM_TABLE_RECORD].indexes[REC_INDEX_TASK_ID]))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's index idem_task_id is missing"),
				 errhint("Run idem_distribute() again.")));
	if (rels_generation == cat->generation && OidIsValid(idem_task_token_seq))
		return;
	idem_task_token_seq = get_relname_relid("idem_task_token_seq", cat->nspid);
	if (!OidIsValid(idem_task_token_seq))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's sequence idem_task_token_seq is missing"),
				 errhint("Drop and re-create the extension idem.")));
	rels_generation = cat->generation;
}

/*
 * On Citus, tasks are leased on the nodes that hold them.  A node without
 * shards of idempotency_record (the coordinator, usually) has none.
 */
void
no_local_shards(int n)
{
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("this node holds no shard of idem's tasks"),
				 errdetail("On Citus, a task is leased, heartbeaten, completed and failed on the node that holds its owner's shard."),
				 errhint("Connect task workers to the Citus worker nodes: each leases the tasks of its own shards.")));
}

/*
 * The JSON body of a 202: {"status": ..., "task_id": ...}; for a task whose
 * outcome is being reconciled, a problem (RFC 9457) saying so, its
 * status 202, with task_status and task_id.
 */
static Datum
accepted_body(IdemStatus status, int64 task_id, bool uncertain)
{
	char		buf[320];

	if (uncertain)
		snprintf(buf, sizeof(buf),
				 "{\"type\": \"" IDEM_PROBLEM_RECONCILING "\", \"title\": \"The outcome is being reconciled\", "
				 "\"detail\": \"An attempt ended without a known outcome; it is being checked before any retry.\", "
				 "\"status\": %d, \"task_status\": \"%s\", \"task_id\": " INT64_FORMAT "}",
				 TASK_HTTP_ACCEPTED, idem_status_name(status), task_id);
	else
		snprintf(buf, sizeof(buf), "{\"status\": \"%s\", \"task_id\": " INT64_FORMAT "}",
				 idem_status_name(status), task_id);
	return CStringGetTextDatum(buf);
}

/* ---------- idem_submit ---------- */

/*
 * Commit call's scope as PROCESSING with its task (payload: argument 4):
 * the record, written as the owner, and a note for the workers.  Returns
 * the task's id.
 */
static int64
submit_task(IdemCall *call, FunctionCallInfo fcinfo, IdemClaim *claim, IdemIdentity *identity)
{
	IdemTaskNew task;
	IdemResult	res = {0};
	TimestampTz never;
	int64		task_id;

	TIMESTAMP_NOEND(never);
	res.http_isnull = res.body_isnull = res.snapshot_isnull = true;
	res.headers_isnull = res.resource_isnull = true;
	task.request = JsonbPGetDatum(call->request);
	task.payload = PG_ARGISNULL(4) ? (Datum) 0 : PointerGetDatum(PG_GETARG_JSONB_P(4));
	task.ttl = call->ttl;
	task.trace_context = idem_trace_context();
	idem_use_safe_search_path(identity);
	task_id = idem_record_insert(&call->cat, &call->scope, &call->print, IDEM_STATUS_PROCESSING,
								 &res, call->now, never, NULL, &task);
	idem_claim_written(claim);
	note_submitted(call->scope.operation);
	idem_note_outcome(&call->scope, IDEM_LOG_EXECUTED, false, 0);
	return task_id;
}

/*
 * idem_submit's row: a task that runs answers 202 and where it stands; a
 * finished one its stored result.
 */
static Datum
submit_answer(IdemCall *call, FunctionCallInfo fcinfo, bool replayed, IdemStatus status,
			  int64 task_id, bool is_task, bool uncertain, const IdemResult *stored)
{
	Datum		values[SUB_NCOLS] = {0};
	bool		nulls[SUB_NCOLS] = {0};

	values[SUB_REPLAYED] = BoolGetDatum(replayed);
	values[SUB_STATUS] = CStringGetTextDatum(idem_status_name(status));
	values[SUB_TASK] = Int64GetDatum(task_id);
	nulls[SUB_TASK] = !is_task;
	if (status == IDEM_STATUS_PROCESSING || status == IDEM_STATUS_FAILED_RETRYABLE)
	{
		values[SUB_HTTP] = Int32GetDatum(TASK_HTTP_ACCEPTED);
		values[SUB_BODY] = accepted_body(status, task_id, uncertain);
		nulls[SUB_HEADERS] = nulls[SUB_RESOURCE] = true;
	}
	else
		idem_result_values(stored, &values[SUB_HTTP], &nulls[SUB_HTTP]);
	return HeapTupleGetDatum(heap_form_tuple(idem_catalog_result(&call->cat, fcinfo), values, nulls));
}

/*
 * SQL: idem_submit(owner, operation, key, request, payload, ttl) returns
 * (replayed, status, http_status, body, headers, resource_id, task_id).
 */
Datum
idem_submit(PG_FUNCTION_ARGS)
{
	IdemCall	call;
	IdemIdentity identity = {0};
	IdemClaim	claim = {0};
	int64		task_id = 0;
	bool		executed;

	if (!idem_call_begin(&call, fcinfo, -1, NULL, 5))
		return idem_citus_redispatch(fcinfo);
	task_relations(&call.cat);
	claim.accept_unfinished = true;
	executed = idem_claim(&claim, &call.cat, &call.scope, &call.print, call.now,
						  &identity) == IDEM_EXECUTE;
	if (executed)
		task_id = submit_task(&call, fcinfo, &claim, &identity);
	idem_restore_caller(&identity);

	if (executed)
		return submit_answer(&call, fcinfo, false, IDEM_STATUS_PROCESSING, task_id, true, false, NULL);
	return submit_answer(&call, fcinfo, true, claim.rec.status, claim.rec.id,
						 claim.rec.is_task, claim.rec.uncertain, &claim.rec.result);
}

/* The attempts a task of operation may fail, its policy's or else idem.max_attempts. */
int
idem_task_max_attempts(const char *operation)
{
	const IdemPolicy *policy = idem_policy_of(operation);

	return policy && policy->max_attempts > 0 ? policy->max_attempts : idem_max_attempts;
}

/* Whether operation's policy reconciles uncertain outcomes (uncertain => 'reconcile'). */
bool
idem_task_reconciles(const char *operation)
{
	const IdemPolicy *policy = idem_policy_of(operation);

	return policy && policy->reconcile;
}

/* Whether a task of operation uncertain since since is past reconcile_within at now. */
bool
idem_task_reconcile_overdue(const char *operation, TimestampTz since, TimestampTz now)
{
	const IdemPolicy *policy = idem_policy_of(operation);

	return policy && policy->has_reconcile_within &&
		idem_timestamp_plus(since, &policy->reconcile_within) <= now;
}

/*
 * The wait before attempt `attempt` + 1 of a task of operation.  Full
 * jitter, a uniform random time up to retry_base * 2^(attempt - 1), capped
 * by retry_max (the operation's policy's, else idem.retry_base and
 * idem.retry_max).
 */
int64
idem_task_backoff_usecs(int32 attempt, const char *operation)
{
	const IdemPolicy *policy = idem_policy_of(operation);
	int			base = policy && policy->retry_base_ms > 0 ? policy->retry_base_ms : idem_retry_base;
	int			max = policy && policy->retry_max_ms > 0 ? policy->retry_max_ms : idem_retry_max;
	double		bound_ms = (double) base * ldexp(1.0, Min(Max(attempt - 1, 0), 62));

	bound_ms = Min(bound_ms, (double) max);
	return (int64) (pg_prng_double(&pg_global_prng_state) * bound_ms * 1000.0);
}
