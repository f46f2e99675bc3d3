/*-------------------------------------------------------------------------
 *
 * catalog.c
 *	  What idem looks up once per backend rather than per call.
 *
 * A prepared statement's function call state lives only for one
 * execution.  So idem keeps one catalog per backend, keyed by the extension
 * (its schema and owner), not by the calling function.  It holds:
 *	- the OIDs of the schema, of idempotency_record and its scope index;
 *	- each registered table (the order demo's, the outbox's), its id
 *	  sequence and where its columns are;
 *	- their CHECK constraints, parsed and planned;
 *	- the result descriptor of each SQL entry point seen.
 * It is built again after a relcache invalidation of any of these
 * relations (ALTER TABLE, DROP EXTENSION, a cache reset), a pg_proc
 * change, or a call from a function of another schema or owner (a
 * re-created extension).
 *
 * Callers copy the catalog for the length of their call.  A nested call (a
 * trigger calling idem) may build it again, and the previous build's
 * memory lives until the end of the transaction.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/genam.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_class.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "optimizer/optimizer.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "idem.h"
#include "catalog.h"
#include "citus_meta.h"
#include "util.h"

static const IdemColumnSpec record_columns[REC_NCOLS] = {
	[REC_ID] = {"id", INT8OID, 0, false, false},
	[REC_OWNER] = {"owner_id", INT8OID, 0, false, false},
	[REC_OPERATION] = {"operation", VARCHAROID, IDEM_OPERATION_MAX_LEN, false, false},
	[REC_KEY] = {"idempotency_key", VARCHAROID, IDEM_KEY_MAX_LEN, false, false},
	[REC_HASH] = {"request_hash", BPCHAROID, IDEM_HASH_HEX_LEN, true, false},
	[REC_STATUS] = {"status", VARCHAROID, 16, false, false},
	[REC_HTTP] = {"http_status", INT4OID, 0, false, false},
	[REC_RESPONSE] = {"response_json", JSONBOID, 0, false, false},
	[REC_RESOURCE] = {"resource_id", INT8OID, 0, false, false},
	[REC_CREATED] = {"created_at", TIMESTAMPTZOID, 0, false, false},
	[REC_UPDATED] = {"updated_at", TIMESTAMPTZOID, 0, false, false},
	[REC_EXPIRES] = {"expires_at", TIMESTAMPTZOID, 0, false, false},
	[REC_BODY] = {"response_body", JSONOID, 0, false, true},
	[REC_HEADERS] = {"response_headers", JSONBOID, 0, false, true},
	[REC_TASK_REQUEST] = {"task_request", JSONBOID, 0, false, true},
	[REC_TASK_PAYLOAD] = {"task_payload", JSONBOID, 0, false, true},
	[REC_TASK_ATTEMPTS] = {"task_attempts", INT4OID, 0, false, true},
	[REC_TASK_TOKEN] = {"task_token", INT8OID, 0, false, true},
	[REC_TASK_DUE] = {"task_due_at", TIMESTAMPTZOID, 0, false, true},
	[REC_TASK_LEASE_EXPIRES] = {"task_lease_expires_at", TIMESTAMPTZOID, 0, false, true},
	[REC_TASK_WORKER] = {"task_worker", VARCHAROID, IDEM_WORKER_MAX_LEN, false, true},
	[REC_TASK_HEARTBEAT] = {"task_heartbeat_at", TIMESTAMPTZOID, 0, false, true},
	[REC_TASK_SESSION] = {"task_session", INT8OID, 0, false, true},
	[REC_TASK_LAST_ERROR] = {"task_last_error", JSONBOID, 0, false, true},
	[REC_TASK_TTL] = {"task_ttl", INTERVALOID, 0, false, true},
	[REC_FP_VERSION] = {"fingerprint_version", INT2OID, 0, false, true},
	[REC_HEADER_LIST] = {"response_header_list", JSONOID, 0, false, true},
	[REC_TASK_LAPSES] = {"task_lapses", INT4OID, 0, false, true},
	[REC_DIGEST] = {"request_digest", BYTEAOID, 0, false, true},
	[REC_TASK_LEASED] = {"task_leased_at", TIMESTAMPTZOID, 0, false, true},
	[REC_TASK_UNCERTAIN] = {"task_uncertain_since", TIMESTAMPTZOID, 0, false, true},
	[REC_TASK_RECONCILE_AT] = {"task_reconcile_at", TIMESTAMPTZOID, 0, false, true},
	[REC_TASK_RECONCILES] = {"task_reconciles", INT4OID, 0, false, true},
	[REC_TASK_TRACE] = {"task_trace_context", TEXTOID, 0, false, true},
};

static const IdemTableSpec record_table = {
	"idempotency_record", "idempotency_record_id_seq", record_columns, REC_NCOLS,
	NULL, 0, false,
	{[REC_INDEX_TASK_DUE] = "idem_task_due", [REC_INDEX_TASK_ID] = "idem_task_id", [REC_INDEX_RECONCILE] = "idem_task_reconcile"}
};

/* The tables, by registration number; idempotency_record first. */
static const IdemTableSpec *table_specs[IDEM_MAX_TABLES] = {&record_table};
static int	ntable_specs = 1;

