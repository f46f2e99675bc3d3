/*-------------------------------------------------------------------------
 *
 * outbox_ack.c
 *	  The acknowledgement of outbox messages.  idem_outbox_ack.
 *
 * Every message acknowledged is deleted at once; each key whose head it
 * was gets its next message made the head (ready).  In order:
 *
 * 1. The messages are read (primary key) as the statement's snapshot
 *    shows them.  A ready message stays ready until it is deleted, so
 *    whether each keyed one is its key's head holds until step 3.  A
 *    message committed after that snapshot is not acknowledged.
 * 2. Their keys' locks are taken, before any row is written.  At most
 *    OUTBOX_KEY_LOCKS keys take each key's lock, more the all-keys lock.
 *    The mode is SHARE if every keyed message is its key's head, else
 *    EXCLUSIVE.  Either excludes the emitters of those keys until the
 *    commit, so that step 4 sees a message an emitter left behind an old
 *    head.  SHARE lets acknowledgements of heads run together.  Each
 *    deletes only heads, and two that delete the same one queue on its
 *    row.  Each touches only the message after each of its heads, which
 *    nobody else writes meanwhile.  A fetch leases heads only, and an
 *    acknowledgement of a message behind a head takes EXCLUSIVE.
 * 3. The messages are deleted, with row locks that follow updates (a
 *    fetch may have leased a message again since step 1), and counted per
 *    topic.
 * 4. A new snapshot is taken.  Each key's first message after its
 *    acknowledged head is made ready, unless it already is or is a dead
 *    letter.  A dead letter's key waits behind it, and an acknowledgement
 *    of a dead letter itself is ignored.  If a message behind its key's
 *    head was acknowledged, the search starts from the key's start.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "idem.h"
#include "compat.h"
#include "catalog.h"
#include "outbox.h"
#include "outbox_int.h"
#include "identity.h"
#include "stats.h"
#include "rowwrite.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_outbox_ack);

/* A message an acknowledgement found in step 1. */
typedef struct AckedMessage
{
	ItemPointerData tid;
	text	   *topic;
	text	   *msg_key;		/* NULL: no key */
	int64		commit_seq;
	bool		ready;
	uint64		keyhash;
} AckedMessage;

static int
int64_order(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return x < y ? -1 : (x > y);
}

/* Keyed messages first, by key (hash, then text), each key's in commit order. */
static int
acked_order(const void *a, const void *b)
{
	const AckedMessage *m1 = a;
	const AckedMessage *m2 = b;

	if ((m1->msg_key == NULL) != (m2->msg_key == NULL))
		return m1->msg_key == NULL ? 1 : -1;
	if (m1->msg_key != NULL)
	{
		int			c;

		if (m1->keyhash != m2->keyhash)
			return m1->keyhash < m2->keyhash ? -1 : 1;
		c = idem_outbox_text_order(m1->topic, m2->topic);
		if (c == 0)
			c = idem_outbox_text_order(m1->msg_key, m2->msg_key);
		if (c != 0)
			return c;
	}
	return m1->commit_seq < m2->commit_seq ? -1 : (m1->commit_seq > m2->commit_seq);
}

static bool
same_key(const AckedMessage *m1, const AckedMessage *m2)
{
	return m1->keyhash == m2->keyhash && idem_outbox_text_order(m1->topic, m2->topic) == 0 &&
		idem_outbox_text_order(m1->msg_key, m2->msg_key) == 0;
}

/* The ids of the array, sorted, NULLs and repeats left out. */
static int64 *
ack_ids(ArrayType *array, int *n)
{
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;
	int64	   *ids;
	int			k = 0;

	deconstruct_array(array, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
					  &elems, &nulls, &nelems);
	ids = palloc(Max(nelems, 1) * sizeof(int64));
	for (int i = 0; i < nelems; i++)
		if (!nulls[i])
			ids[k++] = DatumGetInt64(elems[i]);
	qsort(ids, k, sizeof(int64), int64_order);
	*n = 0;
	for (int i = 0; i < k; i++)
		if (i == 0 || ids[i] != ids[i - 1])
			ids[(*n)++] = ids[i];
	return ids;
}

