/*-------------------------------------------------------------------------
 *
 * rowwrite.c
 *	  Insert (and, for an expired record, delete) rows of idem's tables
 *	  without planning a statement.  The hot path of a fresh key.
 *
 * This is how logical replication's apply worker writes (worker.c,
 * execReplication.c).  A short-lived EState with one range table entry per
 * table, a ResultRelInfo each, and ExecSimpleRelationInsert, which checks
 * NOT NULL and CHECK constraints, fires row triggers (BEFORE at once, AFTER
 * at the end, foreign keys included), inserts the heap tuple and its index
 * entries, and raises unique violations as a statement would.  What it
 * saves against SPI is the executor's start-up and shut-down for a plan:
 * plan cache checks, node and projection set-up, the CTE plumbing.
 *
 * Privileges are checked as the executor checks them (ExecCheckPermissions, so
 * the ExecutorCheckPerms hook sees them too), for the current user.  For
 * idem's functions, the extension's owner.  Row-level security forced on
 * these tables is refused rather than ignored.  Statement-level triggers do
 * not fire, as they do not under logical replication.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "catalog/namespace.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/pg_proc.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "tcop/utility.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"

#include "idem.h"
#include "compat.h"
#include "rowwrite.h"

/*
 * Refuse to fire user-defined triggers of rel as its owner for a caller
 * whose session has a temporary schema.  Such triggers run under search_path
 * pg_catalog, pg_temp, so a name they do not qualify resolves to the
 * caller's temporary table of that name, whose own triggers would then run
 * with the owner's rights; no search_path keeps pg_temp out of relation
 * lookups.  Internal triggers (foreign keys) name everything by OID, and
 * idem's own (the operator audit's guard, a member of the extension)
 * qualify every name.
 * Every write idem makes as the owner passes here: the C writes through
 * idem_rows_begin, the outbox's SQL fetch and ack through
 * idem_outbox_guard().
 */
void
idem_rows_check_triggers(Relation rel, TriggerDesc *trigdesc)
{
	Oid			temp_nspid;
	Oid			temp_toast_nspid;
	bool		user_triggers = false;

	if (trigdesc == NULL || GetOuterUserId() == GetUserId())
		return;
	for (int t = 0; t < trigdesc->numtriggers && !user_triggers; t++)
		if (!trigdesc->triggers[t].tgisinternal &&
			getExtensionOfObject(ProcedureRelationId, trigdesc->triggers[t].tgfoid) !=
			get_extension_oid("idem", true))
			user_triggers = true;
	if (!user_triggers)
		return;
	GetTempNamespaceState(&temp_nspid, &temp_toast_nspid);
	if (OidIsValid(temp_nspid))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idem does not fire the triggers of its table \"%s\" as its owner for a session with temporary tables",
						RelationGetRelationName(rel)),
				 errdetail("A name the triggers do not qualify would resolve to this session's temporary table of that name."),
				 errhint("Call idem from a session that has created no temporary table, or drop the triggers.")));
}

/*
 * Open the tables relids[0..nrels-1] for cmd (CMD_INSERT or CMD_DELETE),
 * with the lock such a statement takes, and check that the current user may
 * do it.
 */
