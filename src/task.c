/*-------------------------------------------------------------------------
 *
 * task.c
 *	  Long flows: a record committed PROCESSING with a task, leased to
 *	  workers with fencing tokens and heartbeats, retried with backoff,
 *	  taken over when a lease lapses or its session ends.
 *
 * A call that must not hold a transaction open across an external system
 * commits its record at once with idem_submit: PROCESSING, with the request
 * and a task due now; repeats report the current state (202) and never
 * start a second task.  Workers take due tasks with idem_lease, each with a
 * new fencing token from one sequence, so that every token of a task is
 * greater than the ones before.  idem_heartbeat, idem_complete and idem_fail
 * lock the record and check the token under that lock: a stale one (the
 * lease was taken over, or the task is finished) raises IK004 and changes
 * nothing, so a stale worker's business write in the same transaction rolls
 * back with it.  idem_complete stores the result in the worker's
 * transaction, next to its business write; idem_fail schedules the next
 * attempt after an exponential backoff with full jitter, or ends the task
 * FAILED_FINAL (HTTP 500).
 *
 * The record is the task: task_due_at says when a worker may lease it next
 * (the submit time, the end of the current lease, the time of the next
 * attempt), and one partial index over (operation, task_due_at) serves
 * every lease.  A lease walks that index from the oldest due task, locks
 * each row it would take without waiting (SKIP LOCKED) and updates it with
 * the executor's own row update, no plan: taking a row over is that one
 * guarded update of the version the scan judged due, which nobody has
 * changed since (else the lock fails and the row is skipped).
 *
 * A lease with bind_session also lapses when the leasing session ends.  A
 * session that leases so registers in shared memory (a slot per backend,
 * with an id that no other session, before or after a restart, gets) and
 * writes that id into the task; when it exits, its slot is cleared and a
 * counter of ended sessions goes up (a crash resets shared memory, and
 * with it every slot).  A lease looks for tasks of dead sessions among the
 * leased tasks of its operation when that counter moved since its backend
 * last looked, and takes them over first.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>
#include <math.h>

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "commands/async.h"
#include "commands/sequence.h"
#include "common/pg_prng.h"
#include "executor/executor.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "idem.h"
#include "api.h"
#include "claim.h"
#include "entry.h"
#include "notify.h"
#include "stats.h"
#include "task.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_submit);
PG_FUNCTION_INFO_V1(idem_lease);
PG_FUNCTION_INFO_V1(idem_heartbeat);
PG_FUNCTION_INFO_V1(idem_complete);
PG_FUNCTION_INFO_V1(idem_fail);

#define TASK_HTTP_ACCEPTED		202
#define TASK_HTTP_FAILED		500
#define TASK_BATCH_MAX			1000

/* The columns of what idem_submit returns (HTTP..RESOURCE: idem_result_values()). */
enum
{
	SUB_REPLAYED, SUB_STATUS, SUB_HTTP, SUB_BODY, SUB_HEADERS, SUB_RESOURCE,
	SUB_TASK, SUB_NCOLS
};

/* The columns of what idem_lease returns. */
enum
{
	LEASE_TASK, LEASE_OWNER, LEASE_KEY, LEASE_REQUEST, LEASE_PAYLOAD,
	LEASE_ATTEMPT, LEASE_TOKEN, LEASE_EXPIRES, LEASE_NCOLS
};

/* GUC variables */
static int	idem_retry_base = 1000;		/* ms */
static int	idem_retry_max = 3600 * 1000;	/* ms */
static int	idem_max_attempts = 10;

/* ---------- sessions of bound leases, in shared memory ---------- */

typedef struct TaskShared
{
	pg_atomic_uint64 next_session;	/* ids: from the start time, in µs */
	pg_atomic_uint64 ended;		/* sessions with an id that have ended */
	pg_atomic_uint64 sessions[FLEXIBLE_ARRAY_MEMBER];	/* by backend; 0: none */
} TaskShared;

static TaskShared *task_shared = NULL;
static uint64 my_session = 0;

/*
 * The operations whose bound leases this backend looked through, with the
 * count of ended sessions at the time: committed ones, and this
 * transaction's (applied at its commit).
 */
#define CHECKED_OPS 16

typedef struct CheckedOperation
{
	char		operation[IDEM_OPERATION_MAX_LEN + 1];
	uint64		ended;
} CheckedOperation;

static CheckedOperation checked[CHECKED_OPS];
static int	nchecked = 0;
static CheckedOperation checked_now[CHECKED_OPS];
static int	nchecked_now = 0;

/* The operations this transaction submitted tasks of: NOTIFY idem_tasks. */
#define SUBMITTED_OPS 16

