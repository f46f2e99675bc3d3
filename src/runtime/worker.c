/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The cleanup background worker: a launcher with no database connection
 *	  that, every idem.cleanup_interval, starts one short-lived worker per
 *	  database in turn; each deletes expired records there and exits.
 *
 * Staying connected to a database would block DROP DATABASE and CREATE
 * DATABASE ... TEMPLATE of it, so nothing stays connected between rounds.
 * Within a round the worker gets out of the way by itself: each batch is its
 * own short transaction, which begins by asking, without waiting, for the
 * lock that connecting backends take on the database object.  DROP DATABASE,
 * CREATE DATABASE ... TEMPLATE and ALTER DATABASE ... RENAME hold a
 * conflicting lock while they wait for other sessions to leave; when the
 * worker sees one it ends its round at once, so such commands wait at most
 * one batch.
 *
 * A database without the extension costs one connection and one catalog
 * lookup per round.  Per-database figures live in shared memory and are shown
 * by idem_cleanup_status().
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
#include "util.h"
#include "worker.h"

PGDLLEXPORT void idem_cleanup_launcher_main(Datum main_arg);
PGDLLEXPORT void idem_cleanup_worker_main(Datum main_arg);

PG_FUNCTION_INFO_V1(idem_cleanup_status);
PG_FUNCTION_INFO_V1(idem_cleanup_worker_notice);

/* A worker waits this long for a table lock before giving up the round. */
#define IDEM_CLEANUP_LOCK_TIMEOUT "100ms"

/* How many databases idem_cleanup_status() can track. */
#define IDEM_MAX_TRACKED_DATABASES 1024

#define IDEM_ERROR_LEN 256

/* What the worker did in one database; shared memory, under IdemShared->lock. */
typedef struct IdemDbStatus
{
	Oid			datid;			/* hash key */
	NameData	datname;
	TimestampTz last_run_started;
	TimestampTz last_run_finished;	/* 0 while a run is in progress */
	int64		last_run_deleted;
	int64		total_deleted;	/* since the server started */
	int64		runs;
	TimestampTz last_error_at;	/* 0 if none since the server started */
	char		last_error[IDEM_ERROR_LEN];
} IdemDbStatus;

typedef struct IdemShared
{
	LWLock	   *lock;
} IdemShared;

/* GUC variables */
static int	idem_cleanup_interval = 60;
static int	idem_cleanup_batch_size = 1000;
static int	idem_cleanup_max_batches = 0;
static int	idem_cleanup_batch_delay = 50;
static char *idem_cleanup_databases = NULL;
static int	idem_cleanup_database_timeout = 600000;	/* ms */

static bool idem_check_cleanup_databases(char **newval, void **extra, GucSource source);

/* Set in _PG_init when loaded from shared_preload_libraries. */
static bool idem_preloaded = false;

static IdemShared *idem_shared = NULL;
static HTAB *idem_status = NULL;

/* In a worker: this database's entry, once a run has begun (NULL if full). */
static IdemDbStatus *my_status = NULL;


/* A database the launcher visits in a round. */
typedef struct IdemDatabase
{
	Oid			oid;
	NameData	name;
} IdemDatabase;

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
	/* not on a standby: it starts when recovery ends, after promotion too */
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
 * Start a run in this database: a fresh entry, or the old one with the last
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
static void
status_record_error(Oid datid, const char *error)
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

/* Forget a database: the extension is gone from it, or the database is. */
static void
status_forget(Oid datid)
{
	LWLockAcquire(idem_shared->lock, LW_EXCLUSIVE);
	hash_search(idem_status, &datid, HASH_REMOVE, NULL);
	LWLockRelease(idem_shared->lock);
}

/* Forget every database that is not in the round's list. */
static void
status_forget_others(List *databases)
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

/* Re-read the configuration after a SIGHUP. */
static void
reload_config_if_asked(void)
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
 * One batch in its own transaction.  Returns the rows deleted, or -1 when
 * the round in this database must end: the extension is not (or no longer)
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
		reload_config_if_asked();
		/* turned off meanwhile: stop between two batches */
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
	 * must neither block nor fail us: a SERIALIZABLE READ ONLY DEFERRABLE
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

/* ---- the launcher -------------------------------------------------------- */

/*
 * Is the database named in idem.cleanup_databases (or is the list empty)?
 * A quoted name matches exactly; an unquoted one ignoring case, so that
 * MyDb finds the database "MyDb" (SQL would fold it to mydb, which would
 * silently match nothing).
 */
