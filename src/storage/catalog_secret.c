/*-------------------------------------------------------------------------
 *
 * catalog_secret.c
 *	  The database's request digest secret.  The one row of
 *	  idem_internal.idem_digest_secret, read with the catalog.
 *
 * The install and update scripts fill it with 16 random bytes
 * (gen_random_uuid); PUBLIC has no privilege on it.  It never changes.  A
 * record's digest is compared under it (fingerprint.c).  A database
 * restored from a dump gets a secret of its own at CREATE EXTENSION (the
 * table is not dumped), so the digests of restored records no longer match
 * and their fingerprints decide.  Slower, never wrong.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

#include "idem.h"
#include "catalog.h"

/* Read the secret into cat, if the table holds one of the right length. */
void
idem_catalog_load_digest_secret(IdemCatalog *cat)
{
	Oid			relid = get_relname_relid("idem_digest_secret", cat->nspid);
	Relation	rel;
	Snapshot	snapshot;
	TableScanDesc scan;
	HeapTuple	tuple;

	cat->has_digest_secret = false;
	if (!OidIsValid(relid) || get_rel_relkind(relid) != RELKIND_RELATION)
		return;
	rel = table_open(relid, AccessShareLock);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	scan = table_beginscan(rel, snapshot, 0, NULL);
	tuple = heap_getnext(scan, ForwardScanDirection);
	if (tuple != NULL && RelationGetDescr(rel)->natts >= 1 &&
		TupleDescAttr(RelationGetDescr(rel), 0)->atttypid == BYTEAOID)
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, 1, RelationGetDescr(rel), &isnull);

		if (!isnull)
		{
			bytea	   *secret = DatumGetByteaPP(d);

			if (VARSIZE_ANY_EXHDR(secret) == IDEM_DIGEST_SECRET_LEN)
			{
				memcpy(cat->digest_secret, VARDATA_ANY(secret), IDEM_DIGEST_SECRET_LEN);
				cat->has_digest_secret = true;
			}
		}
	}
	table_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
}
