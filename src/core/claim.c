/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  The protocol's decision for one call, for every operation: replay,
 *	  refuse, or claim the key for this transaction.
 *
 * Read first.  A finished record the snapshot sees is replayed, or refused
 * (IK001 for a different request, IK002 while still PROCESSING), without a
 * lock or a write.
 *
 * Otherwise take the key lock, which waits for an in-flight original that
 * has not written its record yet.  Then look again before executing, with
 * a dirty snapshot (unless no transaction the read could not see has
 * written the key since, keyxids.c):
 *	- a row of the key that a running transaction is writing (an original
 *	  that wrote its record and gave the key lock back) is waited for, at
 *	  most idem.wait_timeout, as ON CONFLICT waits for a speculative
 *	  insertion;
 *	- a record committed since our read is read again, or reported as
 *	  40001 under REPEATABLE READ and SERIALIZABLE, never replayed unseen;
 *	- an expired record is deleted under the lock.
 *
 * The caller then executes and writes its record (record.c).  It gives the
 * key lock back at once (idem_claim_written).  Its uncommitted record makes
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
#include "history.h"
#include "policy.h"
#include "stats.h"
#include "keyxids.h"

/*
 * How often a call looks at the key's record again.  After waiting for the
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
 * Read the key's record under each of its spellings (idem_scope_spelling).
 * A record stored before the operation's key_format changed is found under
 * the other.  If both have one (two executions under 1.12), the
 * older answers, with a WARNING naming both.
 */
static bool
read_key(IdemClaim *c)
{
	IdemScope	spelled;
	IdemRecord	other;
	bool		found;
	bool		other_older;

	(void) idem_scope_spelling(c->scope, 0, &spelled);
	c->rec_spelling = 0;
	found = idem_record_read(c->cat, &spelled, c->now, &c->rec);
	if (!idem_scope_spelling(c->scope, 1, &spelled) ||
		!idem_record_read(c->cat, &spelled, c->now, found ? &other : &c->rec))
		return found;
	if (!found)
	{
		c->rec_spelling = 1;
		return true;
	}
	other_older = other.created_at < c->rec.created_at ||
		(other.created_at == c->rec.created_at && other.id < c->rec.id);
	ereport(WARNING,
			(errcode(ERRCODE_WARNING),
			 errmsg("idempotency key has a record under each of two spellings"),
			 errdetail("Owner " INT64_FORMAT ", operation %s: records " INT64_FORMAT " (key \"%s\") and " INT64_FORMAT " (key \"%s\"); the older, " INT64_FORMAT ", answers.",
					   c->scope->owner, c->scope->operation, c->rec.id, c->scope->key,
					   other.id, c->scope->sent_key, other_older ? other.id : c->rec.id),
			 errhint("The key was executed twice before 1.13, once per spelling, when the operation's key_format changed. Review the newer execution.")));
	if (other_older)
	{
		c->rec = other;
		c->rec_spelling = 1;
	}
	return true;
}

/*
 * Probe the key's rows under each of its spellings.  IDEM_PROBE_BUSY if a
 * running transaction writes either, else IDEM_PROBE_FOUND if either has
 * one.
 */
static IdemProbe
probe_key(IdemClaim *c, TransactionId *busy)
{
	IdemScope	spelled;
	IdemProbe	result = IDEM_PROBE_NONE;

	for (int i = 0; idem_scope_spelling(c->scope, i, &spelled); i++)
	{
		IdemProbe	probe = idem_record_probe(c->cat, &spelled, busy);

		if (probe == IDEM_PROBE_BUSY)
			return probe;
		if (probe == IDEM_PROBE_FOUND)
			result = probe;
	}
	return result;
}

/* What idem_claim does next, after looking at an absent or expired record. */
typedef enum ClaimStep
{
	CLAIM_AGAIN,				/* look at the key's record again */
	CLAIM_EXECUTE				/* the call executes */
} ClaimStep;

/*
 * No record of the key (found false), or an expired one.  Take the key
 * lock, which waits for an in-flight original that has not written its
 * record yet.  Then look at what the read could not see:
 *	- a row a running transaction is writing is waited for, and the key
 *	  looked at again; the key lock is kept meanwhile, so the duplicates
 *	  queued behind us stay in their order;
 *	- a record committed since the read is read again with a new snapshot,
 *	  or refused where the transaction keeps its snapshot, as the
 *	  executor's ON CONFLICT does, rather than replayed unseen;
 *	- an expired record is deleted, and the key starts afresh.
 */