static char *submitted[SUBMITTED_OPS];	/* in TopTransactionContext */
static int	nsubmitted = 0;
static bool submitted_overflow = false;
static bool submitted_deferred = false;

/* The relations a task call needs besides the catalog's, per catalog build. */
static uint64 rels_generation = 0;
static Oid	due_index = InvalidOid;
static Oid	token_seq = InvalidOid;

void
idem_task_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(offsetof(TaskShared, sessions) +
									MaxBackends * sizeof(pg_atomic_uint64)));
}

void
idem_task_shmem_startup(void)
{
	bool		found;

	task_shared = ShmemInitStruct("idem task sessions",
								  offsetof(TaskShared, sessions) +
								  MaxBackends * sizeof(pg_atomic_uint64),
								  &found);
	if (!found)
	{
		pg_atomic_init_u64(&task_shared->next_session, (uint64) GetCurrentTimestamp());
		pg_atomic_init_u64(&task_shared->ended, 0);
		for (int i = 0; i < MaxBackends; i++)
			pg_atomic_init_u64(&task_shared->sessions[i], 0);
	}
}

/* At exit: this session's bound leases lapse. */
static void
session_ended(int code, Datum arg)
{
	pg_atomic_write_u64(&task_shared->sessions[MyBackendId - 1], 0);
	pg_write_barrier();
	pg_atomic_fetch_add_u64(&task_shared->ended, 1);
}

/* This session's id for bound leases, registered on first use. */
static uint64
session_id(void)
{
	if (my_session != 0)
		return my_session;
	if (task_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("bind_session requires idem in shared_preload_libraries"),
				 errhint("Add idem to shared_preload_libraries and restart the server, or lease without bind_session.")));
	my_session = pg_atomic_fetch_add_u64(&task_shared->next_session, 1);
	pg_atomic_write_u64(&task_shared->sessions[MyBackendId - 1], my_session);
	before_shmem_exit(session_ended, (Datum) 0);
	return my_session;
}

static int
cmp_uint64(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

/* The ids of the sessions alive now, sorted; *n of them. */
static uint64 *
live_sessions(int *n)
{
	uint64	   *ids = palloc(MaxBackends * sizeof(uint64));

	*n = 0;
	for (int i = 0; i < MaxBackends; i++)
	{
		uint64		id = pg_atomic_read_u64(&task_shared->sessions[i]);

		if (id != 0)
			ids[(*n)++] = id;
	}
	qsort(ids, *n, sizeof(uint64), cmp_uint64);
	return ids;
}

/*
 * The count of ended sessions when this backend last looked through the
 * bound leases of operation; PG_UINT64_MAX if it never did.
 */
static uint64
last_checked(const char *operation)
{
	for (int i = 0; i < nchecked; i++)
		if (strcmp(checked[i].operation, operation) == 0)
			return checked[i].ended;
	return PG_UINT64_MAX;
}

/* Remember, for this transaction's commit, that operation was looked through. */
static void
mark_checked(const char *operation, uint64 ended)
{
	if (nchecked_now == CHECKED_OPS)
		return;
	strlcpy(checked_now[nchecked_now].operation, operation, IDEM_OPERATION_MAX_LEN + 1);
	checked_now[nchecked_now++].ended = ended;
}

static void
apply_checked(void)
{
	for (int i = 0; i < nchecked_now; i++)
	{
		int			j = 0;

		while (j < nchecked && strcmp(checked[j].operation, checked_now[i].operation) != 0)
			j++;
		if (j == nchecked)
		{
			if (nchecked == CHECKED_OPS)
				j = nchecked - 1;	/* forget one: it is looked through again */
			else
				nchecked++;
		}
		checked[j] = checked_now[i];
	}
	nchecked_now = 0;
}

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
 * a NOTIFY): workers that also poll find its tasks.
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
			apply_checked();
			forget_submitted();
			break;
		case XACT_EVENT_ABORT:
			if (submitted_deferred)
				idem_notify_aborted(nsubmitted);
			nchecked_now = 0;
			forget_submitted();
			break;
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			nchecked_now = 0;
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
}

/* ---------- helpers ---------- */

/*
 * Check that this database's idem has tasks (1.5), and look up the lease
 * index and the token sequence once per catalog build.
 */
static void
task_relations(const IdemCatalog *cat)
{
	if (cat->tables[IDEM_TABLE_RECORD].att[REC_TASK_DUE] == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("this database's idem has no tasks"),
				 errhint("ALTER EXTENSION idem UPDATE.")));
	if (rels_generation == cat->generation && OidIsValid(due_index))
		return;
	due_index = get_relname_relid("idem_task_due", cat->nspid);
	token_seq = get_relname_relid("idem_task_token_seq", cat->nspid);
	if (!OidIsValid(due_index) || !OidIsValid(token_seq))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's index idem_task_due or sequence idem_task_token_seq is missing"),
				 errhint("Drop and re-create the extension idem.")));
	rels_generation = cat->generation;
}

