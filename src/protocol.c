/*-------------------------------------------------------------------------
 *
 * protocol.c
 *	  The idempotency protocol, run inside the caller's transaction, and its
 *	  first user: idem_create_order, the article's "create an order" flow.
 *
 * One call: validate the key, fingerprint the request, read the key's
 * record.  A finished record is replayed (or refused: IK001, different
 * request) without a lock or a write.  Otherwise take the key lock and
 * claim and execute in one statement: INSERT the record, already finished,
 * ... ON CONFLICT DO NOTHING on the unique (owner_id, operation,
 * idempotency_key) index, and only if it inserted, the order.  A lost claim
 * reads the winner's record and replays it.  An expired record is renewed
 * in place and executed anew.  Record, business write and snapshot are
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
 * after waiting gives the lock back at once.  The lock only bounds waiting:
 * the unique index stays the arbiter, and under REPEATABLE READ or
 * SERIALIZABLE a conflicting claim the snapshot cannot see ends in SQLSTATE
 * 40001 raised by the executor (ExecCheckTupleVisible), never in a replay of
 * something the caller cannot see.
 *
 * Every statement is schema-qualified (the extension's schema and
 * pg_catalog, operators included) and prepared once per backend.
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
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
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

/* Saved plans of idem_create_order, for one extension schema. */
typedef struct OrderPlans
{
	Oid			nspid;			/* InvalidOid until all are prepared */
	SPIPlanPtr	create;
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
} KeyRecord;

/*
 * What one call site of idem_create_order looks up once (fn_extra): the
 * extension's schema, its table and unique index, the result's tuple
 * descriptor.  A dropped and re-created extension has new functions, hence
 * new call sites, so nothing here outlives the objects it names.
 */
typedef struct CallSite
{
	Oid			nspid;
	Oid			heapid;
	Oid			indexid;
	TupleDesc	tupdesc;
	Datum		operation;		/* IDEM_OP_CREATE_ORDER as text */
} CallSite;

/* idempotency_record's columns, by attribute number */
#define Anum_record_id				1
#define Anum_record_request_hash	5
#define Anum_record_status			6
#define Anum_record_http_status		7
#define Anum_record_response_json	8
#define Anum_record_expires_at		12

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


/* ---------- idem_create_order ---------- */