static IdemCatalog catalog;
static MemoryContext catalog_cxt = NULL;
static uint64 catalog_generation = 0;
static bool catalog_building = false;
static bool catalog_build_invalidated = false;

/*
 * Register a table the catalog looks up along with idempotency_record;
 * returns its index in IdemCatalog.tables.  Called from _PG_init.
 */
int
idem_catalog_register(const IdemTableSpec *spec)
{
	if (ntable_specs >= IDEM_MAX_TABLES)
		elog(ERROR, "idem: too many tables registered");
	table_specs[ntable_specs] = spec;
	return ntable_specs++;
}

/* Drop the catalog when one of its relations changes. */
static void
catalog_relcache_callback(Datum arg, Oid relid)
{
	/* while building, any change may concern what was already looked up */
	if (catalog_building)
		catalog_build_invalidated = true;
	if (!catalog.valid)
		return;
	if (relid == InvalidOid || relid == catalog.scopeid)
	{
		catalog.valid = false;
		return;
	}
	for (int i = 0; i < catalog.ntables; i++)
		if (relid == catalog.tables[i].relid || relid == catalog.tables[i].seq ||
			relid == catalog.tables[i].keyindex)
			catalog.valid = false;
	/* a result type altered (ALTER TYPE ... ADD ATTRIBUTE of an update) */
	for (int i = 0; i < catalog.nentries; i++)
		if (OidIsValid(catalog.entries[i].result_relid) && relid == catalog.entries[i].result_relid)
			catalog.valid = false;
}

/*
 * Drop the catalog.  For a cache built on it that saw one of its own
 * relations change (citus.c's shard maps).
 */
void
idem_catalog_invalidate(void)
{
	if (catalog_building)
		catalog_build_invalidated = true;
	catalog.valid = false;
}

/*
 * Drop the catalog when one of its entry points or result types changes
 * (an entry point's owner, say); other functions and types (a temporary
 * table's row type) leave it be.
 */
static void
catalog_syscache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	if (catalog_building)
		catalog_build_invalidated = true;
	/* 0: the whole cache was reset */
	if (hashvalue == 0 || (cacheid == TYPEOID && hashvalue == catalog.result_type_hash))
		catalog.valid = false;
	for (int i = 0; catalog.valid && i < catalog.nentries; i++)
		if ((cacheid == PROCOID && hashvalue == catalog.entries[i].fn_hash) ||
			(cacheid == TYPEOID && hashvalue == catalog.entries[i].result_hash))
			catalog.valid = false;
}

