/*-------------------------------------------------------------------------
 *
 * task_operator.c
 *	  An operator's actions: idem_task_cancel, idem_task_retry,
 *	  idem_task_resolve and idem_task_settle on a task, and the dead-letter
 *	  functions' entry points (idem_outbox_redrive, idem_outbox_discard,
 *	  idem_inbox_redrive), each written to idem_operator_audit.
 *
 * Each runs as its caller until it has taken the caller's names
 * (session_user and current_user), then as idem's owner.  A task's
 * action locks its record, checks the caller's owner and operation
 * bindings (42501), then the task's state against the action's (IK008),
 * ends a lease it finds (a new fencing token: the holder's late call is
 * IK004) and writes the new version; the audit row, in the same
 * transaction, holds who acted, the arguments, the reason and the state
 * before and after.  A dead-letter entry point calls its internal
 * function (the work, the binding checks) as idem's owner and writes an
 * audit row for each message it returns.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "binding.h"
#include "citus.h"
#include "policy.h"
#include "redact.h"
#include "sequence.h"
#include "stats.h"
#include "task_int.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_task_cancel);
PG_FUNCTION_INFO_V1(idem_task_retry);
PG_FUNCTION_INFO_V1(idem_task_resolve);
PG_FUNCTION_INFO_V1(idem_task_settle);
PG_FUNCTION_INFO_V1(idem_outbox_redrive);
PG_FUNCTION_INFO_V1(idem_outbox_discard);
PG_FUNCTION_INFO_V1(idem_inbox_redrive);
PG_FUNCTION_INFO_V1(idem_owner_visible);

/* How long audit rows are kept (idem.operator_audit_ttl), in seconds. */
static int	operator_audit_ttl = 400 * 86400;

enum
{
	AUD_ID, AUD_OWNER, AUD_ACTED, AUD_SESSION, AUD_CURRENT, AUD_ACTION, AUD_TARGET, AUD_TARGET_ID,
	AUD_OPERATION, AUD_KEY, AUD_ARGUMENTS, AUD_REASON, AUD_BEFORE, AUD_AFTER, AUD_EXPIRES, AUD_NCOLS
};

static const IdemColumnSpec audit_columns[AUD_NCOLS] = {
	[AUD_ID] = {"id", INT8OID, 0, false, false},
	[AUD_OWNER] = {"owner_id", INT8OID, 0, false, false},
	[AUD_ACTED] = {"acted_at", TIMESTAMPTZOID, 0, false, false},
	[AUD_SESSION] = {"session_user_name", TEXTOID, 0, false, false},
	[AUD_CURRENT] = {"current_user_name", TEXTOID, 0, false, false},
	[AUD_ACTION] = {"action", TEXTOID, 0, false, false},
	[AUD_TARGET] = {"target", TEXTOID, 0, false, false},
	[AUD_TARGET_ID] = {"target_id", INT8OID, 0, false, false},
	[AUD_OPERATION] = {"operation", TEXTOID, 0, false, false},
	[AUD_KEY] = {"key", TEXTOID, 0, false, false},
	[AUD_ARGUMENTS] = {"arguments", JSONBOID, 0, false, false},
	[AUD_REASON] = {"reason", TEXTOID, 0, false, false},
	[AUD_BEFORE] = {"state_before", JSONBOID, 0, false, false},
	[AUD_AFTER] = {"state_after", JSONBOID, 0, false, false},
	[AUD_EXPIRES] = {"expires_at", TIMESTAMPTZOID, 0, false, false},
};

static const IdemTableSpec audit_spec = {
	"idem_operator_audit", "idem_operator_audit_id_seq", audit_columns, AUD_NCOLS,
	NULL, 0, true, {NULL}
};

static int	audit_table = -1;

/* The states of a task an action is checked against. */
typedef enum TaskState
{
	STATE_DUE,					/* PROCESSING or FAILED_RETRYABLE, not leased */
	STATE_LEASED,				/* leased to a worker */
	STATE_UNCERTAIN,			/* marked, not leased */
	STATE_RECONCILING,			/* marked, leased to a reconciler */
	STATE_FINISHED				/* SUCCEEDED or FAILED_FINAL */
} TaskState;

