/*-------------------------------------------------------------------------
 *
 * maintenance.c
 *	  The SQL face of idem's upkeep.  idem_cleanup_expired (cleanup.c),
 *	  idem_cleanup_status and the preload notice (worker.c), and
 *	  idem_timeline_mark (sequence.c).
 *
 * Each checks its arguments and calls the module that does the work;
 * idem_cleanup_expired is also what a Citus coordinator's cleanup calls on
 * each worker node, as idem_internal.idem_cleanup_node (citus.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/elog.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "idem.h"
#include "util.h"
#include "sequence.h"
#include "citus.h"
#include "cleanup.h"
#include "worker.h"

PG_FUNCTION_INFO_V1(idem_cleanup_expired);
PG_FUNCTION_INFO_V1(idem_cleanup_status);
PG_FUNCTION_INFO_V1(idem_cleanup_worker_notice);
PG_FUNCTION_INFO_V1(idem_timeline_mark);

static void status_row(const IdemDbStatus *st, void *arg);

/* SQL: idem_cleanup_expired(batch_size integer, max_batches integer) returns bigint */
Datum
idem_cleanup_expired(PG_FUNCTION_ARGS)
{
	int32		batch_size;
	int32		max_batches = -1;
	Oid			nspid;
	int64		deleted;

	idem_check_not_null(fcinfo, 0, "batch_size");
	batch_size = PG_GETARG_INT32(0);
	if (batch_size < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be at least 1"),
				 errdetail("The call has batch_size %d.", batch_size)));
	if (!PG_ARGISNULL(1))
	{
		max_batches = PG_GETARG_INT32(1);
		if (max_batches < 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_batches must be at least 1, or NULL for no limit"),
					 errdetail("The call has max_batches %d.", max_batches)));
	}

	nspid = idem_function_tables_schema(fcinfo);
	deleted = idem_cleanup_batches(nspid, batch_size, max_batches);
	/* a Citus coordinator cleans every worker's shards too */
	deleted += idem_citus_cleanup_workers(nspid, batch_size, max_batches);
	PG_RETURN_INT64(deleted);
}

/*
 * SQL: idem_cleanup_status() returns setof record, one row per database in
 * which the worker found the extension since the server started.  Empty
 * when idem is not in shared_preload_libraries.
 */
Datum
idem_cleanup_status(PG_FUNCTION_ARGS)
{
	InitMaterializedSRF(fcinfo, 0);
	idem_worker_status_visit(status_row, fcinfo->resultinfo);
	return (Datum) 0;
}

/* One row of idem_cleanup_status. */
static void
status_row(const IdemDbStatus *st, void *arg)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) arg;
	Datum		values[9];
	bool		nulls[9] = {false};

	values[0] = ObjectIdGetDatum(st->datid);
	values[1] = NameGetDatum(&st->datname);
	values[2] = TimestampTzGetDatum(st->last_run_started);
	values[3] = TimestampTzGetDatum(st->last_run_finished);
	nulls[3] = st->last_run_finished == 0;
	values[4] = Int64GetDatum(st->last_run_deleted);
	values[5] = Int64GetDatum(st->total_deleted);
	values[6] = Int64GetDatum(st->runs);
	values[7] = CStringGetTextDatum(st->last_error);
	nulls[7] = st->last_error_at == 0;
	values[8] = TimestampTzGetDatum(st->last_error_at);
	nulls[8] = st->last_error_at == 0;
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * Raise a NOTICE when idem is not preloaded, so CREATE EXTENSION says that
 * expired records will not be cleaned by themselves.  The install script
 * calls idem_internal.idem_cleanup_worker_notice() once.  CREATE EXTENSION
 * runs its script with client_min_messages raised to WARNING, which would
 * swallow the NOTICE, so it is let through here.
 */
Datum
idem_cleanup_worker_notice(PG_FUNCTION_ARGS)
{
	int			save_client_min_messages = client_min_messages;

	if (idem_worker_preloaded())
		PG_RETURN_VOID();

	client_min_messages = Min(client_min_messages, NOTICE);
	PG_TRY();
	{
		ereport(NOTICE,
				(errmsg("idem is not in shared_preload_libraries, so its cleanup worker is not running"),
				 errdetail("Every idem function works; expired records stay until "
						   "idem_cleanup_expired() deletes them."),
				 errhint("Add idem to shared_preload_libraries and restart the server "
						 "to have expired records deleted in the background.")));
	}
	PG_FINALLY();
	{
		client_min_messages = save_client_min_messages;
	}
	PG_END_TRY();
	PG_RETURN_VOID();
}

/*
 * SQL: idem_timeline_mark() returns void
 *
 * Record the current timeline in idem_timeline_seq without moving the
 * sequences.  What CREATE EXTENSION and the update to 1.12 do, so that only
 * a later timeline moves them.
 */
Datum
idem_timeline_mark(PG_FUNCTION_ARGS)
{
	idem_timeline_mark_current(get_func_namespace(fcinfo->flinfo->fn_oid));
	PG_RETURN_VOID();
}
