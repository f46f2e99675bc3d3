/*-------------------------------------------------------------------------
 *
 * rowwrite.h
 *	  Inserts and deletes on idem's tables without planning a statement.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_ROWWRITE_H
#define IDEM_ROWWRITE_H

#include "access/transam.h"
#include "nodes/execnodes.h"
#include "utils/snapshot.h"

#define IDEM_ROWS_MAX_RELS 2

typedef struct IdemRows
{
	EState	   *estate;
	int			nrels;
	ResultRelInfo *rels[IDEM_ROWS_MAX_RELS];
	TupleTableSlot *slots[IDEM_ROWS_MAX_RELS];
	bool		snapshot_pushed;	/* for the triggers */
} IdemRows;

/*
 * The transaction still inserting, or else deleting, the row a dirty
 * snapshot just returned (HeapTupleSatisfiesDirty sets them for the row it
 * checked last); InvalidTransactionId if none is.  A row some transaction
 * is writing, to be waited for.
 */
static inline TransactionId
idem_dirty_writer(const SnapshotData *dirty)
{
	return TransactionIdIsValid(dirty->xmin) ? dirty->xmin : dirty->xmax;
}

extern void idem_rows_check_triggers(Relation rel, TriggerDesc *trigdesc);
extern void idem_rows_begin(IdemRows *rows, const Oid *relids, int nrels, CmdType cmd);
extern bool idem_rows_run_user_code(IdemRows *rows, int i);
extern void idem_rows_set_checks(IdemRows *rows, int i, Expr **checks, int ncheck);
extern void idem_rows_insert(IdemRows *rows, int i, const Datum *values, const bool *nulls);
extern void idem_rows_delete(IdemRows *rows, int i, TupleTableSlot *locked);
extern void idem_rows_update(IdemRows *rows, int i, TupleTableSlot *locked,
							 const Datum *values, const bool *nulls);
extern void idem_rows_end(IdemRows *rows);

/* What deleting a row the caller had read came to. */
typedef enum IdemRowDeletion
{
	IDEM_ROW_DELETED,			/* deleted by us */
	IDEM_ROW_GONE,				/* deleted by someone else meanwhile */
	IDEM_ROW_CHANGED			/* changed by someone else, so read it again */
} IdemRowDeletion;

extern IdemRowDeletion idem_rows_delete_read(Oid relid, ItemPointer tid, const char *what);

#endif							/* IDEM_ROWWRITE_H */
