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
#include "compat.h"
#include "call.h"
#include "citus.h"
#include "pending.h"
#include "claim.h"
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
static Oid	token_seq = InvalidOid;

/* On Citus: where the next lease starts among this node's shards. */
static uint32 lease_rotor = 0;

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
	pg_atomic_write_u64(&task_shared->sessions[idem_backend_slot()], 0);
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
	pg_atomic_write_u64(&task_shared->sessions[idem_backend_slot()], my_session);
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
 * Check that this database's idem has tasks (1.5) and the indexes they are
 * found through (the catalog's), and look up the token sequence once per
 * catalog build.
 */
static void
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
	/* on Citus the holder finds its task by id alone: the key is (owner_id, id) */
	if (cat->tables[IDEM_TABLE_RECORD].distributed &&
		!OidIsValid(cat->tables[IDEM_TABLE_RECORD].indexes[REC_INDEX_TASK_ID]))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's index idem_task_id is missing"),
				 errhint("Run idem_distribute() again.")));
	if (rels_generation == cat->generation && OidIsValid(token_seq))
		return;
	token_seq = get_relname_relid("idem_task_token_seq", cat->nspid);
	if (!OidIsValid(token_seq))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's sequence idem_task_token_seq is missing"),
				 errhint("Drop and re-create the extension idem.")));
	rels_generation = cat->generation;
}

/*
 * On Citus, tasks are leased on the nodes that hold them: a node without
 * shards of idempotency_record (the coordinator, usually) has none.
 */
static void
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
 * A record being rewritten by a task call: idempotency_record opened for an
 * update as the extension's owner, and the new version, built in values
 * and nulls from a copy of the locked version's columns.
 */
typedef struct TaskRecord
{
	const AttrNumber *att;
	IdemIdentity identity;
	IdemRows	rows;
	Relation	heap;
	Datum	   *values;
	bool	   *nulls;
} TaskRecord;

static void
task_record_open(TaskRecord *tr, const IdemCatalog *cat)
{
	const IdemTableLayout *rt = &cat->tables[IDEM_TABLE_RECORD];
	int			natts;

	tr->att = rt->att;
	idem_become_owner(&tr->identity, cat->owner);
	idem_use_safe_search_path(&tr->identity);
	idem_rows_begin(&tr->rows, &rt->relid, 1, CMD_UPDATE);
	if (idem_catalog_current(cat))
		idem_rows_set_checks(&tr->rows, 0, rt->checks, rt->ncheck);
	tr->heap = tr->rows.rels[0]->ri_RelationDesc;
	natts = RelationGetDescr(tr->heap)->natts;
	tr->values = palloc(natts * sizeof(Datum));
	tr->nulls = palloc(natts * sizeof(bool));
}

/* A slot for tr's table, kept until task_record_close. */
static TupleTableSlot *
task_record_slot(TaskRecord *tr)
{
	return table_slot_create(tr->heap, &tr->rows.estate->es_tupleTable);
}

/* Start the new version from the locked one's columns. */
static void
task_record_take(TaskRecord *tr, TupleTableSlot *locked)
{
	int			natts = locked->tts_tupleDescriptor->natts;

	slot_getallattrs(locked);
	memcpy(tr->values, locked->tts_values, natts * sizeof(Datum));
	memcpy(tr->nulls, locked->tts_isnull, natts * sizeof(bool));
}

/* Column col of the new version: d, or NULL. */
static void
task_record_put(TaskRecord *tr, int col, Datum d, bool isnull)
{
	tr->values[tr->att[col] - 1] = d;
	tr->nulls[tr->att[col] - 1] = isnull;
}

#define TR_SET(tr, col, d)	task_record_put(tr, col, d, false)
#define TR_CLEAR(tr, col)	task_record_put(tr, col, (Datum) 0, true)
#define TR_VALUE(tr, col)	((tr)->values[(tr)->att[col] - 1])
#define TR_ISNULL(tr, col)	((tr)->nulls[(tr)->att[col] - 1])

/* Replace the locked version by the new one. */
static void
task_record_write(TaskRecord *tr, TupleTableSlot *locked)
{
	idem_rows_update(&tr->rows, 0, locked, tr->values, tr->nulls);
}

