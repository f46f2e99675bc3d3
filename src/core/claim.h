/*-------------------------------------------------------------------------
 *
 * claim.h
 *	  The protocol's decision for one call: replay, refuse, or claim the
 *	  key for this transaction.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CLAIM_H
#define IDEM_CLAIM_H

#include "identity.h"
#include "record.h"

typedef enum IdemOutcome
{
	IDEM_REPLAY,				/* claim->rec holds the finished record (or,
								 * with accept_unfinished, an unfinished one) */
	IDEM_EXECUTE				/* the key is this transaction's, so execute */
} IdemOutcome;

typedef struct IdemClaim
{
	const IdemCatalog *cat;
	const IdemScope *scope;
	IdemRequestPrint *print;	/* the call's request */
	TimestampTz now;
	IdemIdentity *identity;		/* switched to the owner by idem_claim */
	LOCKTAG		tag;
	bool		locked;			/* the key lock is held */
	bool		accept_unfinished;	/* set by the caller.  A task's record
									 * PROCESSING or FAILED_RETRYABLE is
									 * returned, not IK002 */
	IdemRecord	rec;
	int			rec_spelling;	/* the key's spelling rec is stored under
								 * (idem_scope_spelling) */
} IdemClaim;

extern IdemOutcome idem_claim(IdemClaim *claim, const IdemCatalog *cat,
							   const IdemScope *scope, IdemRequestPrint *print,
							   TimestampTz now, IdemIdentity *identity);
extern void idem_claim_written(IdemClaim *claim);

#endif							/* IDEM_CLAIM_H */
