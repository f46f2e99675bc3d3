/*-------------------------------------------------------------------------
 *
 * launcher.c
 *	  The cleanup launcher.  A background worker with no database
 *	  connection that, every idem.cleanup_interval, lists the databases
 *	  (those idem.cleanup_databases names, or all) and starts one
 *	  short-lived cleanup worker per database in turn (worker.c), waiting
 *	  for each at most idem.cleanup_database_timeout.
 *
 * Nothing stays connected between rounds, so the launcher never blocks
 * DROP DATABASE or CREATE DATABASE ... TEMPLATE; see worker.c.
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
#include "worker.h"
#include "worker_int.h"

PGDLLEXPORT void idem_cleanup_launcher_main(Datum main_arg);

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
bool
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
 * The databases to visit, allocated in the current memory context.  Those
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
 * Wait for a worker to exit, at most idem.cleanup_database_timeout.  Then
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
		idem_worker_reload_config_if_asked();
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
				idem_worker_status_record_error(db->oid, msg);
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

	/* dropped since the round began, so no worker and no FATAL in the log */
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

/* One round, every selected database in turn. */
static void
run_round(MemoryContext round_cxt)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(round_cxt);
	List	   *databases = list_databases();
	ListCell   *lc;

	idem_worker_status_forget_others(databases);
	foreach(lc, databases)
	{
		CHECK_FOR_INTERRUPTS();
		idem_worker_reload_config_if_asked();
		if (idem_cleanup_interval == 0)
			break;
		run_worker((IdemDatabase *) lfirst(lc));
	}
	MemoryContextSwitchTo(oldcxt);
	MemoryContextReset(round_cxt);
}

/* Entry point of the launcher, a round every idem.cleanup_interval. */
void
idem_cleanup_launcher_main(Datum main_arg)
{
	MemoryContext round_cxt;
	TimestampTz last_round = 0;

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();

	/* no database, which is enough to read pg_database and blocks no DROP DATABASE */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	round_cxt = AllocSetContextCreate(TopMemoryContext, "idem cleanup round",
									  ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		long		timeout = -1;

		CHECK_FOR_INTERRUPTS();
		idem_worker_reload_config_if_asked();

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
