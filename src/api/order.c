/*-------------------------------------------------------------------------
 *
 * order.c
 *	  The article's "create an order" flow, idem_create_order, a thin user
 *	  of the protocol core.
 *
 * Operation CREATE_ORDER.  The fingerprint is idem_request_hash of
 * {"qty": qty, "sku": sku}; the digest is of that canonical text.  A new
 * key (or an expired one) inserts the order in one IdemRows with the
 * finished record.  The order's id comes from its sequence, its order_no
 * is 'ORD-' and the id in at least 12 digits, its status CREATED.  The
 * record's response (response_json) is {orderId, orderNo, status} with
 * HTTP status 201.  A replay decodes that response.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "sequence.h"
#include "citus.h"
#include "claim.h"
#include "binding.h"
#include "stats.h"
#include "order.h"
#include "jcs.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_create_order);

#define ORDER_OPERATION		"CREATE_ORDER"
#define ORDER_HTTP_CREATED	201
#define ORDER_CREATED		"CREATED"
#define ORDER_QTY_MIN		1
#define ORDER_QTY_MAX		100
/* JSON numbers are doubles, so larger integers would fingerprint ambiguously */
#define ORDER_MAX_SAFE_INTEGER	INT64CONST(9007199254740991)

enum
{
	ORD_ID, ORD_NO, ORD_OWNER, ORD_SKU, ORD_QTY, ORD_STATUS, ORD_CREATED, ORD_NCOLS
};

static const IdemColumnSpec order_columns[ORD_NCOLS] = {
	[ORD_ID] = {"id", INT8OID, 0, false, false},
	[ORD_NO] = {"order_no", VARCHAROID, 4 + MAXINT8LEN, false, false},
	[ORD_OWNER] = {"owner_id", INT8OID, 0, false, false},
	[ORD_SKU] = {"sku_id", INT8OID, 0, false, false},
	[ORD_QTY] = {"quantity", INT4OID, 0, false, false},
	[ORD_STATUS] = {"status", VARCHAROID, 7, false, false},
	[ORD_CREATED] = {"created_at", TIMESTAMPTZOID, 0, false, false},
};

static const IdemTableSpec order_table = {
	"purchase_order", "purchase_order_id_seq", order_columns, ORD_NCOLS,
	NULL, 0, false, {NULL}
};

/* Its index in IdemCatalog.tables. */
static int	order_table_index = -1;

/* idem_create_order's result columns. */
enum
{
	RES_ORDER_ID, RES_ORDER_NO, RES_STATUS, RES_HTTP, RES_REPLAYED, RES_NCOLS
};

/* An order call, with its request and its answer. */
typedef struct OrderCall
{
	const IdemCatalog *cat;
	int64		owner;
	int64		sku;
	int32		qty;
	TimestampTz now;
	Datum		order_id;		/* drawn before the record is written */
	Datum		order_no;
	Datum		values[RES_NCOLS];	/* the answer */
	bool		nulls[RES_NCOLS];
} OrderCall;

/* Register the order table with the catalog. */
void
idem_order_init(void)
{
	order_table_index = idem_catalog_register(&order_table);
}

/* Push a string (a key or a value) onto a jsonb under construction. */
static void
push_jsonb_string(IdemJsonbBuild *b, JsonbIteratorToken token,
				  const char *str, int len)
{
	JsonbValue	v;

	v.type = jbvString;
	v.val.string.val = (char *) str;
	v.val.string.len = len;
	idem_jsonb_push(b, token, &v);
}

/* Push a text Datum, or JSON null, as a value. */
static void
push_jsonb_text(IdemJsonbBuild *b, Datum value, bool isnull)
{
	JsonbValue	v;

	if (isnull)
	{
		v.type = jbvNull;
		idem_jsonb_push(b, WJB_VALUE, &v);
		return;
	}
	push_jsonb_string(b, WJB_VALUE, VARDATA_ANY(DatumGetTextPP(value)),
					  VARSIZE_ANY_EXHDR(DatumGetTextPP(value)));
}

/*
 * The response snapshot stored on the record, from the answer:
 * {orderId, orderNo, status}, a NULL column as JSON null.
 */