/* One action on one task. */
typedef struct OpCall
{
	IdemCatalog cat;
	TaskRecord	rec;
	TupleTableSlot *locked;
	const char *action;
	int64		task_id;
	char	   *operation;
	int64		owner;
	char	   *session_role;
	char	   *current_role;
	TimestampTz now;
	IdemStatus	status;
	TaskState	state;
	Datum		before;
} OpCall;

void
idem_operator_init(void)
{
	audit_table = idem_catalog_register(&audit_spec);
	DefineCustomIntVariable("idem.operator_audit_ttl",
							"How long an operator's action is kept in idem_operator_audit.",
							"The cleanup deletes a row this long after the action.",
							&operator_audit_ttl,
							400 * 86400, 86400, INT_MAX,
							PGC_SUSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);
}

/* The caller's names, before anything switches to idem's owner. */
static void
take_names(char **session_role, char **current_role)
{
	*session_role = GetUserNameFromId(GetSessionUserId(), false);
	*current_role = GetUserNameFromId(GetUserId(), false);
}

static const char *
state_name(TaskState state)
{
	static const char *const names[] = {"due", "leased", "uncertain", "reconciling", "finished"};

	return names[state];
}

/* The task's state as JSON: status, state, attempts, worker, token. */
static Datum
state_json(OpCall *oc)
{
	TaskRecord *tr = &oc->rec;
	StringInfoData s;

	initStringInfo(&s);
	appendStringInfo(&s, "{\"status\": \"%s\", \"state\": \"%s\", \"attempts\": %d",
					 TextDatumGetCString(TR_VALUE(tr, REC_STATUS)), state_name(oc->state),
					 TR_ISNULL(tr, REC_TASK_ATTEMPTS) ? 0 : DatumGetInt32(TR_VALUE(tr, REC_TASK_ATTEMPTS)));
	if (!TR_ISNULL(tr, REC_TASK_TOKEN))
		appendStringInfo(&s, ", \"token\": " INT64_FORMAT, DatumGetInt64(TR_VALUE(tr, REC_TASK_TOKEN)));
	appendStringInfoChar(&s, '}');
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(s.data));
}

static TaskState
task_state(OpCall *oc)
{
	TaskRecord *tr = &oc->rec;
	bool		leased = !TR_ISNULL(tr, REC_TASK_LEASE_EXPIRES);

	if (oc->status != IDEM_STATUS_PROCESSING && oc->status != IDEM_STATUS_FAILED_RETRYABLE)
		return STATE_FINISHED;
	if (!TR_ISNULL(tr, REC_TASK_UNCERTAIN))
		return leased ? STATE_RECONCILING : STATE_UNCERTAIN;
	return leased ? STATE_LEASED : STATE_DUE;
}

/*
 * Lock task_id's record, check the caller's bindings (42501) and that the
 * task's state is one of allowed (a bit per TaskState; IK008 otherwise).
 */
static void
begin_action(OpCall *oc, FunctionCallInfo fcinfo, const char *action, int allowed, const char *takes)
{
	TaskRecord *tr = &oc->rec;

	idem_check_not_null(fcinfo, 0, "task_id");
	oc->action = action;
	oc->task_id = PG_GETARG_INT64(0);
	take_names(&oc->session_role, &oc->current_role);
	oc->cat = *idem_catalog(fcinfo);
	task_relations(&oc->cat);
	oc->now = GetCurrentTimestamp();
	if (task_record_lock(tr, &oc->cat, oc->task_id, &oc->locked) != TM_Ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("task " INT64_FORMAT " does not exist", oc->task_id),
				 errdetail("No record has this id: never submitted, or finished and expired.")));
	task_record_take(tr, oc->locked);
	oc->operation = TextDatumGetCString(TR_VALUE(tr, REC_OPERATION));
	oc->owner = DatumGetInt64(TR_VALUE(tr, REC_OWNER));
	idem_check_owner(oc->owner);
	idem_check_operation_allowed(oc->operation);
	if (TR_ISNULL(tr, REC_TASK_ATTEMPTS))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("record " INT64_FORMAT " is not a task", oc->task_id),
				 errdetail("It was written by a synchronous call, not by idem_submit.")));
	oc->status = idem_status_from_name(TextDatumGetCString(TR_VALUE(tr, REC_STATUS)));
	oc->state = task_state(oc);
	if (!(allowed & (1 << oc->state)) ||
		(strcmp(action, "retry") == 0 && oc->status != IDEM_STATUS_FAILED_RETRYABLE))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_TASK_STATE_CONFLICT),
				 errmsg("action not allowed in the task's state: %s of task " INT64_FORMAT " (%s, %s)",
						action, oc->task_id, idem_status_name(oc->status), state_name(oc->state)),
				 errdetail("%s takes a task that is %s.", action, takes)));
	oc->before = state_json(oc);
}

