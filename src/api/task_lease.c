/*-------------------------------------------------------------------------
 *
 * task_lease.c
 *	  idem_lease.  Due tasks handed to a worker, each with a new fencing
 *	  token.
 *
 * The record is the task.  task_due_at says when a worker may lease it
 * next.  The submit time, the end of the current lease, or the time of the
 * next attempt.  One partial index over (operation, task_due_at) serves
 * every lease.  A lease walks that index from the oldest due task and
 * locks each row it would take without waiting (SKIP LOCKED).  It updates
 * the row with the executor's own row update, without a plan.  So taking
 * a row over is one guarded update of the version the scan judged due,
 * which nobody has changed since; if someone has, the lock fails and the
 * row is skipped.  Tasks of ended sessions (bind_session) are taken over
 * first (task_sessions.c).
 *
 * idem_lease_reconcile walks idem_task_reconcile the same way: the tasks
 * whose outcome is uncertain, which no plain lease sees (their
 * task_due_at is NULL).  A plain lease that finds the lapsed lease of an
 * operation that reconciles marks the task instead of leasing it again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "commands/sequence.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "idem.h"
#include "compat.h"
#include "sequence.h"
#include "citus.h"
#include "key.h"
#include "binding.h"
#include "stats.h"
#include "task_int.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_lease);
PG_FUNCTION_INFO_V1(idem_lease_reconcile);

#define TASK_BATCH_MAX			1000

/* The columns of what idem_lease returns. */
enum
{
	LEASE_TASK, LEASE_OWNER, LEASE_KEY, LEASE_REQUEST, LEASE_PAYLOAD,
	LEASE_ATTEMPT, LEASE_TOKEN, LEASE_EXPIRES,
	LEASE_UNCERTAIN, LEASE_ATTEMPTS,	/* idem_lease_reconcile's */
	LEASE_NCOLS
};

/* On Citus, where the next lease starts among this node's shards. */
static uint32 lease_rotor = 0;

/* One call of idem_lease. */
typedef struct LeaseCall
{
	bool		reconcile;		/* idem_lease_reconcile */
	const IdemCatalog *cat;		/* the table (or shard) being leased from */
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
	int			ended_lapsed;	/* tasks ended FAILED_FINAL for lapsing too often */
	int			marked;			/* tasks whose lapsed lease made them uncertain */
	const char *operation;
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

/*
 * The locked row's lease lapsed, or its bound session ended, before its
 * worker ended the attempt.  That attempt counts.  Past the
 * operation's max_attempts, the task ends FAILED_FINAL with the reason, as
 * an idem_fail of its own would (the client's repeat gets that stored
 * failure), and true is returned.  It is not leased again.
 */
static bool
end_lapsed(LeaseCall *lc, int32 attempts)
{
	TaskRecord *tr = &lc->rec;
	int32		lapses = 1;
	Jsonb	   *error;

	if (tr->att[REC_TASK_LAPSES] == InvalidAttrNumber)
		return false;			/* an older version keeps no count */
	if (!TR_ISNULL(tr, REC_TASK_LAPSES))
		lapses += DatumGetInt32(TR_VALUE(tr, REC_TASK_LAPSES));
	TR_SET(tr, REC_TASK_LAPSES, Int32GetDatum(lapses));
	if (attempts < idem_task_max_attempts(lc->operation))
		return false;
	error = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(
		psprintf("{\"reason\": \"lease lapsed %d time%s\", \"attempts\": %d}",
				 lapses, lapses == 1 ? "" : "s", attempts))));
	task_record_fail(tr, error, lc->now, lc->operation);
	TR_SET(tr, REC_TASK_LAST_ERROR, JsonbPGetDatum(error));
	task_record_write(tr, lc->lockslot);
	lc->ended_lapsed++;
	return true;
}

/*
 * The lapsed lease of a task of an operation that reconciles: its outcome
 * is unknown, so the task is marked (a reconcile lease takes it at once)
 * and not leased again.  Past max_attempts too: an uncertain charge is no
 * failure.
 */
static void
mark_lapsed(LeaseCall *lc)
{
	TaskRecord *tr = &lc->rec;
	int32		lapses = 1 + (TR_ISNULL(tr, REC_TASK_LAPSES) ? 0 : DatumGetInt32(TR_VALUE(tr, REC_TASK_LAPSES)));

	TR_SET(tr, REC_TASK_LAPSES, Int32GetDatum(lapses));
	task_record_mark(tr, lc->now, lc->now);
	task_record_write(tr, lc->lockslot);
	lc->marked++;
}

/*
 * The locked row, taken by a reconcile lease: false if it is not handed
 * out.  A task past its operation's reconcile_within is left to an
 * operator (out of idem_task_reconcile).
 */
