/*-------------------------------------------------------------------------
 *
 * identity.h
 *	  Whom idem's table work runs as.  The extension's owner, with a safe
 *	  search_path around writes.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_IDENTITY_H
#define IDEM_IDENTITY_H

typedef struct IdemIdentity
{
	Oid			saved_user;
	int			saved_context;
	int			guc_level;		/* 0 until the search_path is set */
	bool		switched;
} IdemIdentity;

extern void idem_become_owner(IdemIdentity *id, Oid owner);
extern void idem_use_safe_search_path(IdemIdentity *id);
extern void idem_restore_caller(IdemIdentity *id);

#endif							/* IDEM_IDENTITY_H */
