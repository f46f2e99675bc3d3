/*-------------------------------------------------------------------------
 *
 * citus.c
 *	  idem on Citus.  Every call runs on the node that holds its owner's
 *	  shard, with the same direct read and plan-less write as on one server.
 *
 * idem_distribute() distributes idempotency_record and purchase_order by
 * owner_id (co-located) and idem_inbox by consumer.  It delegates every
 * function that takes an owner (or a consumer) by that argument, so Citus
 * plans a call on the coordinator as one query sent to the node holding
 * the shard of the argument's value.  There the table idem looked up by
 * name is Citus's empty shell.  The rows are in the shard, a table of its
 * own named after the table and the shard id.
 *
 * So an entry point, once it has its catalog, asks here for the shard of
 * its owner:
 *	- hash the value as Citus does (the column type's standard hash);
 *	- find the shard whose hash range holds it;
 *	- if a placement of that shard is on this node, point the call's copy
 *	  of the catalog at the shard and its indexes.
 * The claim then races on the shard's own unique index, as on one server.
 *
 * Citus does not delegate every call.  Not one whose owner is a column of
 * another table, not one from a PL/pgSQL simple expression, not one in
 * INSERT ... SELECT.  Such a call runs where it was made, often a node
 * without the shard.  It then runs itself again as SELECT * FROM fn($1..)
 * with its arguments as constants, which Citus does delegate.  The
 * functions are distributed with force_delegation, so this holds inside a
 * transaction block too, as part of the distributed transaction.  If the
 * call comes back to this node unresolved, the error says so.
 *
 * A task is leased on the node that holds it.  idem_lease and the holder's
 * calls go through this node's shards (idem_citus_local_shards, _use_).
 *
 * Nothing here costs anything outside Citus.  The catalog notes once per
 * build whether a table is distributed (a lookup of pg_dist_partition by
 * name, absent without Citus), and an entry point tests that flag.
 *
 * The shard maps (a table's shards in hash order, which of them are here)
 * are read from Citus's metadata with SPI once per catalog build.  Citus
 * invalidates the distributed table's relcache entry whenever its shards
 * or placements change, and that builds the catalog again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "parser/parse_coerce.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "idem.h"
#include "catalog.h"
#include "citus.h"
#include "citus_meta.h"

/* One shard of a distributed table, in hash order. */
typedef struct IdemShard
{
	int32		min;			/* the first hash value it holds */
	Oid			relid;			/* the shard on this node, or InvalidOid */
	bool		loaded;			/* layout and scopeid are filled in */
	IdemTableLayout layout;
	Oid			scopeid;		/* idempotency_record's shards: the scope index */
} IdemShard;

/* A distributed table's shards, and how its distribution column hashes. */
typedef struct IdemShardMap
{
	int			nshards;
	IdemShard  *shards;
	Oid			type;			/* of the distribution column */
	Oid			collation;
	FmgrInfo	hash;
} IdemShardMap;

/* The maps of one catalog build, by table number; built as calls need them. */
static IdemShardMap *maps[IDEM_MAX_TABLES];
static uint64 maps_generation = 0;
static MemoryContext maps_cxt = NULL;

/*
 * The name of shard s.shardid of s.logicalrelid, in the table's schema.
 * Citus's shard_name() qualifies it unless the schema is public, so the
 * name is its last part.  It is looked up in C in the table's schema,
 * since Citus hides shards from queries of pg_class.
 */
#define SHARD_RELNAME \
	"(pg_catalog.parse_ident(pg_catalog.shard_name(s.logicalrelid, s.shardid)))" \
	"[pg_catalog.array_length(pg_catalog.parse_ident(pg_catalog.shard_name(s.logicalrelid, s.shardid)), 1)]"

/* Set while a call runs itself again to be delegated (see above). */
static int	redispatch_depth = 0;

static void shard_relcache_callback(Datum arg, Oid relid);

/*
 * Forget the maps of an earlier build.  A call still running with one of
 * its layouts (a call further up the stack) keeps it until the end of the
 * transaction.
 */
