/*-------------------------------------------------------------------------
 *
 * idem.c
 *	  Module entry of the idem extension: the module magic and the GUCs.
 *
 * The protocol lives in src/protocol.c, canonical JSON and hashing in
 * src/jcs.c, batch cleanup in src/cleanup.c, the cleanup background worker
 * in src/worker.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "idem.h"

PG_MODULE_MAGIC;

int			idem_wait_timeout = 5000;
int			idem_ttl = 86400;

void		_PG_init(void);

/*
 * Define the GUCs, and when loaded from shared_preload_libraries register the
 * cleanup worker.  Loaded on first use instead, every SQL function works and
 * only the worker is absent.
 */
void
_PG_init(void)
{
	DefineCustomIntVariable("idem.wait_timeout",
							"How long a duplicate request waits for the in-flight original.",
							"After this long the duplicate fails with SQLSTATE IK002 "
							"(request still processing). 0 means do not wait.",
							&idem_wait_timeout,
							5000, 0, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.ttl",
							"How long an idempotency record is kept before its key may be used afresh.",
							NULL,
							&idem_ttl,
							86400, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

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

	DefineCustomStringVariable("idem.cleanup_databases",
							   "The databases the cleanup worker visits.",
							   "A comma-separated list of names; empty means every "
							   "database that accepts connections.",
							   &idem_cleanup_databases,
							   "",
							   PGC_SIGHUP,
							   GUC_LIST_INPUT,
							   idem_check_cleanup_databases, NULL, NULL);

	MarkGUCPrefixReserved("idem");

	/* pg_upgrade must not start workers */
	if (process_shared_preload_libraries_in_progress && !IsBinaryUpgrade)
		idem_worker_init();
}