static Datum
order_response(const OrderCall *call)
{
	IdemJsonbBuild b = {0};
	JsonbValue	v;

	idem_jsonb_push(&b, WJB_BEGIN_OBJECT, NULL);
	push_jsonb_string(&b, WJB_KEY, "orderId", 7);
	if (call->nulls[RES_ORDER_ID])
		v.type = jbvNull;
	else
	{
		v.type = jbvNumeric;
		v.val.numeric = int64_to_numeric(DatumGetInt64(call->values[RES_ORDER_ID]));
	}
	idem_jsonb_push(&b, WJB_VALUE, &v);
	push_jsonb_string(&b, WJB_KEY, "orderNo", 7);
	push_jsonb_text(&b, call->values[RES_ORDER_NO], call->nulls[RES_ORDER_NO]);
	push_jsonb_string(&b, WJB_KEY, "status", 6);
	push_jsonb_text(&b, call->values[RES_STATUS], call->nulls[RES_STATUS]);
	idem_jsonb_push(&b, WJB_END_OBJECT, NULL);
	return JsonbPGetDatum(JsonbValueToJsonb(idem_jsonb_result(&b)));
}

/*
 * The order number of order id: 'ORD-' and the id, zero-padded to 12
 * digits; an id of more digits is written whole (never truncated, so two
 * orders never share a number).
 */
static Datum
order_number(int64 id)
{
	char		digits[MAXINT8LEN + 1];
	char		no[4 + MAXINT8LEN + 1] = "ORD-";
	int			len = pg_lltoa(id, digits);
	int			pad = len < 12 ? 12 - len : 0;

	memset(no + 4, '0', pad);
	memcpy(no + 4 + pad, digits, len + 1);
	return CStringGetTextDatum(no);
}

/* A text column of the stored order, copied; or NULL. */
static void
answer_text(OrderCall *call, int res, TupleTableSlot *slot, AttrNumber attnum)
{
	Datum		d = slot_getattr(slot, attnum, &call->nulls[res]);

	call->values[res] = call->nulls[res] ? (Datum) 0 : PointerGetDatum(DatumGetTextPCopy(d));
}

/*
 * Insert the order (IdemBusinessWrite callback), and answer with the order
 * as stored, a BEFORE trigger may have changed it.  The record's response
 * is built from the same row, so every replay answers what this call did.
 */
static void
order_write(IdemRows *rows, void *arg, IdemResult *res)
{
	OrderCall  *call = (OrderCall *) arg;
	const IdemTableLayout *t = &call->cat->tables[order_table_index];
	TupleTableSlot *slot;
	IdemRow		order;

	idem_row_init(&order, t);
	idem_row_set(&order, ORD_ID, call->order_id);
	idem_row_set(&order, ORD_NO, call->order_no);
	idem_row_set(&order, ORD_OWNER, Int64GetDatum(call->owner));
	idem_row_set(&order, ORD_SKU, Int64GetDatum(call->sku));
	idem_row_set(&order, ORD_QTY, Int32GetDatum(call->qty));
	idem_row_set(&order, ORD_STATUS, CStringGetTextDatum(ORDER_CREATED));
	idem_row_set(&order, ORD_CREATED, TimestampTzGetDatum(call->now));
	idem_rows_insert(rows, 1, order.values, order.nulls);

	slot = rows->slots[1];
	call->values[RES_ORDER_ID] = slot_getattr(slot, t->att[ORD_ID], &call->nulls[RES_ORDER_ID]);
	answer_text(call, RES_ORDER_NO, slot, t->att[ORD_NO]);
	answer_text(call, RES_STATUS, slot, t->att[ORD_STATUS]);
	res->snapshot = order_response(call);
	res->snapshot_isnull = false;
	res->resource_isnull = call->nulls[RES_ORDER_ID];
	res->resource_id = call->nulls[RES_ORDER_ID] ? 0 : DatumGetInt64(call->values[RES_ORDER_ID]);
}