/* Fire what the updates queued, and give the caller back its rights. */
static void
task_record_close(TaskRecord *tr)
{
	idem_rows_end(&tr->rows);
	idem_restore_caller(&tr->identity);
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
	idem_use_safe_search_path(identity);
	task_id = idem_record_insert(&call->cat, &call->scope, call->fingerprint, IDEM_STATUS_PROCESSING,
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
			  int64 task_id, bool is_task, const IdemResult *stored)
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
		values[SUB_BODY] = accepted_body(status, task_id);
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
	executed = idem_claim(&claim, &call.cat, &call.scope, call.fingerprint, call.now,
						  &identity) == IDEM_EXECUTE;
	if (executed)
		task_id = submit_task(&call, fcinfo, &claim, &identity);
	idem_restore_caller(&identity);

	if (executed)
		return submit_answer(&call, fcinfo, false, IDEM_STATUS_PROCESSING, task_id, true, NULL);
	return submit_answer(&call, fcinfo, true, claim.rec.status, claim.rec.id,
						 claim.rec.is_task, &claim.rec.result);
}

/* ---------- idem_lease ---------- */

/* One call of idem_lease. */
typedef struct LeaseCall
{
	TaskRecord	rec;
	TupleTableSlot *scanslot;
	TupleTableSlot *lockslot;
	Snapshot	snapshot;
	Datum		worker;
	TimestampTz now;
	TimestampTz expires;
	uint64		session;		/* 0: not bound */
	ReturnSetInfo *rsinfo;
	int			batch;
	int			leased;
	int			takeovers;
	/* whether bound sessions are asked about, and which are alive */
	bool		check_sessions;
	uint64		ended;
	uint64	   *live;
	int			nlive;
	bool		complete;		/* every due task was looked at */
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

	return table_tuple_lock(lc->rec.heap, &lc->scanslot->tts_tid, lc->snapshot, lc->lockslot,
							GetCurrentCommandId(false), LockTupleNoKeyExclusive,
							LockWaitSkip, 0, &tmfd) == TM_Ok;
}