/*
 * Whether the message in slot is a dead letter holding its key back
 * (dead_at set; a late acknowledgement of it changes nothing, and no
 * message behind it becomes its key's head).
 */
static bool
outbox_dead(const IdemTableLayout *t, TupleTableSlot *slot)
{
	bool		isnull = true;

	if (t->att[OB_DEAD] != InvalidAttrNumber)
		(void) slot_getattr(slot, t->att[OB_DEAD], &isnull);
	return !isnull;
}

/* Step 1: the unacknowledged messages of ids[0..n-1], into found. */
static int
ack_read(const IdemTableLayout *t, Relation heap, Snapshot snapshot,
		 const int64 *ids, int n, AckedMessage *found)
{
	Oid			pkid = idem_primary_key_index(heap);
	Relation	pk;
	IndexScanDesc scan;
	TupleTableSlot *slot = table_slot_create(heap, NULL);
	ScanKeyData skey;
	int			nfound = 0;

	if (!OidIsValid(pkid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table idem_outbox has no primary key"),
				 errhint("Drop and re-create the extension idem.")));
	pk = index_open(pkid, AccessShareLock);
	if (pk->rd_index->indnkeyatts != 1 || pk->rd_index->indkey.values[0] != t->att[OB_ID])
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's table idem_outbox has a primary key other than (message_id)"),
				 errhint("Undo the change, or drop and re-create the extension idem.")));
	scan = idem_index_beginscan(heap, pk, snapshot, 1, 0);
	for (int i = 0; i < n; i++)
	{
		AckedMessage *m = &found[nfound];
		bool		isnull;
		Datum		d;

		CHECK_FOR_INTERRUPTS();
		ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(ids[i]));
		index_rescan(scan, &skey, 1, NULL, 0);
		if (!index_getnext_slot(scan, ForwardScanDirection, slot))
			continue;
		(void) slot_getattr(slot, t->att[OB_ACKED], &isnull);
		if (!isnull)
			continue;			/* acknowledged by an older version, so the cleanup's */
		if (outbox_dead(t, slot))
			continue;			/* a dead letter, which only redrive or discard end */
		m->tid = slot->tts_tid;
		m->topic = DatumGetTextPCopy(slot_getattr(slot, t->att[OB_TOPIC], &isnull));
		d = slot_getattr(slot, t->att[OB_KEY], &isnull);
		m->msg_key = isnull ? NULL : DatumGetTextPCopy(d);
		m->commit_seq = DatumGetInt64(slot_getattr(slot, t->att[OB_COMMIT_SEQ], &isnull));
		m->ready = DatumGetBool(slot_getattr(slot, t->att[OB_READY], &isnull));
		m->keyhash = m->msg_key ? idem_outbox_hash_key(m->topic, m->msg_key) : 0;
		nfound++;
	}
	index_endscan(scan);
	index_close(pk, NoLock);
	ExecDropSingleTupleTableSlot(slot);
	return nfound;
}

/*
 * Step 2: the locks of the keyed messages found[0..nkeyed-1], sorted by key;
 * behind.  One of them is not its key's head.
 */
static void
ack_lock(const AckedMessage *found, int nkeyed, bool behind)
{
	uint64	   *hashes = palloc(Max(nkeyed, 1) * sizeof(uint64));

	for (int i = 0; i < nkeyed; i++)
		hashes[i] = found[i].keyhash;
	idem_outbox_lock_key_order(hashes, nkeyed, behind ? ExclusiveLock : ShareLock);
	pfree(hashes);
}

