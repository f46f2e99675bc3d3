/*-------------------------------------------------------------------------
 *
 * policy.c
 *	  Per-operation policy.  The rows of idem_policy, kept per backend in a
 *	  hash table by operation, loaded on first use and again after a
 *	  relcache invalidation of the table, which every write of it sends
 *	  (its statement trigger, idem_policy_changed()).  A call's path is one
 *	  hash lookup; the table is read only after it changed.
 *
 *	  A database without the table (idem before 1.10) has no policies.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "citus.h"
#include "citus_meta.h"
#include "policy.h"
#include "util.h"

typedef struct PolicyEntry
{
	char		operation[IDEM_OPERATION_MAX_LEN + 1];	/* the hash key */
	IdemPolicy	policy;
} PolicyEntry;

/* GUC variables */
int			idem_audit_ttl = 0;
int			idem_reuse_after_expiry = IDEM_REUSE_EXECUTE;

static const struct config_enum_entry reuse_options[] = {
	{"execute", IDEM_REUSE_EXECUTE, false},
	{"refuse", IDEM_REUSE_REFUSE, false},
	{NULL, 0, false}
};

static HTAB *policies = NULL;
static MemoryContext policy_cxt = NULL;	/* the entries and their redact paths */
static bool policies_stale = true;
static Oid	policy_relid = InvalidOid;
static Oid	policy_read_relid = InvalidOid;	/* on Citus, its placement here */
static bool callback_registered = false;

/*
 * The table changed, or, while there is none (idem before 1.10), any
 * relation did.  It may be the table an update just made.
 */
static void
policy_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == policy_relid || relid == policy_read_relid ||
		!OidIsValid(policy_relid))
		policies_stale = true;
}

/*
 * Define the GUCs an operation's policy overrides that no other module
 * has.  Both are read by the cleanup worker too, so they are set for the
 * server (postgresql.conf), not per session.
 */
