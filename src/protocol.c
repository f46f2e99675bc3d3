/*-------------------------------------------------------------------------
 *
 * protocol.c
 *	  The idempotency protocol, run inside the caller's transaction, and its
 *	  first user: idem_create_order, the article's "create an order" flow.
 *
 * One call: validate the key, fingerprint the request, read the key's
 * record through the unique index.  A finished record is replayed (or
 * refused: IK001, different request) without a lock or a write.  Otherwise
 * take the key lock, make sure no record was committed since the read, and
 * claim and execute: insert the record, already finished and holding the
 * response, and the order, without planning a statement (rowwrite.c).  An
 * expired record is renewed in place and executed anew, by one prepared
 * statement (the rare path).  Record, business write and snapshot are
 * written by the caller's transaction, so they commit or roll back
 * together.
 *
 * Concurrency.  Callers of one (owner, operation, key) meet on a
 * transaction-scoped heavyweight lock derived from the three: the "key
 * lock" (an advisory lock tag with field4 = IDEM_LOCK_CLASS, visible in
 * pg_locks).  A caller that executes keeps it until its transaction ends;
 * so a duplicate, which cannot see the uncommitted record, waits for the
 * original to commit or abort, at most idem.wait_timeout, and then replays,
 * executes, or reports IK002 (request in flight).  A caller that replays
 * after waiting gives the lock back at once.  Under the lock no other
 * caller writes the key, so a record our read missed can only have been
 * committed since; a dirty-snapshot probe finds it (and is skipped when no
 * transaction has ended since the read), and it is read again, or under
 * REPEATABLE READ and SERIALIZABLE reported as 40001, never replayed unseen.
 * The unique index stays the arbiter: a row written around idem makes the
 * insert fail with 23505, never a second execution.
 *
 * The tables are read and written as the function's owner, the writes under
 * search_path = pg_catalog, pg_temp (see "whom it runs as"); the renewal
 * statement is schema-qualified (the extension's schema and pg_catalog,
 * operators included) and prepared once per backend.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/nbtree.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "optimizer/optimizer.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/rel.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "idem.h"

PG_FUNCTION_INFO_V1(idem_create_order);

/* locktag_field4 of idem's key locks: tells them from user advisory locks */
#define IDEM_LOCK_CLASS			478

#define IDEM_OP_CREATE_ORDER	"CREATE_ORDER"
#define IDEM_KEY_MIN_LEN		16
#define IDEM_KEY_MAX_LEN		128
#define IDEM_OPERATION_MAX_LEN	64
#define IDEM_QTY_MIN			1
#define IDEM_QTY_MAX			100
/* JSON numbers are doubles: larger integers would fingerprint ambiguously */
#define IDEM_MAX_SAFE_INTEGER	INT64CONST(9007199254740991)

/*
 * How often a call looks at the key's record again: after waiting for the
 * key lock, after losing a claim, after a record vanished under it.
 */
#define IDEM_CLAIM_ATTEMPTS		4

/* The saved plan of idem_create_order's renewal, for one extension schema. */
typedef struct OrderPlans
{
	Oid			nspid;			/* InvalidOid until prepared */
	SPIPlanPtr	renew;
} OrderPlans;

static OrderPlans order_plans;

/* The key's record as the read step found it. */
typedef struct KeyRecord
{
	Datum		id;
	char		request_hash[IDEM_HASH_HEX_LEN + 1];
	bool		succeeded;		/* status SUCCEEDED, else PROCESSING */
	bool		expired;		/* expires_at < now */
	Datum		order_id;		/* the stored response, for a replay */
	Datum		order_no;
	Datum		status;
	Datum		http_status;
	bool		isnull[4];
	uint64		completions;	/* the read snapshot's xactCompletionCount */
} KeyRecord;

/*
 * The columns idem_create_order writes, by name.  They are mapped to
 * attribute numbers once per backend, and a table altered so that idem's
 * raw writes would no longer fit it is refused with a clear error.
 */
typedef struct ColumnSpec
{
	const char *name;
	Oid			type;
	int			len;			/* characters idem may store; 0: any */
	bool		exact;			/* char(n): the typmod must be exactly len */
} ColumnSpec;

enum
{
	REC_ID, REC_OWNER, REC_OPERATION, REC_KEY, REC_HASH, REC_STATUS, REC_HTTP,
	REC_RESPONSE, REC_RESOURCE, REC_CREATED, REC_UPDATED, REC_EXPIRES, REC_NCOLS
};

static const ColumnSpec record_columns[REC_NCOLS] = {
	{"id", INT8OID, 0, false},
	{"owner_id", INT8OID, 0, false},
	{"operation", VARCHAROID, IDEM_OPERATION_MAX_LEN, false},
	{"idempotency_key", VARCHAROID, IDEM_KEY_MAX_LEN, false},
	{"request_hash", BPCHAROID, IDEM_HASH_HEX_LEN, true},
	{"status", VARCHAROID, 10, false},
	{"http_status", INT4OID, 0, false},
	{"response_json", JSONBOID, 0, false},
	{"resource_id", INT8OID, 0, false},
	{"created_at", TIMESTAMPTZOID, 0, false},
	{"updated_at", TIMESTAMPTZOID, 0, false},
	{"expires_at", TIMESTAMPTZOID, 0, false},
};

enum
{
	ORD_ID, ORD_NO, ORD_OWNER, ORD_SKU, ORD_QTY, ORD_STATUS, ORD_CREATED, ORD_NCOLS
};

static const ColumnSpec order_columns[ORD_NCOLS] = {
	{"id", INT8OID, 0, false},
	{"order_no", VARCHAROID, 16, false},
	{"owner_id", INT8OID, 0, false},
	{"sku_id", INT8OID, 0, false},
	{"quantity", INT4OID, 0, false},
	{"status", VARCHAROID, 7, false},
	{"created_at", TIMESTAMPTZOID, 0, false},
};