/* End a lease the task has: the holder's token is stale from now (IK004). */
static void
fence(OpCall *oc)
{
	TaskRecord *tr = &oc->rec;

	if (TR_ISNULL(tr, REC_TASK_LEASE_EXPIRES))
		return;
	TR_SET(tr, REC_TASK_TOKEN, Int64GetDatum(idem_nextval(idem_task_token_seq, false)));
	TR_CLEAR(tr, REC_TASK_LEASE_EXPIRES);
	TR_CLEAR(tr, REC_TASK_SESSION);
}

/*
 * Write one row of idem_operator_audit for a message, as idem's owner (the
 * caller is already), by a statement (on Citus, routed to the owner's
 * shard): who (the names taken before), the action on target target_id of
 * owner, topic (or consumer) and key, its arguments and reason, the state
 * before and after.
 */
static void
audit(const IdemCatalog *cat, const char *session_role, const char *current_role, const char *action,
	  const char *target, int64 target_id, int64 owner, const char *operation, const char *key,
	  Datum arguments, const char *reason, Datum before, Datum after)
{
	Oid			types[14] = {INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID, TEXTOID, TEXTOID,
	JSONBOID, TEXTOID, JSONBOID, JSONBOID, INTERVALOID, INT8OID};
	Datum		values[14];
	char		nulls[14];
	Interval   *ttl;

	values[0] = Int64GetDatum(owner);
	values[1] = CStringGetTextDatum(session_role);
	values[2] = CStringGetTextDatum(current_role);
	values[3] = CStringGetTextDatum(action);
	values[4] = CStringGetTextDatum(target);
	values[5] = Int64GetDatum(target_id);
	values[6] = operation ? CStringGetTextDatum(operation) : (Datum) 0;
	values[7] = key ? CStringGetTextDatum(key) : (Datum) 0;
	values[8] = arguments;
	values[9] = reason ? CStringGetTextDatum(reason) : (Datum) 0;
	values[10] = before;
	values[11] = after;
	ttl = palloc0(sizeof(Interval));
	ttl->time = (int64) operator_audit_ttl * USECS_PER_SEC;
	values[12] = IntervalPGetDatum(ttl);
	values[13] = Int64GetDatum(idem_nextval(cat->tables[audit_table].seq, false));
	for (int i = 0; i < 14; i++)
		nulls[i] = values[i] == (Datum) 0 && i != 0 && i != 5 && i != 13 ? 'n' : ' ';
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idem: SPI_connect failed");
	if (SPI_execute_with_args(psprintf("INSERT INTO %s.idem_operator_audit"
									   " (owner_id, session_user_name, current_user_name, action, target, target_id,"
									   "  operation, key, arguments, reason, state_before, state_after, acted_at, expires_at, id)"
									   " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,"
									   "  pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $13, $14)",
									   idem_quoted_schema(cat->nspid)),
							  14, types, values, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "idem: could not write the operator's audit row");
	SPI_finish();
}

/*
 * The audit row of a task's action, written as the record is, into the
 * table (or on Citus the shard co-located with the owner's records, on
 * this node): a routed insert from within the task call could not run.
 */
static void
audit_task(OpCall *oc, const char *reason, Datum arguments, Datum after)
{
	IdemCatalog local;
	const IdemTableLayout *t = idem_citus_owner_table(&local, &oc->cat, audit_table, oc->owner);
	IdemRows	rows;
	IdemRow		row;
	TimestampTz now = GetCurrentTimestamp();

	if (t == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table idem_operator_audit is missing"),
				 errhint("Update the extension: ALTER EXTENSION idem UPDATE.")));
	idem_rows_begin(&rows, &t->relid, 1, CMD_INSERT);
	idem_row_init(&row, t);
	idem_row_set(&row, AUD_ID, Int64GetDatum(idem_nextval(t->seq, false)));
	idem_row_set(&row, AUD_OWNER, Int64GetDatum(oc->owner));
	idem_row_set(&row, AUD_ACTED, TimestampTzGetDatum(now));
	idem_row_set(&row, AUD_SESSION, CStringGetTextDatum(oc->session_role));
	idem_row_set(&row, AUD_CURRENT, CStringGetTextDatum(oc->current_role));
	idem_row_set(&row, AUD_ACTION, CStringGetTextDatum(oc->action));
	idem_row_set(&row, AUD_TARGET, CStringGetTextDatum("task"));
	idem_row_set(&row, AUD_TARGET_ID, Int64GetDatum(oc->task_id));
	idem_row_set(&row, AUD_OPERATION, CStringGetTextDatum(oc->operation));
	idem_row_set(&row, AUD_KEY, TR_VALUE(&oc->rec, REC_KEY));
	if (arguments != (Datum) 0)
		idem_row_set(&row, AUD_ARGUMENTS, arguments);
	idem_row_set(&row, AUD_REASON, CStringGetTextDatum(reason));
	idem_row_set(&row, AUD_BEFORE, oc->before);
	idem_row_set(&row, AUD_AFTER, after);
	idem_row_set(&row, AUD_EXPIRES, TimestampTzGetDatum(now + (int64) operator_audit_ttl * USECS_PER_SEC));
	idem_rows_insert(&rows, 0, row.values, row.nulls);
	idem_rows_end(&rows);
}