static bool
database_selected(const char *name)
{
	const char *p = idem_cleanup_databases;

	if (p == NULL || *p == '\0')
		return true;
	while (*p != '\0')
	{
		StringInfoData item;
		bool		quoted = false;

		initStringInfo(&item);
		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == '"')
		{
			quoted = true;
			for (p++; *p != '\0'; p++)
			{
				if (*p == '"' && p[1] == '"')
					appendStringInfoChar(&item, *p++);
				else if (*p == '"')
				{
					p++;
					break;
				}
				else
					appendStringInfoChar(&item, *p);
			}
		}
		else
			for (; *p != '\0' && *p != ',' && *p != ' ' && *p != '\t'; p++)
				appendStringInfoChar(&item, *p);
		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == ',')
			p++;
		if (quoted ? strcmp(item.data, name) == 0 : pg_strcasecmp(item.data, name) == 0)
		{
			pfree(item.data);
			return true;
		}
		pfree(item.data);
	}
	return false;
}

/* Check hook of idem.cleanup_databases: a comma-separated list of names. */
static bool
idem_check_cleanup_databases(char **newval, void **extra, GucSource source)
{
	char	   *raw = pstrdup(*newval);
	List	   *names;
	bool		ok = SplitIdentifierString(raw, ',', &names);

	if (!ok)
		GUC_check_errdetail("List syntax is invalid.");
	list_free(names);
	pfree(raw);
	return ok;
}

/*
 * The databases to visit, allocated in the current memory context: those
 * that accept connections, are valid and are selected.
 */
static List *
list_databases(void)
{
	List	   *result = NIL;
	MemoryContext outer = CurrentMemoryContext;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);
		MemoryContext oldcxt;
		IdemDatabase *d;

		if (!db->datallowconn || database_is_invalid_form(db) ||
			!database_selected(NameStr(db->datname)))
			continue;
		oldcxt = MemoryContextSwitchTo(outer);
		d = palloc(sizeof(IdemDatabase));
		d->oid = db->oid;
		d->name = db->datname;
		result = lappend(result, d);
		MemoryContextSwitchTo(oldcxt);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return result;
}

/* Does database dboid still exist (it may have been dropped during the round)? */
static bool
database_exists(Oid dboid)
{
	bool		exists;

	StartTransactionCommand();
	exists = SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dboid));
	CommitTransactionCommand();
	return exists;
}

/*
 * Wait for a worker to exit, at most idem.cleanup_database_timeout: then
 * stop it, record why, and wait for it to be gone.
 */
static void
wait_for_worker(BackgroundWorkerHandle *handle, IdemDatabase *db)
{
	TimestampTz started = GetCurrentTimestamp();
	bool		terminated = false;

	for (;;)
	{
		pid_t		pid;
		BgwHandleStatus status = GetBackgroundWorkerPid(handle, &pid);
		long		wait_ms = 1000;

		if (status == BGWH_STOPPED)
			return;
		if (status == BGWH_POSTMASTER_DIED)
			proc_exit(1);
		reload_config_if_asked();
		if (!terminated && idem_cleanup_database_timeout > 0)
		{
			long		left = idem_cleanup_database_timeout -
				TimestampDifferenceMilliseconds(started, GetCurrentTimestamp());

			if (left <= 0)
			{
				char		msg[IDEM_ERROR_LEN];

				snprintf(msg, sizeof(msg),
						 "stopped after idem.cleanup_database_timeout (%d ms)",
						 idem_cleanup_database_timeout);
				ereport(LOG,
						(errmsg("idem: the cleanup worker for database \"%s\" %s",
								NameStr(db->name), msg)));
				status_record_error(db->oid, msg);
				TerminateBackgroundWorker(handle);
				terminated = true;
			}
			else
				wait_ms = Min(wait_ms, left);
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 wait_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/* Start the worker for one database and wait until it has exited. */
static void
run_worker(IdemDatabase *db)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	/* dropped since the round began: no worker, no FATAL in the log */
	if (!database_exists(db->oid))
		return;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idem");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_cleanup_worker_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idem cleanup worker for database %s",
			 NameStr(db->name));
	snprintf(worker.bgw_type, BGW_MAXLEN, "idem cleanup worker");
	worker.bgw_main_arg = ObjectIdGetDatum(db->oid);
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		ereport(LOG,
				(errmsg("idem: could not start the cleanup worker for database \"%s\"",
						NameStr(db->name)),
				 errhint("Raise max_worker_processes; the cleanup needs one slot "
						 "for its launcher and one for a worker.")));
		return;
	}
	wait_for_worker(handle, db);
	pfree(handle);
}