/* Prepare the statements of idem_create_order for the schema nspid. */
static void
prepare_order_plans(Oid nspid)
{
	char	   *s;
	char	   *new_order;
	char	   *write_order;
	Oid			types[9] = {INT8OID, TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, INT8OID, INT4OID, INT8OID};

	if (order_plans.nspid == nspid)
		return;

	order_plans.nspid = InvalidOid;
	idem_free_kept(&order_plans.create);
	idem_free_kept(&order_plans.renew);

	s = idem_quoted_schema(nspid);

	/*
	 * Both statements draw the order id first, write the record once,
	 * already finished and holding the response, and write the order only
	 * if the record was written.  The finished record's columns:
	 */
	new_order = psprintf(
		"WITH n AS (SELECT v.id,"
		"  'ORD-' OPERATOR(pg_catalog.||) pg_catalog.lpad(v.id::pg_catalog.text, 12, '0') AS no"
		"  FROM (SELECT pg_catalog.nextval(%s::pg_catalog.regclass) AS id) v),",
		quote_literal_cstr(psprintf("%s.purchase_order_id_seq", s)));
	write_order = psprintf(
		" RETURNING r.resource_id, r.response_json OPERATOR(pg_catalog.->>) 'orderNo' AS no)"
		" INSERT INTO %s.purchase_order AS o"
		"  (id, order_no, owner_id, sku_id, quantity, status, created_at)"
		" SELECT r.resource_id, r.no, $1, $7, $8, 'CREATED', $5 FROM r"
		" RETURNING o.id, o.order_no::pg_catalog.text, o.status::pg_catalog.text", s);

	/*
	 * $1 owner, $2 operation, $3 key, $4 fingerprint, $5 now, $6 expiry,
	 * $7 sku, $8 qty: claim the key and execute.  If the claim loses on the
	 * unique index, nothing is written and nothing is returned.
	 */
	order_plans.create = idem_prepare_kept(psprintf(
		"%s r AS ("
		" INSERT INTO %s.idempotency_record AS r"
		"  (owner_id, operation, idempotency_key, request_hash, status, http_status,"
		"   response_json, resource_id, created_at, updated_at, expires_at)"
		" SELECT $1, $2, $3, $4, 'SUCCEEDED', 201,"
		"  pg_catalog.jsonb_build_object('orderId', n.id, 'orderNo', n.no, 'status', 'CREATED'),"
		"  n.id, $5, $5, $6"
		" FROM n"
		" ON CONFLICT (owner_id, operation, idempotency_key) DO NOTHING"
		"%s", new_order, s, write_order), 8, types);

	/*
	 * The same, and $9 the record id: start an expired record afresh, in
	 * place.  If another caller renewed or deleted it first, nothing is
	 * written and nothing is returned.
	 */
	order_plans.renew = idem_prepare_kept(psprintf(
		"%s r AS ("
		" UPDATE %s.idempotency_record AS r"
		" SET request_hash = $4, status = 'SUCCEEDED', http_status = 201,"
		"  response_json = pg_catalog.jsonb_build_object('orderId', n.id, 'orderNo', n.no, 'status', 'CREATED'),"
		"  resource_id = n.id, created_at = $5, updated_at = $5, expires_at = $6"
		" FROM n"
		" WHERE r.id OPERATOR(pg_catalog.=) $9"
		" AND r.expires_at OPERATOR(pg_catalog.<) $5"
		"%s", new_order, s, write_order), 9, types);

	order_plans.nspid = nspid;
}

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
 * Read the key's record through the unique index, as a statement of the
 * caller's transaction would: with a fresh snapshot under READ COMMITTED,
 * the transaction's under REPEATABLE READ and SERIALIZABLE (the index and
 * heap access methods take the predicate locks).  This is the hot path of
 * every call, replays above all: it costs an index probe, not an executor
 * start-up.  Returns false when the snapshot sees no record.
 */
static bool
read_key_record(const CallSite *site, int64 owner, Datum key, TimestampTz now,
				KeyRecord *rec)
{
	Oid			heapid = site->heapid;
	Oid			indexid = site->indexid;
	Relation	heap;
	Relation	index;
	ScanKeyData skey[3];
	Snapshot	snapshot;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		found;

	heap = table_open(heapid, AccessShareLock);
	index = index_open(indexid, AccessShareLock);
	if (index->rd_index->indrelid != heapid || index->rd_index->indnatts != 3)
		elog(ERROR, "idem: uk_idempotency_scope is not the (owner_id, operation, idempotency_key) index");

	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(owner));
	ScanKeyEntryInitialize(&skey[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[1], F_TEXTEQ, site->operation);
	ScanKeyEntryInitialize(&skey[2], 0, 3, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[2], F_TEXTEQ, key);

	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	slot = table_slot_create(heap, NULL);
	scan = index_beginscan(heap, index, snapshot, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found)
	{
		bool		isnull;
		char	   *hash;
		char	   *status;
		Datum		response;

		slot_getallattrs(slot);
		rec->id = slot->tts_values[Anum_record_id - 1];
		hash = TextDatumGetCString(slot->tts_values[Anum_record_request_hash - 1]);
		strlcpy(rec->request_hash, hash, sizeof(rec->request_hash));
		status = TextDatumGetCString(slot->tts_values[Anum_record_status - 1]);
		rec->succeeded = strcmp(status, "SUCCEEDED") == 0;
		rec->expired = DatumGetTimestampTz(slot->tts_values[Anum_record_expires_at - 1]) < now;

		rec->http_status = slot_getattr(slot, Anum_record_http_status, &rec->isnull[3]);
		response = slot_getattr(slot, Anum_record_response_json, &isnull);
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
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	/* the locks stay until the end of the transaction, as a statement's do */
	index_close(index, NoLock);
	table_close(heap, NoLock);
	return found;
}

/* This call site's CallSite, looked up on its first call. */
static CallSite *
call_site(FunctionCallInfo fcinfo)
{
	CallSite   *site = (CallSite *) fcinfo->flinfo->fn_extra;
	MemoryContext oldcxt;
	TupleDesc	tupdesc;

	if (site != NULL)
		return site;

	oldcxt = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
	site = palloc0(sizeof(CallSite));
	site->nspid = idem_extension_schema(fcinfo);
	site->heapid = get_relname_relid("idempotency_record", site->nspid);
	site->indexid = get_relname_relid("uk_idempotency_scope", site->nspid);
	if (!OidIsValid(site->heapid) || !OidIsValid(site->indexid))
		elog(ERROR, "idem: idempotency_record or its unique index is missing in schema %u",
			 site->nspid);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "idem_create_order must return a composite type");
	site->tupdesc = BlessTupleDesc(CreateTupleDescCopy(tupdesc));
	site->operation = CStringGetTextDatum(IDEM_OP_CREATE_ORDER);
	MemoryContextSwitchTo(oldcxt);

	fcinfo->flinfo->fn_extra = site;
	return site;
}