void
idem_rows_begin(IdemRows *rows, const Oid *relids, int nrels, CmdType cmd)
{
	List	   *rtable = NIL;
	AclMode		perms[IDEM_ROWS_MAX_RELS];
	MemoryContext oldcxt;
	const char *cmdname = (cmd == CMD_DELETE) ? "DELETE" :
		(cmd == CMD_UPDATE) ? "UPDATE" : "INSERT";

	Assert(nrels > 0 && nrels <= IDEM_ROWS_MAX_RELS);
	Assert(cmd == CMD_INSERT || cmd == CMD_DELETE || cmd == CMD_UPDATE);

	/* what ExecCheckXactReadOnly says to such a statement */
	PreventCommandIfReadOnly(cmdname);
	PreventCommandIfParallelMode(cmdname);

	memset(rows, 0, sizeof(IdemRows));
	rows->nrels = nrels;
	rows->estate = CreateExecutorState();
	oldcxt = MemoryContextSwitchTo(rows->estate->es_query_cxt);

	for (int i = 0; i < nrels; i++)
	{
		RangeTblEntry *rte = makeNode(RangeTblEntry);

		rte->rtekind = RTE_RELATION;
		rte->relid = relids[i];
		rte->relkind = RELKIND_RELATION;
		rte->rellockmode = RowExclusiveLock;
		perms[i] = (cmd == CMD_DELETE) ? ACL_DELETE :
			(cmd == CMD_UPDATE) ? (ACL_SELECT | ACL_UPDATE) : ACL_INSERT;
		rtable = lappend(rtable, rte);
	}
	idem_init_range_table(rows->estate, rtable, perms);

	for (int i = 0; i < nrels; i++)
	{
		Relation	rel = table_open(relids[i], RowExclusiveLock);
		ResultRelInfo *rri = makeNode(ResultRelInfo);

		if (rel->rd_rel->relkind != RELKIND_RELATION)
			elog(ERROR, "idem: \"%s\" is not a table", RelationGetRelationName(rel));
		if (rel->rd_rel->relrowsecurity &&
			check_enable_rls(relids[i], InvalidOid, false) == RLS_ENABLED)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("idem does not support row-level security on its table \"%s\"",
							RelationGetRelationName(rel)),
					 errhint("ALTER TABLE %s NO FORCE ROW LEVEL SECURITY.",
							 RelationGetRelationName(rel))));

		InitResultRelInfo(rri, rel, i + 1, NULL, 0);
		idem_rows_check_triggers(rel, rri->ri_TrigDesc);
		ExecOpenIndices(rri, false);
		rows->estate->es_opened_result_relations =
			lappend(rows->estate->es_opened_result_relations, rri);
		rows->rels[i] = rri;
		rows->slots[i] = table_slot_create(rel, &rows->estate->es_tupleTable);
	}
	MemoryContextSwitchTo(oldcxt);

	/* the writes are one command of the caller's transaction */
	rows->estate->es_output_cid = GetCurrentCommandId(true);
	AfterTriggerBeginQuery();

	/*
	 * Triggers (foreign keys included) see what a statement's would.  A
	 * snapshot taken now, not the calling query's.  Without triggers
	 * nothing reads through the active snapshot, so none is taken.
	 */
	for (int i = 0; i < nrels; i++)
		if (rows->rels[i]->ri_TrigDesc != NULL)
			rows->snapshot_pushed = true;
	if (rows->snapshot_pushed)
		PushActiveSnapshot(GetTransactionSnapshot());
}

/*
 * Could writing table i run code a user defined: triggers (foreign keys
 * included), CHECK constraints, index expressions or predicates?  Those
 * run under whatever search_path is in force; the caller pins a safe one
 * first when this says so, and saves the GUC work on plain tables.
 */
bool
idem_rows_run_user_code(IdemRows *rows, int i)
{
	ResultRelInfo *rri = rows->rels[i];
	TupleConstr *constr = RelationGetDescr(rri->ri_RelationDesc)->constr;

	if (rri->ri_TrigDesc != NULL || (constr != NULL && constr->num_check > 0))
		return true;
	for (int j = 0; j < rri->ri_NumIndices; j++)
	{
		IndexInfo  *ii = rri->ri_IndexRelationInfo[j];

		if (ii->ii_Expressions != NIL || ii->ii_Predicate != NIL)
			return true;
	}
	return false;
}

/*
 * Give table i its CHECK constraints from trees planned once per backend,
 * so that ExecConstraints does not parse and plan them again.  Only if they
 * are still the table's.  The caller knows its catalog is current.
 */
void
idem_rows_set_checks(IdemRows *rows, int i, Expr **checks, int ncheck)
{
	ResultRelInfo *rri = rows->rels[i];
	TupleConstr *constr = RelationGetDescr(rri->ri_RelationDesc)->constr;
	MemoryContext oldcxt;

	if (ncheck == 0 || constr == NULL || constr->num_check != ncheck)
		return;
	oldcxt = MemoryContextSwitchTo(rows->estate->es_query_cxt);
	idem_ri_check_exprs(rri) = palloc(ncheck * sizeof(ExprState *));
	for (int c = 0; c < ncheck; c++)
		idem_ri_check_exprs(rri)[c] = ExecInitExpr(checks[c], NULL);
	MemoryContextSwitchTo(oldcxt);
}

/*
 * Insert one row into table i.  Values and nulls hold every attribute, in
 * the table's order.
 */