static void
reset_maps(uint64 generation)
{
	if (maps_cxt != NULL)
	{
		if (IsTransactionState())
			MemoryContextSetParent(maps_cxt, TopTransactionContext);
		else
			MemoryContextDelete(maps_cxt);
	}
	else
		CacheRegisterRelcacheCallback(shard_relcache_callback, (Datum) 0);
	maps_cxt = AllocSetContextCreate(CacheMemoryContext, "idem shard maps",
									 ALLOCSET_SMALL_SIZES);
	memset(maps, 0, sizeof(maps));
	maps_generation = generation;
}

/* Is relid a shard this backend's maps point at? */
static bool
known_shard(Oid relid)
{
	for (int t = 0; t < IDEM_MAX_TABLES; t++)
		if (maps[t] != NULL)
			for (int i = 0; i < maps[t]->nshards; i++)
				if (maps[t]->shards[i].relid == relid)
					return true;
	return false;
}

/*
 * A change of a shard the maps point at (or of every relation) drops the
 * catalog, whose next build reads the maps again.  The catalog watches its
 * own relations; this cache watches its own.
 */
static void
shard_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || known_shard(relid))
		idem_catalog_invalidate();
}

/* The distribution column's type and collation of Citus table relid. */
static void
distribution_column(Oid relid, Oid *type, Oid *collation)
{
	Oid			argtypes[1] = {OIDOID};
	Datum		args[1] = {ObjectIdGetDatum(relid)};
	bool		isnull;

	if (SPI_execute_with_args("SELECT a.atttypid, a.attcollation"
							  "  FROM pg_catalog.pg_dist_partition p"
							  "  JOIN pg_catalog.pg_attribute a"
							  "    ON a.attrelid OPERATOR(pg_catalog.=) p.logicalrelid"
							  "   AND a.attname OPERATOR(pg_catalog.=)"
							  "       pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)"
							  " WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1"
							  "   AND p.partmethod OPERATOR(pg_catalog.=) 'h'",
							  1, argtypes, args, NULL, true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table \"%s\" is a Citus table, but not hash-distributed",
						get_rel_name(relid)),
				 errhint("Distribute idem's tables with idem_distribute().")));
	*type = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
										   SPI_tuptable->tupdesc, 1, &isnull));
	*collation = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
												SPI_tuptable->tupdesc, 2, &isnull));
}

/*
 * In an SPI connection.  The shards of Citus table relid in hash order, a
 * row each with its first hash value and, if it is placed on this node, its
 * name.  Returns how many.
 */
static int
read_shards(Oid relid)
{
	Oid			argtypes[1] = {OIDOID};
	Datum		args[1] = {ObjectIdGetDatum(relid)};

	if (SPI_execute_with_args("SELECT s.shardminvalue::pg_catalog.int4,"
							  "       (SELECT " SHARD_RELNAME
							  "          FROM pg_catalog.pg_dist_placement p, pg_catalog.pg_dist_local_group g"
							  "         WHERE p.shardid OPERATOR(pg_catalog.=) s.shardid"
							  "           AND p.groupid OPERATOR(pg_catalog.=) g.groupid"
							  "         LIMIT 1)"
							  "  FROM pg_catalog.pg_dist_shard s"
							  " WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1"
							  " ORDER BY 1",
							  1, argtypes, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "idem: reading the shards of \"%s\" failed", get_rel_name(relid));
	return (int) SPI_processed;
}

/*
 * Row i of read_shards(relid).  The shard relation on this node (Citus names
 * it after the table and the shard id, in the table's schema), or
 * InvalidOid if it is placed elsewhere, or being moved.
 */
static Oid
shard_here(Oid relid, int i)
{
	bool		isnull;
	Datum		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull);

	return isnull ? InvalidOid :
		get_relname_relid(TextDatumGetCString(d), get_rel_namespace(relid));
}

/*
 * Read the shards of table number `table` from Citus's metadata.  Their hash
 * ranges in order and, for those with a placement on this node, the shard
 * relation here.
 */