/* Hand the locked row to the worker: a new attempt, a new token, a lease. */
static void
lease_locked(LeaseCall *lc)
{
	TaskRecord *tr = &lc->rec;
	Datum		out[LEASE_NCOLS];
	bool		outnulls[LEASE_NCOLS] = {0};
	int32		attempt;
	int64		token;

	task_record_take(tr, lc->lockslot);
	attempt = (TR_ISNULL(tr, REC_TASK_ATTEMPTS) ? 0 :
			   DatumGetInt32(TR_VALUE(tr, REC_TASK_ATTEMPTS))) + 1;
	if (!TR_ISNULL(tr, REC_TASK_LEASE_EXPIRES))
		lc->takeovers++;		/* lapsed, or its session ended */
	token = nextval_internal(token_seq, false);

	TR_SET(tr, REC_STATUS, CStringGetTextDatum(idem_status_name(IDEM_STATUS_PROCESSING)));
	TR_SET(tr, REC_UPDATED, TimestampTzGetDatum(lc->now));
	TR_SET(tr, REC_TASK_ATTEMPTS, Int32GetDatum(attempt));
	TR_SET(tr, REC_TASK_TOKEN, Int64GetDatum(token));
	TR_SET(tr, REC_TASK_LEASE_EXPIRES, TimestampTzGetDatum(lc->expires));
	TR_SET(tr, REC_TASK_WORKER, lc->worker);
	TR_SET(tr, REC_TASK_HEARTBEAT, TimestampTzGetDatum(lc->now));
	task_record_put(tr, REC_TASK_SESSION, Int64GetDatum((int64) lc->session), lc->session == 0);

	out[LEASE_TASK] = TR_VALUE(tr, REC_ID);
	out[LEASE_OWNER] = TR_VALUE(tr, REC_OWNER);
	out[LEASE_KEY] = TR_VALUE(tr, REC_KEY);
	out[LEASE_REQUEST] = TR_VALUE(tr, REC_TASK_REQUEST);
	outnulls[LEASE_REQUEST] = TR_ISNULL(tr, REC_TASK_REQUEST);
	out[LEASE_PAYLOAD] = TR_VALUE(tr, REC_TASK_PAYLOAD);
	outnulls[LEASE_PAYLOAD] = TR_ISNULL(tr, REC_TASK_PAYLOAD);
	out[LEASE_ATTEMPT] = Int32GetDatum(attempt);
	out[LEASE_TOKEN] = Int64GetDatum(token);
	out[LEASE_EXPIRES] = TimestampTzGetDatum(lc->expires);
	tuplestore_putvalues(lc->rsinfo->setResult, lc->rsinfo->setDesc, out, outnulls);

	task_record_write(tr, lc->lockslot);
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
lease_due(LeaseCall *lc, Relation index, Datum operation)
{
	const AttrNumber *att = lc->rec.att;
	ScanKeyData skey[2];
	IndexScanDesc scan;

	ScanKeyEntryInitialize(&skey[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[0], F_TEXTEQ, operation);
	ScanKeyInit(&skey[1], 2, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
				TimestampTzGetDatum(lc->now));
	scan = idem_index_beginscan(lc->rec.heap, index, lc->snapshot, 2, 0);
	index_rescan(scan, skey, 2, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, lc->scanslot))
	{
		bool		isnull;
		bool		dead_session = false;
		Datum		d;

		d = slot_getattr(lc->scanslot, att[REC_TASK_LEASE_EXPIRES], &isnull);
		if (!isnull && DatumGetTimestampTz(d) > lc->now)
		{
			uint64		session;

			/* leased, and the lease holds: unless its session has ended */
			if (!lc->check_sessions)
				continue;
			d = slot_getattr(lc->scanslot, att[REC_TASK_SESSION], &isnull);
			session = (uint64) DatumGetInt64(d);
			if (isnull || bsearch(&session, lc->live, lc->nlive, sizeof(uint64), cmp_uint64) != NULL)
				continue;
			dead_session = true;
		}
		if (lc->leased == lc->batch)
		{
			lc->complete = false;
			break;
		}
		if (!lock_scanned(lc))
		{
			/* a dead session's task its ending transaction may still hold */
			if (dead_session)
				lc->complete = false;
			continue;
		}
		lease_locked(lc);
	}
	index_endscan(scan);
}

/*
 * Lease from idempotency_record as cat has it (the table, or on Citus one
 * of its shards here), through its idem_task_due.
 */
static void
lease_from(LeaseCall *lc, const IdemCatalog *cat, Datum operation)
{
	Oid			indexid = cat->tables[IDEM_TABLE_RECORD].indexes[REC_INDEX_TASK_DUE];
	Relation	index;

	task_record_open(&lc->rec, cat);
	lc->scanslot = task_record_slot(&lc->rec);
	lc->lockslot = task_record_slot(&lc->rec);
	lc->snapshot = RegisterSnapshot(GetTransactionSnapshot());
	index = index_open(indexid, AccessShareLock);

	lease_due(lc, index, operation);

	index_close(index, NoLock);
	UnregisterSnapshot(lc->snapshot);
	task_record_close(&lc->rec);
}

/* idem_lease's arguments: 22004 for a NULL, 22023 (or 42501) for a bad one. */
static void
lease_args(LeaseCall *lc, FunctionCallInfo fcinfo, text **operation, char **opname)
{
	text	   *worker;

	for (int i = 0; i < 5; i++)
		idem_check_not_null(fcinfo, i,
							(const char *[]) {"operation", "worker", "lease", "batch", "bind_session"}[i]);
	*operation = PG_GETARG_TEXT_PP(0);
	*opname = text_to_cstring(*operation);
	idem_check_operation(*opname, VARSIZE_ANY_EXHDR(*operation));
	idem_check_operation_allowed(*opname);
	worker = PG_GETARG_TEXT_PP(1);
	idem_check_printable("worker", VARDATA_ANY(worker), VARSIZE_ANY_EXHDR(worker),
						 IDEM_WORKER_MAX_LEN);
	lc->now = GetCurrentTimestamp();
	lc->expires = idem_plus_positive(lc->now, PG_GETARG_INTERVAL_P(2), "lease");
	lc->batch = PG_GETARG_INT32(3);
	if (lc->batch < 1 || lc->batch > TASK_BATCH_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and %d", TASK_BATCH_MAX),
				 errdetail("The call has batch %d.", lc->batch)));
	lc->session = PG_GETARG_BOOL(4) ? session_id() : 0;
	lc->worker = PointerGetDatum(worker);
}

/*
 * Lease from every shard of idempotency_record on this node (Citus),
 * starting from another shard each call, so that one shard's tasks do not
 * starve the others'.
 */
