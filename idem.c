/*-------------------------------------------------------------------------
 *
 * idem.c
 *	  Module entry of the idem extension: the module magic and the GUCs.
 *
 * The protocol lives in src/protocol.c, canonical JSON and hashing in
 * src/jcs.c, batch cleanup in src/cleanup.c.
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
 * Define the GUCs.  The module works when loaded on first use as well as
 * from shared_preload_libraries; every setting here is per session.
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

	MarkGUCPrefixReserved("idem");
}
