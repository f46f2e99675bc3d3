/*-------------------------------------------------------------------------
 *
 * notify.c
 *	  The outbox notifier.  NOTIFY idem_outbox, '<topic>' after the commits
 *	  of emitting transactions, without serializing those commits.
 *
 * PostgreSQL queues notifications in commit order.  It takes one
 * database-wide lock in PreCommit_Notify and holds it until the commit
 * record is flushed, so every transaction that notifies commits after the
 * previous one has.  With synchronous_commit = on, emitting transactions
 * would commit one WAL flush at a time.
 *
 * So an emitting transaction does not NOTIFY itself when the library is
 * preloaded.  At PRE_COMMIT it reserves room for its topics in its
 * database's slot of shared memory.  Once committed (XACT_EVENT_COMMIT,
 * when its rows are visible) it adds them and sets the latch of the
 * database's notifier.  The notifier, a background worker, sends one
 * NOTIFY idem_outbox, '<topic>' per topic for all the commits gathered
 * since its last one.  A publisher woken by it fetches after those
 * commits.
 *
 * The first emitting transaction that finds no notifier starts one.  It
 * exits after a second with nothing to do, so that it never holds up DROP
 * DATABASE, but never while a transaction that reserved room has not
 * ended.  A transaction notifies at its own commit, as NOTIFY does, when
 * it finds no notifier running or no room, when it is being prepared, or
 * when the library is not preloaded.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/async.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "notify.h"

PGDLLEXPORT void idem_outbox_notifier_main(Datum main_arg);

#define NOTIFY_SLOTS			16	/* databases with a notifier at once */
#define NOTIFY_TOPICS			128 /* topics gathered per database */
#define NOTIFY_TOPIC_SIZE		(IDEM_TOPIC_MAX_LEN + 1)
#define NOTIFY_IDLE_MS			1000
#define NOTIFY_GATHER_MS		2	/* after a send, let commits gather this long */
#define NOTIFY_START_RETRY_MS	10000

typedef struct NotifySlot
{
	Oid			dboid;			/* InvalidOid: free */
	bool		running;		/* a notifier serves this database */
	TimestampTz start_requested;	/* 0: none pending */
	Latch	   *latch;			/* the running notifier's */
	int			reserved;		/* room promised to transactions in commit */
	int			ntopics;
	char		topics[NOTIFY_TOPICS][NOTIFY_TOPIC_SIZE];
	uint8		channels[NOTIFY_TOPICS];	/* IdemNotifyChannel of each topic */
} NotifySlot;

typedef struct NotifyShared
{
	slock_t		mutex;
	NotifySlot	slots[NOTIFY_SLOTS];
} NotifyShared;

static NotifyShared *shared = NULL;


/* In a notifier, its slot. */
static int	my_slot = -1;

/* The NOTIFY channel of channel. */
const char *
idem_notify_channel_name(IdemNotifyChannel channel)
{
	return channel == IDEM_NOTIFY_TASKS ? IDEM_TASKS_CHANNEL : IDEM_OUTBOX_CHANNEL;
}

/* Reserve the slots (from idem.c's shmem_request_hook). */
void
idem_notify_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(NotifyShared)));
}

/* Create or attach to the slots (idem.c's shmem_startup_hook, under AddinShmemInitLock). */
void
idem_notify_shmem_startup(void)
{
	bool		found;

	shared = ShmemInitStruct("idem outbox notifier", sizeof(NotifyShared), &found);
	if (!found)
	{
		memset(shared, 0, sizeof(NotifyShared));
		SpinLockInit(&shared->mutex);
	}
}

/* This database's slot, or a free one claimed for it, or NULL; under mutex. */
static NotifySlot *
slot_for(Oid dboid, bool claim)
{
	NotifySlot *free_slot = NULL;

	for (int i = 0; i < NOTIFY_SLOTS; i++)
	{
		NotifySlot *s = &shared->slots[i];

		if (s->dboid == dboid)
			return s;
		if (free_slot == NULL && !s->running && s->reserved == 0 && s->ntopics == 0 &&
			s->start_requested == 0)
			free_slot = s;
	}
	if (claim && free_slot != NULL)
	{
		free_slot->dboid = dboid;
		free_slot->ntopics = 0;
		free_slot->reserved = 0;
	}
	return claim ? free_slot : NULL;
}

/* Ask the postmaster for this database's notifier. */
static void
start_notifier(int slot)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idem");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_outbox_notifier_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idem outbox notifier");
	snprintf(worker.bgw_type, BGW_MAXLEN, "idem outbox notifier");
	worker.bgw_main_arg = Int32GetDatum(slot);
	memcpy(worker.bgw_extra, &MyDatabaseId, sizeof(Oid));
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		/* no free worker slot, so this and later commits notify themselves */
		SpinLockAcquire(&shared->mutex);
		shared->slots[slot].start_requested = 0;
		SpinLockRelease(&shared->mutex);
	}
}

/*
 * At PRE_COMMIT of a transaction with messages of ntopics topics: true if
 * the notifier will send its notifications (room is reserved; call
 * idem_notify_committed or idem_notify_aborted next), false if the caller
 * must NOTIFY itself.  Starts a notifier if the database has none.
 */