void
idem_policy_init(void)
{
	DefineCustomIntVariable("idem.audit_ttl",
							"How long the audit fields of an expired record are kept after it expires.",
							"0 keeps none: the record goes whole at its expiry. "
							"An operation's policy (audit_ttl) overrides it.",
							&idem_audit_ttl,
							0, 0, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomEnumVariable("idem.reuse_after_expiry",
							 "What a key whose record expired does while its audit fields are kept.",
							 "execute: it executes afresh; refuse: IK007 until its audit period ends. "
							 "An operation's policy (reuse_after_expiry) overrides it.",
							 &idem_reuse_after_expiry,
							 IDEM_REUSE_EXECUTE, reuse_options,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);
}

/* An interval as whole milliseconds (months and days at 30 and 1 days). */
int
idem_interval_ms(const Interval *iv)
{
	double		ms = ((double) iv->month * DAYS_PER_MONTH + iv->day) * (double) SECS_PER_DAY * 1000.0 +
		(double) iv->time / 1000.0;

	return ms >= (double) PG_INT32_MAX ? PG_INT32_MAX : ms <= 0 ? 0 : (int) ms;
}

/* The key format of its name ("token", "uuid", "ulid"); *ok false for another. */
IdemKeyFormat
idem_key_format_from_name(const char *name, bool *ok)
{
	*ok = true;
	if (strcmp(name, "uuid") == 0)
		return IDEM_KEY_UUID;
	if (strcmp(name, "ulid") == 0)
		return IDEM_KEY_ULID;
	*ok = strcmp(name, "token") == 0;
	return IDEM_KEY_TOKEN;
}

/* The column `name` of the row, or NULL. */
static Datum
column(HeapTuple tuple, TupleDesc desc, const char *name, bool *isnull)
{
	for (int i = 0; i < desc->natts; i++)
		if (!TupleDescAttr(desc, i)->attisdropped &&
			strcmp(NameStr(TupleDescAttr(desc, i)->attname), name) == 0)
			return heap_getattr(tuple, i + 1, desc, isnull);
	*isnull = true;
	return (Datum) 0;
}

/*
 * The text[] path (for jsonb's #- operator) of an RFC 6901 JSON Pointer:
 * "/card/number" is {card,number}, "~1" stands for "/" and "~0" for "~".
 * NULL, with *error set, for what is no pointer to a member ("" is the
 * whole document).
 */
Datum
idem_json_pointer_path(const char *pointer, const char **error)
{
	int			n = 0;
	Datum	   *segs = palloc(sizeof(Datum) * (strlen(pointer) + 1));
	StringInfoData seg;
	const char *p = pointer;

	*error = NULL;
	if (*p != '/')
	{
		*error = *p ? "a JSON Pointer starts with \"/\"" : "the empty JSON Pointer is the whole document";
		return (Datum) 0;
	}
	initStringInfo(&seg);
	for (p++;; p++)
	{
		if (*p == '/' || *p == '\0')
		{
			segs[n++] = PointerGetDatum(cstring_to_text_with_len(seg.data, seg.len));
			resetStringInfo(&seg);
			if (*p == '\0')
				break;
		}
		else if (*p == '~')
		{
			if (p[1] != '0' && p[1] != '1')
			{
				*error = "\"~\" must be followed by 0 or 1 in a JSON Pointer";
				return (Datum) 0;
			}
			appendStringInfoChar(&seg, p[1] == '0' ? '~' : '/');
			p++;
		}
		else
			appendStringInfoChar(&seg, *p);
	}
	return PointerGetDatum(construct_array(segs, n, TEXTOID, -1, false, TYPALIGN_INT));
}

/* The policy's redact pointers, as paths in policy_cxt (bad ones skipped). */
static void
load_redact(IdemPolicy *policy, ArrayType *pointers)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	MemoryContext old;

	deconstruct_array(pointers, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	old = MemoryContextSwitchTo(policy_cxt);
	policy->redact_paths = palloc(sizeof(Datum) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		const char *error;
		Datum		path;

		if (nulls[i])
			continue;
		path = idem_json_pointer_path(TextDatumGetCString(elems[i]), &error);
		if (error == NULL)
			policy->redact_paths[policy->nredact++] = path;
	}
	MemoryContextSwitchTo(old);
}

static void
load_row(HeapTuple tuple, TupleDesc desc)
{
	bool		isnull;
	Datum		d = column(tuple, desc, "operation", &isnull);
	char	   *op;
	PolicyEntry *e;
	bool		found;

	if (isnull)
		return;
	op = TextDatumGetCString(d);
	if (strlen(op) > IDEM_OPERATION_MAX_LEN)
		return;
	e = hash_search(policies, op, HASH_ENTER, &found);
	memset(&e->policy, 0, sizeof(IdemPolicy));
	e->policy.wait_timeout_ms = -1;
	d = column(tuple, desc, "ttl", &isnull);
	if ((e->policy.has_ttl = !isnull))
		e->policy.ttl = *DatumGetIntervalP(d);
	d = column(tuple, desc, "failure_ttl", &isnull);
	if ((e->policy.has_failure_ttl = !isnull))
		e->policy.failure_ttl = *DatumGetIntervalP(d);
	d = column(tuple, desc, "wait_timeout", &isnull);
	if (!isnull)
		e->policy.wait_timeout_ms = idem_interval_ms(DatumGetIntervalP(d));
	d = column(tuple, desc, "max_attempts", &isnull);
	if (!isnull)
		e->policy.max_attempts = Max(DatumGetInt32(d), 1);
	d = column(tuple, desc, "retry_base", &isnull);
	if (!isnull)
		e->policy.retry_base_ms = Max(idem_interval_ms(DatumGetIntervalP(d)), 1);
	d = column(tuple, desc, "retry_max", &isnull);
	if (!isnull)
		e->policy.retry_max_ms = Max(idem_interval_ms(DatumGetIntervalP(d)), 1);
	d = column(tuple, desc, "audit_ttl", &isnull);
	if ((e->policy.has_audit_ttl = !isnull))
		e->policy.audit_ttl = *DatumGetIntervalP(d);
	e->policy.reuse_after_expiry = -1;
	d = column(tuple, desc, "reuse_after_expiry", &isnull);
	if (!isnull)
		e->policy.reuse_after_expiry = strcmp(TextDatumGetCString(d), "refuse") == 0 ?
			IDEM_REUSE_REFUSE : IDEM_REUSE_EXECUTE;
	d = column(tuple, desc, "key_format", &isnull);
	if (!isnull)
	{
		bool		ok;

		e->policy.key_format = idem_key_format_from_name(TextDatumGetCString(d), &ok);
	}
	d = column(tuple, desc, "reject_weak_keys", &isnull);
	e->policy.reject_weak_keys = !isnull && DatumGetBool(d);
	d = column(tuple, desc, "uncertain", &isnull);
	e->policy.reconcile = !isnull && strcmp(TextDatumGetCString(d), "reconcile") == 0;
	d = column(tuple, desc, "reconcile_within", &isnull);
	if ((e->policy.has_reconcile_within = !isnull))
		e->policy.reconcile_within = *DatumGetIntervalP(d);
	d = column(tuple, desc, "redact", &isnull);
	if (!isnull)
		load_redact(&e->policy, DatumGetArrayTypeP(d));
}

static void read_policies(Oid relid);

/* Read every row of idem_policy as stored (no permission applies here). */
static void
load_policies(void)
{
	HASHCTL		ctl = {0};
	Oid			nspid = InvalidOid;
	Oid			owner;

	if (policy_cxt == NULL)
		policy_cxt = AllocSetContextCreate(TopMemoryContext, "idem policies", ALLOCSET_SMALL_SIZES);
	MemoryContextReset(policy_cxt);
	policies = NULL;
	ctl.keysize = IDEM_OPERATION_MAX_LEN + 1;
	ctl.entrysize = sizeof(PolicyEntry);
	ctl.hcxt = policy_cxt;
	policies = hash_create("idem policies", 16, &ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(policy_relcache_callback, (Datum) 0);
		callback_registered = true;
	}
	/* stale from here on only if the table changes after this read */
	policies_stale = false;
	policy_relid = idem_extension_row(&nspid, &owner) ? get_relname_relid("idem_policy", nspid) : InvalidOid;
	policy_read_relid = policy_relid;
	if (!OidIsValid(policy_relid))
		return;

	PG_TRY();
	{
		/*
		 * On Citus idem_policy is a reference table: its rows are in
		 * the placement on this node, whose own trigger invalidates it; a
		 * node without one has no policies
		 */
		if (idem_citus_distributed(policy_relid))
		{
			List	   *here = idem_citus_local_relations(policy_relid);

			policy_read_relid = here != NIL ? linitial_oid(here) : InvalidOid;
		}
		if (OidIsValid(policy_read_relid))
			read_policies(policy_read_relid);
	}
	PG_CATCH();
	{
		policies_stale = true;	/* read it again next time */
		PG_RE_THROW();
	}
	PG_END_TRY();
}

/* Read every row of relation relid, idem_policy or its placement here. */
static void
read_policies(Oid relid)
{
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tuple;
	Snapshot	snapshot;

	rel = table_open(relid, AccessShareLock);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	/* a heap scan without an index, the same call on every major */
	scan = systable_beginscan(rel, InvalidOid, false, snapshot, 0, NULL);
	while ((tuple = systable_getnext(scan)) != NULL)
		load_row(tuple, RelationGetDescr(rel));
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
}

/* The policy of operation, or NULL when it has none. */
const IdemPolicy *
idem_policy_of(const char *operation)
{
	PolicyEntry *e;

	if (policies_stale || policies == NULL)
	{
		if (!IsTransactionState())
			return NULL;
		load_policies();
	}
	e = hash_search(policies, operation, HASH_FIND, NULL);
	return e ? &e->policy : NULL;
}

/*
 * When the audit fields of a record of operation that expires at
 * expires_at are to go.  False if the operation keeps none (its policy's
 * audit_ttl, else idem.audit_ttl, is unset or 0).
 */
bool
idem_audit_until(const char *operation, TimestampTz expires_at, TimestampTz *until)
{
	const IdemPolicy *policy = idem_policy_of(operation);

	if (policy && policy->has_audit_ttl)
	{
		*until = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														 TimestampTzGetDatum(expires_at),
														 IntervalPGetDatum(&policy->audit_ttl)));
		return *until > expires_at;
	}
	if (idem_audit_ttl <= 0)
		return false;
	*until = expires_at + (TimestampTz) idem_audit_ttl * USECS_PER_SEC;
	return true;
}