static IdemShardMap *
build_map(const IdemCatalog *cat, int table)
{
	Oid			relid = cat->tables[table].relid;
	IdemShardMap *map;
	TypeCacheEntry *typentry;
	MemoryContext oldcxt;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idem: SPI_connect failed");
	map = MemoryContextAllocZero(maps_cxt, sizeof(IdemShardMap));
	distribution_column(relid, &map->type, &map->collation);
	map->nshards = read_shards(relid);
	map->shards = MemoryContextAllocZero(maps_cxt, Max(map->nshards, 1) * sizeof(IdemShard));
	for (int i = 0; i < map->nshards; i++)
	{
		bool		isnull;

		map->shards[i].min = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i],
														 SPI_tuptable->tupdesc, 1, &isnull));
		map->shards[i].relid = shard_here(relid, i);
	}
	SPI_finish();

	typentry = lookup_type_cache(map->type, TYPECACHE_HASH_PROC_FINFO);
	if (!OidIsValid(typentry->hash_proc))
		elog(ERROR, "idem: type %s has no hash function", format_type_be(map->type));
	oldcxt = MemoryContextSwitchTo(maps_cxt);
	fmgr_info_copy(&map->hash, &typentry->hash_proc_finfo, maps_cxt);
	MemoryContextSwitchTo(oldcxt);
	return map;
}

/* The shard map of cat's table number `table`, read if need be. */
static IdemShardMap *
shard_map(const IdemCatalog *cat, int table)
{
	if (maps_generation != cat->generation || maps_cxt == NULL)
		reset_maps(cat->generation);
	if (maps[table] == NULL)
		maps[table] = build_map(cat, table);
	return maps[table];
}

/* Point cat's table number `table` at shard, loading its layout once. */
static void
use_shard(IdemCatalog *cat, int table, IdemShard *shard)
{
	if (!shard->loaded)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(maps_cxt);

		idem_catalog_shard_layout(&shard->layout, &shard->scopeid, cat, table, shard->relid);
		MemoryContextSwitchTo(oldcxt);
		shard->loaded = true;
	}
	cat->tables[table] = shard->layout;
	if (table == IDEM_TABLE_RECORD)
		cat->scopeid = shard->scopeid;
}

/*
 * Table number `table` of cat for owner, a table co-located with the
 * records by owner: the table, or on Citus (in a copy of cat, local) its
 * shard here, next to the owner's records; NULL if this database lacks it
 * (an optional table, before its version).
 */
const IdemTableLayout *
idem_citus_owner_table(IdemCatalog *local, const IdemCatalog *cat, int table, int64 owner)
{
	const IdemTableLayout *t = &cat->tables[table];

	if (!OidIsValid(t->relid))
		return NULL;
	if (!t->distributed)
		return t;
	*local = *cat;
	if (!idem_citus_localize(local, table, Int64GetDatum(owner), INT8OID))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table %s is not co-located with idempotency_record", get_rel_name(t->relid)),
				 errhint("Distribute idem's tables with idem_distribute().")));
	return &local->tables[table];
}

/*
 * Point cat's table number `table` (a distributed one) at its shard on this
 * node that holds value, of type `type`.  False if that shard is elsewhere.
 */
bool
idem_citus_localize(IdemCatalog *cat, int table, Datum value, Oid type)
{
	IdemShardMap *map = shard_map(cat, table);
	IdemShard  *shard;
	int32		hash;
	int			lo;
	int			hi;
	if (map->type != type && !IsBinaryCoercible(type, map->type))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table \"%s\" is distributed by a column of type %s, not %s",
						get_rel_name(cat->tables[table].relid),
						format_type_be(map->type), format_type_be(type)),
				 errhint("Undistribute it and run idem_distribute().")));
	if (map->nshards == 0)
		return false;

	/* the last shard whose range starts at or below the hash */
	hash = DatumGetInt32(FunctionCall1Coll(&map->hash, map->collation, value));
	lo = 0;
	hi = map->nshards - 1;
	while (lo < hi)
	{
		int			mid = lo + (hi - lo + 1) / 2;

		if (map->shards[mid].min <= hash)
			lo = mid;
		else
			hi = mid - 1;
	}
	shard = &map->shards[lo];
	if (!OidIsValid(shard->relid))
		return false;
	use_shard(cat, table, shard);
	return true;
}