/* The OID of relation name in schema nspid, or an error saying it is missing. */
static Oid
extension_relation(const char *name, Oid nspid, char relkind)
{
	Oid			relid = get_relname_relid(name, nspid);

	if (!OidIsValid(relid) || get_rel_relkind(relid) != relkind)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's relation \"%s\" is missing from schema \"%s\"",
						name, get_namespace_name(nspid)),
				 errhint("Drop and re-create the extension idem.")));
	return relid;
}

/*
 * Map spec's columns to attribute numbers of rel, checking that idem's raw
 * writes fit them.  The type, a length limit no shorter than what idem
 * stores, and no column idem does not know (it would get no default).
 */
static void
map_columns(Relation rel, const IdemColumnSpec *spec, int ncols, AttrNumber *attnums)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			live = 0;
	int			mapped = 0;

	for (int j = 0; j < desc->natts; j++)
		if (!TupleDescAttr(desc, j)->attisdropped)
			live++;

	for (int i = 0; i < ncols; i++)
	{
		Form_pg_attribute att = NULL;
		int32		maxlen;

		for (int j = 0; j < desc->natts; j++)
		{
			Form_pg_attribute a = TupleDescAttr(desc, j);

			if (!a->attisdropped && strcmp(NameStr(a->attname), spec[i].name) == 0)
			{
				att = a;
				break;
			}
		}
		if (att == NULL && spec[i].optional)
		{
			attnums[i] = InvalidAttrNumber;
			continue;
		}
		maxlen = (att && att->atttypmod >= 0) ? att->atttypmod - VARHDRSZ : -1;
		if (att == NULL || att->atttypid != spec[i].type ||
			(spec[i].len > 0 && maxlen >= 0 &&
			 (spec[i].exact ? maxlen != spec[i].len : maxlen < spec[i].len)))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idem's table \"%s\" was altered: column \"%s\" is missing or of another type",
							RelationGetRelationName(rel), spec[i].name),
					 errhint("Undo the change, or drop and re-create the extension idem.")));
		attnums[i] = att->attnum;
		mapped++;
	}
	if (live != mapped)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table \"%s\" was altered: it has columns idem does not write",
						RelationGetRelationName(rel)),
				 errhint("Undo the change, or drop and re-create the extension idem.")));
}

/*
 * rel's CHECK constraints, parsed and planned as ExecRelCheck does for
 * every statement; here once per backend.  Only the expression trees are
 * kept.  Each call builds its own executable state from them.
 */
static Expr **
plan_checks(Relation rel, int *ncheck)
{
	TupleConstr *constr = RelationGetDescr(rel)->constr;
	Expr	  **checks;

	*ncheck = constr ? constr->num_check : 0;
	if (*ncheck == 0)
		return NULL;
	checks = palloc(*ncheck * sizeof(Expr *));
	for (int i = 0; i < *ncheck; i++)
		checks[i] = expression_planner((Expr *) stringToNode(constr->check[i].ccbin));
	return checks;
}

/*
 * Check that index indexid is a valid, immediate, non-partial unique index
 * of t on exactly the attributes attnums[0..nkey-1], in that order.  What a
 * read through it relies on to find at most one row.
 */
static void
check_key_index(Oid indexid, Oid relid, const AttrNumber *attnums, int nkey)
{
	Relation	index = index_open(indexid, AccessShareLock);
	Form_pg_index ind = index->rd_index;
	bool		ok;

	ok = ind->indrelid == relid && ind->indnatts == nkey &&
		ind->indisunique && ind->indimmediate && ind->indisvalid &&
		heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL) &&
		heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL);
	for (int i = 0; ok && i < nkey; i++)
		ok = ind->indkey.values[i] == attnums[i];
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's index \"%s\" is not the unique index idem reads \"%s\" through",
						RelationGetRelationName(index), get_rel_name(relid)),
				 errdetail("It must be valid, immediate, without a predicate or expressions."),
				 errhint("Undo the change, or drop and re-create the extension idem.")));
	index_close(index, NoLock);
}