/* Refuse (22023) an interval argument that is not positive. */
static TimestampTz
plus_positive(TimestampTz now, Interval *iv, const char *what)
{
	TimestampTz t = idem_timestamp_plus(now, iv);

	if (t <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be positive", what),
				 errdetail("The call has %s %s.", what,
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(iv))))));
	return t;
}

/* The JSON body of a 202: {"status": ..., "task_id": ...}. */
static Datum
accepted_body(IdemStatus status, int64 task_id)
{
	char		buf[96];

	snprintf(buf, sizeof(buf), "{\"status\": \"%s\", \"task_id\": " INT64_FORMAT "}",
			 idem_status_name(status), task_id);
	return CStringGetTextDatum(buf);
}

/* ---------- idem_submit ---------- */

/*
 * SQL: idem_submit(owner, operation, key, request, payload, ttl) returns
 * (replayed, status, http_status, body, headers, resource_id, task_id).
 */
Datum
idem_submit(PG_FUNCTION_ARGS)
{
	IdemScope	scope;
	IdemFingerprint fingerprint;
	IdemCatalog cat;
	IdemIdentity identity = {0};
	IdemClaim	claim = {0};
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	Interval   *ttl = NULL;
	Jsonb	   *request;
	Datum		values[SUB_NCOLS] = {0};
	bool		nulls[SUB_NCOLS] = {0};

	idem_check_not_null(fcinfo, 0, "owner");
	idem_check_not_null(fcinfo, 1, "operation");
	idem_check_not_null(fcinfo, 2, "key");
	idem_scope_init(&scope, PG_GETARG_INT64(0), PG_GETARG_DATUM(1), PG_GETARG_DATUM(2));
	idem_stats_count(scope.operation, IDEM_STAT_CALLS, 1);
	idem_check_not_null(fcinfo, 3, "request");
	if (!PG_ARGISNULL(5))
	{
		ttl = PG_GETARG_INTERVAL_P(5);
		idem_check_ttl(ttl, now);
	}
	request = PG_GETARG_JSONB_P(3);
	idem_fingerprint_jsonb(request, fingerprint);
	idem_api_check_unclaimed(&scope, fingerprint);

	cat = *idem_catalog(fcinfo);
	task_relations(&cat);
	claim.accept_unfinished = true;
	if (idem_claim(&claim, &cat, &scope, fingerprint, now, &identity) == IDEM_EXECUTE)
	{
		IdemTaskNew task;
		IdemResult	res;
		TimestampTz never;
		int64		id;

		TIMESTAMP_NOEND(never);
		memset(&res, 0, sizeof(res));
		res.http_isnull = res.body_isnull = res.snapshot_isnull = true;
		res.headers_isnull = res.resource_isnull = true;
		task.request = JsonbPGetDatum(request);
		task.payload = PG_ARGISNULL(4) ? (Datum) 0 : PointerGetDatum(PG_GETARG_JSONB_P(4));
		task.ttl = ttl;
		idem_use_safe_search_path(&identity);
		id = idem_record_insert(&cat, &scope, fingerprint, IDEM_STATUS_PROCESSING, &res,
								now, never, NULL, &task);
		idem_restore_caller(&identity);
		note_submitted(scope.operation);
		idem_note_outcome(&scope, IDEM_LOG_EXECUTED, false, 0);

		values[SUB_REPLAYED] = BoolGetDatum(false);
		values[SUB_STATUS] = CStringGetTextDatum(idem_status_name(IDEM_STATUS_PROCESSING));
		values[SUB_HTTP] = Int32GetDatum(TASK_HTTP_ACCEPTED);
		values[SUB_BODY] = accepted_body(IDEM_STATUS_PROCESSING, id);
		nulls[SUB_HEADERS] = nulls[SUB_RESOURCE] = true;
		values[SUB_TASK] = Int64GetDatum(id);
	}
	else
	{
		IdemRecord *rec = &claim.rec;

		idem_restore_caller(&identity);
		values[SUB_REPLAYED] = BoolGetDatum(true);
		values[SUB_STATUS] = CStringGetTextDatum(idem_status_name(rec->status));
		values[SUB_TASK] = Int64GetDatum(rec->id);
		nulls[SUB_TASK] = !rec->is_task;
		if (rec->status == IDEM_STATUS_PROCESSING ||
			rec->status == IDEM_STATUS_FAILED_RETRYABLE)
		{
			values[SUB_HTTP] = Int32GetDatum(TASK_HTTP_ACCEPTED);
			values[SUB_BODY] = accepted_body(rec->status, rec->id);
			nulls[SUB_HEADERS] = nulls[SUB_RESOURCE] = true;
		}
		else
		{
			idem_result_values(&rec->result, &values[SUB_HTTP], &nulls[SUB_HTTP]);
		}
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(idem_catalog_result(&cat, fcinfo),
													  values, nulls)));
}

