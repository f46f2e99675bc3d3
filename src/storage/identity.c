/*-------------------------------------------------------------------------
 *
 * identity.c
 *	  Whom idem's table work runs as.
 *
 * Callers may execute idem's functions, not touch its tables.  The functions
 * read and write them as the extension's owner, as SECURITY DEFINER would,
 * but switch only around their own work (fmgr's switch, with its SET
 * search_path, costs a GUC save and restore on every call, replays
 * included).  Reads run no code anyone but idem defined: cached OIDs, the
 * index's own comparison, no SQL.  Writes may run user-defined code
 * (triggers, constraints), so they also run under search_path =
 * pg_catalog, pg_temp.  Anything the caller gave idem to run (an idem_run
 * handler) runs between idem_restore_caller and the next switch, as the
 * caller.  An error restores both, as it does for SECURITY DEFINER.
 * Transaction and subtransaction abort reset the user and unwind GUC
 * nesting.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/guc.h"

#include "identity.h"

/* Act as owner until idem_restore_caller. */
void
idem_become_owner(IdemIdentity *id, Oid owner)
{
	GetUserIdAndSecContext(&id->saved_user, &id->saved_context);
	SetUserIdAndSecContext(owner, id->saved_context | SECURITY_LOCAL_USERID_CHANGE);
	id->guc_level = 0;
	id->switched = true;
}

/* Pin search_path to pg_catalog, pg_temp until idem_restore_caller. */
void
idem_use_safe_search_path(IdemIdentity *id)
{
	if (id->guc_level > 0)
		return;
	id->guc_level = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp",
							 superuser() ? PGC_SUSET : PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
}

/* Back to the caller's user and search_path. */
void
idem_restore_caller(IdemIdentity *id)
{
	if (!id->switched)
		return;
	if (id->guc_level > 0)
		AtEOXact_GUC(true, id->guc_level);
	id->guc_level = 0;
	SetUserIdAndSecContext(id->saved_user, id->saved_context);
	id->switched = false;
}