/* One of idem's tables as idem_create_order writes it. */
typedef struct TableLayout
{
	Oid			relid;
	Oid			seq;			/* the sequence of its id */
	int			natts;			/* attributes, dropped ones included */
	AttrNumber	att[REC_NCOLS];	/* by column of its ColumnSpec array */
	int			ncheck;			/* CHECK constraints, planned */
	Expr	  **checks;
} TableLayout;

StaticAssertDecl((int) ORD_NCOLS <= (int) REC_NCOLS, "TableLayout.att holds every table's columns");

/*
 * What idem_create_order looks up once per backend rather than per call
 * (a prepared statement's function call state lives only for one
 * execution): the extension's schema, tables, index and sequences, where
 * the columns are, the result's tuple descriptor.  A relcache invalidation
 * of any of these relations (ALTER TABLE, DROP EXTENSION, a cache reset)
 * or a call through another function (a re-created extension) looks them
 * up again.
 */
typedef struct OrderCatalog
{
	bool		valid;
	Oid			fn_oid;			/* the idem_create_order it was built for */
	Oid			owner;			/* its owner: whom the tables are accessed as */
	Oid			nspid;
	TableLayout record;			/* idempotency_record */
	Oid			scopeid;		/* its (owner_id, operation, idempotency_key) index */
	TableLayout order;			/* purchase_order */
	TupleDesc	result;			/* blessed */
	Datum		operation;		/* IDEM_OP_CREATE_ORDER as text */
	uint64		generation;		/* tells one build from the next */
} OrderCatalog;

static OrderCatalog catalog;
static MemoryContext catalog_cxt = NULL;
static uint64 catalog_generation = 0;
static bool catalog_building = false;
static bool catalog_build_invalidated = false;

/* What idem_create_order returns. */
typedef struct OrderResult
{
	Datum		order_id;
	Datum		order_no;
	Datum		status;
	Datum		http_status;
	bool		isnull[4];
	bool		replayed;
} OrderResult;


/* ---------- SPI helpers shared with cleanup.c ---------- */

/*
 * Prepare a statement and keep its plan for the life of the backend.
 * The SQL must be fully schema-qualified: it is parsed again, under the
 * search_path then in force, whenever the plan is invalidated.
 */
SPIPlanPtr
idem_prepare_kept(const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	plan = SPI_prepare(sql, nargs, argtypes);

	if (plan == NULL)
		elog(ERROR, "idem: could not prepare \"%s\": %s",
			 sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "idem: could not keep plan for \"%s\"", sql);
	return plan;
}

/* Free a kept plan, if there is one. */
void
idem_free_kept(SPIPlanPtr *plan)
{
	if (*plan != NULL)
		SPI_freeplan(*plan);
	*plan = NULL;
}

/*
 * The schema idem is installed in: the namespace of the SQL function being
 * called (the extension is not relocatable, so its objects stay together).
 */
Oid
idem_extension_schema(FunctionCallInfo fcinfo)
{
	Oid			nspid = get_func_namespace(fcinfo->flinfo->fn_oid);

	if (!OidIsValid(nspid))
		elog(ERROR, "idem: no schema for function %u", fcinfo->flinfo->fn_oid);
	return nspid;
}

/* The quoted name of a schema, ready to prefix a table name. */
char *
idem_quoted_schema(Oid nspid)
{
	char	   *name = get_namespace_name(nspid);

	if (name == NULL)
		elog(ERROR, "idem: schema %u does not exist", nspid);
	return pstrdup(quote_identifier(name));
}


/* ---------- input checks ---------- */

/*
 * Check an idempotency key: 16 to 128 characters from [A-Za-z0-9_-].  The
 * message never echoes the key itself: it may carry anything, newlines
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

/* Raise 22004 when a required argument is NULL. */
void
idem_check_not_null(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("argument \"%s\" must not be null", argname)));
}

/* Compare two hex fingerprints in time independent of where they differ. */
static bool
fingerprints_equal(const char *a, const char *b)
{
	unsigned char diff = 0;

	if (strlen(a) != IDEM_HASH_HEX_LEN || strlen(b) != IDEM_HASH_HEX_LEN)
		return false;
	for (int i = 0; i < IDEM_HASH_HEX_LEN; i++)
		diff |= (unsigned char) (a[i] ^ b[i]);
	return diff == 0;
}


/* ---------- the key lock ---------- */

/* The lock tag of one (owner, operation, key) in this database. */
static void
key_locktag(LOCKTAG *tag, int64 owner, const char *operation, const char *key)
{
	unsigned char buf[sizeof(int64) + IDEM_OPERATION_MAX_LEN + 1 + IDEM_KEY_MAX_LEN];
	size_t		oplen = strlen(operation);
	size_t		keylen = strlen(key);
	size_t		len = 0;
	uint64		h;

	Assert(oplen <= IDEM_OPERATION_MAX_LEN && keylen <= IDEM_KEY_MAX_LEN);
	memcpy(buf, &owner, sizeof(int64));
	len += sizeof(int64);
	memcpy(buf + len, operation, oplen + 1);	/* with its NUL, as separator */
	len += oplen + 1;
	memcpy(buf + len, key, keylen);
	len += keylen;

	h = hash_bytes_extended(buf, (int) len, 0);
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_LOCK_CLASS);
}

/* How long a duplicate waits: idem.wait_timeout, or lock_timeout if shorter. */
static int
key_wait_ms(void)
{
	if (LockTimeout > 0 && LockTimeout < idem_wait_timeout)
		return LockTimeout;
	return idem_wait_timeout;
}

/*
 * Wait for a key lock another transaction holds, at most idem.wait_timeout
 * (and at most lock_timeout, if that is shorter).  Returns false when the
 * time ran out.  On success the lock belongs to the caller's resource owner,
 * as if taken with a plain LockAcquire.
 *
 * The wait is an ordinary lock wait, so it shows in pg_locks and
 * pg_blocking_pids and takes part in deadlock detection.  The timeout is
 * lock_timeout's own machinery; its error is caught in a subtransaction,
 * which is only ever started on this slow path.
 */