/* ---------- idem_lease ---------- */

/* One call of idem_lease. */
typedef struct LeaseCall
{
	const AttrNumber *att;
	IdemRows	rows;
	Relation	heap;
	TupleTableSlot *scanslot;
	TupleTableSlot *lockslot;
	Snapshot	snapshot;
	Datum	   *values;			/* the new version being built */
	bool	   *nulls;
	Datum		worker;
	TimestampTz now;
	TimestampTz expires;
	uint64		session;		/* 0: not bound */
	ReturnSetInfo *rsinfo;
	int			batch;
	int			leased;
	int			takeovers;
} LeaseCall;

/*
 * Lock the row the scan returned, without waiting: false if another
 * transaction holds it, or changed or deleted it since the scan's snapshot
 * (the scan would no longer judge it due: it is skipped).
 */
static bool
lock_scanned(LeaseCall *lc)
{
	TM_FailureData tmfd;

	return table_tuple_lock(lc->heap, &lc->scanslot->tts_tid, lc->snapshot, lc->lockslot,
							GetCurrentCommandId(false), LockTupleNoKeyExclusive,
							LockWaitSkip, 0, &tmfd) == TM_Ok;
}

/* Hand the locked row to the worker: a new attempt, a new token, a lease. */
static void
lease_locked(LeaseCall *lc)
{
	const AttrNumber *att = lc->att;
	TupleTableSlot *slot = lc->lockslot;
	int			natts = slot->tts_tupleDescriptor->natts;
	Datum		out[LEASE_NCOLS];
	bool		outnulls[LEASE_NCOLS] = {0};
	int32		attempt;
	int64		token;

	slot_getallattrs(slot);
	memcpy(lc->values, slot->tts_values, natts * sizeof(Datum));
	memcpy(lc->nulls, slot->tts_isnull, natts * sizeof(bool));

	attempt = (lc->nulls[att[REC_TASK_ATTEMPTS] - 1] ? 0 :
			   DatumGetInt32(lc->values[att[REC_TASK_ATTEMPTS] - 1])) + 1;
	if (!lc->nulls[att[REC_TASK_LEASE_EXPIRES] - 1])
		lc->takeovers++;		/* lapsed, or its session ended */
	token = nextval_internal(token_seq, false);

#define SET(col, d) (lc->values[att[col] - 1] = (d), lc->nulls[att[col] - 1] = false)
	SET(REC_STATUS, CStringGetTextDatum(idem_status_name(IDEM_STATUS_PROCESSING)));
	SET(REC_UPDATED, TimestampTzGetDatum(lc->now));
	SET(REC_TASK_ATTEMPTS, Int32GetDatum(attempt));
	SET(REC_TASK_TOKEN, Int64GetDatum(token));
	SET(REC_TASK_LEASE_EXPIRES, TimestampTzGetDatum(lc->expires));
	SET(REC_TASK_WORKER, lc->worker);
	SET(REC_TASK_HEARTBEAT, TimestampTzGetDatum(lc->now));
	if (lc->session != 0)
		SET(REC_TASK_SESSION, Int64GetDatum((int64) lc->session));
	else
		lc->nulls[att[REC_TASK_SESSION] - 1] = true;
#undef SET

	out[LEASE_TASK] = lc->values[att[REC_ID] - 1];
	out[LEASE_OWNER] = lc->values[att[REC_OWNER] - 1];
	out[LEASE_KEY] = lc->values[att[REC_KEY] - 1];
	out[LEASE_REQUEST] = lc->values[att[REC_TASK_REQUEST] - 1];
	outnulls[LEASE_REQUEST] = lc->nulls[att[REC_TASK_REQUEST] - 1];
	out[LEASE_PAYLOAD] = lc->values[att[REC_TASK_PAYLOAD] - 1];
	outnulls[LEASE_PAYLOAD] = lc->nulls[att[REC_TASK_PAYLOAD] - 1];
	out[LEASE_ATTEMPT] = Int32GetDatum(attempt);
	out[LEASE_TOKEN] = Int64GetDatum(token);
	out[LEASE_EXPIRES] = TimestampTzGetDatum(lc->expires);
	tuplestore_putvalues(lc->rsinfo->setResult, lc->rsinfo->setDesc, out, outnulls);

	idem_rows_update(&lc->rows, 0, slot, lc->values, lc->nulls);
	lc->leased++;
}