/* One round: every selected database in turn. */
static void
run_round(MemoryContext round_cxt)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(round_cxt);
	List	   *databases = list_databases();
	ListCell   *lc;

	status_forget_others(databases);
	foreach(lc, databases)
	{
		CHECK_FOR_INTERRUPTS();
		reload_config_if_asked();
		if (idem_cleanup_interval == 0)
			break;
		run_worker((IdemDatabase *) lfirst(lc));
	}
	MemoryContextSwitchTo(oldcxt);
	MemoryContextReset(round_cxt);
}

/* Entry point of the launcher: a round every idem.cleanup_interval. */
void
idem_cleanup_launcher_main(Datum main_arg)
{
	MemoryContext round_cxt;
	TimestampTz last_round = 0;

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();

	/* no database: enough to read pg_database, and blocks no DROP DATABASE */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	round_cxt = AllocSetContextCreate(TopMemoryContext, "idem cleanup round",
									  ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		long		timeout = -1;

		CHECK_FOR_INTERRUPTS();
		reload_config_if_asked();

		if (idem_cleanup_interval > 0)
		{
			TimestampTz now = GetCurrentTimestamp();
			TimestampTz next = TimestampTzPlusMilliseconds(last_round,
														   (int64) idem_cleanup_interval * 1000);

			if (last_round == 0 || now >= next)
			{
				last_round = now;
				run_round(round_cxt);
				continue;
			}
			timeout = (long) ((next - now + 999) / 1000);
		}

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_EXIT_ON_PM_DEATH | (timeout >= 0 ? WL_TIMEOUT : 0),
						 timeout, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* ---- SQL ----------------------------------------------------------------- */

/*
 * SQL: idem_cleanup_status() returns setof record, one row per database in
 * which the worker found the extension since the server started.  Empty
 * when idem is not in shared_preload_libraries.
 */
Datum
idem_cleanup_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS scan;
	IdemDbStatus *st;

	InitMaterializedSRF(fcinfo, 0);
	if (idem_status == NULL)
		return (Datum) 0;

	LWLockAcquire(idem_shared->lock, LW_SHARED);
	hash_seq_init(&scan, idem_status);
	while ((st = hash_seq_search(&scan)) != NULL)
	{
		Datum		values[9];
		bool		nulls[9] = {false};

		values[0] = ObjectIdGetDatum(st->datid);
		values[1] = NameGetDatum(&st->datname);
		values[2] = TimestampTzGetDatum(st->last_run_started);
		values[3] = TimestampTzGetDatum(st->last_run_finished);
		nulls[3] = st->last_run_finished == 0;
		values[4] = Int64GetDatum(st->last_run_deleted);
		values[5] = Int64GetDatum(st->total_deleted);
		values[6] = Int64GetDatum(st->runs);
		values[7] = CStringGetTextDatum(st->last_error);
		nulls[7] = st->last_error_at == 0;
		values[8] = TimestampTzGetDatum(st->last_error_at);
		nulls[8] = st->last_error_at == 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	LWLockRelease(idem_shared->lock);
	return (Datum) 0;
}

/*
 * Raise a NOTICE when idem is not preloaded, so CREATE EXTENSION says that
 * expired records will not be cleaned by themselves.  The extension script
 * calls it once and drops it.  CREATE EXTENSION runs its script with
 * client_min_messages raised to WARNING, which would swallow the NOTICE, so
 * it is let through here.
 */
Datum
idem_cleanup_worker_notice(PG_FUNCTION_ARGS)
{
	int			save_client_min_messages = client_min_messages;

	if (idem_preloaded)
		PG_RETURN_VOID();

	client_min_messages = Min(client_min_messages, NOTICE);
	PG_TRY();
	{
		ereport(NOTICE,
				(errmsg("idem is not in shared_preload_libraries, so its cleanup worker is not running"),
				 errdetail("Every idem function works; expired records stay until "
						   "idem_cleanup_expired() deletes them."),
				 errhint("Add idem to shared_preload_libraries and restart the server "
						 "to have expired records deleted in the background.")));
	}
	PG_FINALLY();
	{
		client_min_messages = save_client_min_messages;
	}
	PG_END_TRY();
	PG_RETURN_VOID();
}
