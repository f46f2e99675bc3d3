/*-------------------------------------------------------------------------
 *
 * cleanup.c
 *	  Batch deletion of expired idempotency records.
 *
 * One huge DELETE would hold many row locks and flood WAL at once, so
 * expired records go in batches of at most batch_size rows, oldest expiry
 * first.  Rows another transaction holds (a caller renewing an expired key,
 * say) are skipped, never waited for, and a row is deleted only while its
 * expires_at is in the past: the row lock is taken on its newest version.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "cleanup.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_cleanup_expired);

/* The kept plan of one batch, for one extension schema. */
static Oid	cleanup_nspid = InvalidOid;
static SPIPlanPtr cleanup_plan = NULL;

/* Prepare the batch DELETE for the schema nspid. */
static void
prepare_cleanup_plan(Oid nspid)
{
	char	   *s;
	Oid			types[2] = {TIMESTAMPTZOID, INT4OID};

	if (cleanup_nspid == nspid)
		return;

	cleanup_nspid = InvalidOid;
	idem_free_kept(&cleanup_plan);
	s = idem_quoted_schema(nspid);

	/*
	 * $1 now, $2 batch size.  The subquery locks the rows, rechecking
	 * expires_at on the newest version of a row updated meanwhile, and nobody
	 * can change them before we commit; the DELETE then finds them by ctid,
	 * a TID scan whatever the statistics say.  (Looking them up by id let a
	 * generic plan test every row of the table against the whole batch.)  A
	 * row whose ctid moved on is not matched and waits for the next batch.
	 */
	cleanup_plan = idem_prepare_kept(psprintf(
		"DELETE FROM %s.idempotency_record AS r"
		" WHERE r.ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
		"  SELECT e.ctid FROM %s.idempotency_record e"
		"  WHERE e.expires_at OPERATOR(pg_catalog.<) $1"
		"  ORDER BY e.expires_at LIMIT $2"
		"  FOR UPDATE SKIP LOCKED))", s, s), 2, types);
	cleanup_nspid = nspid;
}

/*
 * Delete expired records in batches of at most batch_size rows, at most
 * max_batches batches (all of them if max_batches < 0), all in the current
 * transaction.  Returns how many rows were deleted.  The caller is connected
 * to SPI.  idem_cleanup_expired() and the cleanup worker both come here.
 */
int64
idem_cleanup_batches(Oid nspid, int batch_size, int max_batches)
{
	int64		total = 0;
	Datum		args[2];

	prepare_cleanup_plan(nspid);
	args[0] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	args[1] = Int32GetDatum(batch_size);

	for (int batch = 0; max_batches < 0 || batch < max_batches; batch++)
	{
		int			rc;

		CHECK_FOR_INTERRUPTS();
		rc = SPI_execute_plan(cleanup_plan, args, NULL, false, 0);
		if (rc != SPI_OK_DELETE)
			elog(ERROR, "idem: cleanup batch failed: %s", SPI_result_code_string(rc));
		total += SPI_processed;
		/* a short batch: nothing expired is left, or only rows others hold */
		if (SPI_processed < (uint64) batch_size)
			break;
	}
	return total;
}

/* SQL: idem_cleanup_expired(batch_size integer, max_batches integer) returns bigint */
Datum
idem_cleanup_expired(PG_FUNCTION_ARGS)
{
	int32		batch_size;
	int32		max_batches = -1;
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

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idem: SPI_connect failed");
	deleted = idem_cleanup_batches(idem_extension_schema(fcinfo), batch_size, max_batches);
	SPI_finish();

	PG_RETURN_INT64(deleted);
}
