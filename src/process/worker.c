/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The cleanup background worker: a launcher with no database connection
 *	  that, every idem.cleanup_interval, starts one short-lived worker per
 *	  database in turn; each deletes expired records there and exits.
 *
 * Staying connected to a database would block DROP DATABASE and CREATE
 * DATABASE ... TEMPLATE of it, so nothing stays connected between rounds.
 * Within a round the worker gets out of the way by itself.  Each batch is its
 * own short transaction, which begins by asking, without waiting, for the
 * lock that connecting backends take on the database object.  DROP DATABASE,
 * CREATE DATABASE ... TEMPLATE and ALTER DATABASE ... RENAME hold a
 * conflicting lock while they wait for other sessions to leave; when the
 * worker sees one it ends its round at once, so such commands wait at most
 * one batch.
 *
 * A database without the extension costs one connection and one catalog
 * lookup per round.  Per-database figures live in shared memory and are shown
 * by idem_cleanup_status() (src/api/maintenance.c).
 *
 * This file holds the module's shared memory, its settings and the
 * per-database worker; launcher.c the launcher; worker_int.h what they
 * share.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/varlena.h"

#include "idem.h"
#include "compat.h"
#include "cleanup.h"
#include "policy.h"
#include "util.h"
#include "worker.h"
#include "worker_int.h"

PGDLLEXPORT void idem_cleanup_worker_main(Datum main_arg);


/* A worker waits this long for a table lock before giving up the round. */
#define IDEM_CLEANUP_LOCK_TIMEOUT "100ms"

/* How many databases idem_cleanup_status() can track. */
#define IDEM_MAX_TRACKED_DATABASES 1024


/* What the worker did in one database; shared memory, under IdemShared->lock. */

typedef struct IdemShared
{
	LWLock	   *lock;
} IdemShared;

/* GUC variables */
int			idem_cleanup_interval = 60;
static int	idem_cleanup_batch_size = 1000;
static int	idem_cleanup_max_batches = 0;
static int	idem_cleanup_batch_delay = 50;
char	   *idem_cleanup_databases = NULL;
int			idem_cleanup_database_timeout = 600000;	/* ms */

/* Set in _PG_init when loaded from shared_preload_libraries. */
static bool idem_preloaded = false;

static IdemShared *idem_shared = NULL;
static HTAB *idem_status = NULL;

/* In a worker, this database's entry once a run has begun (NULL if full). */
static IdemDbStatus *my_status = NULL;


/* ---- shared memory ------------------------------------------------------ */

static Size
idem_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(IdemShared)),
					hash_estimate_size(IDEM_MAX_TRACKED_DATABASES,
									   sizeof(IdemDbStatus)));
}

/* Reserve the status table and its lock (from idem.c's shmem_request_hook). */
void
idem_worker_shmem_request(void)
{
	RequestAddinShmemSpace(idem_shmem_size());
	RequestNamedLWLockTranche("idem", 1);
}

/*
 * Create or attach to the status table (from idem.c's shmem_startup_hook,
 * which holds AddinShmemInitLock).
 */
void
idem_worker_shmem_startup(void)
{
	bool		found;
	HASHCTL		info;

	idem_shared = ShmemInitStruct("idem cleanup", sizeof(IdemShared), &found);
	if (!found)
		idem_shared->lock = &(GetNamedLWLockTranche("idem"))->lock;
	info.keysize = sizeof(Oid);
	info.entrysize = sizeof(IdemDbStatus);
	idem_status = idem_shmem_init_hash("idem cleanup status", IDEM_MAX_TRACKED_DATABASES,
									   &info, HASH_ELEM | HASH_BLOBS);
}

/*
 * Define the cleanup worker's GUCs.  Called from _PG_init whether or not
 * the library is preloaded, so that the settings are known either way.
 */