/* Execute, drawing the order id and writing record and order. */
static void
order_execute(OrderCall *call, const IdemScope *scope, IdemRequestPrint *print)
{
	const IdemTableLayout *t = &call->cat->tables[order_table_index];
	IdemResult	res = {0};
	IdemBusinessWrite biz = {order_table_index, order_write, call};

	/* an INSERT's error in a read-only transaction, before nextval's */
	PreventCommandIfReadOnly("INSERT");
	/* the order id first, then the record's */
	call->order_id = Int64GetDatum(idem_nextval(t->seq, true));
	call->order_no = order_number(DatumGetInt64(call->order_id));

	res.http_status = ORDER_HTTP_CREATED;
	res.body_isnull = true;
	res.headers_isnull = true;
	idem_record_insert(call->cat, scope, print, IDEM_STATUS_SUCCEEDED, &res,
					   call->now, idem_record_expiry(IDEM_STATUS_SUCCEEDED, call->now, NULL, scope->operation),
					   &biz, NULL);
	call->values[RES_HTTP] = Int32GetDatum(ORDER_HTTP_CREATED);
	call->nulls[RES_HTTP] = false;
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

/* Answer with the stored response of a finished record. */
static void
order_replay(OrderCall *call, const IdemResult *stored)
{
	call->values[RES_HTTP] = Int32GetDatum(stored->http_status);
	call->nulls[RES_HTTP] = stored->http_isnull;
	call->nulls[RES_ORDER_ID] = call->nulls[RES_ORDER_NO] = call->nulls[RES_STATUS] = true;
	if (!stored->snapshot_isnull)
	{
		Jsonb	   *jb = DatumGetJsonbP(stored->snapshot);
		JsonbValue	v;

		if (getKeyJsonValueFromContainer(&jb->root, "orderId", 7, &v) &&
			v.type == jbvNumeric)
		{
			call->values[RES_ORDER_ID] = DirectFunctionCall1(numeric_int8,
															 NumericGetDatum(v.val.numeric));
			call->nulls[RES_ORDER_ID] = false;
		}
		call->nulls[RES_ORDER_NO] = !jsonb_text_field(jb, "orderNo", &call->values[RES_ORDER_NO]);
		call->nulls[RES_STATUS] = !jsonb_text_field(jb, "status", &call->values[RES_STATUS]);
	}
}

/* Refuse a quantity or sku outside the demo's range (22023). */
static void
check_order_request(int64 sku, int32 qty)
{
	if (qty < ORDER_QTY_MIN || qty > ORDER_QTY_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("qty must be between %d and %d", ORDER_QTY_MIN, ORDER_QTY_MAX),
				 errdetail("The request has qty %d.", qty)));
	if (sku < -ORDER_MAX_SAFE_INTEGER || sku > ORDER_MAX_SAFE_INTEGER)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("sku must be between -9007199254740991 and 9007199254740991"),
				 errdetail("The request fingerprint holds sku as a JSON number, exact only up to 2^53 - 1.")));
}

/*
 * The request's canonical text, {"qty":..,"sku":..} (keys in JCS order):
 * its SHA-256 is the fingerprint, its bytes the digest a replay compares.
 */
static void
order_request_text(int64 sku, int32 qty, StringInfo request)
{
	initStringInfo(request);
	appendStringInfoString(request, "{\"qty\":");
	idem_jcs_append_number(request, (double) qty);
	appendStringInfoString(request, ",\"sku\":");
	idem_jcs_append_number(request, (double) sku);
	appendStringInfoChar(request, '}');
}

/*
 * idem_create_order's arguments: 22004 for a NULL, 22023 for a bad key,
 * 42501 for an owner or an operation outside the session's binding.  The
 * operation is CREATE_ORDER.
 */
static void
order_args(FunctionCallInfo fcinfo, IdemScope *scope, OrderCall *call)
{
	text	   *key;

	idem_check_not_null(fcinfo, 0, "owner");
	idem_check_not_null(fcinfo, 1, "key");
	idem_check_not_null(fcinfo, 2, "sku");
	idem_check_not_null(fcinfo, 3, "qty");
	key = PG_GETARG_TEXT_PP(1);
	scope->owner = PG_GETARG_INT64(0);
	idem_check_owner(scope->owner);
	idem_check_operation_allowed(ORDER_OPERATION);
	scope->operation = ORDER_OPERATION;
	scope->operation_text = CStringGetTextDatum(ORDER_OPERATION);
	idem_scope_set_key(scope, PointerGetDatum(key));
	call->owner = scope->owner;
	call->sku = PG_GETARG_INT64(2);
	call->qty = PG_GETARG_INT32(3);
}