/*
 * Look up a table, its id sequence and its key index in schema nspid, as
 * spec describes them.  An optional table that is absent (a database not
 * yet updated to the version that adds it) is left with relid 0.
 */
static void
load_layout(IdemTableLayout *t, const IdemTableSpec *spec, Oid nspid)
{
	Relation	rel;

	memset(t, 0, sizeof(IdemTableLayout));
	if (spec->optional && !OidIsValid(get_relname_relid(spec->name, nspid)))
		return;
	t->relid = extension_relation(spec->name, nspid, RELKIND_RELATION);
	if (spec->seqname)
		t->seq = extension_relation(spec->seqname, nspid, RELKIND_SEQUENCE);
	rel = table_open(t->relid, AccessShareLock);
	t->att = palloc(spec->ncols * sizeof(AttrNumber));
	map_columns(rel, spec->columns, spec->ncols, t->att);
	t->natts = RelationGetDescr(rel)->natts;
	t->checks = plan_checks(rel, &t->ncheck);
	if (spec->keyname)
	{
		t->keyindex = extension_relation(spec->keyname, nspid, RELKIND_INDEX);
		check_key_index(t->keyindex, t->relid, t->att, spec->nkey);
	}
	for (int i = 0; i < IDEM_MAX_INDEXES; i++)
		if (spec->indexes[i])
			t->indexes[i] = get_relname_relid(spec->indexes[i], nspid);
	t->distributed = idem_citus_distributed(t->relid);
	table_close(rel, NoLock);
}

static Oid	check_scope_index(Oid indexid, const IdemTableLayout *record);

/*
 * The index of shard that Citus created from index shell_index of the
 * distributed table: the same columns, by name, and the same uniqueness;
 * its name is the shell's with the shard id appended, or a hash of it.
 */
static Oid
shard_index(Relation shard, Oid shell_index)
{
	Relation	shell = index_open(shell_index, AccessShareLock);
	Form_pg_index want = shell->rd_index;
	List	   *indexes = RelationGetIndexList(shard);
	Oid			found = InvalidOid;
	ListCell   *lc;

	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index ind = index->rd_index;
		bool		same = ind->indnatts == want->indnatts &&
			ind->indisunique == want->indisunique;

		for (int i = 0; same && i < ind->indnatts; i++)
		{
			AttrNumber	a = ind->indkey.values[i];
			AttrNumber	b = want->indkey.values[i];

			same = a > 0 && b > 0 &&
				strcmp(get_attname(RelationGetRelid(shard), a, false),
					   get_attname(want->indrelid, b, false)) == 0;
		}
		index_close(index, AccessShareLock);
		if (same)
		{
			found = lfirst_oid(lc);
			break;
		}
	}
	list_free(indexes);
	if (!OidIsValid(found))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's shard \"%s\" has no index like \"%s\"",
						RelationGetRelationName(shard), RelationGetRelationName(shell)),
				 errhint("Citus creates a shard's indexes from the distributed table's: undo the change to the shard.")));
	index_close(shell, AccessShareLock);
	return found;
}

/*
 * The layout of shard, a shard of table number `table` of cat (a Citus
 * distributed table): its columns mapped, its CHECKs planned, its key index
 * and other indexes and, for idempotency_record, its scope index (*scopeid)
 * found and checked,
 * all as for the table itself; the id sequence is the table's.  The result
 * is a local table.  Not distributed.
 */