static void
lease_from_shards(LeaseCall *lc, IdemCatalog *cat, Datum operation)
{
	int			n = idem_citus_local_shards(cat, IDEM_TABLE_RECORD);
	int			i;

	no_local_shards(n);
	for (i = 0; i < n && lc->leased < lc->batch; i++)
	{
		IdemCatalog shard = *cat;

		idem_citus_use_local_shard(&shard, IDEM_TABLE_RECORD, (lease_rotor + i) % n);
		lease_from(lc, &shard, operation);
	}
	if (i < n)
		lc->complete = false;
	lease_rotor++;
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
	text	   *operation;
	char	   *opname;

	lease_args(&lc, fcinfo, &operation, &opname);
	InitMaterializedSRF(fcinfo, 0);
	lc.rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	cat = *idem_catalog(fcinfo);
	task_relations(&cat);

	/* ask about bound sessions only if one ended since this backend last did */
	lc.complete = true;
	if (task_shared != NULL)
	{
		lc.ended = pg_atomic_read_u64(&task_shared->ended);
		if (last_checked(opname) != lc.ended)
		{
			pg_read_barrier();
			lc.live = live_sessions(&lc.nlive);
			lc.check_sessions = true;
		}
	}
	if (cat.tables[IDEM_TABLE_RECORD].distributed)
		lease_from_shards(&lc, &cat, PointerGetDatum(operation));
	else
		lease_from(&lc, &cat, PointerGetDatum(operation));
	if (lc.check_sessions)
	{
		pfree(lc.live);
		if (lc.complete)
			mark_checked(opname, lc.ended);
	}
	idem_stats_count_at_commit(IDEM_KIND_OPERATION, opname, IDEM_STAT_LEASES, lc.leased);
	idem_stats_count_at_commit(IDEM_KIND_OPERATION, opname, IDEM_STAT_TAKEOVERS, lc.takeovers);
	return (Datum) 0;
}

/* ---------- the holder's calls: heartbeat, complete, fail ---------- */

/* One call of the holder of a lease, on its task locked. */
typedef struct HolderCall
{
	IdemCatalog cat;
	TaskRecord	rec;
	TupleTableSlot *locked;
	char	   *operation;		/* the task's */
	TimestampTz now;
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
 * Open idempotency_record as hc->cat has it and lock task_id's row, found
 * through indexid (an index whose first column is id), waiting for a
 * holder's short transaction: TM_Invisible if there is no such row.
 */
static TM_Result
lock_task(HolderCall *hc, Oid indexid, int64 task_id)
{
	TaskRecord *tr = &hc->rec;
	Relation	index;
	ScanKeyData skey;
	IndexScanDesc scan;
	TupleTableSlot *found;
	Snapshot	snapshot;
	TM_FailureData tmfd;
	TM_Result	tmres = TM_Invisible;

	task_record_open(tr, &hc->cat);
	if (!OidIsValid(indexid))
		indexid = idem_primary_key_index(tr->heap);
	if (!OidIsValid(indexid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table idempotency_record has no primary key"),
				 errhint("Drop and re-create the extension idem.")));
	found = task_record_slot(tr);
	hc->locked = task_record_slot(tr);

	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	index = index_open(indexid, AccessShareLock);
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(task_id));
	scan = idem_index_beginscan(tr->heap, index, snapshot, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, found))
		tmres = table_tuple_lock(tr->heap, &found->tts_tid, snapshot, hc->locked,
								 GetCurrentCommandId(false), LockTupleNoKeyExclusive,
								 LockWaitBlock,
								 IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION,
								 &tmfd);
	index_endscan(scan);
	index_close(index, NoLock);
	UnregisterSnapshot(snapshot);
	return tmres;
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

	if (hc->cat.tables[IDEM_TABLE_RECORD].distributed)
	{
		/* on Citus: the task is in one of this node's shards, if here */
		IdemCatalog cat = hc->cat;
		int			n = idem_citus_local_shards(&cat, IDEM_TABLE_RECORD);

		no_local_shards(n);
		tmres = TM_Invisible;
		for (int i = 0; i < n && tmres == TM_Invisible; i++)
		{
			hc->cat = cat;
			idem_citus_use_local_shard(&hc->cat, IDEM_TABLE_RECORD, i);
			tmres = lock_task(hc, hc->cat.tables[IDEM_TABLE_RECORD].indexes[REC_INDEX_TASK_ID], task_id);
			if (tmres == TM_Invisible)
				task_record_close(tr);
		}
	}
	else
		tmres = lock_task(hc, InvalidOid, task_id);

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
		return;
	report_stale(task_id, token, hc->operation, detail);
}

/* Write the new version built in hc->rec, and give the caller back its rights. */
static void
end_holder_call(HolderCall *hc)
{
	task_record_write(&hc->rec, hc->locked);
	task_record_close(&hc->rec);
}