/* How many shards of cat's table number `table` (distributed) are here. */
int
idem_citus_local_shards(IdemCatalog *cat, int table)
{
	IdemShardMap *map = shard_map(cat, table);
	int			n = 0;

	for (int i = 0; i < map->nshards; i++)
		if (OidIsValid(map->shards[i].relid))
			n++;
	return n;
}

/* Point cat's table number `table` at the n-th of its shards here. */
void
idem_citus_use_local_shard(IdemCatalog *cat, int table, int n)
{
	IdemShardMap *map = shard_map(cat, table);

	for (int i = 0; i < map->nshards; i++)
		if (OidIsValid(map->shards[i].relid) && n-- == 0)
		{
			use_shard(cat, table, &map->shards[i]);
			return;
		}
	elog(ERROR, "idem: no local shard %d", n);
}

/*
 * The call fcinfo is in, whose shard is on another node, run again as
 * SELECT * FROM fn($1, ...) with its arguments as constants.  Citus sends
 * that to the node holding the shard, inside the current transaction.
 * Returns what the call returned there.
 */
Datum
idem_citus_redispatch(FunctionCallInfo fcinfo)
{
	Oid			fn_oid = fcinfo->flinfo->fn_oid;
	HeapTuple	proctup;
	Form_pg_proc proc;
	StringInfoData sql;
	int			nargs = fcinfo->nargs;
	Oid		   *argtypes = palloc(Max(nargs, 1) * sizeof(Oid));
	Datum	   *values = palloc(Max(nargs, 1) * sizeof(Datum));
	char	   *nulls = palloc(Max(nargs, 1) * sizeof(char));
	TupleDesc	tupdesc;
	Datum		result = (Datum) 0;
	bool		isnull = true;
	int			rc;

	if (redispatch_depth > 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the shard this call needs is not on this node, and Citus did not delegate the call to the node that holds it"),
				 errhint("Every node needs Citus metadata (citus_add_node syncs it), and idem_distribute() must have distributed the function.")));

	proctup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn_oid));
	if (!HeapTupleIsValid(proctup))
		elog(ERROR, "idem: cache lookup failed for function %u", fn_oid);
	proc = (Form_pg_proc) GETSTRUCT(proctup);
	initStringInfo(&sql);
	appendStringInfo(&sql, "SELECT * FROM %s(",
					 quote_qualified_identifier(get_namespace_name(proc->pronamespace),
												NameStr(proc->proname)));
	for (int i = 0; i < nargs; i++)
	{
		argtypes[i] = proc->proargtypes.values[i];
		values[i] = fcinfo->args[i].value;
		nulls[i] = fcinfo->args[i].isnull ? 'n' : ' ';
		appendStringInfo(&sql, "%s$%d", i > 0 ? ", " : "", i + 1);
	}
	appendStringInfoChar(&sql, ')');
	ReleaseSysCache(proctup);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idem: SPI_connect failed");
	redispatch_depth++;
	PG_TRY();
	{
		rc = SPI_execute_with_args(sql.data, nargs, argtypes, values, nulls, false, 2);
	}
	PG_FINALLY();
	{
		redispatch_depth--;
	}
	PG_END_TRY();
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "idem: the delegated call returned %d rows (SPI code %d)",
			 (int) SPI_processed, rc);

	if (get_call_result_type(fcinfo, NULL, &tupdesc) == TYPEFUNC_COMPOSITE)
	{
		result = PointerGetDatum(SPI_returntuple(SPI_tuptable->vals[0], tupdesc));
		isnull = false;
	}
	else
	{
		Oid			rettype = SPI_gettypeid(SPI_tuptable->tupdesc, 1);
		int16		typlen;
		bool		typbyval;

		result = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		get_typlenbyval(rettype, &typlen, &typbyval);
		if (!isnull)
			result = SPI_datumTransfer(result, typbyval, typlen);
	}
	SPI_finish();
	fcinfo->isnull = isnull;
	return result;
}