/* Write the new version and its audit row (arguments: the action's, or 0). */
static Datum
end_action(OpCall *oc, const char *reason, Datum arguments)
{
	TaskRecord *tr = &oc->rec;
	IdemStatus	status = idem_status_from_name(TextDatumGetCString(TR_VALUE(tr, REC_STATUS)));

	TR_SET(tr, REC_UPDATED, TimestampTzGetDatum(oc->now));
	task_record_write(tr, oc->locked);
	oc->status = status;
	oc->state = task_state(oc);
	audit_task(oc, reason, arguments, state_json(oc));
	task_record_close(tr);
	return CStringGetTextDatum(idem_status_name(status));
}

/* The reason argument argno: not NULL, not empty (22023). */
static const char *
reason_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *reason;

	idem_check_not_null(fcinfo, argno, "reason");
	reason = TextDatumGetCString(PG_GETARG_DATUM(argno));
	if (reason[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("an operator's action needs a reason"),
				 errhint("Say why, for whoever reads idem_operator_audit later.")));
	return reason;
}

#define ANY_UNFINISHED ((1 << STATE_DUE) | (1 << STATE_LEASED) | (1 << STATE_UNCERTAIN) | (1 << STATE_RECONCILING))
#define ANY_UNCERTAIN ((1 << STATE_UNCERTAIN) | (1 << STATE_RECONCILING))
#define UNFINISHED_TEXT "unfinished (due, leased, uncertain or reconciling)"

/*
 * Store the answer http_status/body/resource_id/headers (arguments from
 * argno on) as the task's result: SUCCEEDED for 2xx/3xx, FAILED_FINAL for
 * 4xx; the answer redacted as any other.  Its arguments as JSON.
 */
static Datum
store_answer(OpCall *oc, FunctionCallInfo fcinfo, int http_arg, int body_arg, int resource_arg, int headers_arg)
{
	TaskRecord *tr = &oc->rec;
	IdemResult	res;
	IdemStatus	status;
	bool		no_headers = headers_arg < 0 || PG_ARGISNULL(headers_arg);
	Datum		body;
	StringInfoData args;

	status = idem_result_make(&res, false, PG_GETARG_INT32(http_arg),
							  PG_ARGISNULL(body_arg), PG_ARGISNULL(body_arg) ? (Datum) 0 : PG_GETARG_DATUM(body_arg),
							  no_headers, no_headers ? (Datum) 0 : PG_GETARG_DATUM(headers_arg),
							  PG_ARGISNULL(resource_arg), PG_ARGISNULL(resource_arg) ? 0 : PG_GETARG_INT64(resource_arg));
	fence(oc);
	task_record_end(tr, status, oc->now, oc->operation);
	TR_SET(tr, REC_HTTP, Int32GetDatum(res.http_status));
	body = res.body_isnull ? res.body : idem_redact_json(oc->operation, res.body);
	task_record_put(tr, REC_BODY, body, res.body_isnull);
	task_record_put(tr, REC_HEADERS, res.headers_isnull ? res.headers : idem_redact_headers(oc->operation, res.headers),
					res.headers_isnull);
	task_record_put(tr, REC_RESOURCE, Int64GetDatum(res.resource_id), res.resource_isnull);
	initStringInfo(&args);
	appendStringInfo(&args, "{\"http_status\": %d, \"body\": %s", res.http_status,
					 res.body_isnull ? "null" : TextDatumGetCString(body));
	if (!res.resource_isnull)
		appendStringInfo(&args, ", \"resource_id\": " INT64_FORMAT, res.resource_id);
	appendStringInfoChar(&args, '}');
	if (status == IDEM_STATUS_FAILED_FINAL)
		idem_stats_count_at_commit(IDEM_KIND_OPERATION, oc->operation, IDEM_STAT_FAILED_FINAL, 1);
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(args.data));
}