bool
idem_notify_defer(int ntopics)
{
	NotifySlot *s;
	bool		deferred = false;
	int			start = -1;
	TimestampTz now = GetCurrentTimestamp();

	if (shared == NULL)
		return false;
	SpinLockAcquire(&shared->mutex);
	s = slot_for(MyDatabaseId, true);
	if (s != NULL)
	{
		if (s->running && s->ntopics + s->reserved + ntopics <= NOTIFY_TOPICS)
		{
			s->reserved += ntopics;
			deferred = true;
		}
		else if (!s->running &&
				 (s->start_requested == 0 ||
				  TimestampDifferenceExceeds(s->start_requested, now, NOTIFY_START_RETRY_MS)))
		{
			s->start_requested = now;
			start = s - shared->slots;
		}
	}
	SpinLockRelease(&shared->mutex);
	if (start >= 0)
		start_notifier(start);
	return deferred;
}

/*
 * After the commit of a transaction that deferred.  Hand over its topics
 * (ntopics, as reserved) and wake the notifier.  Cannot fail.
 */
void
idem_notify_committed(IdemNotifyChannel channel, const char *const *topics, int ntopics)
{
	NotifySlot *s;
	Latch	   *latch = NULL;

	SpinLockAcquire(&shared->mutex);
	s = slot_for(MyDatabaseId, false);
	if (s != NULL)
	{
		bool		was_empty = s->ntopics == 0;

		s->reserved -= ntopics;
		for (int i = 0; i < ntopics; i++)
		{
			bool		known = false;

			for (int j = 0; j < s->ntopics && !known; j++)
				known = s->channels[j] == channel && strcmp(s->topics[j], topics[i]) == 0;
			if (!known && s->ntopics < NOTIFY_TOPICS)
			{
				s->channels[s->ntopics] = (uint8) channel;
				strlcpy(s->topics[s->ntopics++], topics[i], NOTIFY_TOPIC_SIZE);
			}
		}
		/* a list that was not empty had its notifier woken already */
		latch = was_empty ? s->latch : NULL;
	}
	SpinLockRelease(&shared->mutex);
	if (latch != NULL)
		SetLatch(latch);
}

/* After the abort of a transaction that deferred, give back its room. */
void
idem_notify_aborted(int ntopics)
{
	NotifySlot *s;

	SpinLockAcquire(&shared->mutex);
	s = slot_for(MyDatabaseId, false);
	if (s != NULL)
		s->reserved -= ntopics;
	SpinLockRelease(&shared->mutex);
}

/* The notifier leaves its slot.  Later commits start another or notify themselves. */
static void
notifier_exit(int code, Datum arg)
{
	NotifySlot *s = &shared->slots[my_slot];

	SpinLockAcquire(&shared->mutex);
	s->running = false;
	s->latch = NULL;
	s->start_requested = 0;
	SpinLockRelease(&shared->mutex);
}

/* Send what is gathered; false if there was nothing. */
static bool
send_gathered(void)
{
	NotifySlot *s = &shared->slots[my_slot];
	char		topics[NOTIFY_TOPICS][NOTIFY_TOPIC_SIZE];
	uint8		channels[NOTIFY_TOPICS];
	int			n;

	SpinLockAcquire(&shared->mutex);
	n = s->ntopics;
	memcpy(topics, s->topics, n * NOTIFY_TOPIC_SIZE);
	memcpy(channels, s->channels, n);
	s->ntopics = 0;
	SpinLockRelease(&shared->mutex);
	if (n == 0)
		return false;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	pgstat_report_activity(STATE_RUNNING, "idem: notifying publishers");
	for (int i = 0; i < n; i++)
		Async_Notify(idem_notify_channel_name(channels[i]), topics[i]);
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	return true;
}

/* Main of the notifier of one database. */
void
idem_outbox_notifier_main(Datum main_arg)
{
	Oid			dboid;
	TimestampTz idle_since;

	my_slot = DatumGetInt32(main_arg);
	memcpy(&dboid, MyBgworkerEntry->bgw_extra, sizeof(Oid));
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	SpinLockAcquire(&shared->mutex);
	if (shared->slots[my_slot].dboid != dboid || shared->slots[my_slot].running)
	{
		/* the slot went to another database, or has a notifier already */
		SpinLockRelease(&shared->mutex);
		proc_exit(0);
	}
	shared->slots[my_slot].running = true;
	shared->slots[my_slot].start_requested = 0;
	shared->slots[my_slot].latch = MyLatch;
	SpinLockRelease(&shared->mutex);
	before_shmem_exit(notifier_exit, (Datum) 0);

	idle_since = GetCurrentTimestamp();
	for (;;)
	{
		if (send_gathered())
		{
			idle_since = GetCurrentTimestamp();
			/*
			 * Under load, one NOTIFY transaction per few milliseconds of
			 * commits rather than one per wake-up.  The notifier's own work
			 * stays small next to the emitters'.
			 */
			(void) WaitLatch(MyLatch, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 NOTIFY_GATHER_MS, PG_WAIT_EXTENSION);
		}
		else if (TimestampDifferenceExceeds(idle_since, GetCurrentTimestamp(), NOTIFY_IDLE_MS))
		{
			bool		done;

			SpinLockAcquire(&shared->mutex);
			done = shared->slots[my_slot].ntopics == 0 && shared->slots[my_slot].reserved == 0;
			if (done)
			{
				shared->slots[my_slot].running = false;
				shared->slots[my_slot].latch = NULL;
				shared->slots[my_slot].dboid = InvalidOid;
			}
			SpinLockRelease(&shared->mutex);
			if (done)
				proc_exit(0);
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 NOTIFY_IDLE_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}
