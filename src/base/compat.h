/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  The PostgreSQL versions idem builds on, behind one header.  Each
 *	  difference of the server's API that idem meets is named here once, so
 *	  that the code reads the same on every major version.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_COMPAT_H
#define IDEM_COMPAT_H

/* the majors idem is tested on; a newer one may need a shim added here */
#if PG_VERSION_NUM < 150000 || PG_VERSION_NUM >= 200000
#error "idem builds on PostgreSQL 15 to 19 (its suites are run on those)"
#endif

#include "access/genam.h"
#include "executor/executor.h"
#include "nodes/bitmapset.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/relcache.h"
#include "storage/shmem.h"

#if PG_VERSION_NUM >= 160000
#include "catalog/pg_proc.h"
#include "parser/parse_relation.h"
#endif
#if PG_VERSION_NUM >= 170000
#include "storage/procnumber.h"
#endif
#if PG_VERSION_NUM >= 190000
#include "access/tableam.h"
#endif

/*
 * 18: a noreturn function is marked in front (pg_noreturn, C11's
 * _Noreturn); before, pg_attribute_noreturn() followed the declarator.  GCC
 * and clang take the attribute in front on every version.
 */
#ifndef pg_noreturn
#define pg_noreturn pg_attribute_noreturn()
#endif

/*
 * 18: index_beginscan takes the scan's instrumentation (none here); 19 also
 * the scan's options (none: idem's scans feed updates and deletes too).
 */
#if PG_VERSION_NUM >= 190000
#define idem_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys), SO_NONE)
#elif PG_VERSION_NUM >= 180000
#define idem_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
#else
#define idem_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

/* 18: the CHECK constraints' expression states were renamed. */
#if PG_VERSION_NUM >= 180000
#define idem_ri_check_exprs(rri) ((rri)->ri_CheckConstraintExprs)
#else
#define idem_ri_check_exprs(rri) ((rri)->ri_ConstraintExprs)
#endif

/* 18: RelationGetPrimaryKeyIndex says whether a deferrable key will do. */
#if PG_VERSION_NUM >= 180000
#define idem_primary_key_index(rel) RelationGetPrimaryKeyIndex((rel), false)
#else
#define idem_primary_key_index(rel) RelationGetPrimaryKeyIndex(rel)
#endif

/*
 * 19: a jsonb under construction is a JsonbInState (zeroed to start),
 * pushJsonbValue returns nothing and the value is the state's result; before,
 * a JsonbParseState stack whose last push returned the value.  Build with
 * IdemJsonbBuild b = {0}, idem_jsonb_push(&b, ...), idem_jsonb_result(&b).
 */
#if PG_VERSION_NUM >= 190000
typedef JsonbInState IdemJsonbBuild;
#define idem_jsonb_push(b, token, value) pushJsonbValue((b), (token), (value))
#else
typedef struct IdemJsonbBuild
{
	JsonbParseState *parseState;
	JsonbValue *result;
} IdemJsonbBuild;

static inline void
idem_jsonb_push(IdemJsonbBuild *b, JsonbIteratorToken token, JsonbValue *value)
{
	b->result = pushJsonbValue(&b->parseState, token, value);
}
#endif
#define idem_jsonb_result(b) ((b)->result)

/*
 * 19: a shared hash table has one size (its initial and maximum sizes were
 * two arguments; idem always gave the same).
 */
#if PG_VERSION_NUM >= 190000
#define idem_shmem_init_hash(name, nelems, info, flags) \
	ShmemInitHash((name), (nelems), (info), (flags))
#else
#define idem_shmem_init_hash(name, nelems, info, flags) \
	ShmemInitHash((name), (nelems), (nelems), (info), (flags))
#endif

/* 16: EvalPlanQualInit takes the result relations (none here). */
#if PG_VERSION_NUM >= 160000
#define idem_epq_init(epq, estate) EvalPlanQualInit((epq), (estate), NULL, NIL, -1, NIL)
#else
#define idem_epq_init(epq, estate) EvalPlanQualInit((epq), (estate), NULL, NIL, -1)
#endif

/* 16: pg_proc_aclcheck became object_aclcheck on pg_proc. */
#if PG_VERSION_NUM >= 160000
#define idem_proc_aclcheck(proc, role, mode) \
	object_aclcheck(ProcedureRelationId, (proc), (role), (mode))
#else
#define idem_proc_aclcheck(proc, role, mode) pg_proc_aclcheck((proc), (role), (mode))
#endif

/*
 * 16: a GUC check hook's extra must come from guc_malloc, and the GUC code
 * frees it with guc_free; before, malloc and free.  guc_malloc at LOG
 * returns NULL when out of memory, as malloc does.
 */
#if PG_VERSION_NUM >= 160000
#define idem_guc_malloc(size) guc_malloc(LOG, (size))
#define idem_guc_free(ptr) guc_free(ptr)
#else
#define idem_guc_malloc(size) malloc(size)
#define idem_guc_free(ptr) free(ptr)
#endif

/*
 * This backend's slot among MaxBackends, from 0: 17 numbers processes from
 * 0 (MyProcNumber; regular backends and background workers below
 * MaxBackends); before, backends from 1 (MyBackendId).
 */
#if PG_VERSION_NUM >= 170000
#define idem_backend_slot() ((int) MyProcNumber)
#else
#define idem_backend_slot() ((int) MyBackendId - 1)
#endif

/*
 * Open the range table rtable of a statement idem writes without planning.
 * The current user must have the rights requiredPerms[i] on its i-th
 * relation, checked as the executor checks them, so the ExecutorCheckPerms
 * hook sees them too.  16 keeps the rights in RTEPermissionInfo entries
 * beside the range table.  18 also names the range table's unpruned
 * entries, all of them here.
 */
static inline void
idem_init_range_table(EState *estate, List *rtable, const AclMode *requiredPerms)
{
#if PG_VERSION_NUM >= 160000
	List	   *perminfos = NIL;
	int			i = 0;
	ListCell   *lc;

	foreach(lc, rtable)
	{
		RTEPermissionInfo *perminfo = addRTEPermissionInfo(&perminfos,
														   (RangeTblEntry *) lfirst(lc));

		perminfo->requiredPerms = requiredPerms[i++];
	}
	(void) ExecCheckPermissions(rtable, perminfos, true);
#if PG_VERSION_NUM >= 180000
	ExecInitRangeTable(estate, rtable, perminfos, bms_add_range(NULL, 1, list_length(rtable)));
#else
	ExecInitRangeTable(estate, rtable, perminfos);
#endif
#else
	int			i = 0;
	ListCell   *lc;

	foreach(lc, rtable)
		((RangeTblEntry *) lfirst(lc))->requiredPerms = requiredPerms[i++];
	(void) ExecCheckRTPerms(rtable, true);
	ExecInitRangeTable(estate, rtable);
#endif
}

#endif							/* IDEM_COMPAT_H */