static ClaimStep
claim_absent(IdemClaim *c, bool found)
{
	IdemProbe	probe;
	TransactionId busy = InvalidTransactionId;
	IdemScope	spelled;

	if (!c->locked)
	{
		idem_key_locktag(&c->tag, c->scope);
		if (!idem_lock_key(&c->tag, IDEM_KIND_OPERATION, c->scope->operation))
			idem_report_in_flight(c->scope, IDEM_IN_FLIGHT_WAITED);
		c->locked = true;
		/* an expired record may have been replaced while we waited */
		if (found)
			return CLAIM_AGAIN;
	}
	/*
	 * no row of the key when it was read, and no writer of it since that
	 * the read could not see (keyxids.c)
	 */
	if (!found && c->rec.read_clean && !idem_scope_spelling(c->scope, 1, &spelled) &&
		idem_keyxids_settled(&c->tag, c->rec.read_xmin))
	{
		idem_check_key_policy(c->scope);
		return CLAIM_EXECUTE;
	}
	probe = probe_key(c, &busy);
	if (probe == IDEM_PROBE_BUSY)
	{
		if (!idem_wait_for_xact(busy, IDEM_KIND_OPERATION, c->scope->operation))
			idem_report_in_flight(c->scope, IDEM_IN_FLIGHT_WAITED);
		return CLAIM_AGAIN;
	}
	if (!found)
	{
		if (probe != IDEM_PROBE_FOUND)
		{
			/* a new execution, to which the policy's key checks apply */
			idem_check_key_policy(c->scope);
			return CLAIM_EXECUTE;
		}
		if (IsolationUsesXactSnapshot())
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent update")));
		return CLAIM_AGAIN;
	}

	/*
	 * expired: the old record goes, unless another changed it first; its
	 * audit fields stay, for the operation's audit period
	 */
	idem_check_key_policy(c->scope);
	idem_use_safe_search_path(c->identity);
	if (idem_record_delete_expired(c->cat, &c->rec) != IDEM_ROW_DELETED)
		return CLAIM_AGAIN;		/* changed, or deleted and archived by another */
	(void) idem_scope_spelling(c->scope, c->rec_spelling, &spelled);
	idem_history_archive(c->cat, &spelled, &c->rec, c->now);
	idem_stats_count_at_commit(IDEM_KIND_OPERATION, c->scope->operation, IDEM_STAT_RENEWED, 1);
	return CLAIM_EXECUTE;
}

/*
 * A live record of the key: replayed if it has the call's request (the same
 * digest of its bytes, or else the same fingerprint, fingerprint.c) and
 * is finished (IK001 for another request; IK002 for one not finished, but
 * a task's when the caller accepts that).  A replay leaves the key to
 * others at once.
 */
static IdemOutcome
claim_replay(IdemClaim *c)
{
	IdemRecord *rec = &c->rec;

	if (!idem_print_matches(c->print, idem_catalog_digest_secret(c->cat), rec->request_hash,
							rec->fp_version, rec->has_digest ? rec->digest : NULL))
		idem_report_key_reused(c->scope);
	if (!replayable(rec->status) &&
		!(c->accept_unfinished && rec->is_task &&
		  (rec->status == IDEM_STATUS_PROCESSING ||
		   rec->status == IDEM_STATUS_FAILED_RETRYABLE)))
		idem_report_in_flight(c->scope, IDEM_IN_FLIGHT_RECORDED);
	idem_claim_written(c);
	idem_note_outcome(c->scope, IDEM_LOG_REPLAYED, !rec->result.resource_isnull,
					 rec->result.resource_id);
	return IDEM_REPLAY;
}

/*
 * The key's record expired (found) or is gone: where its operation refuses
 * reuse (reuse_after_expiry 'refuse'), IK007 while the earlier
 * execution is in its audit period.  The expired record's own, or a row of
 * idem_history.  The cleanup moves a record to the history in one
 * transaction, so a read sees the one or the other.
 */
static void
check_reuse(IdemClaim *c, bool found)
{
	TimestampTz until;
	IdemScope	spelled;

	if (!idem_refuses_reuse(c->scope->operation))
		return;
	if (found && idem_audit_until(c->scope->operation, c->rec.expires_at, &until) &&
		until > c->now)
		idem_report_key_expired(c->scope, c->rec.expires_at, until);
	for (int i = 0; idem_scope_spelling(c->scope, i, &spelled); i++)
		if (idem_history_in_audit(c->cat, &spelled, c->now, &until))
			idem_report_key_expired(c->scope, 0, until);
}

/*
 * Decide the call for scope and its request's fingerprint, as the
 * extension's owner.  Identity is switched to it here, and the caller
 * restores it (idem_restore_caller) when its own work as the owner is done.
 * IDEM_REPLAY: claim->rec is the finished record with the same fingerprint,
 * and no lock is kept.  IDEM_EXECUTE: this transaction holds the key lock,
 * no record of the key exists for it, and the caller executes.  Errors:
 * IK001, IK002, 40001.
 */
IdemOutcome
idem_claim(IdemClaim *c, const IdemCatalog *cat, const IdemScope *scope,
		   IdemRequestPrint *print, TimestampTz now, IdemIdentity *identity)
{
	c->cat = cat;
	c->scope = scope;
	c->print = print;
	c->now = now;
	c->identity = identity;
	c->locked = false;
	idem_become_owner(identity, cat->owner);
	for (int attempt = 1; attempt <= IDEM_CLAIM_ATTEMPTS; attempt++)
	{
		bool		found = read_key(c);

		if (found && !c->rec.expired)
			return claim_replay(c);
		check_reuse(c, found);
		if (claim_absent(c, found) == CLAIM_EXECUTE)
			return IDEM_EXECUTE;
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not claim idempotency key: its record kept changing"),
			 errhint("Retry the transaction.")));
	return IDEM_EXECUTE;		/* keep the compiler quiet */
}

/*
 * The claim's record is written (or the call replays).  Give the key lock
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
