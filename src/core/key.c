/*-------------------------------------------------------------------------
 *
 * key.c
 *	  The scope of a claim.  Checks of the key and the operation name, the
 *	  key lock, and the errors that refuse a key (IK001, IK002).
 *
 * Callers of one (owner, operation, key) meet on a transaction-scoped
 * heavyweight lock derived from the three.  The "key lock" (an advisory
 * lock tag with field4 = IDEM_LOCK_CLASS_KEY, visible in pg_locks).  A caller
 * that executes keeps it until its transaction ends, so a duplicate, which
 * cannot see the uncommitted record, waits for the original to commit or
 * abort, at most idem.wait_timeout.  The wait is an ordinary lock wait.  It
 * shows in pg_blocking_pids and takes part in deadlock detection.
 *
 * Here too: the checks of keys and names (operations, topics, consumers,
 * workers) and the errors that refuse a key (IK001, IK002, IK007).  A
 * call's scope is made in key_spelling.c, the outcome's log line in
 * key_log.c; which owners and operations a role may act for is binding.c's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/xact.h"
#include "common/hashfn.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "idem.h"
#include "key.h"
#include "policy.h"
#include "stats.h"

/* GUC variables */
int			idem_wait_timeout = 5000;


/* Define the GUCs of this module (idem.log_outcomes is key_log.c's). */
void
idem_key_init(void)
{
	idem_key_log_init();

	DefineCustomIntVariable("idem.wait_timeout",
							"How long a duplicate request waits for the in-flight original.",
							"After this long the duplicate fails with SQLSTATE IK002 "
							"(request still processing). 0 means do not wait.",
							&idem_wait_timeout,
							5000, 0, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/*
 * Check an idempotency key: 16 to 128 characters from [A-Za-z0-9_-].  The
 * message never echoes the key itself.  It may carry anything, newlines
 * included, and would end up in logs.
 */
void
idem_check_key(const char *key, int len)
{
	int			nchars = pg_mbstrlen_with_len(key, len);

	if (nchars < IDEM_KEY_MIN_LEN || nchars > IDEM_KEY_MAX_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency key must be %d to %d characters long",
						IDEM_KEY_MIN_LEN, IDEM_KEY_MAX_LEN),
				 errdetail("The key has %d characters.", nchars),
				 errhint("Send one high-entropy key per business intent, such as a UUID or a ULID.")));

	for (int i = 0; i < len; i++)
	{
		char		c = key[i];

		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
			  (c >= '0' && c <= '9') || c == '_' || c == '-'))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("idempotency key may contain only letters A-Z and a-z, digits, \"_\" and \"-\""),
					 errdetail("Character %d of the key is not allowed.",
							   pg_mbstrlen_with_len(key, i) + 1),
					 errhint("Send one high-entropy key per business intent, such as a UUID or a ULID.")));
	}
}

/*
 * Check a name (an operation, a topic, a consumer): 1 to maxlen characters
 * from [A-Za-z0-9_.:-].  Like the key, it is never echoed when invalid.
 */
void
idem_check_name(const char *what, const char *name, int len, int maxlen)
{
	int			nchars = pg_mbstrlen_with_len(name, len);

	if (nchars < 1 || nchars > maxlen)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be 1 to %d characters long", what, maxlen),
				 errdetail("The %s has %d characters.", what, nchars)));
	for (int i = 0; i < len; i++)
	{
		if (!idem_name_char(name[i]))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s may contain only letters A-Z and a-z, digits, \"_\", \".\", \":\" and \"-\"", what),
					 errdetail("Character %d of the %s is not allowed.",
							   pg_mbstrlen_with_len(name, i) + 1, what)));
	}
}

/*
 * Check a name given as free text (an inbox message id, a worker): 1 to
 * maxlen characters of printable text; control characters (C0, DEL, C1) are
 * refused.  Never echoed when invalid.
 */
void
idem_check_printable(const char *what, const char *s, int len, int maxlen)
{
	int			nchars = pg_mbstrlen_with_len(s, len);
	const unsigned char *p = (const unsigned char *) s;
	const unsigned char *end = p + len;
	int			pos = 1;

	if (nchars < 1 || nchars > maxlen)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be 1 to %d characters long", what, maxlen),
				 errdetail("The %s has %d characters.", what, nchars)));
	while (p < end)
	{
		int			clen = pg_mblen((const char *) p);
		pg_wchar	c = *p;

		if (GetDatabaseEncoding() == PG_UTF8 && clen > 1)
			c = utf8_to_unicode(p);
		if (c < 0x20 || c == 0x7f || (GetDatabaseEncoding() == PG_UTF8 && c >= 0x80 && c <= 0x9f))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must not contain control characters", what),
					 errdetail("Character %d of the %s is a control character.", pos, what)));
		p += clen;
		pos++;
	}
}