/* Does a policy (or, policy NULL, the GUCs) keep no audit period? */
static bool
keeps_no_audit(const IdemPolicy *policy)
{
	if (policy && policy->has_audit_ttl)
		return idem_interval_ms(&policy->audit_ttl) <= 0;
	return idem_audit_ttl <= 0;
}

/*
 * The operations that refuse reused keys (reuse_after_expiry 'refuse') but
 * keep no audit period, so that their expired keys execute again as if
 * 'execute'.  Their names, and "*" for the operations without a
 * policy of their own when the GUCs say so.  In the current memory context.
 */
List *
idem_policy_unaudited_refusals(void)
{
	List	   *out = NIL;
	HASH_SEQ_STATUS seq;
	PolicyEntry *e;

	(void) idem_policy_of("");	/* (re)load */
	if (policies != NULL)
	{
		hash_seq_init(&seq, policies);
		while ((e = hash_seq_search(&seq)) != NULL)
			if ((e->policy.reuse_after_expiry >= 0 ? e->policy.reuse_after_expiry :
				 idem_reuse_after_expiry) == IDEM_REUSE_REFUSE && keeps_no_audit(&e->policy))
				out = lappend(out, pstrdup(e->operation));
	}
	if (idem_reuse_after_expiry == IDEM_REUSE_REFUSE && keeps_no_audit(NULL))
		out = lappend(out, pstrdup("*"));
	return out;
}

/* Does operation refuse (IK007) a key still in its audit period? */
bool
idem_refuses_reuse(const char *operation)
{
	const IdemPolicy *policy = idem_policy_of(operation);

	if (policy && policy->reuse_after_expiry >= 0)
		return policy->reuse_after_expiry == IDEM_REUSE_REFUSE;
	return idem_reuse_after_expiry == IDEM_REUSE_REFUSE;
}