/*
 * The relations that hold relid's rows on this node.  relid itself, or, for
 * a Citus distributed table, its shards placed here (none on a coordinator
 * without shards).
 */
List *
idem_citus_local_relations(Oid relid)
{
	List	   *relids = NIL;
	MemoryContext callercxt = CurrentMemoryContext;
	int			n;

	if (!idem_citus_distributed(relid))
		return list_make1_oid(relid);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idem: SPI_connect failed");
	n = read_shards(relid);
	for (int i = 0; i < n; i++)
	{
		Oid			shard = shard_here(relid, i);
		MemoryContext oldcxt;

		if (!OidIsValid(shard))
			continue;
		oldcxt = MemoryContextSwitchTo(callercxt);
		relids = lappend_oid(relids, shard);
		MemoryContextSwitchTo(oldcxt);
	}
	SPI_finish();
	return relids;
}

/*
 * The name of the function in schema nspid (idem's tables') that cleans one
 * node.  idem_cleanup_node, or idem_cleanup_expired on an older version.
 */
static const char *
cleanup_node_function(Oid nspid)
{
	Oid			argtypes[2] = {INT4OID, INT4OID};
	oidvector  *args = buildoidvector(argtypes, 2);

	if (OidIsValid(GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid,
								   CStringGetDatum("idem_cleanup_node"),
								   PointerGetDatum(args), ObjectIdGetDatum(nspid))))
		return "idem_cleanup_node";
	return "idem_cleanup_expired";
}

/*
 * On a Citus coordinator whose idempotency_record is distributed.  Run
 * idem_cleanup_expired(batch_size, max_batches) on every worker node, each
 * of which cleans its own shards and commits on its own (what is deleted is
 * expired either way).  Returns how many rows they deleted; 0 elsewhere.
 */
int64
idem_citus_cleanup_workers(Oid nspid, int batch_size, int max_batches)
{
	Oid			record = get_relname_relid("idempotency_record", nspid);
	StringInfoData cmd;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	int64		total = 0;

	if (!idem_citus_distributed(record))
		return 0;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idem: SPI_connect failed");
	if (SPI_execute("SELECT 1 FROM pg_catalog.pg_dist_local_group"
					" WHERE groupid OPERATOR(pg_catalog.=) 0", true, 1) != SPI_OK_SELECT)
		elog(ERROR, "idem: reading pg_dist_local_group failed");
	if (SPI_processed == 0)
	{
		/* a worker node cleans its own shards only */
		SPI_finish();
		return 0;
	}
	/*
	 * Each node runs idem_internal.idem_cleanup_node, which only idem's
	 * owner can create, rename or drop (an older version: the one function).
	 */
	initStringInfo(&cmd);
	appendStringInfo(&cmd, "SELECT %s.%s(%d, %s)",
					 quote_identifier(get_namespace_name(nspid)),
					 cleanup_node_function(nspid), batch_size,
					 max_batches < 0 ? "NULL" : psprintf("%d", max_batches));
	args[0] = CStringGetTextDatum(cmd.data);
	if (SPI_execute_with_args("SELECT nodename, nodeport, success, result"
							  "  FROM pg_catalog.run_command_on_workers($1)",
							  1, argtypes, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "idem: run_command_on_workers failed");
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		char	   *result = SPI_getvalue(tup, desc, 4);
		bool		isnull;

		if (!DatumGetBool(SPI_getbinval(tup, desc, 3, &isnull)))
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("idem_cleanup_expired failed on worker node %s:%s",
							SPI_getvalue(tup, desc, 1), SPI_getvalue(tup, desc, 2)),
					 errdetail("%s", result ? result : "no message")));
		total += pg_strtoint64(result);
	}
	SPI_finish();
	return total;
}