/* Connect to SPI and prepare the statements, once per call that writes. */
static void
start_writing(bool *connected, Oid nspid)
{
	if (*connected)
		return;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idem: SPI_connect failed");
	*connected = true;
	prepare_order_plans(nspid);
}

/* Run a kept plan and check that it returned what it must. */
static void
exec_plan(SPIPlanPtr plan, Datum *values, int expected)
{
	int			rc = SPI_execute_plan(plan, values, NULL, false, 0);

	if (rc != expected)
		elog(ERROR, "idem: statement failed: %s (expected %s)",
			 SPI_result_code_string(rc), SPI_result_code_string(expected));
}

/* Column i (1-based) of the single result row, as a Datum. */
static Datum
result_col(int i, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, i, isnull);
}

/*
 * SQL: idem_create_order(owner, key, sku, qty) returns
 * (order_id, order_no, status, http_status, replayed).
 */
Datum
idem_create_order(PG_FUNCTION_ARGS)
{
	int64		owner;
	char	   *key;
	int64		sku;
	int32		qty;
	StringInfoData request;
	char		fingerprint[IDEM_HASH_HEX_LEN + 1];
	LOCKTAG		tag;
	CallSite   *site;
	bool		connected = false;
	MemoryContext callercxt = CurrentMemoryContext;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz expires;
	Datum		args[9];
	bool		locked = false;
	bool		executed = false;
	OrderResult res = {0};
	Datum		values[5];
	bool		nulls[5];
	HeapTuple	tuple;

	idem_check_not_null(fcinfo, 0, "owner");
	idem_check_not_null(fcinfo, 1, "key");
	idem_check_not_null(fcinfo, 2, "sku");
	idem_check_not_null(fcinfo, 3, "qty");
	owner = PG_GETARG_INT64(0);
	key = text_to_cstring(PG_GETARG_TEXT_PP(1));
	sku = PG_GETARG_INT64(2);
	qty = PG_GETARG_INT32(3);

	idem_check_key(key, strlen(key));
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

	site = call_site(fcinfo);

	/* the fingerprint: SHA-256 of the canonical {"qty":..,"sku":..} */
	initStringInfo(&request);
	appendStringInfoString(&request, "{\"qty\":");
	idem_jcs_append_number(&request, (double) qty);
	appendStringInfoString(&request, ",\"sku\":");
	idem_jcs_append_number(&request, (double) sku);
	appendStringInfoChar(&request, '}');
	idem_sha256_hex(request.data, request.len, fingerprint);

	expires = now + (TimestampTz) idem_ttl * USECS_PER_SEC;

	/* $1 owner, $2 operation, $3 key, $4 fingerprint, $5 now, $6 expiry, $7 sku, $8 qty; $9 set by a renewal */
	args[0] = Int64GetDatum(owner);
	args[1] = site->operation;
	args[2] = CStringGetTextDatum(key);
	args[3] = CStringGetTextDatum(fingerprint);
	args[4] = TimestampTzGetDatum(now);
	args[5] = TimestampTzGetDatum(expires);
	args[6] = Int64GetDatum(sku);
	args[7] = Int32GetDatum(qty);

	/*
	 * Read first: a finished record the snapshot sees is replayed (or
	 * refused) without a lock or a write.  Otherwise take the key lock, which
	 * waits for an in-flight original, and claim; a lost claim reads again.
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

		found = read_key_record(site, owner, PG_GETARG_DATUM(1), now, &rec);
		if (!found || rec.expired)
		{
			/* no record, or an expired one: this call may execute */
			if (!locked)
			{
				key_locktag(&tag, owner, IDEM_OP_CREATE_ORDER, key);
				if (!lock_key(&tag))
					report_in_flight(owner, IDEM_OP_CREATE_ORDER, key, true);
				locked = true;
				/* an expired record may have been renewed while we waited */
				if (found)
					continue;
			}

			if (!found)
			{
				/* claim with a finished record, and write the order */
				start_writing(&connected, site->nspid);
				exec_plan(order_plans.create, args, SPI_OK_INSERT_RETURNING);
				if (SPI_processed == 1)
				{
					executed = true;
					break;
				}
				continue;		/* lost the claim: read the winner */
			}

			/* expired: the key starts afresh, in place */
			start_writing(&connected, site->nspid);
			args[8] = rec.id;
			exec_plan(order_plans.renew, args, SPI_OK_INSERT_RETURNING);
			if (SPI_processed == 1)
			{
				executed = true;
				break;
			}
			continue;			/* renewed or deleted by another: read again */
		}

		if (!fingerprints_equal(rec.request_hash, fingerprint))
			report_key_reused(owner, IDEM_OP_CREATE_ORDER, key);
		if (!rec.succeeded)
			report_in_flight(owner, IDEM_OP_CREATE_ORDER, key, false);

		/* replay the stored response */
		res.order_id = rec.order_id;
		res.order_no = rec.order_no;
		res.status = rec.status;
		res.http_status = rec.http_status;
		memcpy(res.isnull, rec.isnull, sizeof(res.isnull));
		res.replayed = true;
		break;
	}

	if (executed)
	{
		/* both statements return (order id, order_no, status) */
		res.order_id = result_col(1, &res.isnull[0]);
		res.order_no = result_col(2, &res.isnull[1]);
		res.status = result_col(3, &res.isnull[2]);
		res.http_status = Int32GetDatum(201);
		res.isnull[3] = false;
		res.replayed = false;
	}
	else if (locked)
	{
		/* a replay leaves the key to others at once */
		LockRelease(&tag, ExclusiveLock, false);
	}

	ereport(DEBUG1,
			(errmsg_internal("idem: owner " INT64_FORMAT " operation %s key \"%.8s...\" order " INT64_FORMAT " replayed=%s",
							 owner, IDEM_OP_CREATE_ORDER, key,
							 res.isnull[0] ? INT64CONST(-1) : DatumGetInt64(res.order_id),
							 res.replayed ? "true" : "false")));

	/* form the result outside SPI's memory, which SPI_finish frees */
	MemoryContextSwitchTo(callercxt);
	values[0] = res.order_id;
	values[1] = res.order_no;
	values[2] = res.status;
	values[3] = res.http_status;
	values[4] = BoolGetDatum(res.replayed);
	memcpy(nulls, res.isnull, sizeof(res.isnull));
	nulls[4] = false;
	tuple = heap_form_tuple(site->tupdesc, values, nulls);

	if (connected)
		SPI_finish();
	PG_RETURN_DATUM(HeapTupleGetDatum(tuple));
}
