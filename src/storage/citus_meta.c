/*-------------------------------------------------------------------------
 *
 * citus_meta.c
 *	  What Citus's metadata says of a relation, read without Citus's own
 *	  headers: whether it is a distributed table.  Absent Citus, the answer is no,
 *	  at the cost of one catalog lookup by name.  The catalog asks it when
 *	  it is built; the routing (citus.c) builds on it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/pg_namespace.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "idem.h"
#include "citus_meta.h"

/* Is relid a Citus distributed table?  false without Citus. */
bool
idem_citus_distributed(Oid relid)
{
	Oid			partition = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	bool		found;

	if (!OidIsValid(partition) || !OidIsValid(relid))
		return false;
	rel = table_open(partition, AccessShareLock);
	/* pg_dist_partition.logicalrelid, its first column */
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
	found = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}