void
idem_catalog_shard_layout(IdemTableLayout *t, Oid *scopeid, const IdemCatalog *cat,
						  int table, Oid shard)
{
	const IdemTableSpec *spec = table_specs[table];
	const IdemTableLayout *shell = &cat->tables[table];
	Relation	rel = table_open(shard, AccessShareLock);

	memset(t, 0, sizeof(IdemTableLayout));
	t->relid = shard;
	t->seq = shell->seq;
	t->att = palloc(spec->ncols * sizeof(AttrNumber));
	map_columns(rel, spec->columns, spec->ncols, t->att);
	t->natts = RelationGetDescr(rel)->natts;
	t->checks = plan_checks(rel, &t->ncheck);
	if (OidIsValid(shell->keyindex))
	{
		t->keyindex = shard_index(rel, shell->keyindex);
		check_key_index(t->keyindex, shard, t->att, spec->nkey);
	}
	for (int i = 0; i < IDEM_MAX_INDEXES; i++)
		if (OidIsValid(shell->indexes[i]))
			t->indexes[i] = shard_index(rel, shell->indexes[i]);
	if (table == IDEM_TABLE_RECORD)
		*scopeid = check_scope_index(shard_index(rel, cat->scopeid), t);
	table_close(rel, NoLock);
}

/*
 * Check that uk_idempotency_scope is what the protocol relies on: a valid,
 * immediate, non-partial unique index on exactly (owner_id, operation,
 * idempotency_key).
 */
static Oid
check_scope_index(Oid indexid, const IdemTableLayout *record)
{
	Relation	index = index_open(indexid, AccessShareLock);
	Form_pg_index ind = index->rd_index;

	if (ind->indrelid != record->relid || ind->indnatts != 3 ||
		!ind->indisunique || !ind->indimmediate || !ind->indisvalid ||
		!heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL) ||
		!heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) ||
		ind->indkey.values[0] != record->att[REC_OWNER] ||
		ind->indkey.values[1] != record->att[REC_OPERATION] ||
		ind->indkey.values[2] != record->att[REC_KEY])
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's index \"uk_idempotency_scope\" is not the unique index on (owner_id, operation, idempotency_key)"),
				 errdetail("It must be valid, immediate, without a predicate or expressions."),
				 errhint("Undo the change, or drop and re-create the extension idem.")));
	index_close(index, NoLock);
	return indexid;
}

/* The owner and schema of function fn_oid. */
static void
function_owner_schema(Oid fn_oid, Oid *owner, Oid *nspid)
{
	HeapTuple	proctup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn_oid));
	Form_pg_proc proc;

	if (!HeapTupleIsValid(proctup))
		elog(ERROR, "idem: cache lookup failed for function %u", fn_oid);
	proc = (Form_pg_proc) GETSTRUCT(proctup);
	*owner = proc->proowner;
	*nspid = proc->pronamespace;
	ReleaseSysCache(proctup);
}

/* Add the calling function to the entry points of the current build. */
static void
add_entry_point(FunctionCallInfo fcinfo)
{
	IdemEntryPoint *e;
	TupleDesc	tupdesc;
	MemoryContext oldcxt;

	Assert(catalog.nentries < IDEM_MAX_ENTRY_POINTS);
	e = &catalog.entries[catalog.nentries];
	e->fn_oid = fcinfo->flinfo->fn_oid;
	e->fn_hash = GetSysCacheHashValue1(PROCOID, ObjectIdGetDatum(e->fn_oid));
	e->result = NULL;
	e->result_relid = InvalidOid;
	e->result_hash = 0;
	oldcxt = MemoryContextSwitchTo(catalog_cxt);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) == TYPEFUNC_COMPOSITE)
	{
		e->result = BlessTupleDesc(CreateTupleDescCopy(tupdesc));
		e->result_relid = get_typ_typrelid(tupdesc->tdtypeid);
		if (tupdesc->tdtypeid != RECORDOID)
			e->result_hash = GetSysCacheHashValue1(TYPEOID, ObjectIdGetDatum(tupdesc->tdtypeid));
	}
	MemoryContextSwitchTo(oldcxt);
	catalog.nentries++;
}

/* Is fn_oid an entry point of the current build? */
static bool
known_entry_point(Oid fn_oid)
{
	for (int i = 0; i < catalog.nentries; i++)
		if (catalog.entries[i].fn_oid == fn_oid)
			return true;
	return false;
}

