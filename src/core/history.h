/*-------------------------------------------------------------------------
 *
 * history.h
 *	  idem_history.  The audit fields of expired executions, kept
 *	  for the operation's audit period.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_HISTORY_H
#define IDEM_HISTORY_H

#include "executor/tuptable.h"

#include "catalog.h"
#include "key.h"
#include "record.h"
#include "rowwrite.h"

/* The columns of idem_history, in the order of its spec. */
typedef enum IdemHistoryColumn
{
	HIST_OWNER, HIST_OPERATION, HIST_KEY, HIST_RECORD, HIST_HASH, HIST_FP_VERSION,
	HIST_STATUS, HIST_HTTP, HIST_RESOURCE, HIST_CREATED, HIST_UPDATED, HIST_EXPIRES,
	HIST_ARCHIVED, HIST_AUDIT_UNTIL, HIST_NCOLS
} IdemHistoryColumn;

/*
 * A batch of rows the cleanup archives.  The history table (or its shard
 * here) open for inserts, and where the record table has its columns.
 */
typedef struct IdemArchive
{
	bool		open;
	IdemRows	rows;
	IdemTableLayout layout;		/* of the history relation written */
	AttrNumber	rec_att[HIST_NCOLS];	/* the record's column of each */
	TimestampTz now;
} IdemArchive;

extern int	idem_history_table;

extern void idem_history_init(void);
extern void idem_history_archive(const IdemCatalog *cat, const IdemScope *scope,
								 const IdemRecord *rec, TimestampTz now);
extern bool idem_history_in_audit(const IdemCatalog *cat, const IdemScope *scope,
								  TimestampTz now, TimestampTz *until);
extern bool idem_archive_begin(IdemArchive *a, Oid history, Oid record, TimestampTz now);
extern void idem_archive_slot(IdemArchive *a, TupleTableSlot *record, const char *operation);
extern void idem_archive_end(IdemArchive *a);

#endif							/* IDEM_HISTORY_H */