/* Check an operation name: 1 to 64 characters from [A-Za-z0-9_.:-]. */
void
idem_check_operation(const char *operation, int len)
{
	idem_check_name("operation", operation, len, IDEM_OPERATION_MAX_LEN);
}

/* The lock tag of one (owner, operation, key) in this database. */
void
idem_key_locktag(LOCKTAG *tag, const IdemScope *scope)
{
	unsigned char buf[sizeof(int64) + IDEM_OPERATION_MAX_LEN + 1 + IDEM_KEY_MAX_LEN];
	size_t		oplen = strlen(scope->operation);
	size_t		keylen = strlen(scope->key);
	size_t		len = 0;
	uint64		h;

	Assert(oplen <= IDEM_OPERATION_MAX_LEN && keylen <= IDEM_KEY_MAX_LEN);
	memcpy(buf, &scope->owner, sizeof(int64));
	len += sizeof(int64);
	memcpy(buf + len, scope->operation, oplen + 1);	/* with its NUL, as separator */
	len += oplen + 1;
	memcpy(buf + len, scope->key, keylen);
	len += keylen;

	h = hash_bytes_extended(buf, (int) len, 0);
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_LOCK_CLASS_KEY);
}

/*
 * How long a duplicate waits: the operation's policy's wait_timeout, else
 * idem.wait_timeout (a consumer's: idem.wait_timeout); lock_timeout if
 * shorter.
 */
static int
key_wait_ms(IdemStatKind kind, const char *name)
{
	const IdemPolicy *policy = kind == IDEM_KIND_OPERATION ? idem_policy_of(name) : NULL;
	int			wait = policy && policy->wait_timeout_ms >= 0 ? policy->wait_timeout_ms : idem_wait_timeout;

	if (LockTimeout > 0 && LockTimeout < wait)
		return LockTimeout;
	return wait;
}

/*
 * Wait at most idem.wait_timeout (and at most lock_timeout, if that is
 * shorter) for the key lock tag another transaction holds, or, with tag
 * NULL, for transaction xid to end.  Returns false when the time ran out.
 * A key lock acquired here belongs to the caller's subtransaction
 * (CurTransactionResourceOwner), as idem_lock_key's do.
 *
 * The timeout is lock_timeout's own machinery, which bounds the wait for a
 * transaction (XactLockTableWait) as it bounds any heavyweight lock; its
 * error is caught in a subtransaction, which is only ever started on this
 * slow path.
 */
