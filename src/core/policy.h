/*-------------------------------------------------------------------------
 *
 * policy.h
 *	  Per-operation policy (idem_policy).  What an operation's row
 *	  overrides of the GUCs, read once per backend and again only after
 *	  the table changed.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_POLICY_H
#define IDEM_POLICY_H

#include "nodes/pg_list.h"

#include "datatype/timestamp.h"

/* What an operation's keys must look like (key_format). */
typedef enum IdemKeyFormat
{
	IDEM_KEY_TOKEN = 0,			/* [A-Za-z0-9_-]{16,128}: every key */
	IDEM_KEY_UUID,				/* 8-4-4-4-12 hex digits, any version */
	IDEM_KEY_ULID				/* 26 Crockford base32 characters */
} IdemKeyFormat;

/* What a key whose record expired does while in its audit period. */
typedef enum IdemReuse
{
	IDEM_REUSE_EXECUTE = 0,		/* execute afresh (the article's rule) */
	IDEM_REUSE_REFUSE			/* IK007 until the audit period ends */
} IdemReuse;

/* An operation's policy; an unset setting defers to its GUC. */
typedef struct IdemPolicy
{
	bool		has_ttl;
	Interval	ttl;
	bool		has_failure_ttl;
	Interval	failure_ttl;
	int			wait_timeout_ms;	/* -1: unset */
	int			max_attempts;		/* 0: unset */
	int			retry_base_ms;		/* 0: unset */
	int			retry_max_ms;		/* 0: unset */
	bool		has_audit_ttl;		Interval	audit_ttl;
	int			reuse_after_expiry;	/* -1: unset; else an IdemReuse */
	IdemKeyFormat key_format;
	bool		reject_weak_keys;
	bool		reconcile;		/* uncertain 'reconcile' */
	bool		has_reconcile_within;
	Interval	reconcile_within;
	int			nredact;		/* redact's JSON Pointers, as text[] paths */
	Datum	   *redact_paths;
} IdemPolicy;

extern int	idem_audit_ttl;
extern int	idem_reuse_after_expiry;

extern List *idem_policy_unaudited_refusals(void);

extern void idem_policy_init(void);
extern const IdemPolicy *idem_policy_of(const char *operation);
extern bool idem_audit_until(const char *operation, TimestampTz expires_at,
							 TimestampTz *until);
extern bool idem_refuses_reuse(const char *operation);
extern int	idem_interval_ms(const Interval *iv);
extern IdemKeyFormat idem_key_format_from_name(const char *name, bool *ok);
extern Datum idem_json_pointer_path(const char *pointer, const char **error);

#endif							/* IDEM_POLICY_H */