static bool
wait_for_key_lock(const LOCKTAG *tag)
{
	MemoryContext callercxt = CurrentMemoryContext;
	ResourceOwner callerowner = CurrentResourceOwner;
	int			saved_lock_timeout = LockTimeout;
	volatile bool acquired = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(callercxt);

	PG_TRY();
	{
		ResourceOwner subowner = CurrentResourceOwner;

		LockTimeout = key_wait_ms();
		(void) LockAcquire(tag, ExclusiveLock, false, false);
		LockTimeout = saved_lock_timeout;

		/* hand the lock from the subtransaction to the caller */
		CurrentResourceOwner = callerowner;
		(void) LockAcquire(tag, ExclusiveLock, false, true);
		CurrentResourceOwner = subowner;
		LockRelease(tag, ExclusiveLock, false);

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

/* Take the key lock; false if another transaction kept it past the wait. */
static bool
lock_key(const LOCKTAG *tag)
{
	if (LockAcquire(tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
		return true;
	if (key_wait_ms() <= 0)
		return false;
	return wait_for_key_lock(tag);
}

/*
 * Raise IK002: the original request has not finished, either still running
 * after our wait or recorded as PROCESSING by a committed transaction.
 */
static void
report_in_flight(int64 owner, const char *operation, const char *key, bool waited)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_IN_FLIGHT),
			 errmsg("a request with this idempotency key is still being processed"),
			 waited ?
			 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": the first request has not finished within %d ms (idem.wait_timeout, or lock_timeout if shorter).",
					   owner, operation, key, key_wait_ms()) :
			 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": the first request is recorded as still processing.",
					   owner, operation, key),
			 errhint("Retry the same request in about a second; an HTTP API answers 409 Conflict with Retry-After: 1.")));
}

/* Raise IK001: the key was first used with another request. */
static void
report_key_reused(int64 owner, const char *operation, const char *key)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_KEY_REUSED),
			 errmsg("idempotency key was already used with a different request"),
			 errdetail("Owner " INT64_FORMAT ", operation %s, key \"%.8s...\": the stored request fingerprint differs from this request's.",
					   owner, operation, key),
			 errhint("Send a new idempotency key for a new request; an HTTP API answers 409 Conflict (or 422 Unprocessable Content).")));
}


/* ---------- idem_create_order: what it looks up once ---------- */

/* Drop the catalog when one of its relations changes. */
static void
catalog_relcache_callback(Datum arg, Oid relid)
{
	/* while building, any change may concern what was already looked up */
	if (catalog_building)
		catalog_build_invalidated = true;
	if (!catalog.valid)
		return;
	if (relid == InvalidOid || relid == catalog.record.relid ||
		relid == catalog.scopeid || relid == catalog.record.seq ||
		relid == catalog.order.relid || relid == catalog.order.seq)
		catalog.valid = false;
}

/* Drop the catalog when a function changes (its owner, say). */
static void
catalog_proc_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	if (catalog_building)
		catalog_build_invalidated = true;
	catalog.valid = false;
}

/* The OID of relation name in schema nspid, or an error saying it is missing. */
static Oid
extension_relation(const char *name, Oid nspid, char relkind)
{
	Oid			relid = get_relname_relid(name, nspid);

	if (!OidIsValid(relid) || get_rel_relkind(relid) != relkind)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's relation \"%s\" is missing from schema \"%s\"",
						name, get_namespace_name(nspid)),
				 errhint("Drop and re-create the extension idem.")));
	return relid;
}

/*
 * Map spec's columns to attribute numbers of rel, checking that idem's raw
 * writes fit them: the type, a length limit no shorter than what idem
 * stores, and no column idem does not know (it would get no default).
 */
static void
map_columns(Relation rel, const ColumnSpec *spec, int ncols, AttrNumber *attnums)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			live = 0;

	for (int j = 0; j < desc->natts; j++)
		if (!TupleDescAttr(desc, j)->attisdropped)
			live++;

	for (int i = 0; i < ncols; i++)
	{
		Form_pg_attribute att = NULL;
		int32		maxlen;

		for (int j = 0; j < desc->natts; j++)
		{
			Form_pg_attribute a = TupleDescAttr(desc, j);

			if (!a->attisdropped && strcmp(NameStr(a->attname), spec[i].name) == 0)
			{
				att = a;
				break;
			}
		}
		maxlen = (att && att->atttypmod >= 0) ? att->atttypmod - VARHDRSZ : -1;
		if (att == NULL || att->atttypid != spec[i].type ||
			(spec[i].len > 0 && maxlen >= 0 &&
			 (spec[i].exact ? maxlen != spec[i].len : maxlen < spec[i].len)))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idem's table \"%s\" was altered: column \"%s\" is missing or of another type",
							RelationGetRelationName(rel), spec[i].name),
					 errhint("Undo the change, or drop and re-create the extension idem.")));
		attnums[i] = att->attnum;
	}
	if (live != ncols)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table \"%s\" was altered: it has columns idem does not write",
						RelationGetRelationName(rel)),
				 errhint("Undo the change, or drop and re-create the extension idem.")));
}

/*
 * rel's CHECK constraints, parsed and planned as ExecRelCheck does for
 * every statement; here once per backend.  Only the expression trees are
 * kept: each call builds its own executable state from them.
 */
static Expr **
plan_checks(Relation rel, int *ncheck)
{
	TupleConstr *constr = RelationGetDescr(rel)->constr;
	Expr	  **checks;

	*ncheck = constr ? constr->num_check : 0;
	if (*ncheck == 0)
		return NULL;
	checks = palloc(*ncheck * sizeof(Expr *));
	for (int i = 0; i < *ncheck; i++)
		checks[i] = expression_planner((Expr *) stringToNode(constr->check[i].ccbin));
	return checks;
}

