/*-------------------------------------------------------------------------
 *
 * statistics.c
 *	  The SQL face of idem's statistics (stats.c).  idem_stats_entries (the
 *	  idem_stats view's rows), idem_stats_reset, and idem_stats_add for
 *	  idem's SQL functions.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "idem.h"
#include "stats.h"

PG_FUNCTION_INFO_V1(idem_stats_entries);
PG_FUNCTION_INFO_V1(idem_stats_reset);
PG_FUNCTION_INFO_V1(idem_stats_add);

static void stats_row(Oid dbid, const char *name, const char *kind, const uint64 *counters,
					  TimestampTz reset_at, void *arg);

/* Where stats_row puts its rows, and whether they have the kind column. */
typedef struct StatsRows
{
	ReturnSetInfo *rsinfo;
	bool		with_kind;		/* the kind column; absent before the update */
} StatsRows;

/* SQL: idem_stats_entries() returns setof record (the idem_stats view's rows) */
Datum
idem_stats_entries(PG_FUNCTION_ARGS)
{
	StatsRows	rows;

	InitMaterializedSRF(fcinfo, 0);
	rows.rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	rows.with_kind = rows.rsinfo->setDesc->natts == IDEM_STAT_NCOUNTERS + 4;
	idem_stats_visit(stats_row, &rows);
	return (Datum) 0;
}

/* One row of idem_stats. */
static void
stats_row(Oid dbid, const char *name, const char *kind, const uint64 *counters,
		  TimestampTz reset_at, void *arg)
{
	const StatsRows *rows = (const StatsRows *) arg;
	Datum		values[IDEM_STAT_NCOUNTERS + 4];
	bool		nulls[IDEM_STAT_NCOUNTERS + 4] = {false};
	int			col = 0;

	values[col] = ObjectIdGetDatum(dbid);
	nulls[col++] = !OidIsValid(dbid);
	values[col++] = CStringGetTextDatum(name);
	if (rows->with_kind)
	{
		nulls[col] = (kind == NULL);
		values[col++] = kind == NULL ? (Datum) 0 : CStringGetTextDatum(kind);
	}
	for (int i = 0; i < IDEM_STAT_NCOUNTERS; i++)
		values[col++] = Int64GetDatum((int64) counters[i]);
	values[col++] = TimestampTzGetDatum(reset_at);
	tuplestore_putvalues(rows->rsinfo->setResult, rows->rsinfo->setDesc, values, nulls);
}

/* SQL: idem_stats_reset() returns void, every counter back to 0 */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	idem_stats_reset_all();
	PG_RETURN_VOID();
}

/*
 * SQL: idem_stats_add(name text, counter text, n bigint) returns bigint (n),
 * counted at commit.  For idem's PL/pgSQL functions (idem_outbox_ack).
 */
Datum
idem_stats_add(PG_FUNCTION_ARGS)
{
	char	   *name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *counter = text_to_cstring(PG_GETARG_TEXT_PP(1));

	if (strcmp(counter, "outbox_acked") != 0)
		elog(ERROR, "idem: idem_stats_add counts only outbox_acked");
	idem_stats_count_at_commit(IDEM_KIND_TOPIC, name, IDEM_STAT_OUTBOX_ACKED, PG_GETARG_INT64(2));
	PG_RETURN_INT64(PG_GETARG_INT64(2));
}