static bool
bounded_wait(const LOCKTAG *tag, TransactionId xid, int wait_ms)
{
	MemoryContext callercxt = CurrentMemoryContext;
	ResourceOwner callerowner = CurrentResourceOwner;
	ResourceOwner keyowner = CurTransactionResourceOwner;
	int			saved_lock_timeout = LockTimeout;
	volatile bool acquired = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(callercxt);

	PG_TRY();
	{
		ResourceOwner subowner = CurrentResourceOwner;

		LockTimeout = wait_ms;
		if (tag == NULL)
			XactLockTableWait(xid, NULL, NULL, XLTW_None);
		else
			(void) LockAcquire(tag, ExclusiveLock, false, false);
		LockTimeout = saved_lock_timeout;

		if (tag != NULL)
		{
			/* hand the lock from the subtransaction to the caller's */
			CurrentResourceOwner = keyowner;
			(void) LockAcquire(tag, ExclusiveLock, false, true);
			CurrentResourceOwner = subowner;
			LockRelease(tag, ExclusiveLock, false);
		}

		ReleaseCurrentSubTransaction();
		acquired = true;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		LockTimeout = saved_lock_timeout;
		MemoryContextSwitchTo(callercxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(callercxt);
		CurrentResourceOwner = callerowner;

		/* only our own timeout means "still in flight" */
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
			ReThrowError(edata);
		FreeErrorData(edata);
	}
	PG_END_TRY();

	MemoryContextSwitchTo(callercxt);
	CurrentResourceOwner = callerowner;
	return acquired;
}

/*
 * Take the key lock; false if another transaction kept it past the wait.
 * The lock belongs to the current subtransaction, not to the statement's
 * portal, so that a later statement of the same subtransaction (idem_finish
 * after idem_begin) can give it back with idem_unlock_key.  A wait counts
 * in name's row of idem_stats.
 */
bool
idem_lock_key(const LOCKTAG *tag, IdemStatKind kind, const char *name)
{
	ResourceOwner callerowner = CurrentResourceOwner;
	LockAcquireResult got;
	int			wait_ms;

	CurrentResourceOwner = CurTransactionResourceOwner;
	got = LockAcquire(tag, ExclusiveLock, false, true);
	CurrentResourceOwner = callerowner;
	if (got != LOCKACQUIRE_NOT_AVAIL)
		return true;
	idem_stats_count(kind, name, IDEM_STAT_WAITS, 1);
	wait_ms = key_wait_ms(kind, name);
	if (wait_ms <= 0)
		return false;
	return bounded_wait(tag, InvalidTransactionId, wait_ms);
}

/*
 * Give back a key lock idem_lock_key took in the current subtransaction.
 * A claim does so as soon as its row is written.  From then on the row's
 * uncommitted index entry is what makes a duplicate wait (see
 * idem_wait_for_xact), so a transaction holds no lock per key it wrote.
 */
void
idem_unlock_key(const LOCKTAG *tag)
{
	ResourceOwner callerowner = CurrentResourceOwner;

	CurrentResourceOwner = CurTransactionResourceOwner;
	LockRelease(tag, ExclusiveLock, false);
	CurrentResourceOwner = callerowner;
}

/*
 * Wait for transaction xid, which wrote a row of a key and has not ended,
 * as a duplicate waits for the key lock.  At most idem.wait_timeout (or
 * lock_timeout, if shorter).  False if it is still running then.  This is
 * what the executor's speculative insertion does for ON CONFLICT.  Find the
 * uncommitted index entry with a dirty snapshot, wait for its transaction,
 * look again.  A wait counts in name's row of idem_stats.
 */
bool
idem_wait_for_xact(TransactionId xid, IdemStatKind kind, const char *name)
{
	int			wait_ms;

	if (!TransactionIdIsInProgress(xid))
		return true;
	idem_stats_count(kind, name, IDEM_STAT_WAITS, 1);
	wait_ms = key_wait_ms(kind, name);
	if (wait_ms <= 0)
		return false;
	return bounded_wait(NULL, xid, wait_ms);
}

/* Raise IK002, since the original request has not finished. */
void
idem_report_in_flight(const IdemScope *scope, IdemInFlight why)
{
	idem_note_outcome(scope, IDEM_LOG_IN_FLIGHT, false, 0);
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_IN_FLIGHT),
			 errmsg("a request with this idempotency key is still being processed"),
			 why == IDEM_IN_FLIGHT_WAITED ?
			 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": the first request has not finished within %d ms (the operation's wait_timeout or idem.wait_timeout, or lock_timeout if shorter).",
					   scope->owner, scope->operation, scope->key,
					   key_wait_ms(IDEM_KIND_OPERATION, scope->operation)) :
			 why == IDEM_IN_FLIGHT_RECORDED ?
			 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": the first request is recorded as still processing.",
					   scope->owner, scope->operation, scope->key) :
			 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": this transaction claimed the key and has not called idem_finish for it.",
					   scope->owner, scope->operation, scope->key),
			 errhint("Retry the same request in about a second; an HTTP API answers 409 Conflict with Retry-After: 1.")));
	pg_unreachable();
}

/* Raise IK001, since the key was first used with another request. */
void
idem_report_key_reused(const IdemScope *scope)
{
	idem_note_outcome(scope, IDEM_LOG_CONFLICT, false, 0);
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_KEY_REUSED),
			 errmsg("idempotency key was already used with a different request"),
			 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": the stored request fingerprint differs from this request's.",
					   scope->owner, scope->operation, scope->key),
			 errhint("Send a new idempotency key for a new request; an HTTP API answers 409 Conflict (or 422 Unprocessable Content).")));
	pg_unreachable();
}

/*
 * Raise IK007: the key's record expired (at expired_at; 0 if it has left
 * for idem_history) and its operation refuses reuse until audit_until.
 */
void
idem_report_key_expired(const IdemScope *scope, TimestampTz expired_at, TimestampTz audit_until)
{
	idem_note_outcome(scope, IDEM_LOG_EXPIRED, false, 0);
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_KEY_EXPIRED),
			 errmsg("idempotency key expired"),
			 expired_at != 0 ?
			 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": its record expired at %s; the operation refuses the key until %s (reuse_after_expiry 'refuse').",
					   scope->owner, scope->operation, scope->key,
					   pstrdup(timestamptz_to_str(expired_at)), pstrdup(timestamptz_to_str(audit_until))) :
			 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": an earlier execution of the key is in its audit period until %s (reuse_after_expiry 'refuse').",
					   scope->owner, scope->operation, scope->key, timestamptz_to_str(audit_until)),
			 errhint("The request was executed before and is not executed again. Send a new idempotency key for a new request; an HTTP API answers 422 Unprocessable Content.")));
	pg_unreachable();
}
