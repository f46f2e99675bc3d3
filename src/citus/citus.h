/*-------------------------------------------------------------------------
 *
 * citus.h
 *	  idem on Citus: the shard of a distributed table that holds an owner's
 *	  rows, found on the node a call was delegated to; the call sent on to
 *	  that node when it runs elsewhere.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CITUS_H
#define IDEM_CITUS_H

#include "fmgr.h"
#include "nodes/pg_list.h"

#include "catalog.h"
#include "citus_meta.h"

extern bool idem_citus_localize(IdemCatalog *cat, int table, Datum value, Oid type);
extern Datum idem_citus_redispatch(FunctionCallInfo fcinfo);
extern int	idem_citus_local_shards(IdemCatalog *cat, int table);
extern void idem_citus_use_local_shard(IdemCatalog *cat, int table, int n);
extern List *idem_citus_local_relations(Oid relid);
extern int64 idem_citus_cleanup_workers(Oid nspid, int batch_size, int max_batches);
extern const IdemTableLayout *idem_citus_owner_table(IdemCatalog *local, const IdemCatalog *cat,
													  int table, int64 owner);

/*
 * In an entry point, after copying the catalog: point cat's table at the
 * shard on this node that holds value, true; false when that shard is on
 * another node, and the entry point then returns what
 * idem_citus_redispatch(fcinfo) returns.  Outside Citus: one test.
 */
static inline bool
idem_citus_route(IdemCatalog *cat, int table, Datum value, Oid type)
{
	return !cat->tables[table].distributed || idem_citus_localize(cat, table, value, type);
}

#endif							/* IDEM_CITUS_H */
