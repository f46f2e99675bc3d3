/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  The protocol's decision for one call, for every operation: replay,
 *	  refuse, or claim the key for this transaction.
 *
 * Read first: a finished record the snapshot sees is replayed (or refused:
 * IK001, different request; IK002, still PROCESSING) without a lock or a
 * write.  Otherwise take the key lock, which waits for an in-flight
 * original that has not written its record yet, and look again before
 * executing, with a dirty snapshot: a row of the key that a running
 * transaction is writing (an original that wrote its record and gave the
 * key lock back) is waited for, at most idem.wait_timeout, as ON CONFLICT
 * waits for a speculative insertion; a record committed since our read is
 * read again, or under REPEATABLE READ and SERIALIZABLE reported as 40001,
 * never replayed unseen.  An expired record is deleted under the lock.
 * The caller then executes and writes its record (record.c), and gives the
 * key lock back at once (idem_claim_written): its uncommitted record makes
 * duplicates wait from then on, so a transaction of a million calls holds
 * no million locks.  A caller that replays after waiting gives the lock
 * back at once too.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"

#include "idem.h"
#include "claim.h"
#include "stats.h"

/*
 * How often a call looks at the key's record again: after waiting for the
 * key lock, after losing a claim, after a record changed under it.
 */
#define IDEM_CLAIM_ATTEMPTS		4

/* Is a record of this status replayed (a finished one)? */
static bool
replayable(IdemStatus status)
{
	return status == IDEM_STATUS_SUCCEEDED || status == IDEM_STATUS_FAILED_FINAL;
}

/*
 * Decide the call for scope and its request's fingerprint, as the
 * extension's owner: identity is switched to it here, and the caller
 * restores it (idem_restore_caller) when its own work as the owner is done.
 * IDEM_REPLAY: claim->rec is the finished record with the same fingerprint,
 * and no lock is kept.  IDEM_EXECUTE: this transaction holds the key lock,
 * no record of the key exists for it, and the caller executes.  Errors:
 * IK001, IK002, 40001.
 */
IdemOutcome
idem_claim(IdemClaim *c, const IdemCatalog *cat, const IdemScope *scope,
		   const char *fingerprint, TimestampTz now, IdemIdentity *identity)
{
	IdemRecord *rec = &c->rec;

	c->cat = cat;
	c->scope = scope;
	c->fingerprint = fingerprint;
	c->now = now;
	c->identity = identity;
	c->locked = false;
	idem_become_owner(identity, cat->owner);
	for (int attempt = 1;; attempt++)
	{
		bool		found;

		if (attempt > IDEM_CLAIM_ATTEMPTS)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not claim idempotency key: its record kept changing"),
					 errhint("Retry the transaction.")));

		found = idem_record_read(c->cat, c->scope, c->now, rec);
		if (!found || rec->expired)
		{
			IdemProbe	probe;
			TransactionId busy = InvalidTransactionId;

			/* no record, or an expired one: this call may execute */
			if (!c->locked)
			{
				idem_key_locktag(&c->tag, c->scope);
				if (!idem_lock_key(&c->tag, IDEM_KIND_OPERATION, c->scope->operation))
					idem_report_in_flight(c->scope, IDEM_IN_FLIGHT_WAITED);
				c->locked = true;
				/* an expired record may have been replaced while we waited */
				if (found)
					continue;
			}

			/*
			 * What the read could not see: a row a running transaction is
			 * writing is waited for, keeping the key lock so that the
			 * duplicates queued behind us stay in their order, and the key
			 * looked at again; a record committed since the read is read
			 * again with a new snapshot, or, where the transaction keeps its
			 * snapshot, refused as the executor's ON CONFLICT does rather
			 * than replayed unseen.
			 */
			probe = idem_record_probe(c->cat, c->scope, &busy);
			if (probe == IDEM_PROBE_BUSY)
			{
				if (!idem_wait_for_xact(busy, IDEM_KIND_OPERATION, c->scope->operation))
					idem_report_in_flight(c->scope, IDEM_IN_FLIGHT_WAITED);
				continue;
			}
			if (!found)
			{
				if (probe == IDEM_PROBE_FOUND)
				{
					if (IsolationUsesXactSnapshot())
						ereport(ERROR,
								(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
								 errmsg("could not serialize access due to concurrent update")));
					continue;
				}
				return IDEM_EXECUTE;
			}

			/* expired: the key starts afresh, the old record goes */
			idem_use_safe_search_path(c->identity);
			if (idem_record_delete_expired(c->cat, rec) != IDEM_ROW_CHANGED)
			{
				idem_stats_count_at_commit(IDEM_KIND_OPERATION, c->scope->operation, IDEM_STAT_RENEWED, 1);
				return IDEM_EXECUTE;
			}
			continue;			/* changed by another: read again */
		}

		if (!idem_fingerprints_equal(rec->request_hash, c->fingerprint))
			idem_report_key_reused(c->scope);
		if (!replayable(rec->status) &&
			!(c->accept_unfinished && rec->is_task &&
			  (rec->status == IDEM_STATUS_PROCESSING ||
			   rec->status == IDEM_STATUS_FAILED_RETRYABLE)))
			idem_report_in_flight(c->scope, IDEM_IN_FLIGHT_RECORDED);

		/* a replay leaves the key to others at once */
		idem_claim_written(c);
		idem_note_outcome(c->scope, IDEM_LOG_REPLAYED, !rec->result.resource_isnull,
						 rec->result.resource_id);
		return IDEM_REPLAY;
	}
}

/*
 * The claim's record is written (or the call replays): give the key lock
 * back.  From now on the record's uncommitted index entry is what makes a
 * duplicate wait (idem_claim's probe), until this transaction ends.
 */
void
idem_claim_written(IdemClaim *c)
{
	if (c->locked)
	{
		idem_unlock_key(&c->tag);
		c->locked = false;
	}
}