/*
 * Look up table name and its id sequence in schema nspid, map its columns
 * and plan its CHECK constraints.
 */
static void
load_layout(TableLayout *t, const char *name, const char *seqname, Oid nspid,
			const ColumnSpec *spec, int ncols)
{
	Relation	rel;

	t->relid = extension_relation(name, nspid, RELKIND_RELATION);
	t->seq = extension_relation(seqname, nspid, RELKIND_SEQUENCE);
	rel = table_open(t->relid, AccessShareLock);
	map_columns(rel, spec, ncols, t->att);
	t->natts = RelationGetDescr(rel)->natts;
	t->checks = plan_checks(rel, &t->ncheck);
	table_close(rel, NoLock);
}

/* The catalog for the idem_create_order being called, built if need be. */
static const OrderCatalog *
order_catalog(FunctionCallInfo fcinfo)
{
	Oid			fn_oid = fcinfo->flinfo->fn_oid;
	OrderCatalog cat = {0};
	HeapTuple	proctup;
	TupleDesc	tupdesc;
	Relation	index;
	MemoryContext oldcxt;

	if (catalog.valid && catalog.fn_oid == fn_oid)
		return &catalog;

	/*
	 * A call in progress further up the stack (from a trigger, say) may
	 * still use the previous build: it is freed with the transaction.
	 */
	if (catalog_cxt == NULL)
	{
		CacheRegisterRelcacheCallback(catalog_relcache_callback, (Datum) 0);
		CacheRegisterSyscacheCallback(PROCOID, catalog_proc_callback, (Datum) 0);
	}
	else
		MemoryContextSetParent(catalog_cxt, TopTransactionContext);
	catalog_cxt = AllocSetContextCreate(CacheMemoryContext, "idem catalog",
										ALLOCSET_SMALL_SIZES);
	catalog.valid = false;
	catalog_building = true;
	catalog_build_invalidated = false;

	cat.fn_oid = fn_oid;
	proctup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn_oid));
	if (!HeapTupleIsValid(proctup))
		elog(ERROR, "idem: cache lookup failed for function %u", fn_oid);
	cat.owner = ((Form_pg_proc) GETSTRUCT(proctup))->proowner;
	ReleaseSysCache(proctup);
	cat.nspid = idem_extension_schema(fcinfo);

	oldcxt = MemoryContextSwitchTo(catalog_cxt);

	load_layout(&cat.record, "idempotency_record", "idempotency_record_id_seq",
				cat.nspid, record_columns, REC_NCOLS);
	load_layout(&cat.order, "purchase_order", "purchase_order_id_seq",
				cat.nspid, order_columns, ORD_NCOLS);
	cat.scopeid = extension_relation("uk_idempotency_scope", cat.nspid, RELKIND_INDEX);
	index = index_open(cat.scopeid, AccessShareLock);
	if (index->rd_index->indrelid != cat.record.relid || index->rd_index->indnatts != 3 ||
		!index->rd_index->indisunique ||
		index->rd_index->indkey.values[0] != cat.record.att[REC_OWNER] ||
		index->rd_index->indkey.values[1] != cat.record.att[REC_OPERATION] ||
		index->rd_index->indkey.values[2] != cat.record.att[REC_KEY])
		elog(ERROR, "idem: uk_idempotency_scope is not the unique (owner_id, operation, idempotency_key) index");
	index_close(index, NoLock);

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "idem_create_order must return a composite type");
	cat.result = BlessTupleDesc(CreateTupleDescCopy(tupdesc));
	cat.operation = CStringGetTextDatum(IDEM_OP_CREATE_ORDER);
	MemoryContextSwitchTo(oldcxt);

	/*
	 * The relations are locked now, so what was read is current; but if an
	 * invalidation came while looking them up, serve this call and look
	 * again on the next.  (An error above leaves catalog_building set: it
	 * only makes the next build's check pessimistic.)
	 */
	catalog_building = false;
	cat.generation = ++catalog_generation;
	cat.valid = !catalog_build_invalidated;
	catalog = cat;
	return &catalog;
}


/* ---------- idem_create_order: the statement of the rare path ---------- */

/* Prepare the statement that renews an expired record, for the schema nspid. */
static void
prepare_order_plans(Oid nspid)
{
	char	   *s;
	Oid			types[9] = {INT8OID, TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, INT8OID, INT4OID, INT8OID};

	if (order_plans.nspid == nspid)
		return;

	order_plans.nspid = InvalidOid;
	idem_free_kept(&order_plans.renew);

	s = idem_quoted_schema(nspid);

	/*
	 * $1 owner, $2 operation, $3 key, $4 fingerprint, $5 now, $6 expiry, $7
	 * sku, $8 qty, $9 the record id: start an expired record afresh, in
	 * place, already finished and holding the response, and write the order
	 * only if the record was renewed.  If another caller renewed or deleted
	 * it first, nothing is written and nothing is returned.  The rows are
	 * the ones insert_order writes for a new key.
	 */
	order_plans.renew = idem_prepare_kept(psprintf(
		"WITH n AS (SELECT v.id,"
		"  'ORD-' OPERATOR(pg_catalog.||) pg_catalog.lpad(v.id::pg_catalog.text, 12, '0') AS no"
		"  FROM (SELECT pg_catalog.nextval(%s::pg_catalog.regclass) AS id) v),"
		" r AS ("
		" UPDATE %s.idempotency_record AS r"
		" SET request_hash = $4, status = 'SUCCEEDED', http_status = 201,"
		"  response_json = pg_catalog.jsonb_build_object('orderId', n.id, 'orderNo', n.no, 'status', 'CREATED'),"
		"  resource_id = n.id, created_at = $5, updated_at = $5, expires_at = $6"
		" FROM n"
		" WHERE r.id OPERATOR(pg_catalog.=) $9"
		" AND r.expires_at OPERATOR(pg_catalog.<) $5"
		" RETURNING r.resource_id, r.response_json OPERATOR(pg_catalog.->>) 'orderNo' AS no)"
		" INSERT INTO %s.purchase_order AS o"
		"  (id, order_no, owner_id, sku_id, quantity, status, created_at)"
		" SELECT r.resource_id, r.no, $1, $7, $8, 'CREATED', $5 FROM r"
		" RETURNING o.id, o.order_no::pg_catalog.text, o.status::pg_catalog.text",
		quote_literal_cstr(psprintf("%s.purchase_order_id_seq", s)), s, s), 9, types);

	order_plans.nspid = nspid;
}