/* Step 3: delete the messages found[0..n-1]; returns how many. */
static int64
ack_delete(const IdemTableLayout *t, IdemRows *rows, Snapshot snapshot,
		   const AckedMessage *found, int n)
{
	Relation	heap = rows->rels[0]->ri_RelationDesc;
	TupleTableSlot *locked = table_slot_create(heap, NULL);
	char	  **topics = palloc(Max(n, 1) * sizeof(char *));
	int64	   *counts = palloc0(Max(n, 1) * sizeof(int64));
	int			ntopics = 0;
	int64		deleted = 0;

	for (int i = 0; i < n; i++)
	{
		ItemPointerData tid = found[i].tid;
		TM_FailureData tmfd;
		TM_Result	tmres;
		bool		isnull;
		char	   *topic;
		int			k;

		CHECK_FOR_INTERRUPTS();
		tmres = table_tuple_lock(heap, &tid, snapshot, locked, GetCurrentCommandId(false),
								 LockTupleExclusive, LockWaitBlock,
								 TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd);
		if (tmres == TM_Deleted || tmres == TM_SelfModified)
			continue;			/* another acknowledgement's */
		if (tmres != TM_Ok)
			elog(ERROR, "idem: unexpected result %d locking an outbox message", (int) tmres);
		(void) slot_getattr(locked, t->att[OB_ACKED], &isnull);
		if (!isnull)
			continue;
		idem_rows_delete(rows, 0, locked);
		deleted++;

		topic = text_to_cstring(found[i].topic);
		for (k = 0; k < ntopics && strcmp(topics[k], topic) != 0; k++)
			;
		if (k == ntopics)
			topics[ntopics++] = topic;
		counts[k]++;
	}
	for (int k = 0; k < ntopics; k++)
		idem_stats_count_at_commit(IDEM_KIND_TOPIC, topics[k], IDEM_STAT_OUTBOX_ACKED, counts[k]);
	ExecDropSingleTupleTableSlot(locked);
	return deleted;
}

/*
 * Step 4, for the key of m.  Its first unacknowledged message after
 * commit_seq `after`, made ready unless it is.
 */
