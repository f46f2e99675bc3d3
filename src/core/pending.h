/*-------------------------------------------------------------------------
 *
 * pending.h
 *	  The keys this transaction claimed with the generic API and has not
 *	  finished (pending.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_PENDING_H
#define IDEM_PENDING_H

#include "datatype/timestamp.h"

#include "fingerprint.h"
#include "key.h"

/* A key this transaction claimed. */
typedef struct IdemPendingClaim
{
	int64		owner;
	char	   *operation;
	char	   *key;
	IdemRequestPrint print;		/* settled: no request */
	bool		has_ttl;
	Interval	ttl;
	SubTransactionId subid;		/* claimed in */
	SubTransactionId finished_subid;	/* finished in; Invalid: not yet */
	bool		running;		/* idem_run is calling its handler */
	struct IdemPendingClaim *next;
} IdemPendingClaim;

extern void idem_pending_init(void);
extern IdemPendingClaim *idem_pending_add(const IdemScope *scope, IdemRequestPrint *print,
										  const uint8 *db_secret, const Interval *ttl);
extern bool idem_pending_owner(int64 *owner);
extern IdemPendingClaim *idem_pending_find(const IdemScope *scope);
extern void idem_pending_forget(IdemPendingClaim *p);
extern void idem_pending_check_not_running(const IdemPendingClaim *p, const IdemScope *scope);
extern void idem_pending_check_unclaimed(const IdemScope *scope, IdemRequestPrint *print);

#endif							/* IDEM_PENDING_H */