/*
 * Lease operation's due tasks, oldest due first, up to the batch: those
 * never leased or due again after a failure, and those whose lease has
 * lapsed or whose bound session has ended (takeovers).  A lease leaves the
 * index key alone (so that it is a HOT update): the leased tasks stay in
 * place, and the scan steps over those whose lease holds.  Whether a bound
 * session has ended is asked only when some session ended since this
 * backend last went through operation's leases.
 */
static void
lease_due(LeaseCall *lc, Relation index, Datum operation, const char *opname)
{
	ScanKeyData skey[2];
	IndexScanDesc scan;
	uint64		ended = 0;
	uint64	   *live = NULL;
	int			nlive = 0;
	bool		check_sessions = false;
	bool		complete = true;

	if (task_shared != NULL)
	{
		ended = pg_atomic_read_u64(&task_shared->ended);
		if (last_checked(opname) != ended)
		{
			pg_read_barrier();
			live = live_sessions(&nlive);
			check_sessions = true;
		}
	}

	ScanKeyEntryInitialize(&skey[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[0], F_TEXTEQ, operation);
	ScanKeyInit(&skey[1], 2, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
				TimestampTzGetDatum(lc->now));
	scan = index_beginscan(lc->heap, index, lc->snapshot, 2, 0);
	index_rescan(scan, skey, 2, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, lc->scanslot))
	{
		bool		isnull;
		bool		dead_session = false;
		Datum		d;

		d = slot_getattr(lc->scanslot, lc->att[REC_TASK_LEASE_EXPIRES], &isnull);
		if (!isnull && DatumGetTimestampTz(d) > lc->now)
		{
			uint64		session;

			/* leased, and the lease holds: unless its session has ended */
			if (!check_sessions)
				continue;
			d = slot_getattr(lc->scanslot, lc->att[REC_TASK_SESSION], &isnull);
			session = (uint64) DatumGetInt64(d);
			if (isnull || bsearch(&session, live, nlive, sizeof(uint64), cmp_uint64) != NULL)
				continue;
			dead_session = true;
		}
		if (lc->leased == lc->batch)
		{
			complete = false;
			break;
		}
		if (!lock_scanned(lc))
		{
			/* a dead session's task its ending transaction may still hold */
			if (dead_session)
				complete = false;
			continue;
		}
		lease_locked(lc);
	}
	index_endscan(scan);
	if (check_sessions)
	{
		pfree(live);
		if (complete)
			mark_checked(opname, ended);
	}
}

/*
 * SQL: idem_lease(operation, worker, lease, batch, bind_session) returns
 * setof (task_id, owner, key, request, payload, attempt, token,
 * lease_expires_at).
 */
Datum
idem_lease(PG_FUNCTION_ARGS)
{
	LeaseCall	lc = {0};
	IdemCatalog cat;
	IdemIdentity identity = {0};
	text	   *operation;
	text	   *worker;
	char	   *opname;
	Relation	index;
	Oid			relid;
	int			natts;

	for (int i = 0; i < 5; i++)
		idem_check_not_null(fcinfo, i,
							(const char *[]) {"operation", "worker", "lease", "batch", "bind_session"}[i]);
	operation = PG_GETARG_TEXT_PP(0);
	opname = text_to_cstring(operation);
	idem_check_operation(opname, VARSIZE_ANY_EXHDR(operation));
	worker = PG_GETARG_TEXT_PP(1);
	idem_check_printable("worker", VARDATA_ANY(worker), VARSIZE_ANY_EXHDR(worker),
						 IDEM_WORKER_MAX_LEN);
	lc.now = GetCurrentTimestamp();
	lc.expires = plus_positive(lc.now, PG_GETARG_INTERVAL_P(2), "lease");
	lc.batch = PG_GETARG_INT32(3);
	if (lc.batch < 1 || lc.batch > TASK_BATCH_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and %d", TASK_BATCH_MAX),
				 errdetail("The call has batch %d.", lc.batch)));
	lc.session = PG_GETARG_BOOL(4) ? session_id() : 0;
	lc.worker = PointerGetDatum(worker);

	InitMaterializedSRF(fcinfo, 0);
	lc.rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	cat = *idem_catalog(fcinfo);
	task_relations(&cat);
	lc.att = cat.tables[IDEM_TABLE_RECORD].att;

	idem_become_owner(&identity, cat.owner);
	idem_use_safe_search_path(&identity);
	relid = cat.tables[IDEM_TABLE_RECORD].relid;
	idem_rows_begin(&lc.rows, &relid, 1, CMD_UPDATE);
	if (idem_catalog_current(&cat))
		idem_rows_set_checks(&lc.rows, 0, cat.tables[IDEM_TABLE_RECORD].checks,
							 cat.tables[IDEM_TABLE_RECORD].ncheck);
	lc.heap = lc.rows.rels[0]->ri_RelationDesc;
	lc.scanslot = table_slot_create(lc.heap, &lc.rows.estate->es_tupleTable);
	lc.lockslot = table_slot_create(lc.heap, &lc.rows.estate->es_tupleTable);
	natts = RelationGetDescr(lc.heap)->natts;
	lc.values = palloc(natts * sizeof(Datum));
	lc.nulls = palloc(natts * sizeof(bool));
	lc.snapshot = RegisterSnapshot(GetTransactionSnapshot());
	index = index_open(due_index, AccessShareLock);

	lease_due(&lc, index, PointerGetDatum(operation), opname);

	index_close(index, NoLock);
	UnregisterSnapshot(lc.snapshot);
	idem_rows_end(&lc.rows);
	idem_restore_caller(&identity);

	idem_stats_count_at_commit(opname, IDEM_STAT_LEASES, lc.leased);
	idem_stats_count_at_commit(opname, IDEM_STAT_TAKEOVERS, lc.takeovers);
	return (Datum) 0;
}