/* ---------- idem_create_order: reading the key ---------- */

/* A text field of a jsonb object as a text Datum; false if absent or not a string. */
static bool
jsonb_text_field(Jsonb *jb, const char *name, Datum *result)
{
	JsonbValue	v;

	if (!getKeyJsonValueFromContainer(&jb->root, name, strlen(name), &v) ||
		v.type != jbvString)
		return false;
	*result = PointerGetDatum(cstring_to_text_with_len(v.val.string.val, v.val.string.len));
	return true;
}

/*
 * Scan the unique index for (owner, operation, key) under snapshot and
 * return the first row it gives in slot; false if none.  The relations stay
 * locked until the end of the transaction, as a statement's do.
 */
static bool
scan_key(const OrderCatalog *cat, int64 owner, Datum key, Snapshot snapshot,
		 TupleTableSlot **slotp, Relation *heapp)
{
	Relation	heap = table_open(cat->record.relid, AccessShareLock);
	Relation	index = index_open(cat->scopeid, AccessShareLock);
	ScanKeyData skey[3];
	IndexScanDesc scan;
	TupleTableSlot *slot = table_slot_create(heap, NULL);
	bool		found;

	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(owner));
	ScanKeyEntryInitialize(&skey[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[1], F_TEXTEQ, cat->operation);
	ScanKeyEntryInitialize(&skey[2], 0, 3, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[2], F_TEXTEQ, key);

	scan = index_beginscan(heap, index, snapshot, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	index_close(index, NoLock);

	*slotp = slot;
	*heapp = heap;
	return found;
}

/*
 * Read the key's record through the unique index, as a statement of the
 * caller's transaction would: with a fresh snapshot under READ COMMITTED,
 * the transaction's under REPEATABLE READ and SERIALIZABLE (the index and
 * heap access methods take the predicate locks).  This is the hot path of
 * every call, replays above all: it costs an index probe, not an executor
 * start-up.  Returns false when the snapshot sees no record.
 */
static bool
read_key_record(const OrderCatalog *cat, int64 owner, Datum key, TimestampTz now,
				KeyRecord *rec)
{
	const AttrNumber *att = cat->record.att;
	Snapshot	current = GetTransactionSnapshot();
	Snapshot	snapshot;
	TupleTableSlot *slot;
	Relation	heap;
	bool		found;

	/* (a registered copy does not keep the count) */
	rec->completions = current->snapXactCompletionCount;
	snapshot = RegisterSnapshot(current);
	found = scan_key(cat, owner, key, snapshot, &slot, &heap);
	if (found)
	{
		bool		isnull;
		char	   *hash;
		char	   *status;
		Datum		response;

		rec->id = slot_getattr(slot, att[REC_ID], &isnull);
		hash = TextDatumGetCString(slot_getattr(slot, att[REC_HASH], &isnull));
		strlcpy(rec->request_hash, hash, sizeof(rec->request_hash));
		status = TextDatumGetCString(slot_getattr(slot, att[REC_STATUS], &isnull));
		rec->succeeded = strcmp(status, "SUCCEEDED") == 0;
		rec->expired = DatumGetTimestampTz(slot_getattr(slot, att[REC_EXPIRES], &isnull)) < now;

		rec->http_status = slot_getattr(slot, att[REC_HTTP], &rec->isnull[3]);
		response = slot_getattr(slot, att[REC_RESPONSE], &isnull);
		rec->isnull[0] = rec->isnull[1] = rec->isnull[2] = true;
		if (!isnull)
		{
			Jsonb	   *jb = DatumGetJsonbP(response);
			JsonbValue	v;

			if (getKeyJsonValueFromContainer(&jb->root, "orderId", 7, &v) &&
				v.type == jbvNumeric)
			{
				rec->order_id = DirectFunctionCall1(numeric_int8, NumericGetDatum(v.val.numeric));
				rec->isnull[0] = false;
			}
			rec->isnull[1] = !jsonb_text_field(jb, "orderNo", &rec->order_no);
			rec->isnull[2] = !jsonb_text_field(jb, "status", &rec->status);
		}
	}
	ExecDropSingleTupleTableSlot(slot);
	table_close(heap, NoLock);
	UnregisterSnapshot(snapshot);
	return found;
}

/*
 * Has a transaction that may have written anything ended since the read
 * whose snapshot counted `completions` ended transactions?  If not, what
 * is committed now was committed then, and the read saw it.
 *
 * Asked under the key lock.  A transaction that wrote the key held the key
 * lock until after its end was counted (ProcArrayEndTransaction comes
 * before the release of its locks), and our LockAcquire went through the
 * lock manager's partition lock after that release, so the count we read
 * here includes its end.  The counter is 64 bits wide and only grows.
 */
static bool
transactions_ended_since(uint64 completions)
{
	pg_memory_barrier();
	return ((volatile VariableCacheData *) ShmemVariableCache)->xactCompletionCount != completions;
}

/*
 * Is there a record of the key that the last read could not see?  Asked
 * under the key lock, before writing a new record.  A dirty snapshot sees
 * every row not known dead, whatever the caller's snapshot: rows committed
 * since it was taken, and rows of transactions still running.  No other
 * caller of idem can be writing the key while we hold its lock, so such a
 * row is a record committed by the previous holder between our read and
 * our lock, or a row written around idem.
 */
static bool
unseen_record_exists(const OrderCatalog *cat, int64 owner, Datum key)
{
	SnapshotData dirty;
	TupleTableSlot *slot;
	Relation	heap;
	bool		found;

	InitDirtySnapshot(dirty);
	found = scan_key(cat, owner, key, &dirty, &slot, &heap);

	/*
	 * A row still being inserted (dirty.xmin set) comes from a transaction
	 * that writes the table without the key lock: the unique index waits
	 * for it and decides, whether or not this probe ran.
	 */
	if (found && TransactionIdIsValid(dirty.xmin))
		found = false;
	ExecDropSingleTupleTableSlot(slot);
	table_close(heap, NoLock);
	return found;
}


/* ---------- idem_create_order: writing ---------- */

/* Push a string (a key or a value) onto a jsonb under construction. */
static void
push_jsonb_string(JsonbParseState **state, JsonbIteratorToken token,
				  const char *str, int len)
{
	JsonbValue	v;

	v.type = jbvString;
	v.val.string.val = (char *) str;
	v.val.string.len = len;
	pushJsonbValue(state, token, &v);
}

/* Push a text Datum as a jsonb string value. */
static void
push_jsonb_text(JsonbParseState **state, Datum value)
{
	text	   *t = DatumGetTextPP(value);

	push_jsonb_string(state, WJB_VALUE, VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
}

/* The response snapshot stored on the record: {orderId, orderNo, status}. */
static Datum
order_response(Datum order_id, Datum order_no, Datum status)
{
	JsonbParseState *state = NULL;
	JsonbValue	id;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	push_jsonb_string(&state, WJB_KEY, "orderId", 7);
	id.type = jbvNumeric;
	id.val.numeric = int64_to_numeric(DatumGetInt64(order_id));
	pushJsonbValue(&state, WJB_VALUE, &id);
	push_jsonb_string(&state, WJB_KEY, "orderNo", 7);
	push_jsonb_text(&state, order_no);
	push_jsonb_string(&state, WJB_KEY, "status", 6);
	push_jsonb_text(&state, status);
	return JsonbPGetDatum(JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL)));
}

