/*-------------------------------------------------------------------------
 *
 * key.h
 *	  The scope of a claim, (owner, operation, key): validation, the key
 *	  lock, and the errors that refuse a key.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEY_H
#define IDEM_KEY_H

#include "fmgr.h"
#include "datatype/timestamp.h"
#include "storage/lock.h"

#include "compat.h"
#include "stats.h"

/* One (owner, operation, key), the scope of a claim and of a record. */
typedef struct IdemScope
{
	int64		owner;
	const char *operation;		/* NUL-terminated */
	Datum		operation_text; /* the same, as text */
	const char *key;			/* NUL-terminated, validated; in its one
								 * case if shaped like a UUID or a ULID */
	Datum		key_text;		/* the same, as text */
	const char *sent_key;		/* the key as sent, if not key; else
								 * NULL */
	Datum		sent_text;		/* the same, as text */
} IdemScope;

/*
 * The spellings of a key a lookup tries, in order.  The key in its one
 * case, then as sent (if another).  A record stored before 1.13 is under
 * either.
 */
#define IDEM_KEY_SPELLINGS	2

/* Why IK002, where the unfinished original was seen. */
typedef enum IdemInFlight
{
	IDEM_IN_FLIGHT_WAITED,		/* its transaction kept the key lock too long */
	IDEM_IN_FLIGHT_RECORDED,	/* a committed record still PROCESSING */
	IDEM_IN_FLIGHT_THIS_XACT	/* claimed by this transaction, not finished */
} IdemInFlight;

/* What a call did with its key, counted in idem_stats and logged per idem.log_outcomes. */
typedef enum IdemOutcomeLog
{
	IDEM_LOG_EXECUTED,
	IDEM_LOG_REPLAYED,
	IDEM_LOG_CONFLICT,			/* IK001 */
	IDEM_LOG_IN_FLIGHT,			/* IK002 */
	IDEM_LOG_EXPIRED			/* IK007, counted with the conflicts */
} IdemOutcomeLog;

extern int	idem_wait_timeout;

extern void idem_key_init(void);
extern void idem_key_log_init(void);
extern void idem_check_key(const char *key, int len);
extern void idem_check_key_policy(const IdemScope *scope);
extern void idem_scope_set_key(IdemScope *scope, Datum key_text);
extern bool idem_scope_spelling(const IdemScope *scope, int i, IdemScope *spelled);
extern void idem_check_name(const char *what, const char *name, int len, int maxlen);
extern void idem_check_operation(const char *operation, int len);
extern void idem_check_printable(const char *what, const char *s, int len, int maxlen);
extern void idem_scope_init(IdemScope *scope, int64 owner, Datum operation_text,
							Datum key_text);
extern void idem_scope_from_args(FunctionCallInfo fcinfo, IdemScope *scope);
extern void idem_key_locktag(LOCKTAG *tag, const IdemScope *scope);
extern bool idem_lock_key(const LOCKTAG *tag, IdemStatKind kind, const char *name);
extern void idem_unlock_key(const LOCKTAG *tag);
extern bool idem_wait_for_xact(TransactionId xid, IdemStatKind kind, const char *name);
extern void idem_note_outcome(const IdemScope *scope, IdemOutcomeLog outcome,
							 bool has_resource, int64 resource_id);
pg_noreturn extern void idem_report_in_flight(const IdemScope *scope, IdemInFlight why);
pg_noreturn extern void idem_report_key_reused(const IdemScope *scope);
pg_noreturn extern void idem_report_key_expired(const IdemScope *scope, TimestampTz expired_at,
												TimestampTz audit_until);

#endif							/* IDEM_KEY_H */