/* ---------- the holder's calls: heartbeat, complete, fail ---------- */

/* One call of the holder of a lease, on its task locked. */
typedef struct HolderCall
{
	IdemCatalog cat;
	const AttrNumber *att;
	IdemIdentity identity;
	IdemRows	rows;
	TupleTableSlot *locked;
	Datum	   *values;			/* the locked row's, then the new version */
	bool	   *nulls;
	char	   *operation;		/* the task's */
	TimestampTz now;
} HolderCall;

/* Raise IK004 for task_id and token, counting it for operation (NULL: unknown). */
static void pg_attribute_noreturn()
report_stale(int64 task_id, int64 token, const char *operation, const char *detail)
{
	if (operation)
		idem_stats_count(operation, IDEM_STAT_STALE_TOKENS, 1);
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
	const IdemTableLayout *rt;
	Relation	heap;
	Relation	index;
	Oid			pk;
	ScanKeyData skey;
	IndexScanDesc scan;
	TupleTableSlot *found;
	Snapshot	snapshot;
	TM_FailureData tmfd;
	TM_Result	tmres = TM_Invisible;
	IdemStatus	status;
	char		detail[160];
	int			natts;

	hc->cat = *idem_catalog(fcinfo);
	task_relations(&hc->cat);
	rt = &hc->cat.tables[IDEM_TABLE_RECORD];
	hc->att = rt->att;
	hc->now = GetCurrentTimestamp();

	idem_become_owner(&hc->identity, hc->cat.owner);
	idem_use_safe_search_path(&hc->identity);
	idem_rows_begin(&hc->rows, &rt->relid, 1, CMD_UPDATE);
	if (idem_catalog_current(&hc->cat))
		idem_rows_set_checks(&hc->rows, 0, rt->checks, rt->ncheck);
	heap = hc->rows.rels[0]->ri_RelationDesc;
	pk = RelationGetPrimaryKeyIndex(heap);
	if (!OidIsValid(pk))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table idempotency_record has no primary key"),
				 errhint("Drop and re-create the extension idem.")));
	found = table_slot_create(heap, &hc->rows.estate->es_tupleTable);
	hc->locked = table_slot_create(heap, &hc->rows.estate->es_tupleTable);

	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	index = index_open(pk, AccessShareLock);
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(task_id));
	scan = index_beginscan(heap, index, snapshot, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, found))
		tmres = table_tuple_lock(heap, &found->tts_tid, snapshot, hc->locked,
								 GetCurrentCommandId(false), LockTupleNoKeyExclusive,
								 LockWaitBlock,
								 IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION,
								 &tmfd);
	index_endscan(scan);
	index_close(index, NoLock);
	UnregisterSnapshot(snapshot);

	if (tmres == TM_Updated && IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update")));
	if (tmres != TM_Ok)
	{
		snprintf(detail, sizeof(detail),
				 "Task " INT64_FORMAT " does not exist (never submitted, or finished and expired).",
				 task_id);
		report_stale(task_id, token, NULL, detail);
	}

	slot_getallattrs(hc->locked);
	natts = hc->locked->tts_tupleDescriptor->natts;
	hc->values = palloc(natts * sizeof(Datum));
	hc->nulls = palloc(natts * sizeof(bool));
	memcpy(hc->values, hc->locked->tts_values, natts * sizeof(Datum));
	memcpy(hc->nulls, hc->locked->tts_isnull, natts * sizeof(bool));
	hc->operation = TextDatumGetCString(hc->values[hc->att[REC_OPERATION] - 1]);

	status = idem_status_from_name(TextDatumGetCString(hc->values[hc->att[REC_STATUS] - 1]));
	if (hc->nulls[hc->att[REC_TASK_ATTEMPTS] - 1])
		snprintf(detail, sizeof(detail), "Record " INT64_FORMAT " is not a task.", task_id);
	else if (status != IDEM_STATUS_PROCESSING && status != IDEM_STATUS_FAILED_RETRYABLE)
		snprintf(detail, sizeof(detail), "The task is finished: %s.", idem_status_name(status));
	else if (hc->nulls[hc->att[REC_TASK_LEASE_EXPIRES] - 1])
		snprintf(detail, sizeof(detail), "The task is not leased (%s, attempt %d).",
				 idem_status_name(status),
				 DatumGetInt32(hc->values[hc->att[REC_TASK_ATTEMPTS] - 1]));
	else if (DatumGetInt64(hc->values[hc->att[REC_TASK_TOKEN] - 1]) != token)
		snprintf(detail, sizeof(detail), "The task was leased again, with token " INT64_FORMAT " (attempt %d).",
				 DatumGetInt64(hc->values[hc->att[REC_TASK_TOKEN] - 1]),
				 DatumGetInt32(hc->values[hc->att[REC_TASK_ATTEMPTS] - 1]));
	else
		return;
	report_stale(task_id, token, hc->operation, detail);
}