/* 'ORD-' || lpad(id::text, 12, '0'), as the renewal statement computes it. */
static Datum
order_number(int64 id)
{
	char		digits[MAXINT8LEN + 1];
	char		no[4 + 12 + 1] = "ORD-";
	int			len = pg_lltoa(id, digits);
	int			pad = len < 12 ? 12 - len : 0;

	memset(no + 4, '0', pad);
	memcpy(no + 4 + pad, digits, Min(len, 12));	/* lpad truncates on the right */
	no[4 + 12] = '\0';
	return CStringGetTextDatum(no);
}

/*
 * Give a result relation its CHECK constraints from the catalog's planned
 * trees, so that ExecConstraints does not parse and plan them again.
 */
static void
set_checks(ResultRelInfo *rri, const TableLayout *t, EState *estate)
{
	TupleConstr *constr = RelationGetDescr(rri->ri_RelationDesc)->constr;
	MemoryContext oldcxt;

	if (t->ncheck == 0 || constr == NULL || constr->num_check != t->ncheck)
		return;
	oldcxt = MemoryContextSwitchTo(estate->es_query_cxt);
	rri->ri_ConstraintExprs = palloc(t->ncheck * sizeof(ExprState *));
	for (int i = 0; i < t->ncheck; i++)
		rri->ri_ConstraintExprs[i] = ExecInitExpr(t->checks[i], NULL);
	MemoryContextSwitchTo(oldcxt);
}

/* A row of one of idem's tables being filled in: every column NULL at first. */
typedef struct Row
{
	const TableLayout *table;
	Datum	   *values;
	bool	   *nulls;
} Row;

static void
row_init(Row *row, const TableLayout *t)
{
	row->table = t;
	row->values = palloc0(t->natts * sizeof(Datum));
	row->nulls = palloc(t->natts * sizeof(bool));
	memset(row->nulls, true, t->natts * sizeof(bool));
}

/* Set column col (an index into the table's ColumnSpec array). */
static void
row_set(Row *row, int col, Datum value)
{
	AttrNumber	attnum = row->table->att[col];

	row->values[attnum - 1] = value;
	row->nulls[attnum - 1] = false;
}

/*
 * Claim a new key and execute: insert the record, already finished and
 * holding the response, and the order, in the caller's transaction.  The
 * key lock is held and the last read saw no record.  Whatever else writes
 * the table, the unique index stays the arbiter: a duplicate raises 23505.
 */