void
idem_worker_define_gucs(void)
{
	DefineCustomIntVariable("idem.cleanup_interval",
							"Time between two rounds of the cleanup worker.",
							"Each round deletes the expired records of every database "
							"that has the extension. 0 turns the worker off.",
							&idem_cleanup_interval,
							60, 0, INT_MAX / 1000,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.cleanup_batch_size",
							"How many expired records the cleanup worker deletes per transaction.",
							NULL,
							&idem_cleanup_batch_size,
							1000, 1, INT_MAX,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.cleanup_max_batches",
							"How many batches the cleanup worker deletes per database and round.",
							"0 means no limit: a round ends when nothing expired is left.",
							&idem_cleanup_max_batches,
							0, 0, INT_MAX,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.cleanup_batch_delay",
							"How long the cleanup worker pauses between two batches.",
							"The pause leaves the machine to foreground work.",
							&idem_cleanup_batch_delay,
							50, 0, 10000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.cleanup_database_timeout",
							"How long the cleanup launcher lets one database's worker run per round.",
							"After this long the launcher stops the worker and goes on with "
							"the next database. 0 means no limit.",
							&idem_cleanup_database_timeout,
							600000, 0, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomStringVariable("idem.cleanup_databases",
							   "The databases the cleanup worker visits.",
							   "A comma-separated list of names; empty means every "
							   "database that accepts connections.",
							   &idem_cleanup_databases,
							   "",
							   PGC_SIGHUP,
							   GUC_LIST_INPUT,
							   idem_check_cleanup_databases, NULL, NULL);
}

/*
 * Register the launcher.  Called from _PG_init while
 * shared_preload_libraries is processed, and never under pg_upgrade.
 */
void
idem_worker_init(void)
{
	BackgroundWorker worker;

	idem_preloaded = true;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	/* not on a standby, where it starts when recovery ends, after promotion too */
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	/* back by itself after a crash, a termination or an error */
	worker.bgw_restart_time = 10;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idem");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_cleanup_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idem cleanup launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "idem cleanup launcher");
	RegisterBackgroundWorker(&worker);
}

/*
 * Start a run in this database.  A fresh entry, or the old one with the last
 * run's figures reset.  Nothing is recorded when the table is full.
 */
static void
status_begin_run(const char *datname)
{
	IdemDbStatus *st;
	bool		found;

	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	st = hash_search(idem_status, &MyDatabaseId, HASH_ENTER_NULL, &found);
	if (st != NULL)
	{
		if (!found)
		{
			st->total_deleted = 0;
			st->runs = 0;
			st->last_error_at = 0;
			st->last_error[0] = '\0';
		}
		namestrcpy(&st->datname, datname);
		st->last_run_started = GetCurrentTimestamp();
		st->last_run_finished = 0;
		st->last_run_deleted = 0;
		st->runs++;
	}
	LWLockRelease(idem_shared->lock);
	my_status = st;
}

/* Count the rows deleted by one batch. */
static void
status_add_deleted(int64 deleted)
{
	IdemDbStatus *st = my_status;

	if (st == NULL)
		return;
	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	st->last_run_deleted += deleted;
	st->total_deleted += deleted;
	LWLockRelease(idem_shared->lock);
}

/* End the run; with an error message, record it too. */
static void
status_end_run(const char *error)
{
	IdemDbStatus *st = my_status;

	if (st == NULL)
		return;
	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	st->last_run_finished = GetCurrentTimestamp();
	if (error != NULL)
	{
		st->last_error_at = st->last_run_finished;
		strlcpy(st->last_error, error, IDEM_ERROR_LEN);
	}
	LWLockRelease(idem_shared->lock);
}

/* Record an error for database datid from the launcher, if it is tracked. */
void
idem_worker_status_record_error(Oid datid, const char *error)
{
	IdemDbStatus *st;

	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	st = hash_search(idem_status, &datid, HASH_FIND, NULL);
	if (st != NULL)
	{
		st->last_error_at = GetCurrentTimestamp();
		if (st->last_run_finished == 0)
			st->last_run_finished = st->last_error_at;
		strlcpy(st->last_error, error, IDEM_ERROR_LEN);
	}
	LWLockRelease(idem_shared->lock);
}

/* Forget a database whose extension, or itself, is gone. */
static void
status_forget(Oid datid)
{
	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	hash_search(idem_status, &datid, HASH_REMOVE, NULL);
	LWLockRelease(idem_shared->lock);
}

/* Forget every database that is not in the round's list. */
void
idem_worker_status_forget_others(List *databases)
{
	HASH_SEQ_STATUS scan;
	IdemDbStatus *st;

	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&scan, idem_status);
	while ((st = hash_seq_search(&scan)) != NULL)
	{
		ListCell   *lc;
		bool		listed = false;

		foreach(lc, databases)
		{
			if (((IdemDatabase *) lfirst(lc))->oid == st->datid)
				listed = true;
		}
		if (!listed)
			hash_search(idem_status, &st->datid, HASH_REMOVE, NULL);
	}
	LWLockRelease(idem_shared->lock);
}

/* ---- the per-database worker -------------------------------------------- */

/* Re-read the configuration after a SIGHUP (the worker and the launcher). */
void
idem_worker_reload_config_if_asked(void)
{
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
}

/*
 * Take, without waiting, the lock every connecting backend takes on its
 * database, for the rest of this transaction.  False means a DROP DATABASE,
 * CREATE DATABASE ... TEMPLATE or the like holds a conflicting lock and is
 * waiting for us to leave.
 */