/* Write the new version built in hc->values, and give the caller back its rights. */
static void
end_holder_call(HolderCall *hc)
{
	idem_rows_update(&hc->rows, 0, hc->locked, hc->values, hc->nulls);
	idem_rows_end(&hc->rows);
	idem_restore_caller(&hc->identity);
}

#define HC_SET(hc, col, d) \
	((hc)->values[(hc)->att[col] - 1] = (d), (hc)->nulls[(hc)->att[col] - 1] = false)
#define HC_CLEAR(hc, col) ((hc)->nulls[(hc)->att[col] - 1] = true)

/* The task is over: nothing more to lease. */
static void
finish_task(HolderCall *hc, IdemStatus status)
{
	const Interval *ttl = NULL;

	if (!hc->nulls[hc->att[REC_TASK_TTL] - 1])
		ttl = DatumGetIntervalP(hc->values[hc->att[REC_TASK_TTL] - 1]);
	HC_SET(hc, REC_STATUS, CStringGetTextDatum(idem_status_name(status)));
	HC_SET(hc, REC_UPDATED, TimestampTzGetDatum(hc->now));
	HC_SET(hc, REC_EXPIRES, TimestampTzGetDatum(idem_record_expiry(status, hc->now, ttl)));
	HC_CLEAR(hc, REC_TASK_DUE);
	HC_CLEAR(hc, REC_TASK_LEASE_EXPIRES);
	HC_CLEAR(hc, REC_TASK_SESSION);
}

/* SQL: idem_heartbeat(task_id, token, extend) returns the new lease_expires_at. */
Datum
idem_heartbeat(PG_FUNCTION_ARGS)
{
	HolderCall	hc = {0};
	TimestampTz expires;

	idem_check_not_null(fcinfo, 0, "task_id");
	idem_check_not_null(fcinfo, 1, "token");
	begin_holder_call(&hc, fcinfo, PG_GETARG_INT64(0), PG_GETARG_INT64(1));
	if (PG_ARGISNULL(2))
	{
		/* the interval the lease was granted (or last extended) for */
		TimestampTz old_expires = DatumGetTimestampTz(hc.values[hc.att[REC_TASK_LEASE_EXPIRES] - 1]);
		TimestampTz old_beat = DatumGetTimestampTz(hc.values[hc.att[REC_TASK_HEARTBEAT] - 1]);

		expires = hc.now + Max(old_expires - old_beat, 1);
	}
	else
		expires = plus_positive(hc.now, PG_GETARG_INTERVAL_P(2), "extend");
	HC_SET(&hc, REC_TASK_LEASE_EXPIRES, TimestampTzGetDatum(expires));
	HC_SET(&hc, REC_TASK_HEARTBEAT, TimestampTzGetDatum(hc.now));
	HC_SET(&hc, REC_UPDATED, TimestampTzGetDatum(hc.now));
	end_holder_call(&hc);
	PG_RETURN_TIMESTAMPTZ(expires);
}

/*
 * SQL: idem_complete(task_id, token, http_status, body, resource_id,
 * headers): the task's result, stored in the worker's transaction.
 */