static void
insert_order(const OrderCatalog *cat, int64 owner, Datum key, const char *fingerprint,
			 TimestampTz now, TimestampTz expires, int64 sku, int32 qty,
			 OrderResult *res)
{
	Oid			relids[2] = {cat->record.relid, cat->order.relid};
	Datum		order_id;
	Datum		order_no;
	Datum		created = CStringGetTextDatum("CREATED");
	Row			record;
	Row			order;
	IdemRows	rows;
	TupleTableSlot *slot;
	const AttrNumber *oa = cat->order.att;

	idem_rows_begin(&rows, relids, 2);
	/* the tables are locked now: if the catalog is still current, so are its constraints */
	if (catalog.valid && catalog.generation == cat->generation)
	{
		set_checks(rows.rels[0], &cat->record, rows.estate);
		set_checks(rows.rels[1], &cat->order, rows.estate);
	}

	/* the order id first, then the record's, as the statements draw them */
	order_id = Int64GetDatum(nextval_internal(cat->order.seq, true));
	order_no = order_number(DatumGetInt64(order_id));

	row_init(&record, &cat->record);
	row_set(&record, REC_ID, Int64GetDatum(nextval_internal(cat->record.seq, true)));
	row_set(&record, REC_OWNER, Int64GetDatum(owner));
	row_set(&record, REC_OPERATION, cat->operation);
	row_set(&record, REC_KEY, key);
	row_set(&record, REC_HASH, CStringGetTextDatum(fingerprint));
	row_set(&record, REC_STATUS, CStringGetTextDatum("SUCCEEDED"));
	row_set(&record, REC_HTTP, Int32GetDatum(201));
	row_set(&record, REC_RESPONSE, order_response(order_id, order_no, created));
	row_set(&record, REC_RESOURCE, order_id);
	row_set(&record, REC_CREATED, TimestampTzGetDatum(now));
	row_set(&record, REC_UPDATED, TimestampTzGetDatum(now));
	row_set(&record, REC_EXPIRES, TimestampTzGetDatum(expires));

	row_init(&order, &cat->order);
	row_set(&order, ORD_ID, order_id);
	row_set(&order, ORD_NO, order_no);
	row_set(&order, ORD_OWNER, Int64GetDatum(owner));
	row_set(&order, ORD_SKU, Int64GetDatum(sku));
	row_set(&order, ORD_QTY, Int32GetDatum(qty));
	row_set(&order, ORD_STATUS, created);
	row_set(&order, ORD_CREATED, TimestampTzGetDatum(now));

	idem_rows_insert(&rows, 0, record.values, record.nulls);
	idem_rows_insert(&rows, 1, order.values, order.nulls);

	/* answer with the order as stored: a BEFORE trigger may have changed it */
	slot = rows.slots[1];
	res->order_id = slot_getattr(slot, oa[ORD_ID], &res->isnull[0]);
	res->order_no = slot_getattr(slot, oa[ORD_NO], &res->isnull[1]);
	if (!res->isnull[1])
		res->order_no = PointerGetDatum(DatumGetTextPCopy(res->order_no));
	res->status = slot_getattr(slot, oa[ORD_STATUS], &res->isnull[2]);
	if (!res->isnull[2])
		res->status = PointerGetDatum(DatumGetTextPCopy(res->status));
	res->http_status = Int32GetDatum(201);
	res->isnull[3] = false;
	res->replayed = false;

	idem_rows_end(&rows);
}

/* Connect to SPI and prepare the renewal, for a call that renews. */
static void
start_spi(bool *connected, Oid nspid)
{
	if (*connected)
		return;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idem: SPI_connect failed");
	*connected = true;
	prepare_order_plans(nspid);
}

/*
 * Renew an expired record in place and execute; false if another caller
 * renewed or deleted it first.
 */
static bool
renew_order(Datum *args, Datum record_id, MemoryContext callercxt, OrderResult *res)
{
	int			rc;

	args[8] = record_id;
	rc = SPI_execute_plan(order_plans.renew, args, NULL, false, 0);
	if (rc != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "idem: statement failed: %s (expected %s)",
			 SPI_result_code_string(rc), SPI_result_code_string(SPI_OK_INSERT_RETURNING));
	if (SPI_processed != 1)
		return false;

	/* (order id, order_no, status), copied out of SPI's memory */
	res->order_id = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &res->isnull[0]);
	res->order_no = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &res->isnull[1]);
	res->status = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &res->isnull[2]);
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(callercxt);

		if (!res->isnull[1])
			res->order_no = PointerGetDatum(DatumGetTextPCopy(res->order_no));
		if (!res->isnull[2])
			res->status = PointerGetDatum(DatumGetTextPCopy(res->status));
		MemoryContextSwitchTo(oldcxt);
	}
	res->http_status = Int32GetDatum(201);
	res->isnull[3] = false;
	res->replayed = false;
	return true;
}


/* ---------- idem_create_order: whom it runs as ---------- */

/*
 * The caller may execute idem_create_order, not touch its tables: the
 * function reads and writes them as its owner, as SECURITY DEFINER would,
 * but switches only around its own work (fmgr's switch, with its SET
 * search_path, costs a GUC save and restore on every call, replays
 * included).  Reads run no code anyone but idem defined: cached OIDs, the
 * index's own comparison, no SQL.  Writes may run user-defined code
 * (triggers, constraints, the renewal statement), so they also run under
 * search_path = pg_catalog, pg_temp.  An error restores both, as it does
 * for SECURITY DEFINER: transaction and subtransaction abort reset the
 * user and unwind GUC nesting.
 */
typedef struct Identity
{
	Oid			saved_user;
	int			saved_context;
	int			guc_level;		/* 0 until the search_path is set */
} Identity;

static void
become_owner(Identity *id, Oid owner)
{
	GetUserIdAndSecContext(&id->saved_user, &id->saved_context);
	SetUserIdAndSecContext(owner, id->saved_context | SECURITY_LOCAL_USERID_CHANGE);
	id->guc_level = 0;
}

static void
use_safe_search_path(Identity *id)
{
	if (id->guc_level > 0)
		return;
	id->guc_level = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp",
							 superuser() ? PGC_SUSET : PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
}

static void
restore_caller(Identity *id)
{
	if (id->guc_level > 0)
		AtEOXact_GUC(true, id->guc_level);
	SetUserIdAndSecContext(id->saved_user, id->saved_context);
}


/* ---------- idem_create_order ---------- */

/*
 * SQL: idem_create_order(owner, key, sku, qty) returns
 * (order_id, order_no, status, http_status, replayed).
 */
