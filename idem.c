/*-------------------------------------------------------------------------
 *
 * idem.c
 *	  Module entry of the idem extension: _PG_init hands each module its
 *	  start-up, nothing else.
 *
 * The layers (src/), each including only headers of its own or a lower one:
 *	 L0  idem.h (constants), util, identity, jcs, rowwrite
 *	 L1  fingerprint (jcs), key, catalog
 *	 L2  record (catalog, rowwrite, key, fingerprint)
 *	 L3  claim (record, identity)
 *	 L4  order (idem_create_order), api (idem_begin/finish/run),
 *	     outbox (idem_outbox_emit), inbox (idem_consume)
 *	 side: cleanup (util) <- worker (the background cleanup);
 *	       notify (the outbox notifier) <- outbox;
 *	       stats (idem_stats counters) <- key, claim, api, outbox, inbox, cleanup
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "entry.h"
#include "key.h"
#include "notify.h"
#include "stats.h"
#include "record.h"
#include "worker.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/*
 * Define the GUCs, register the tables and transaction callbacks, and when
 * loaded from shared_preload_libraries register the cleanup worker.
 * Loaded on first use instead, every SQL function works and only the
 * worker is absent.
 */
void
_PG_init(void)
{
	idem_key_init();
	idem_record_init();
	idem_worker_define_gucs();
	idem_stats_define_gucs();
	MarkGUCPrefixReserved("idem");

	idem_order_init();
	idem_api_init();
	idem_outbox_init();
	idem_inbox_init();

	/* pg_upgrade must not start workers */
	if (process_shared_preload_libraries_in_progress && !IsBinaryUpgrade)
	{
		idem_worker_init();
		idem_notify_init();
		idem_stats_init();
	}
}