void
idem_rows_insert(IdemRows *rows, int i, const Datum *values, const bool *nulls)
{
	TupleTableSlot *slot = rows->slots[i];
	int			natts = slot->tts_tupleDescriptor->natts;

	ExecClearTuple(slot);
	memcpy(slot->tts_values, values, natts * sizeof(Datum));
	memcpy(slot->tts_isnull, nulls, natts * sizeof(bool));
	ExecStoreVirtualTuple(slot);
	ExecSimpleRelationInsert(rows->rels[i], rows->estate, slot);
	ResetPerTupleExprContext(rows->estate);
}

/*
 * Delete from table i the row in slot `locked`, which the caller has
 * locked (table_tuple_lock), so nobody else can change it first: row
 * triggers fire as for a DELETE.
 */
void
idem_rows_delete(IdemRows *rows, int i, TupleTableSlot *locked)
{
	EPQState	epq;

	idem_epq_init(&epq, rows->estate);
	ExecSimpleRelationDelete(rows->rels[i], rows->estate, &epq, locked);
	EvalPlanQualEnd(&epq);
	ResetPerTupleExprContext(rows->estate);
}

/*
 * Update in table i the row in slot `locked`, which the caller has locked.
 * Values and nulls hold every attribute of the new version.  Row triggers
 * fire, constraints are checked and index entries made as for an UPDATE
 * (none when the update is HOT).
 */
void
idem_rows_update(IdemRows *rows, int i, TupleTableSlot *locked,
				 const Datum *values, const bool *nulls)
{
	TupleTableSlot *slot = rows->slots[i];
	int			natts = slot->tts_tupleDescriptor->natts;
	EPQState	epq;

	ExecClearTuple(slot);
	memcpy(slot->tts_values, values, natts * sizeof(Datum));
	memcpy(slot->tts_isnull, nulls, natts * sizeof(bool));
	ExecStoreVirtualTuple(slot);
	idem_epq_init(&epq, rows->estate);
	ExecSimpleRelationUpdate(rows->rels[i], rows->estate, &epq, locked, slot);
	EvalPlanQualEnd(&epq);
	ResetPerTupleExprContext(rows->estate);
}

/*
 * Delete the row at tid of relid, which the caller read (an expired record
 * or inbox entry, under its key's lock).  The row is locked first, as a
 * DELETE's would be: if the cleanup (or anything else) deleted it
 * meanwhile, it is gone; if something changed it, the caller reads again.
 * Where the transaction keeps its snapshot, either is 40001, as for a
 * DELETE.  what names the row in an unexpected error.
 */
IdemRowDeletion
idem_rows_delete_read(Oid relid, ItemPointer tid, const char *what)
{
	IdemRows	rows;
	TupleTableSlot *slot;
	TM_FailureData tmfd;
	TM_Result	tmres;
	IdemRowDeletion outcome = IDEM_ROW_DELETED;

	idem_rows_begin(&rows, &relid, 1, CMD_DELETE);
	slot = rows.slots[0];
	tmres = table_tuple_lock(rows.rels[0]->ri_RelationDesc, tid, GetActiveSnapshot(),
							 slot, GetCurrentCommandId(false), LockTupleExclusive,
							 LockWaitBlock, 0, &tmfd);
	switch (tmres)
	{
		case TM_Ok:
			idem_rows_delete(&rows, 0, slot);
			break;
		case TM_Deleted:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent delete")));
			outcome = IDEM_ROW_GONE;
			break;
		case TM_Updated:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update")));
			outcome = IDEM_ROW_CHANGED;
			break;
		case TM_SelfModified:
			outcome = IDEM_ROW_CHANGED;
			break;
		default:
			elog(ERROR, "idem: unexpected result %d locking %s", (int) tmres, what);
	}
	idem_rows_end(&rows);
	return outcome;
}

/*
 * Fire the queued AFTER triggers, close everything, and make the rows
 * visible to what the caller's transaction runs next, this statement
 * included.
 */
void
idem_rows_end(IdemRows *rows)
{
	AfterTriggerEndQuery(rows->estate);
	if (rows->snapshot_pushed)
		PopActiveSnapshot();
	ExecCloseResultRelations(rows->estate);
	ExecResetTupleTable(rows->estate->es_tupleTable, false);
	for (int i = 0; i < rows->nrels; i++)
		table_close(rows->rels[i]->ri_RelationDesc, NoLock);
	FreeExecutorState(rows->estate);
	rows->estate = NULL;
	CommandCounterIncrement();
}