Datum
idem_complete(PG_FUNCTION_ARGS)
{
	HolderCall	hc = {0};
	IdemResult	res;
	IdemStatus	status;

	idem_check_not_null(fcinfo, 0, "task_id");
	idem_check_not_null(fcinfo, 1, "token");
	idem_check_not_null(fcinfo, 2, "http_status");
	status = idem_result_make(&res, false, PG_GETARG_INT32(2),
							  PG_ARGISNULL(3), PG_GETARG_DATUM(3),
							  PG_ARGISNULL(5), PG_GETARG_DATUM(5),
							  PG_ARGISNULL(4), PG_ARGISNULL(4) ? 0 : PG_GETARG_INT64(4));
	begin_holder_call(&hc, fcinfo, PG_GETARG_INT64(0), PG_GETARG_INT64(1));
	finish_task(&hc, status);
	HC_SET(&hc, REC_HTTP, Int32GetDatum(res.http_status));
	if (res.body_isnull)
		HC_CLEAR(&hc, REC_BODY);
	else
		HC_SET(&hc, REC_BODY, res.body);
	if (res.headers_isnull)
		HC_CLEAR(&hc, REC_HEADERS);
	else
		HC_SET(&hc, REC_HEADERS, res.headers);
	if (res.resource_isnull)
		HC_CLEAR(&hc, REC_RESOURCE);
	else
		HC_SET(&hc, REC_RESOURCE, Int64GetDatum(res.resource_id));
	end_holder_call(&hc);
	if (status == IDEM_STATUS_FAILED_FINAL)
		idem_stats_count_at_commit(hc.operation, IDEM_STAT_FAILED_FINAL, 1);
	PG_RETURN_VOID();
}

/*
 * The wait before attempt `attempt` + 1: full jitter, a uniform random time
 * up to idem.retry_base * 2^(attempt - 1), capped by idem.retry_max.
 */
static int64
backoff_usecs(int32 attempt)
{
	double		bound_ms = (double) idem_retry_base * ldexp(1.0, Min(Max(attempt - 1, 0), 62));

	bound_ms = Min(bound_ms, (double) idem_retry_max);
	return (int64) (pg_prng_double(&pg_global_prng_state) * bound_ms * 1000.0);
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
	Jsonb	   *error;
	bool		retryable;
	int32		attempts;
	IdemStatus	status;

	idem_check_not_null(fcinfo, 0, "task_id");
	idem_check_not_null(fcinfo, 1, "token");
	idem_check_not_null(fcinfo, 2, "error");
	idem_check_not_null(fcinfo, 3, "retryable");
	error = PG_GETARG_JSONB_P(2);
	retryable = PG_GETARG_BOOL(3);
	begin_holder_call(&hc, fcinfo, PG_GETARG_INT64(0), PG_GETARG_INT64(1));
	attempts = DatumGetInt32(hc.values[hc.att[REC_TASK_ATTEMPTS] - 1]);
	HC_SET(&hc, REC_TASK_LAST_ERROR, JsonbPGetDatum(error));
	if (retryable && attempts < idem_max_attempts)
	{
		status = IDEM_STATUS_FAILED_RETRYABLE;
		HC_SET(&hc, REC_STATUS, CStringGetTextDatum(idem_status_name(status)));
		HC_SET(&hc, REC_UPDATED, TimestampTzGetDatum(hc.now));
		HC_SET(&hc, REC_TASK_DUE, TimestampTzGetDatum(hc.now + backoff_usecs(attempts)));
		HC_CLEAR(&hc, REC_TASK_LEASE_EXPIRES);
		HC_CLEAR(&hc, REC_TASK_SESSION);
	}
	else
	{
		StringInfoData body;

		status = IDEM_STATUS_FAILED_FINAL;
		finish_task(&hc, status);
		HC_SET(&hc, REC_HTTP, Int32GetDatum(TASK_HTTP_FAILED));
		/* {"error": error}: only what the caller passed */
		initStringInfo(&body);
		appendStringInfoString(&body, "{\"error\": ");
		(void) JsonbToCString(&body, &error->root, VARSIZE(error));
		appendStringInfoChar(&body, '}');
		HC_SET(&hc, REC_BODY, PointerGetDatum(cstring_to_text_with_len(body.data, body.len)));
		HC_CLEAR(&hc, REC_HEADERS);
		HC_CLEAR(&hc, REC_RESOURCE);
	}
	end_holder_call(&hc);
	idem_stats_count_at_commit(hc.operation,
							   status == IDEM_STATUS_FAILED_FINAL ? IDEM_STAT_FAILED_FINAL : IDEM_STAT_RETRIES,
							   1);
	PG_RETURN_TEXT_P(cstring_to_text(idem_status_name(status)));
}
