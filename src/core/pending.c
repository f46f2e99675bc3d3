/*-------------------------------------------------------------------------
 *
 * pending.c
 *	  The keys the current transaction claimed with the generic API and has
 *	  not finished yet.  They make COMMIT refuse an unfinished claim
 *	  (IK005) and refuse a handler that calls idem for the key it runs
 *	  (IK006).  A second claim of the same key in the same transaction is
 *	  answered (IK001, IK002) without a lock wait on itself.
 *
 * The list lives in TopTransactionContext, with the subtransaction that made
 * (and the one that finished) each claim, so that rolling back to a
 * savepoint undoes them as it undoes the key lock and the record.  A claim
 * finished in the subtransaction that made it leaves the list (api.c's
 * finish_claim).  A transaction of a million idem_begin/idem_finish pairs
 * keeps neither a million entries nor a million locks.  api.c claims and
 * finishes; task.c's idem_submit asks before it claims.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/memutils.h"

#include "idem.h"
#include "pending.h"

static IdemPendingClaim *pending = NULL;

/* IK005: refuse to commit or prepare with a claim not finished. */
static void
check_all_finished(void)
{
	for (IdemPendingClaim *p = pending; p != NULL; p = p->next)
		if (p->finished_subid == InvalidSubTransactionId)
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_UNFINISHED_CLAIM),
					 errmsg("transaction claimed an idempotency key and did not finish it"),
					 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": idem_begin claimed it, idem_finish was not called.",
							   p->owner, p->operation, p->key),
					 errhint("Call idem_finish for the key before COMMIT, or roll back.")));
}

static void
pending_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			check_all_finished();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			pending = NULL;		/* its memory goes with TopTransactionContext */
			break;
		default:
			break;
	}
}

/* Free a claim taken out of the list. */
static void
free_claim(IdemPendingClaim *p)
{
	pfree(p->operation);
	pfree(p->key);
	pfree(p);
}

/*
 * A subtransaction that rolls back takes its claims (and its key locks)
 * and its idem_finish calls with it; one that commits hands them to its
 * parent.
 */
static void
pending_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					 SubTransactionId parentSubid, void *arg)
{
	IdemPendingClaim **link = &pending;

	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;
	while (*link != NULL)
	{
		IdemPendingClaim *p = *link;

		if (event == SUBXACT_EVENT_ABORT_SUB)
		{
			if (p->subid == mySubid)
			{
				*link = p->next;
				free_claim(p);
				continue;
			}
			if (p->finished_subid == mySubid)
				p->finished_subid = InvalidSubTransactionId;
		}
		else
		{
			if (p->subid == mySubid)
				p->subid = parentSubid;
			if (p->finished_subid == mySubid)
				p->finished_subid = parentSubid;
		}
		link = &p->next;
	}
}

/* Register the transaction callbacks. */
void
idem_pending_init(void)
{
	RegisterXactCallback(pending_xact_callback, NULL);
	RegisterSubXactCallback(pending_subxact_callback, NULL);
}

/* This transaction's claim of scope, or NULL. */
IdemPendingClaim *
idem_pending_find(const IdemScope *scope)
{
	for (IdemPendingClaim *p = pending; p != NULL; p = p->next)
		if (p->owner == scope->owner && strcmp(p->operation, scope->operation) == 0 &&
			strcmp(p->key, scope->key) == 0)
			return p;
	return NULL;
}

/* IK006: the key is the one idem_run is running, from inside its handler. */
void
idem_pending_check_not_running(const IdemPendingClaim *p, const IdemScope *scope)
{
	if (p != NULL && p->running)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_KEY_RUNNING),
				 errmsg("the key is being run by idem_run"),
				 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": the handler of idem_run for this key called idem for the same key.",
						   scope->owner, scope->operation, scope->key),
				 errhint("A handler does the work and returns its idem_result; idem_run stores it. Do not call idem_begin, idem_finish, idem_run or idem_submit for the key being run.")));
}

/*
 * Before claiming.  A claim of scope this transaction holds, not finished,
 * is being run (IK006), in flight (IK002), or a different request
 * (IK001).  (idem_submit asks too.)
 */
void
idem_pending_check_unclaimed(const IdemScope *scope, IdemRequestPrint *print)
{
	IdemPendingClaim *p;

	if (pending == NULL)
		return;
	p = idem_pending_find(scope);
	idem_pending_check_not_running(p, scope);

	if (p == NULL || p->finished_subid != InvalidSubTransactionId)
		return;
	if (!idem_fingerprints_equal(p->print.fingerprint, idem_print_fingerprint(print)))
		idem_report_key_reused(scope);
	idem_report_in_flight(scope, IDEM_IN_FLIGHT_THIS_XACT);
}

/*
 * The owner of this transaction's unfinished claims (idem_begin's, not yet
 * finished), if it has some and they are all one owner's.  Whose a message
 * emitted in the middle of them is (idem_outbox_emit).
 */
bool
idem_pending_owner(int64 *owner)
{
	bool		found = false;

	for (IdemPendingClaim *p = pending; p != NULL; p = p->next)
	{
		if (p->finished_subid != InvalidSubTransactionId)
			continue;
		if (found && p->owner != *owner)
			return false;
		*owner = p->owner;
		found = true;
	}
	return found;
}

/*
 * Remember that this transaction claimed scope for the request print, which
 * is settled (its fingerprint and digest computed, under db_secret) for the
 * record written later.
 */
IdemPendingClaim *
idem_pending_add(const IdemScope *scope, IdemRequestPrint *print, const uint8 *db_secret,
				 const Interval *ttl)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	IdemPendingClaim *p = palloc0(sizeof(IdemPendingClaim));

	p->owner = scope->owner;
	p->operation = pstrdup(scope->operation);
	p->key = pstrdup(scope->key);
	idem_print_settle(print, db_secret);
	p->print = *print;
	p->has_ttl = (ttl != NULL);
	if (ttl)
		p->ttl = *ttl;
	p->subid = GetCurrentSubTransactionId();
	p->finished_subid = InvalidSubTransactionId;
	p->next = pending;
	pending = p;
	MemoryContextSwitchTo(oldcxt);
	return p;
}

/* Take p out of the list, and free it. */
void
idem_pending_forget(IdemPendingClaim *p)
{
	for (IdemPendingClaim **link = &pending; *link != NULL; link = &(*link)->next)
		if (*link == p)
		{
			*link = p->next;
			free_claim(p);
			return;
		}
}