/* The task is over: nothing more to lease. */
static void
finish_task(HolderCall *hc, IdemStatus status)
{
	TaskRecord *tr = &hc->rec;
	const Interval *ttl = NULL;

	if (!TR_ISNULL(tr, REC_TASK_TTL))
		ttl = DatumGetIntervalP(TR_VALUE(tr, REC_TASK_TTL));
	TR_SET(tr, REC_STATUS, CStringGetTextDatum(idem_status_name(status)));
	TR_SET(tr, REC_UPDATED, TimestampTzGetDatum(hc->now));
	TR_SET(tr, REC_EXPIRES, TimestampTzGetDatum(idem_record_expiry(status, hc->now, ttl)));
	TR_CLEAR(tr, REC_TASK_DUE);
	TR_CLEAR(tr, REC_TASK_LEASE_EXPIRES);
	TR_CLEAR(tr, REC_TASK_SESSION);
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
	begin_holder_call(&hc, fcinfo, PG_GETARG_INT64(0), PG_GETARG_INT64(1));
	finish_task(&hc, status);
	TR_SET(tr, REC_HTTP, Int32GetDatum(res.http_status));
	task_record_put(tr, REC_BODY, res.body, res.body_isnull);
	task_record_put(tr, REC_HEADERS, res.headers, res.headers_isnull);
	task_record_put(tr, REC_RESOURCE, Int64GetDatum(res.resource_id), res.resource_isnull);
	end_holder_call(&hc);
	if (status == IDEM_STATUS_FAILED_FINAL)
		idem_stats_count_at_commit(IDEM_KIND_OPERATION, hc.operation, IDEM_STAT_FAILED_FINAL, 1);
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

/* A retryable failure of attempt attempts: due again after its backoff. */
static IdemStatus
fail_retryable(HolderCall *hc, int32 attempts)
{
	TaskRecord *tr = &hc->rec;

	TR_SET(tr, REC_STATUS, CStringGetTextDatum(idem_status_name(IDEM_STATUS_FAILED_RETRYABLE)));
	TR_SET(tr, REC_UPDATED, TimestampTzGetDatum(hc->now));
	TR_SET(tr, REC_TASK_DUE, TimestampTzGetDatum(hc->now + backoff_usecs(attempts)));
	TR_CLEAR(tr, REC_TASK_LEASE_EXPIRES);
	TR_CLEAR(tr, REC_TASK_SESSION);
	return IDEM_STATUS_FAILED_RETRYABLE;
}

/* A final failure: FAILED_FINAL, HTTP 500, body {"error": error}. */
static IdemStatus
fail_final(HolderCall *hc, Jsonb *error)
{
	TaskRecord *tr = &hc->rec;
	StringInfoData body;

	finish_task(hc, IDEM_STATUS_FAILED_FINAL);
	TR_SET(tr, REC_HTTP, Int32GetDatum(TASK_HTTP_FAILED));
	/* only what the caller passed */
	initStringInfo(&body);
	appendStringInfoString(&body, "{\"error\": ");
	(void) JsonbToCString(&body, &error->root, VARSIZE(error));
	appendStringInfoChar(&body, '}');
	TR_SET(tr, REC_BODY, PointerGetDatum(cstring_to_text_with_len(body.data, body.len)));
	TR_CLEAR(tr, REC_HEADERS);
	TR_CLEAR(tr, REC_RESOURCE);
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
	bool		retryable;
	int32		attempts;
	IdemStatus	status;

	for (int i = 0; i < 4; i++)
		idem_check_not_null(fcinfo, i, (const char *[]) {"task_id", "token", "error", "retryable"}[i]);
	error = PG_GETARG_JSONB_P(2);
	retryable = PG_GETARG_BOOL(3);
	begin_holder_call(&hc, fcinfo, PG_GETARG_INT64(0), PG_GETARG_INT64(1));
	attempts = DatumGetInt32(TR_VALUE(tr, REC_TASK_ATTEMPTS));
	TR_SET(tr, REC_TASK_LAST_ERROR, JsonbPGetDatum(error));
	if (retryable && attempts < idem_max_attempts)
		status = fail_retryable(&hc, attempts);
	else
		status = fail_final(&hc, error);
	end_holder_call(&hc);
	idem_stats_count_at_commit(IDEM_KIND_OPERATION, hc.operation,
							   status == IDEM_STATUS_FAILED_FINAL ? IDEM_STAT_FAILED_FINAL : IDEM_STAT_RETRIES,
							   1);
	PG_RETURN_TEXT_P(cstring_to_text(idem_status_name(status)));
}