/* The answer's replayed column, and the outcome's log lines. */
static void
order_note(OrderCall *call, const IdemScope *scope, IdemOutcome outcome)
{
	bool		has_order = !call->nulls[RES_ORDER_ID];
	int64		order_id = has_order ? DatumGetInt64(call->values[RES_ORDER_ID]) : INT64CONST(-1);

	call->values[RES_REPLAYED] = BoolGetDatum(outcome == IDEM_REPLAY);
	call->nulls[RES_REPLAYED] = false;
	if (outcome == IDEM_EXECUTE)
		idem_note_outcome(scope, IDEM_LOG_EXECUTED, has_order, has_order ? order_id : 0);
	ereport(DEBUG1,
			(errmsg_internal("idem: owner " INT64_FORMAT " operation %s key \"%.8s...\" order " INT64_FORMAT " replayed=%s",
							 scope->owner, scope->operation, scope->key, order_id,
							 outcome == IDEM_REPLAY ? "true" : "false")));
}

/*
 * The idem_order_outcome row of the answer.  Its attributes in order, past
 * any a DROP ATTRIBUTE left behind; any other count is 55000.
 */
static Datum
order_result(TupleDesc desc, const OrderCall *call)
{
	Datum	   *values = palloc0(desc->natts * sizeof(Datum));
	bool	   *nulls = palloc(desc->natts * sizeof(bool));
	int			live = 0;

	for (int i = 0; i < desc->natts; i++)
	{
		nulls[i] = true;
		if (TupleDescAttr(desc, i)->attisdropped)
			continue;
		if (live < RES_NCOLS)
		{
			values[i] = call->values[live];
			nulls[i] = call->nulls[live];
		}
		live++;
	}
	if (live != RES_NCOLS)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's type idem_order_outcome was altered: it must have %d attributes",
						RES_NCOLS),
				 errhint("Undo the change, or drop and re-create the extension idem.")));
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

/*
 * SQL: idem_create_order(owner, key, sku, qty) returns
 * (order_id, order_no, status, http_status, replayed).
 */
Datum
idem_create_order(PG_FUNCTION_ARGS)
{
	IdemCatalog cat;
	IdemScope	scope;
	IdemRequestPrint print;
	StringInfoData request;
	IdemIdentity identity = {0};
	OrderCall	call = {0};
	IdemClaim	claim = {0};
	IdemOutcome outcome;

	order_args(fcinfo, &scope, &call);
	/* a copy, since a nested call may build the catalog again under us */
	cat = *idem_catalog(fcinfo);
	if (!idem_citus_route(&cat, IDEM_TABLE_RECORD, Int64GetDatum(scope.owner), INT8OID) ||
		!idem_citus_route(&cat, order_table_index, Int64GetDatum(scope.owner), INT8OID))
		return idem_citus_redispatch(fcinfo);
	idem_stats_count(IDEM_KIND_OPERATION, scope.operation, IDEM_STAT_CALLS, 1);
	check_order_request(call.sku, call.qty);
	call.cat = &cat;
	call.now = GetCurrentTransactionStartTimestamp();
	/* no request document: the canonical text of its two numbers decides */
	order_request_text(call.sku, call.qty, &request);
	idem_print_of_text(&print, request.data, request.len);

	outcome = idem_claim(&claim, &cat, &scope, &print, call.now, &identity);
	if (outcome == IDEM_EXECUTE)
	{
		idem_use_safe_search_path(&identity);
		order_execute(&call, &scope, &print);
		idem_claim_written(&claim);
	}
	else
		order_replay(&call, &claim.rec.result);
	idem_restore_caller(&identity);

	order_note(&call, &scope, outcome);
	PG_RETURN_DATUM(order_result(idem_catalog_result(&cat, fcinfo), &call));
}