/*
 * SQL: idem_task_cancel(task_id, reason) returns the new status: an
 * unfinished task (its lease ended, its mark gone) ends FAILED_FINAL, HTTP
 * 500, body {"error": {"cancelled": reason}}.
 */
Datum
idem_task_cancel(PG_FUNCTION_ARGS)
{
	OpCall		oc = {0};
	const char *reason = reason_arg(fcinfo, 1);
	StringInfoData error;

	begin_action(&oc, fcinfo, "cancel", ANY_UNFINISHED, UNFINISHED_TEXT);
	fence(&oc);
	initStringInfo(&error);
	appendStringInfoString(&error, "{\"cancelled\": ");
	escape_json(&error, reason);
	appendStringInfoChar(&error, '}');
	task_record_fail(&oc.rec, DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(error.data))),
					 oc.now, oc.operation);
	idem_stats_count_at_commit(IDEM_KIND_OPERATION, oc.operation, IDEM_STAT_FAILED_FINAL, 1);
	PG_RETURN_DATUM(end_action(&oc, reason, (Datum) 0));
}

/*
 * SQL: idem_task_retry(task_id, reason): a task waiting for its next
 * attempt (FAILED_RETRYABLE) is due now.
 */
Datum
idem_task_retry(PG_FUNCTION_ARGS)
{
	OpCall		oc = {0};
	const char *reason = reason_arg(fcinfo, 1);

	begin_action(&oc, fcinfo, "retry", 1 << STATE_DUE,
				 "FAILED_RETRYABLE and waiting for its next attempt (not leased, not uncertain)");
	TR_SET(&oc.rec, REC_TASK_DUE, TimestampTzGetDatum(oc.now));
	PG_RETURN_DATUM(end_action(&oc, reason, (Datum) 0));
}

/*
 * SQL: idem_task_resolve(task_id, http_status, body, reason, resource_id,
 * headers): an unfinished task ends with this answer, as idem_complete
 * would store it; the client's repeat gets it.
 */
Datum
idem_task_resolve(PG_FUNCTION_ARGS)
{
	OpCall		oc = {0};
	const char *reason;
	Datum		args;

	idem_check_not_null(fcinfo, 1, "http_status");
	reason = reason_arg(fcinfo, 3);
	begin_action(&oc, fcinfo, "resolve", ANY_UNFINISHED, UNFINISHED_TEXT);
	args = store_answer(&oc, fcinfo, 1, 2, 4, 5);
	PG_RETURN_DATUM(end_action(&oc, reason, args));
}

/*
 * SQL: idem_task_settle(task_id, happened, reason, http_status, body,
 * resource_id): a task whose outcome is uncertain, settled from what the
 * provider says.  Happened: the answer (http_status required) is stored.
 * Did not happen: FAILED_RETRYABLE, due now.
 */
Datum
idem_task_settle(PG_FUNCTION_ARGS)
{
	OpCall		oc = {0};
	const char *reason;
	Datum		args = (Datum) 0;

	idem_check_not_null(fcinfo, 1, "happened");
	reason = reason_arg(fcinfo, 2);
	if (PG_GETARG_BOOL(1))
		idem_check_not_null(fcinfo, 3, "http_status");
	begin_action(&oc, fcinfo, "settle", ANY_UNCERTAIN,
				 "uncertain or reconciling (marked by an attempt of unknown outcome)");
	if (PG_GETARG_BOOL(1))
		args = store_answer(&oc, fcinfo, 3, 4, 5, -1);
	else
	{
		TaskRecord *tr = &oc.rec;

		fence(&oc);
		TR_SET(tr, REC_STATUS, CStringGetTextDatum(idem_status_name(IDEM_STATUS_FAILED_RETRYABLE)));
		TR_SET(tr, REC_TASK_DUE, TimestampTzGetDatum(oc.now));
		task_record_unmark(tr);
		args = DirectFunctionCall1(jsonb_in, CStringGetDatum("{\"happened\": false}"));
	}
	PG_RETURN_DATUM(end_action(&oc, reason, args));
}