static void
ack_promote(const IdemTableLayout *t, IdemRows *rows, Relation keyindex,
			Snapshot snapshot, const AckedMessage *m, int64 after,
			TupleTableSlot *slot, TupleTableSlot *locked)
{
	Relation	heap = rows->rels[0]->ri_RelationDesc;
	ScanKeyData skey[3];
	IndexScanDesc scan;

	ScanKeyEntryInitialize(&skey[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   keyindex->rd_indcollation[0], F_TEXTEQ, PointerGetDatum(m->topic));
	ScanKeyEntryInitialize(&skey[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   keyindex->rd_indcollation[1], F_TEXTEQ, PointerGetDatum(m->msg_key));
	ScanKeyEntryInitialize(&skey[2], 0, 3, BTGreaterStrategyNumber, InvalidOid,
						   InvalidOid, F_INT8GT, Int64GetDatum(after));
	scan = idem_index_beginscan(heap, keyindex, snapshot, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		ItemPointerData tid = slot->tts_tid;
		TM_FailureData tmfd;
		TM_Result	tmres;
		bool		isnull;
		int			natts = locked->tts_tupleDescriptor->natts;
		Datum	   *values;
		bool	   *nulls;

		(void) slot_getattr(slot, t->att[OB_ACKED], &isnull);
		if (!isnull)
			continue;
		if (DatumGetBool(slot_getattr(slot, t->att[OB_READY], &isnull)) ||
			outbox_dead(t, slot))
			break;				/* the head already, or a dead letter holding the key */
		tmres = table_tuple_lock(heap, &tid, snapshot, locked, GetCurrentCommandId(false),
								 LockTupleNoKeyExclusive, LockWaitBlock,
								 TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd);
		if (tmres == TM_Deleted)
			continue;			/* acknowledged meanwhile, so on to the next one */
		if (tmres != TM_Ok)
			elog(ERROR, "idem: unexpected result %d locking an outbox message", (int) tmres);
		slot_getallattrs(locked);
		if (!locked->tts_isnull[t->att[OB_ACKED] - 1] ||
			DatumGetBool(locked->tts_values[t->att[OB_READY] - 1]))
			break;
		values = palloc(natts * sizeof(Datum));
		nulls = palloc(natts * sizeof(bool));
		memcpy(values, locked->tts_values, natts * sizeof(Datum));
		memcpy(nulls, locked->tts_isnull, natts * sizeof(bool));
		values[t->att[OB_READY] - 1] = BoolGetDatum(true);
		idem_rows_update(rows, 0, locked, values, nulls);
		pfree(values);
		pfree(nulls);
		break;
	}
	index_endscan(scan);
}

/* SQL: idem_outbox_ack(message_ids bigint[]) returns bigint */
Datum
idem_outbox_ack(PG_FUNCTION_ARGS)
{
	const IdemCatalog *cat;
	const IdemTableLayout *t;
	IdemIdentity identity = {0};
	IdemRows	rows;
	int64	   *ids;
	int			n;
	AckedMessage *found;
	int			nfound;
	int			nkeyed = 0;
	bool		behind = false;
	Snapshot	snapshot;
	int64		deleted;

	idem_check_not_null(fcinfo, 0, "message_ids");
	if (XactIsoLevel != XACT_READ_COMMITTED)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idem_outbox_ack must run in a READ COMMITTED transaction"),
				 errdetail("After taking its keys' locks it must see what committed before them.")));
	cat = idem_catalog(fcinfo);
	t = idem_catalog_table(cat, idem_outbox_table_index);
	ids = ack_ids(PG_GETARG_ARRAYTYPE_P(0), &n);

	idem_become_owner(&identity, cat->owner);
	idem_use_safe_search_path(&identity);
	/* the trigger check of every idem write, even with nothing to delete */
	idem_rows_begin(&rows, &t->relid, 1, CMD_DELETE);

	/* step 1 */
	found = palloc(Max(n, 1) * sizeof(AckedMessage));
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	nfound = ack_read(t, rows.rels[0]->ri_RelationDesc, snapshot, ids, n, found);
	qsort(found, nfound, sizeof(AckedMessage), acked_order);
	while (nkeyed < nfound && found[nkeyed].msg_key != NULL)
		behind |= !found[nkeyed++].ready;

	/* steps 2 and 3 */
	ack_lock(found, nkeyed, behind);
	deleted = ack_delete(t, &rows, snapshot, found, nfound);
	UnregisterSnapshot(snapshot);
	idem_rows_end(&rows);

	/* step 4, seeing what committed before the locks */
	if (nkeyed > 0)
	{
		Relation	keyindex;
		TupleTableSlot *slot;
		TupleTableSlot *locked;
		Relation	heap;

		snapshot = RegisterSnapshot(GetLatestSnapshot());
		idem_rows_begin(&rows, &t->relid, 1, CMD_UPDATE);
		heap = rows.rels[0]->ri_RelationDesc;
		keyindex = idem_outbox_open_key_index(t, cat->nspid, heap);
		slot = table_slot_create(heap, NULL);
		locked = table_slot_create(heap, NULL);
		for (int i = 0; i < nkeyed; i++)
		{
			CHECK_FOR_INTERRUPTS();
			if (i > 0 && same_key(&found[i - 1], &found[i]))
				continue;		/* its first message found decides */
			ack_promote(t, &rows, keyindex, snapshot, &found[i],
						behind ? PG_INT64_MIN : found[i].commit_seq, slot, locked);
		}
		ExecDropSingleTupleTableSlot(slot);
		ExecDropSingleTupleTableSlot(locked);
		index_close(keyindex, NoLock);
		idem_rows_end(&rows);
		UnregisterSnapshot(snapshot);
	}
	idem_restore_caller(&identity);
	PG_RETURN_INT64(deleted);
}