/*
 * Build the catalog for the extension whose function fcinfo calls.  Its API
 * in schema apinspid, its tables in nspid.
 */
static void
build_catalog(Oid owner, Oid apinspid, Oid nspid)
{
	IdemCatalog cat = {0};
	MemoryContext oldcxt;

	/*
	 * A call in progress further up the stack (from a trigger, say) may
	 * still use the previous build.  It is freed with the transaction.
	 */
	if (catalog_cxt == NULL)
	{
		CacheRegisterRelcacheCallback(catalog_relcache_callback, (Datum) 0);
		CacheRegisterSyscacheCallback(PROCOID, catalog_syscache_callback, (Datum) 0);
		CacheRegisterSyscacheCallback(TYPEOID, catalog_syscache_callback, (Datum) 0);
	}
	else
		MemoryContextSetParent(catalog_cxt, TopTransactionContext);
	catalog_cxt = AllocSetContextCreate(CacheMemoryContext, "idem catalog",
										ALLOCSET_SMALL_SIZES);
	catalog.valid = false;
	catalog_building = true;
	catalog_build_invalidated = false;

	cat.owner = owner;
	cat.apinspid = apinspid;
	cat.nspid = nspid;
	oldcxt = MemoryContextSwitchTo(catalog_cxt);
	cat.ntables = ntable_specs;
	for (int i = 0; i < ntable_specs; i++)
		load_layout(&cat.tables[i], table_specs[i], nspid);
	cat.scopeid = check_scope_index(extension_relation("uk_idempotency_scope", nspid,
													   RELKIND_INDEX),
									&cat.tables[IDEM_TABLE_RECORD]);
	cat.result_type = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
									  CStringGetDatum("idem_result"),
									  ObjectIdGetDatum(apinspid));
	if (OidIsValid(cat.result_type))
		cat.result_type_hash = GetSysCacheHashValue1(TYPEOID, ObjectIdGetDatum(cat.result_type));
	idem_catalog_load_digest_secret(&cat);
	MemoryContextSwitchTo(oldcxt);

	/*
	 * The relations are locked now, so what was read is current; but if an
	 * invalidation came while looking them up, serve this call and look
	 * again on the next.  (An error above leaves catalog_building set: it
	 * only makes the next build's check pessimistic.)
	 */
	catalog_building = false;
	cat.generation = ++catalog_generation;
	cat.valid = !catalog_build_invalidated;
	catalog = cat;
}

/*
 * The catalog for the extension of the function being called, built if
 * need be.  Callers copy it for the length of their call.
 */
const IdemCatalog *
idem_catalog(FunctionCallInfo fcinfo)
{
	Oid			fn_oid = fcinfo->flinfo->fn_oid;
	Oid			owner;
	Oid			nspid;

	if (catalog.valid && known_entry_point(fn_oid))
		return &catalog;

	function_owner_schema(fn_oid, &owner, &nspid);
	/* a full table of entry points starts a new build, in a new context */
	if (!catalog.valid || catalog.apinspid != nspid || catalog.owner != owner ||
		catalog.nentries >= IDEM_MAX_ENTRY_POINTS)
		build_catalog(owner, nspid, idem_function_tables_schema(fcinfo));
	add_entry_point(fcinfo);
	return &catalog;
}

/* Is cat still the current, valid build (so its planned CHECKs apply)? */
bool
idem_catalog_current(const IdemCatalog *cat)
{
	return catalog.valid && catalog.generation == cat->generation;
}

/*
 * Table number `table` of cat; an optional table this database lacks is an
 * error telling to update the extension.
 */
const IdemTableLayout *
idem_catalog_table(const IdemCatalog *cat, int table)
{
	const IdemTableLayout *t = &cat->tables[table];

	if (!OidIsValid(t->relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table \"%s\" is missing from schema \"%s\"",
						table_specs[table]->name, get_namespace_name(cat->nspid)),
				 errhint("Update the extension: ALTER EXTENSION idem UPDATE.")));
	return t;
}