Datum
idem_create_order(PG_FUNCTION_ARGS)
{
	int64		owner;
	text	   *key_text;
	Datum		key;
	char	   *key_str;
	int64		sku;
	int32		qty;
	StringInfoData request;
	char		fingerprint[IDEM_HASH_HEX_LEN + 1];
	LOCKTAG		tag;
	OrderCatalog catcopy;
	const OrderCatalog *cat = &catcopy;
	bool		connected = false;
	MemoryContext callercxt = CurrentMemoryContext;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz expires;
	Datum		args[9];
	bool		locked = false;
	bool		executed = false;
	OrderResult res = {0};
	Identity	identity;
	Datum		values[5];
	bool		nulls[5];
	HeapTuple	tuple;

	idem_check_not_null(fcinfo, 0, "owner");
	idem_check_not_null(fcinfo, 1, "key");
	idem_check_not_null(fcinfo, 2, "sku");
	idem_check_not_null(fcinfo, 3, "qty");
	owner = PG_GETARG_INT64(0);
	key_text = PG_GETARG_TEXT_PP(1);
	key = PointerGetDatum(key_text);
	key_str = text_to_cstring(key_text);
	sku = PG_GETARG_INT64(2);
	qty = PG_GETARG_INT32(3);

	idem_check_key(key_str, strlen(key_str));
	if (qty < IDEM_QTY_MIN || qty > IDEM_QTY_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("qty must be between %d and %d", IDEM_QTY_MIN, IDEM_QTY_MAX),
				 errdetail("The request has qty %d.", qty)));
	if (sku < -IDEM_MAX_SAFE_INTEGER || sku > IDEM_MAX_SAFE_INTEGER)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("sku must be between -9007199254740991 and 9007199254740991"),
				 errdetail("The request fingerprint holds sku as a JSON number, exact only up to 2^53 - 1.")));

	/* a copy: a nested call may build the catalog again under us */
	catcopy = *order_catalog(fcinfo);

	/* the fingerprint: SHA-256 of the canonical {"qty":..,"sku":..} */
	initStringInfo(&request);
	appendStringInfoString(&request, "{\"qty\":");
	idem_jcs_append_number(&request, (double) qty);
	appendStringInfoString(&request, ",\"sku\":");
	idem_jcs_append_number(&request, (double) sku);
	appendStringInfoChar(&request, '}');
	idem_sha256_hex(request.data, request.len, fingerprint);

	expires = now + (TimestampTz) idem_ttl * USECS_PER_SEC;

	become_owner(&identity, cat->owner);

	/*
	 * Read first: a finished record the snapshot sees is replayed (or
	 * refused) without a lock or a write.  Otherwise take the key lock,
	 * which waits for an in-flight original, and look again before writing.
	 */
	for (int attempt = 1;; attempt++)
	{
		KeyRecord	rec;
		bool		found;

		if (attempt > IDEM_CLAIM_ATTEMPTS)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not claim idempotency key: its record kept changing"),
					 errhint("Retry the transaction.")));

		found = read_key_record(cat, owner, key, now, &rec);
		if (!found || rec.expired)
		{
			/* no record, or an expired one: this call may execute */
			if (!locked)
			{
				key_locktag(&tag, owner, IDEM_OP_CREATE_ORDER, key_str);
				if (!lock_key(&tag))
					report_in_flight(owner, IDEM_OP_CREATE_ORDER, key_str, true);
				locked = true;
				/* an expired record may have been renewed while we waited */
				if (found)
					continue;
			}

			if (!found)
			{
				/*
				 * A record our snapshot cannot see was committed after it
				 * was taken (only possible if some transaction ended since):
				 * read again with a new one, or, where the transaction keeps
				 * its snapshot, fail as the executor's ON CONFLICT does,
				 * rather than replay what it cannot see.
				 */
				if (transactions_ended_since(rec.completions) &&
					unseen_record_exists(cat, owner, key))
				{
					if (IsolationUsesXactSnapshot())
						ereport(ERROR,
								(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
								 errmsg("could not serialize access due to concurrent update")));
					continue;
				}
				/* claim with a finished record, and write the order */
				use_safe_search_path(&identity);
				insert_order(cat, owner, key, fingerprint, now, expires, sku, qty, &res);
				executed = true;
				break;
			}

			/* expired: the key starts afresh, in place */
			use_safe_search_path(&identity);
			start_spi(&connected, cat->nspid);
			/* $1 owner, $2 operation, $3 key, $4 fingerprint, $5 now, $6 expiry, $7 sku, $8 qty */
			args[0] = Int64GetDatum(owner);
			args[1] = cat->operation;
			args[2] = key;
			args[3] = CStringGetTextDatum(fingerprint);
			args[4] = TimestampTzGetDatum(now);
			args[5] = TimestampTzGetDatum(expires);
			args[6] = Int64GetDatum(sku);
			args[7] = Int32GetDatum(qty);
			if (renew_order(args, rec.id, callercxt, &res))
			{
				executed = true;
				break;
			}
			continue;			/* renewed or deleted by another: read again */
		}

		if (!fingerprints_equal(rec.request_hash, fingerprint))
			report_key_reused(owner, IDEM_OP_CREATE_ORDER, key_str);
		if (!rec.succeeded)
			report_in_flight(owner, IDEM_OP_CREATE_ORDER, key_str, false);

		/* replay the stored response */
		res.order_id = rec.order_id;
		res.order_no = rec.order_no;
		res.status = rec.status;
		res.http_status = rec.http_status;
		memcpy(res.isnull, rec.isnull, sizeof(res.isnull));
		res.replayed = true;
		break;
	}

	/* a replay leaves the key to others at once */
	if (!executed && locked)
		LockRelease(&tag, ExclusiveLock, false);

	ereport(DEBUG1,
			(errmsg_internal("idem: owner " INT64_FORMAT " operation %s key \"%.8s...\" order " INT64_FORMAT " replayed=%s",
							 owner, IDEM_OP_CREATE_ORDER, key_str,
							 res.isnull[0] ? INT64CONST(-1) : DatumGetInt64(res.order_id),
							 res.replayed ? "true" : "false")));

	if (connected)
		SPI_finish();
	MemoryContextSwitchTo(callercxt);
	restore_caller(&identity);

	values[0] = res.order_id;
	values[1] = res.order_no;
	values[2] = res.status;
	values[3] = res.http_status;
	values[4] = BoolGetDatum(res.replayed);
	memcpy(nulls, res.isnull, sizeof(res.isnull));
	nulls[4] = false;
	tuple = heap_form_tuple(cat->result, values, nulls);
	PG_RETURN_DATUM(HeapTupleGetDatum(tuple));
}
