/*-------------------------------------------------------------------------
 *
 * task_sessions.c
 *	  The sessions that hold bound leases (idem_lease with bind_session), in
 *	  shared memory.  A slot per backend with an id that no other session,
 *	  before or after a restart, gets, and a counter of ended sessions.
 *
 * A session that leases so registers here and writes its id into the task;
 * when it exits, its slot is cleared and the counter goes up (a crash
 * resets shared memory, and with it every slot).  A lease asks which
 * sessions are alive only when the counter moved since its backend last
 * looked through the operation's leases (the "checked" operations, kept
 * per backend and applied at commit).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "task.h"
#include "task_int.h"

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
 * count of ended sessions at the time.  Committed ones, and this
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

/* The slots of the sessions, one per backend, and the counters. */
void
idem_task_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(offsetof(TaskShared, sessions) +
									MaxBackends * sizeof(pg_atomic_uint64)));
}

/* Create or attach to the sessions' shared memory. */
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

/* At exit this session's bound leases lapse. */
static void
session_ended(int code, Datum arg)
{
	pg_atomic_write_u64(&task_shared->sessions[idem_backend_slot()], 0);
	pg_write_barrier();
	pg_atomic_fetch_add_u64(&task_shared->ended, 1);
}

/* This session's id for bound leases, registered on first use. */
uint64
idem_task_session_id(void)
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
uint64 *
idem_task_live_sessions(int *n)
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
uint64
idem_task_last_checked(const char *operation)
{
	for (int i = 0; i < nchecked; i++)
		if (strcmp(checked[i].operation, operation) == 0)
			return checked[i].ended;
	return PG_UINT64_MAX;
}

/* Remember, for this transaction's commit, that operation was looked through. */
void
idem_task_mark_checked(const char *operation, uint64 ended)
{
	if (nchecked_now == CHECKED_OPS)
		return;
	strlcpy(checked_now[nchecked_now].operation, operation, IDEM_OPERATION_MAX_LEN + 1);
	checked_now[nchecked_now++].ended = ended;
}

/* At commit, what this transaction looked through counts from now on. */
void
idem_task_apply_checked(void)
{
	for (int i = 0; i < nchecked_now; i++)
	{
		int			j = 0;

		while (j < nchecked && strcmp(checked[j].operation, checked_now[i].operation) != 0)
			j++;
		if (j == nchecked)
		{
			if (nchecked == CHECKED_OPS)
				j = nchecked - 1;	/* forget one, to be looked through again */
			else
				nchecked++;
		}
		checked[j] = checked_now[i];
	}
	nchecked_now = 0;
}

/* At abort or prepare, what this transaction looked through does not count. */
void
idem_task_discard_checked(void)
{
	nchecked_now = 0;
}

/*
 * The count of sessions with an id that have ended, in *ended; false
 * without the shared memory (idem not preloaded: no bound leases).
 */
bool
idem_task_sessions_ended(uint64 *ended)
{
	if (task_shared == NULL)
		return false;
	*ended = pg_atomic_read_u64(&task_shared->ended);
	pg_read_barrier();
	return true;
}

/* Is session among live, the sorted ids of nlive live sessions? */
bool
idem_task_session_alive(uint64 session, const uint64 *live, int nlive)
{
	return bsearch(&session, live, nlive, sizeof(uint64), cmp_uint64) != NULL;
}