/* ---------- dead letters ---------- */

/*
 * Call idem_internal.<internal>(args...) as idem's owner: it does the work
 * and returns a row per message acted on (owner_id, message_id, topic,
 * msg_key, state_before, state_after); an audit row is written for each.
 * Returns how many.  nargs arguments of types types, the reason last.
 */
static Datum
dead_letter_call(FunctionCallInfo fcinfo, const char *action, const char *internal, int nargs,
				 const Oid *types)
{
	const IdemCatalog *cat = idem_catalog(fcinfo);
	IdemIdentity identity = {0};
	char	   *session_role;
	char	   *current_role;
	Datum		values[4];
	char		nulls[4];
	StringInfoData sql;
	const char *reason = PG_ARGISNULL(nargs - 1) ? NULL : TextDatumGetCString(PG_GETARG_DATUM(nargs - 1));
	uint64		n;
	SPITupleTable *rows;

	take_names(&session_role, &current_role);
	initStringInfo(&sql);
	appendStringInfo(&sql, "SELECT * FROM %s.%s(", idem_quoted_schema(cat->nspid), internal);
	for (int i = 0; i < nargs; i++)
	{
		values[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
		appendStringInfo(&sql, "%s$%d", i ? ", " : "", i + 1);
	}
	appendStringInfoChar(&sql, ')');
	idem_become_owner(&identity, cat->owner);
	idem_use_safe_search_path(&identity);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idem: SPI_connect failed");
	if (SPI_execute_with_args(sql.data, nargs, (Oid *) types, values, nulls, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "idem: %s failed", internal);
	n = SPI_processed;
	rows = SPI_tuptable;
	for (uint64 i = 0; i < n; i++)
	{
		Datum		d[6];
		bool		isnull[6];

		heap_deform_tuple(rows->vals[i], rows->tupdesc, d, isnull);
		audit(cat, session_role, current_role, action, "message", isnull[1] ? 0 : DatumGetInt64(d[1]),
			  isnull[0] ? 0 : DatumGetInt64(d[0]), TextDatumGetCString(d[2]),
			  isnull[3] ? NULL : TextDatumGetCString(d[3]), (Datum) 0, reason,
			  isnull[4] ? (Datum) 0 : d[4], isnull[5] ? (Datum) 0 : d[5]);
	}
	SPI_finish();
	idem_restore_caller(&identity);
	PG_RETURN_INT64((int64) n);
}

/* SQL: idem_outbox_redrive(message_ids, reason) returns how many. */
Datum
idem_outbox_redrive(PG_FUNCTION_ARGS)
{
	static const Oid types[2] = {INT8ARRAYOID, TEXTOID};

	return dead_letter_call(fcinfo, "redrive", "idem_outbox_redrive_rows", 2, types);
}

/* SQL: idem_outbox_discard(message_ids, reason) returns how many. */
Datum
idem_outbox_discard(PG_FUNCTION_ARGS)
{
	static const Oid types[2] = {INT8ARRAYOID, TEXTOID};

	return dead_letter_call(fcinfo, "discard", "idem_outbox_discard_rows", 2, types);
}

/* SQL: idem_inbox_redrive(consumer, message_ids, discard, reason) returns how many. */
Datum
idem_inbox_redrive(PG_FUNCTION_ARGS)
{
	static const Oid types[4] = {TEXTOID, TEXTARRAYOID, BOOLOID, TEXTOID};

	return dead_letter_call(fcinfo, PG_ARGISNULL(2) || !PG_GETARG_BOOL(2) ? "redrive" : "discard",
							"idem_inbox_redrive_rows", 4, types);
}

/*
 * SQL: idem_internal.idem_owner_visible(owner): whether the caller's
 * idem.allowed_owners lets it act for owner (true for NULL: a message
 * without one).  For the dead-letter functions' internals, which run as
 * idem's owner with the caller's settings.
 */
Datum
idem_owner_visible(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(PG_ARGISNULL(0) || idem_owner_allowed(PG_GETARG_INT64(0)));
}