static bool
reconcile_locked(LeaseCall *lc)
{
	TaskRecord *tr = &lc->rec;

	if (TR_ISNULL(tr, REC_TASK_UNCERTAIN))
		return false;
	if (!idem_task_reconcile_overdue(lc->operation, DatumGetTimestampTz(TR_VALUE(tr, REC_TASK_UNCERTAIN)),
									 lc->now))
		return true;
	TR_CLEAR(tr, REC_TASK_RECONCILE_AT);
	TR_CLEAR(tr, REC_TASK_LEASE_EXPIRES);
	TR_CLEAR(tr, REC_TASK_SESSION);
	TR_SET(tr, REC_UPDATED, TimestampTzGetDatum(lc->now));
	task_record_write(tr, lc->lockslot);
	return false;
}

/*
 * The locked row's lease lapsed, or its session ended: that attempt ends
 * "lapsed" (*lapsed, for its row).  A plain lease marks the task of an
 * operation that reconciles, or ends one past max_attempts: false then,
 * the row written, and the task is not handed out.
 */
static bool
take_over(LeaseCall *lc, TaskAttempt *lapsed, int32 attempt)
{
	TaskRecord *tr = &lc->rec;
	bool		ended;

	lc->takeovers++;
	task_attempt_take(lapsed, tr);
	if (lc->reconcile)
		return true;
	if (TR_CAN_MARK(tr) && idem_task_reconciles(lc->operation))
	{
		mark_lapsed(lc);
		ended = true;
	}
	else
		ended = end_lapsed(lc, attempt - 1);
	if (ended)
		task_attempt_write(lapsed, lc->cat, tr, ATTEMPT_LAPSED, 0, (Datum) 0, lc->now);
	return !ended;
}

/* Hand the locked row to the worker with a new attempt, a new token, a lease. */
static void
lease_locked(LeaseCall *lc)
{
	TaskRecord *tr = &lc->rec;
	Datum		out[LEASE_NCOLS];
	bool		outnulls[LEASE_NCOLS] = {0};
	int32		attempt;
	int64		token;
	TaskAttempt lapsed;
	bool		had_lapsed;

	task_record_take(tr, lc->lockslot);
	/* a plain lease never hands out a marked task (its index has none) */
	if (!lc->reconcile && !TR_ISNULL(tr, REC_TASK_UNCERTAIN))
		return;
	attempt = (TR_ISNULL(tr, REC_TASK_ATTEMPTS) ? 0 :
			   DatumGetInt32(TR_VALUE(tr, REC_TASK_ATTEMPTS))) + (lc->reconcile ? 0 : 1);
	had_lapsed = !TR_ISNULL(tr, REC_TASK_LEASE_EXPIRES);
	if (had_lapsed && !take_over(lc, &lapsed, attempt))
		return;
	if (lc->reconcile && !reconcile_locked(lc))
	{
		if (had_lapsed)
			task_attempt_write(&lapsed, lc->cat, tr, ATTEMPT_LAPSED, 0, (Datum) 0, lc->now);
		return;
	}
	token = idem_nextval(idem_task_token_seq, false);

	TR_SET(tr, REC_STATUS, CStringGetTextDatum(idem_status_name(IDEM_STATUS_PROCESSING)));
	TR_SET(tr, REC_UPDATED, TimestampTzGetDatum(lc->now));
	TR_SET(tr, REC_TASK_ATTEMPTS, Int32GetDatum(attempt));
	TR_SET(tr, REC_TASK_TOKEN, Int64GetDatum(token));
	TR_SET(tr, REC_TASK_LEASE_EXPIRES, TimestampTzGetDatum(lc->expires));
	TR_SET(tr, REC_TASK_WORKER, lc->worker);
	TR_SET(tr, REC_TASK_HEARTBEAT, TimestampTzGetDatum(lc->now));
	TR_SET(tr, REC_TASK_LEASED, TimestampTzGetDatum(lc->now));
	task_record_put(tr, REC_TASK_SESSION, Int64GetDatum((int64) lc->session), lc->session == 0);
	if (lc->reconcile)
		TR_SET(tr, REC_TASK_RECONCILES, Int32GetDatum(1 + (TR_ISNULL(tr, REC_TASK_RECONCILES) ? 0 :
														   DatumGetInt32(TR_VALUE(tr, REC_TASK_RECONCILES)))));

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

	task_record_write(tr, lc->lockslot);
	if (had_lapsed)
		task_attempt_write(&lapsed, lc->cat, tr, ATTEMPT_LAPSED, 0, (Datum) 0, lc->now);
	if (lc->reconcile)
	{
		out[LEASE_UNCERTAIN] = TR_VALUE(tr, REC_TASK_UNCERTAIN);
		out[LEASE_ATTEMPTS] = task_attempts_json(lc->cat, DatumGetInt64(TR_VALUE(tr, REC_OWNER)),
												 DatumGetInt64(TR_VALUE(tr, REC_ID)));
	}
	tuplestore_putvalues(lc->rsinfo->setResult, lc->rsinfo->setDesc, out, outnulls);
	lc->leased++;
}