static bool
database_still_ours(void)
{
	LOCKTAG		tag;

	SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, MyDatabaseId, 0);
	return LockAcquire(&tag, RowExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

/*
 * Once a round per database: a WARNING for each operation that refuses
 * reused keys but keeps no audit period.  Its expired keys execute
 * again, as with 'execute', which its policy says they must not.
 */
static void
warn_unaudited_refusals(void)
{
	ListCell   *lc;

	foreach(lc, idem_policy_unaudited_refusals())
	{
		const char *op = lfirst(lc);

		ereport(WARNING,
				(errcode(ERRCODE_WARNING),
				 errmsg("idem: %s refuses reused keys but keeps no audit period: its expired keys execute again",
						strcmp(op, "*") == 0 ? "every operation without a policy" : psprintf("operation %s", op)),
				 errhint("Give it an audit period: idem_set_policy(operation, audit_ttl => '30 days'), or idem.audit_ttl.")));
	}
}

/*
 * One batch in its own transaction.  Returns the rows deleted, or -1 when
 * the round in this database must end.  The extension is not (or no longer)
 * installed, or someone is waiting to drop or copy the database.
 */
static int64
cleanup_one_batch(bool first)
{
	Oid			nspid;
	Oid			owner;
	Oid			save_userid;
	int			save_sec_context;
	int64		deleted = -1;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (!database_still_ours())
	{
		CommitTransactionCommand();
		return -1;
	}
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idem: SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "idem: deleting a batch of expired records");

	if (idem_extension_row(&nspid, &owner))
	{
		if (first)
			status_begin_run(get_database_name(MyDatabaseId));

		/* delete with the rights of the extension's owner, not a superuser's */
		GetUserIdAndSecContext(&save_userid, &save_sec_context);
		SetUserIdAndSecContext(owner, save_sec_context |
							   SECURITY_LOCAL_USERID_CHANGE |
							   SECURITY_RESTRICTED_OPERATION);
		deleted = idem_cleanup_batches(nspid, idem_cleanup_batch_size, 1);
		SetUserIdAndSecContext(save_userid, save_sec_context);
		if (first)
			warn_unaudited_refusals();
	}
	else if (first)
		status_forget(MyDatabaseId);

	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	return deleted;
}

/* Delete expired records here, batch by batch, until none is left. */
static void
run_batches(void)
{
	int			batches = 0;

	for (;;)
	{
		int64		deleted;

		CHECK_FOR_INTERRUPTS();
		idem_worker_reload_config_if_asked();
		/* turned off meanwhile, so stop between two batches */
		if (idem_cleanup_interval == 0)
			break;

		deleted = cleanup_one_batch(batches == 0);
		if (deleted < 0)
			break;
		status_add_deleted(deleted);
		batches++;
		if (deleted < idem_cleanup_batch_size ||
			(idem_cleanup_max_batches > 0 && batches >= idem_cleanup_max_batches))
			break;

		/* let foreground work have the machine for a moment */
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 idem_cleanup_batch_delay, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* Run the batches; an error is recorded for idem_cleanup_status(), then raised. */
static void
cleanup_database(void)
{
	PG_TRY();
	{
		run_batches();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		/* the caller logs it, once, and the worker exits */
		MemoryContextSwitchTo(TopMemoryContext);
		edata = CopyErrorData();
		status_end_run(edata->message);
		PG_RE_THROW();
	}
	PG_END_TRY();

	status_end_run(NULL);
}

/* What the worker pins, whatever the database's settings say. */
static const char *const worker_settings[][2] = {
	{"lock_timeout", IDEM_CLEANUP_LOCK_TIMEOUT},
	{"default_transaction_isolation", "read committed"},
	{"default_transaction_read_only", "off"},
	{"default_transaction_deferrable", "off"},
	{"statement_timeout", "0"},
	{"idle_in_transaction_session_timeout", "0"},
	{"idle_session_timeout", "0"},
	{"search_path", "pg_catalog, pg_temp"},
	{"session_replication_role", "origin"},
	{"synchronous_commit", "local"},
};

/* Entry point of the per-database worker; main_arg is the database's OID. */
void
idem_cleanup_worker_main(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();

	/* the bootstrap superuser; deletes run as the extension's owner */
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	/*
	 * Settings of the database (ALTER DATABASE ... SET, its owner's to make)
	 * must neither block nor fail us.  A SERIALIZABLE READ ONLY DEFERRABLE
	 * default would wait for a safe snapshot for as long as any serializable
	 * writer runs, a read-only default would fail every batch, a short
	 * statement_timeout every slow one.  A table held by ACCESS EXCLUSIVE
	 * delays us (lock_timeout), never the reverse.
	 */
	for (size_t i = 0; i < lengthof(worker_settings); i++)
		SetConfigOption(worker_settings[i][0], worker_settings[i][1],
						PGC_SUSET, PGC_S_OVERRIDE);

	if (!RecoveryInProgress())
		cleanup_database();
	proc_exit(0);
}

/* ---- for the SQL functions (src/api/maintenance.c) ---------------------- */

/* Is idem in shared_preload_libraries (its worker and shared memory set up)? */
bool
idem_worker_preloaded(void)
{
	return idem_preloaded;
}

/*
 * Call visit for each database in which the worker found the extension
 * since the server started, under the status's lock (shared).  visit should
 * only form its row.  Nothing when idem is not preloaded.
 */
void
idem_worker_status_visit(IdemWorkerStatusVisit visit, void *arg)
{
	HASH_SEQ_STATUS scan;
	IdemDbStatus *st;

	if (idem_status == NULL)
		return;
	LWLockAcquire(idem_shared->lock, LW_SHARED);
	hash_seq_init(&scan, idem_status);
	while ((st = hash_seq_search(&scan)) != NULL)
		visit(st, arg);
	LWLockRelease(idem_shared->lock);
}
