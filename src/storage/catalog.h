/*-------------------------------------------------------------------------
 *
 * catalog.h
 *	  What idem looks up once per backend.  Its schema and owner, the
 *	  layout of idempotency_record and of every registered table, the
 *	  scope index, the result types.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CATALOG_H
#define IDEM_CATALOG_H

#include "access/attnum.h"
#include "access/tupdesc.h"
#include "fmgr.h"
#include "nodes/primnodes.h"

#include "idem.h"

/*
 * A column idem writes, by name.  Columns are mapped to attribute numbers
 * once per backend, and a table altered so that idem's raw writes would no
 * longer fit it is refused with a clear error (55000).
 */
typedef struct IdemColumnSpec
{
	const char *name;
	Oid			type;
	int			len;			/* characters idem may store; 0: any */
	bool		exact;			/* char(n): the typmod must be exactly len */
	bool		optional;		/* absent before some version: attnum 0 */
} IdemColumnSpec;

/* Other indexes a table's calls scan, by name; absent ones are InvalidOid. */
#define IDEM_MAX_INDEXES		3

/*
 * A table idem writes: its name, its id sequence (or NULL), its columns;
 * optionally a unique index on its first nkey columns that idem reads
 * through; whether it is absent before some version of the extension; and
 * other indexes its calls scan, each absent before some version.
 */
typedef struct IdemTableSpec
{
	const char *name;
	const char *seqname;
	const IdemColumnSpec *columns;
	int			ncols;
	const char *keyname;		/* unique index on columns[0..nkey-1], or NULL */
	int			nkey;
	bool		optional;		/* absent before some version: relid 0 */
	const char *indexes[IDEM_MAX_INDEXES];	/* NULL: none */
} IdemTableSpec;

/* A table as this backend found it. */
typedef struct IdemTableLayout
{
	Oid			relid;			/* InvalidOid: an optional table, absent */
	Oid			seq;			/* the sequence of its id, if it has one */
	Oid			keyindex;		/* the spec's unique index, if it has one */
	Oid			indexes[IDEM_MAX_INDEXES];	/* the spec's other indexes, if here */
	int			natts;			/* attributes, dropped ones included */
	AttrNumber *att;			/* by column of its spec; 0: absent */
	int			ncheck;			/* CHECK constraints, planned */
	Expr	  **checks;
	bool		distributed;	/* a Citus table, whose rows are in its shards */
} IdemTableLayout;

/* The columns of idempotency_record, in the order of its spec. */
typedef enum IdemRecordColumn
{
	REC_ID, REC_OWNER, REC_OPERATION, REC_KEY, REC_HASH, REC_STATUS, REC_HTTP,
	REC_RESPONSE, REC_RESOURCE, REC_CREATED, REC_UPDATED, REC_EXPIRES,
	REC_BODY, REC_HEADERS,
	REC_TASK_REQUEST, REC_TASK_PAYLOAD, REC_TASK_ATTEMPTS, REC_TASK_TOKEN,
	REC_TASK_DUE, REC_TASK_LEASE_EXPIRES, REC_TASK_WORKER, REC_TASK_HEARTBEAT,
	REC_TASK_SESSION, REC_TASK_LAST_ERROR, REC_TASK_TTL,
	REC_FP_VERSION, REC_HEADER_LIST, REC_TASK_LAPSES, REC_DIGEST,
	REC_TASK_LEASED, REC_TASK_UNCERTAIN, REC_TASK_RECONCILE_AT, REC_TASK_RECONCILES, REC_TASK_TRACE, REC_NCOLS
} IdemRecordColumn;

/* idempotency_record's other indexes: the leases', and (on Citus) the holder's */
#define REC_INDEX_TASK_DUE		0	/* idem_task_due */
#define REC_INDEX_TASK_ID		1	/* idem_task_id, made by idem_distribute() */
#define REC_INDEX_RECONCILE		2	/* idem_task_reconcile */

/* idempotency_record is table 0; the others register in _PG_init */
#define IDEM_TABLE_RECORD		0
#define IDEM_MAX_TABLES			8
#define IDEM_MAX_ENTRY_POINTS	24

/* One SQL function this build of the catalog was checked for. */
typedef struct IdemEntryPoint
{
	Oid			fn_oid;
	uint32		fn_hash;		/* its pg_proc syscache hash */
	TupleDesc	result;			/* blessed, or NULL if not composite */
	Oid			result_relid;	/* the composite type's relation */
	uint32		result_hash;	/* the composite type's pg_type syscache hash, or 0 */
} IdemEntryPoint;

typedef struct IdemCatalog
{
	bool		valid;
	Oid			apinspid;		/* the extension's schema, with its API and types */
	Oid			nspid;			/* its tables' (idem_internal from 1.13) */
	Oid			owner;			/* whom the tables are accessed as */
	Oid			scopeid;		/* uk_idempotency_scope */
	Oid			result_type;	/* idem_result, InvalidOid before 1.3 */
	uint32		result_type_hash;	/* its pg_type syscache hash, or 0 */
	int			ntables;
	IdemTableLayout tables[IDEM_MAX_TABLES];
	int			nentries;
	IdemEntryPoint entries[IDEM_MAX_ENTRY_POINTS];
	uint64		generation;		/* tells one build from the next */
	bool		has_digest_secret;	/* idem_digest_secret holds one */
	uint8		digest_secret[IDEM_DIGEST_SECRET_LEN];
} IdemCatalog;

/* The request digest secret of cat's database, or NULL (catalog_secret.c). */
static inline const uint8 *
idem_catalog_digest_secret(const IdemCatalog *cat)
{
	return cat->has_digest_secret ? cat->digest_secret : NULL;
}

/* A row of one of idem's tables being filled in, every column NULL at first. */
typedef struct IdemRow
{
	const IdemTableLayout *table;
	Datum	   *values;
	bool	   *nulls;
} IdemRow;

extern int	idem_catalog_register(const IdemTableSpec *spec);
extern const IdemCatalog *idem_catalog(FunctionCallInfo fcinfo);
extern bool idem_catalog_current(const IdemCatalog *cat);
extern void idem_catalog_invalidate(void);
extern TupleDesc idem_catalog_result(const IdemCatalog *cat, FunctionCallInfo fcinfo);
extern const IdemTableLayout *idem_catalog_table(const IdemCatalog *cat, int table);
extern void idem_catalog_load_digest_secret(IdemCatalog *cat);

extern void idem_catalog_shard_layout(IdemTableLayout *t, Oid *scopeid,
									  const IdemCatalog *cat, int table, Oid shard);

extern void idem_row_init(IdemRow *row, const IdemTableLayout *t);
extern void idem_row_set(IdemRow *row, int col, Datum value);

#endif							/* IDEM_CATALOG_H */
