/*-------------------------------------------------------------------------
 *
 * catalog_row.c
 *	  A row of one of idem's tables to write (IdemRow).  Its values set by
 *	  the columns of the table's spec, whatever their order in this
 *	  installation's table (catalog.c maps them).  And the result
 *	  descriptor of an entry point the catalog checked.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/lsyscache.h"

#include "idem.h"
#include "catalog.h"

/* A row of table t, every column NULL. */
void
idem_row_init(IdemRow *row, const IdemTableLayout *t)
{
	row->table = t;
	row->values = palloc0(t->natts * sizeof(Datum));
	row->nulls = palloc(t->natts * sizeof(bool));
	memset(row->nulls, true, t->natts * sizeof(bool));
}

/*
 * Set column col (an index into the table's column spec); a column the
 * table lacks (an optional one, before the version that added it) must be
 * left NULL.
 */
void
idem_row_set(IdemRow *row, int col, Datum value)
{
	AttrNumber	attnum = row->table->att[col];

	if (attnum == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table \"%s\" lacks a column this version of the library writes",
						get_rel_name(row->table->relid)),
				 errhint("Update the extension: ALTER EXTENSION idem UPDATE.")));
	row->values[attnum - 1] = value;
	row->nulls[attnum - 1] = false;
}

/* The blessed result descriptor of the entry point fcinfo calls. */
TupleDesc
idem_catalog_result(const IdemCatalog *cat, FunctionCallInfo fcinfo)
{
	for (int i = 0; i < cat->nentries; i++)
		if (cat->entries[i].fn_oid == fcinfo->flinfo->fn_oid && cat->entries[i].result)
			return cat->entries[i].result;
	elog(ERROR, "idem: function %u must return a composite type", fcinfo->flinfo->fn_oid);
	return NULL;				/* keep compiler quiet */
}
