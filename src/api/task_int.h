/*-------------------------------------------------------------------------
 *
 * task_int.h
 *	  What the long-flow modules share: task.c (submit, the transaction
 *	  callback, the policy's settings), task_record.c (the record a task
 *	  call rewrites), task_sessions.c, task_lease.c, task_holder.c,
 *	  task_attempt.c and task_operator.c.  Not for other modules.  Their
 *	  header is task.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TASK_INT_H
#define IDEM_TASK_INT_H

#include "access/tableam.h"
#include "executor/tuptable.h"
#include "utils/jsonb.h"

#include "catalog.h"
#include "identity.h"
#include "record.h"
#include "rowwrite.h"

#define TASK_HTTP_ACCEPTED		202
#define TASK_HTTP_FAILED		500

/* the problem type of a 202 for a task whose outcome is being reconciled */
#define IDEM_PROBLEM_RECONCILING	"urn:idem:task:reconciling"

/* the sequence of fencing tokens, once task_relations() has looked it up */
extern Oid	idem_task_token_seq;

/*
 * A record being rewritten by a task call.  idempotency_record opened for an
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

#define TR_SET(tr, col, d)	task_record_put(tr, col, d, false)
#define TR_CLEAR(tr, col)	task_record_put(tr, col, (Datum) 0, true)
#define TR_VALUE(tr, col)	((tr)->values[(tr)->att[col] - 1])
/* a column the table lacks (an older version's) reads as NULL */
#define TR_ISNULL(tr, col)	((tr)->att[col] == InvalidAttrNumber || (tr)->nulls[(tr)->att[col] - 1])
/* whether tasks may be marked uncertain (1.16) */
#define TR_CAN_MARK(tr)		((tr)->att[REC_TASK_RECONCILE_AT] != InvalidAttrNumber)

/*
 * The lease a task call ends, as the locked record had it, for its row in
 * idem_task_attempt (task_attempt.c).
 */
typedef struct TaskAttempt
{
	int64		owner;
	int64		task_id;
	int64		token;
	int32		attempt;
	bool		reconcile;		/* a reconcile lease's */
	Datum		worker;
	TimestampTz started;
} TaskAttempt;

/* What an attempt came to (idem_task_attempt.outcome). */
#define ATTEMPT_SUCCEEDED	"succeeded"
#define ATTEMPT_FAILED		"failed"
#define ATTEMPT_RETRYABLE	"retryable"
#define ATTEMPT_UNKNOWN		"unknown"
#define ATTEMPT_LAPSED		"lapsed"

/* task.c */
extern void task_relations(const IdemCatalog *cat);
extern void no_local_shards(int n);
extern void task_record_open(TaskRecord *tr, const IdemCatalog *cat);
extern TM_Result task_record_lock(TaskRecord *tr, IdemCatalog *cat, int64 task_id, TupleTableSlot **locked);
extern TupleTableSlot *task_record_slot(TaskRecord *tr);
extern void task_record_take(TaskRecord *tr, TupleTableSlot *locked);
extern void task_record_put(TaskRecord *tr, int col, Datum d, bool isnull);
extern void task_record_write(TaskRecord *tr, TupleTableSlot *locked);
extern void task_record_close(TaskRecord *tr);
extern void task_record_end(TaskRecord *tr, IdemStatus status, TimestampTz now,
							const char *operation);
extern void task_record_fail(TaskRecord *tr, Jsonb *error, TimestampTz now, const char *operation);
extern int64 idem_task_backoff_usecs(int32 attempt, const char *operation);
extern int	idem_task_max_attempts(const char *operation);
extern bool idem_task_reconciles(const char *operation);
extern bool idem_task_reconcile_overdue(const char *operation, TimestampTz since, TimestampTz now);
extern void task_record_mark(TaskRecord *tr, TimestampTz now, TimestampTz reconcile_at);
extern void task_record_unmark(TaskRecord *tr);

/* task_operator.c */
extern void idem_operator_init(void);

/* task_attempt.c */
extern void idem_task_attempt_init(void);
extern void task_attempt_take(TaskAttempt *a, TaskRecord *tr);
extern void task_attempt_write(const TaskAttempt *a, const IdemCatalog *cat, TaskRecord *tr,
							   const char *outcome, int32 http_status, Datum error, TimestampTz now);
extern Datum task_attempts_json(const IdemCatalog *cat, int64 owner, int64 task_id);

/* task_sessions.c */
extern uint64 idem_task_session_id(void);
extern bool idem_task_sessions_ended(uint64 *ended);
extern uint64 *idem_task_live_sessions(int *n);
extern bool idem_task_session_alive(uint64 session, const uint64 *live, int nlive);
extern uint64 idem_task_last_checked(const char *operation);
extern void idem_task_mark_checked(const char *operation, uint64 ended);
extern void idem_task_apply_checked(void);
extern void idem_task_discard_checked(void);

#endif							/* IDEM_TASK_INT_H */
