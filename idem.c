/*-------------------------------------------------------------------------
 *
 * idem.c
 *	  Module entry of the idem extension.  _PG_init hands each module its
 *	  start-up, and the shared-memory hooks call each module's part.
 *
 * The modules sit in layers, one folder each.  src/LAYERS lists them in
 * order and states the rule test/layers.sh checks.  A file includes idem
 * headers only of its own module and of the modules listed above it, and
 * an SQL entry point includes none of another.  This file is the top, so
 * it includes every module's start-up.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "utils/guc.h"

#include "fingerprint.h"
#include "history.h"
#include "inbox.h"
#include "policy.h"
#include "order.h"
#include "outbox.h"
#include "pending.h"
#include "key.h"
#include "binding.h"
#include "trace.h"
#include "keycheck.h"
#include "keyxids.h"
#include "notify.h"
#include "stats.h"
#include "record.h"
#include "task.h"
#include "worker.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Reserve what the worker, the notifier and the statistics keep in shared memory. */
static void
idem_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	idem_worker_shmem_request();
	idem_notify_shmem_request();
	idem_stats_shmem_request();
	idem_keycheck_shmem_request();
	idem_keyxids_shmem_request();
	idem_task_shmem_request();
}

/* Create or attach to it, under AddinShmemInitLock. */
static void
idem_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	idem_worker_shmem_startup();
	idem_notify_shmem_startup();
	idem_stats_shmem_startup();
	idem_keycheck_shmem_startup();
	idem_keyxids_shmem_startup();
	idem_task_shmem_startup();
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Define the GUCs, register the tables and transaction callbacks, and when
 * loaded from shared_preload_libraries reserve the shared memory (the
 * cleanup status, the notifier's slots, idem_stats) and register the cleanup
 * worker.  Loaded on first use instead, every SQL function works; the
 * worker, the notifier and idem_stats are absent.
 */
void
_PG_init(void)
{
	idem_key_init();
	idem_binding_init();
	idem_trace_init();
	idem_record_init();
	idem_history_init();
	idem_policy_init();
	idem_fingerprint_init();
	idem_worker_define_gucs();
	idem_stats_define_gucs();
	idem_order_init();
	idem_pending_init();
	idem_outbox_init();
	idem_inbox_init();
	idem_task_init();

	/*
	 * Only now that every idem.* GUC is defined.  Reserving the prefix
	 * removes the placeholders of the names not defined yet, and with them
	 * what postgresql.conf set for them.
	 */
	MarkGUCPrefixReserved("idem");

	/* pg_upgrade must not start workers */
	if (process_shared_preload_libraries_in_progress && !IsBinaryUpgrade)
	{
		prev_shmem_request_hook = shmem_request_hook;
		shmem_request_hook = idem_shmem_request;
		prev_shmem_startup_hook = shmem_startup_hook;
		shmem_startup_hook = idem_shmem_startup;
		idem_worker_init();
		idem_stats_init();
	}
}