/*
 * Lease operation's due tasks, oldest due first, up to the batch.  Those
 * never leased or due again after a failure, and those whose lease has
 * lapsed or whose bound session has ended (takeovers).  A lease leaves the
 * index key alone (so that it is a HOT update).  The leased tasks stay in
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

			/* leased, and the lease holds unless its session has ended */
			if (!lc->check_sessions)
				continue;
			d = slot_getattr(lc->scanslot, att[REC_TASK_SESSION], &isnull);
			session = (uint64) DatumGetInt64(d);
			if (isnull || idem_task_session_alive(session, lc->live, lc->nlive))
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
 * of its shards here), through its idem_task_due (idem_task_reconcile for
 * a reconcile lease).
 */
static void
lease_from(LeaseCall *lc, const IdemCatalog *cat, Datum operation)
{
	Oid			indexid = cat->tables[IDEM_TABLE_RECORD].indexes[lc->reconcile ? REC_INDEX_RECONCILE :
																 REC_INDEX_TASK_DUE];
	Relation	index;

	lc->cat = cat;
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
	lc->session = PG_GETARG_BOOL(4) ? idem_task_session_id() : 0;
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
 * idem_lease, or idem_lease_reconcile (reconcile), for fcinfo's
 * arguments.
 */
static Datum
lease(FunctionCallInfo fcinfo, bool reconcile)
{
	LeaseCall	lc = {0};
	IdemCatalog cat;
	text	   *operation;
	char	   *opname;

	lc.reconcile = reconcile;
	lease_args(&lc, fcinfo, &operation, &opname);
	lc.operation = opname;
	InitMaterializedSRF(fcinfo, 0);
	lc.rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	cat = *idem_catalog(fcinfo);
	task_relations(&cat);
	if (reconcile && !OidIsValid(cat.tables[IDEM_TABLE_RECORD].indexes[REC_INDEX_RECONCILE]))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's index idem_task_reconcile is missing"),
				 errhint("Drop and re-create the extension idem.")));

	/*
	 * Ask about bound sessions only if one ended since this backend last
	 * went through the operation's plain leases; a reconcile lease, which
	 * is rare, asks whenever one ever ended, and keeps no mark.
	 */
	lc.complete = true;
	if (idem_task_sessions_ended(&lc.ended) &&
		(reconcile ? lc.ended > 0 : idem_task_last_checked(opname) != lc.ended))
	{
		lc.live = idem_task_live_sessions(&lc.nlive);
		lc.check_sessions = true;
	}
	if (cat.tables[IDEM_TABLE_RECORD].distributed)
		lease_from_shards(&lc, &cat, PointerGetDatum(operation));
	else
		lease_from(&lc, &cat, PointerGetDatum(operation));
	if (lc.check_sessions)
	{
		pfree(lc.live);
		if (lc.complete && !reconcile)
			idem_task_mark_checked(opname, lc.ended);
	}
	idem_stats_count_at_commit(IDEM_KIND_OPERATION, opname, IDEM_STAT_LEASES, lc.leased);
	idem_stats_count_at_commit(IDEM_KIND_OPERATION, opname, IDEM_STAT_TAKEOVERS, lc.takeovers);
	idem_stats_count_at_commit(IDEM_KIND_OPERATION, opname, IDEM_STAT_FAILED_FINAL, lc.ended_lapsed);
	return (Datum) 0;
}

/*
 * SQL: idem_lease(operation, worker, lease, batch, bind_session) returns
 * setof (task_id, owner, key, request, payload, attempt, token,
 * lease_expires_at).
 */
Datum
idem_lease(PG_FUNCTION_ARGS)
{
	return lease(fcinfo, false);
}

/*
 * SQL: idem_lease_reconcile(operation, worker, lease, batch, bind_session)
 * returns setof (task_id, owner, key, request, payload, attempt, token,
 * lease_expires_at, uncertain_since, attempts): the marked tasks, each with
 * its ended attempts.  attempt is the task's attempt whose outcome is
 * being reconciled (a reconcile lease is no new attempt).
 */
Datum
idem_lease_reconcile(PG_FUNCTION_ARGS)
{
	return lease(fcinfo, true);
}
