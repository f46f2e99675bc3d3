/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  The transactional outbox.  Its table and the commit-order locks of its
 *	  keys, which the emit (outbox_emit.c) and the acknowledgement
 *	  (outbox_ack.c) take alike.
 *
 * A message exists if and only if the transaction that emitted it
 * commits, and for one (topic, msg_key) messages are delivered in the
 * order their transactions committed (outbox_emit.c says how).  Both rest
 * on the locks here: one per (topic, msg_key), an advisory lock of the
 * key's hash.
 *
 * The locks are two-level, as a table's are to its rows.  A transaction of
 * at most OUTBOX_KEY_LOCKS keys takes the all-keys lock in ROW EXCLUSIVE
 * mode, which such transactions share, and then each key's lock.  A
 * transaction of more keys takes the all-keys lock alone, in EXCLUSIVE
 * mode, which orders it against every key at once.  So a commit holds at
 * most OUTBOX_KEY_LOCKS + 1 locks, whatever it emitted, and a backfill of a
 * million keyed messages cannot fill the server's lock table.  The locks
 * of one transaction are taken in one global order (the all-keys lock,
 * then by hash), so committing transactions cannot deadlock on them.
 *
 * An acknowledgement takes the same locks.  One of more keys whose
 * messages are all their keys' heads takes the all-keys lock in SHARE mode
 * instead.  That excludes every emitter but not the other
 * acknowledgements, which touch only their own heads and the messages
 * after them (outbox_ack.c).
 *
 * The fetch is SQL (idem_outbox_fetch), one UPDATE ... FOR UPDATE SKIP
 * LOCKED of the keys' heads.  Its first statement is idem_outbox_guard,
 * defined here.  idem_outbox_lock_keys, here too, is what the SQL
 * acknowledgement of older versions locked its keys with.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "idem.h"
#include "catalog.h"
#include "outbox.h"
#include "outbox_int.h"
#include "rowwrite.h"

PG_FUNCTION_INFO_V1(idem_outbox_lock_keys);
PG_FUNCTION_INFO_V1(idem_outbox_guard);

static const IdemColumnSpec outbox_columns[OB_NCOLS] = {
	[OB_ID] = {"message_id", INT8OID, 0, false, false},
	[OB_TOPIC] = {"topic", VARCHAROID, OUTBOX_TOPIC_MAX_LEN, false, false},
	[OB_KEY] = {"msg_key", VARCHAROID, OUTBOX_KEY_MAX_LEN, false, false},
	[OB_PAYLOAD] = {"payload", JSONBOID, 0, false, false},
	[OB_HEADERS] = {"headers", JSONBOID, 0, false, false},
	[OB_EMITTED] = {"emitted_at", TIMESTAMPTZOID, 0, false, false},
	[OB_COMMIT_SEQ] = {"commit_seq", INT8OID, 0, false, false},
	[OB_ATTEMPT] = {"attempt", INT4OID, 0, false, false},
	[OB_READY] = {"ready", BOOLOID, 0, false, false},
	[OB_LEASED] = {"leased_until", TIMESTAMPTZOID, 0, false, false},
	[OB_ACKED] = {"acked_at", TIMESTAMPTZOID, 0, false, false},
	[OB_OWNER] = {"owner_id", INT8OID, 0, false, true},
	/* written by the SQL of idem_outbox_nack and idem_outbox_fetch */
	[OB_NACKS] = {"nacks", INT4OID, 0, false, true},
	[OB_LAPSES] = {"lapses", INT4OID, 0, false, true},
	[OB_REASON] = {"last_reason", TEXTOID, 0, false, true},
	[OB_NOT_BEFORE] = {"not_before", TIMESTAMPTZOID, 0, false, true},
	/* a dead letter holding its key back (on_dead 'block') */
	[OB_DEAD] = {"dead_at", TIMESTAMPTZOID, 0, false, true},
};

/* idem.outbox_max_deliveries, read by idem_outbox_nack (SQL) */
static int	idem_outbox_max_deliveries = 5;

static const IdemTableSpec outbox_table = {
	"idem_outbox", "idem_outbox_message_id_seq", outbox_columns, OB_NCOLS,
	NULL, 0, true, {NULL}
};

int			idem_outbox_table_index = -1;

/*
 * Take the commit-order locks of the keys hashes[0..n-1] until the end of
 * the transaction.  The hashes are sorted; a key may repeat.  At most
 * OUTBOX_KEY_LOCKS keys take the all-keys lock in ROW EXCLUSIVE mode and
 * each key's lock.  More keys take the all-keys lock alone, in many_mode
 * (EXCLUSIVE for emitters).  The file's header says why.
 */
void
idem_outbox_lock_key_order(const uint64 *hashes, int n, LOCKMODE many_mode)
{
	LOCKTAG		tag;
	int			keys = 0;

	for (int i = 0; i < n; i++)
		if (i == 0 || hashes[i] != hashes[i - 1])
			keys++;
	if (keys == 0)
		return;
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, IDEM_LOCK_CLASS_OUTBOX_ALL);
	(void) LockAcquire(&tag, keys > OUTBOX_KEY_LOCKS ? many_mode : RowExclusiveLock,
					   false, false);
	if (keys > OUTBOX_KEY_LOCKS)
		return;
	for (int i = 0; i < n; i++)
	{
		if (i > 0 && hashes[i] == hashes[i - 1])
			continue;
		SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (hashes[i] >> 32),
							 (uint32) hashes[i], IDEM_LOCK_CLASS_OUTBOX);
		(void) LockAcquire(&tag, ExclusiveLock, false, false);
	}
}

/* A hash of (topic, msg_key), the topic's NUL as separator. */
uint64
idem_outbox_hash_key(const text *topic, const text *msg_key)
{
	int			tlen = VARSIZE_ANY_EXHDR(topic);
	int			klen = VARSIZE_ANY_EXHDR(msg_key);
	char	   *buf = palloc(tlen + 1 + klen);
	uint64		h;

	memcpy(buf, VARDATA_ANY(topic), tlen);
	buf[tlen] = '\0';
	memcpy(buf + tlen + 1, VARDATA_ANY(msg_key), klen);
	h = hash_bytes_extended((unsigned char *) buf, tlen + 1 + klen, 0);
	pfree(buf);
	return h;
}

/*
 * idem_outbox_key_order, the index of each key's unacknowledged messages
 * (topic, msg_key, commit_seq), opened.
 */
Relation
idem_outbox_open_key_index(const IdemTableLayout *t, Oid nspid, Relation heap)
{
	Oid			indexid = get_relname_relid("idem_outbox_key_order", nspid);
	Relation	index;

	if (!OidIsValid(indexid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's index \"idem_outbox_key_order\" is missing"),
				 errhint("Drop and re-create the extension idem.")));
	index = index_open(indexid, AccessShareLock);
	if (index->rd_index->indrelid != RelationGetRelid(heap) ||
		index->rd_index->indnkeyatts < 2 ||
		index->rd_index->indkey.values[0] != t->att[OB_TOPIC] ||
		index->rd_index->indkey.values[1] != t->att[OB_KEY] ||
		(index->rd_index->indnkeyatts >= 3 &&
		 index->rd_index->indkey.values[2] != t->att[OB_COMMIT_SEQ]))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's index \"idem_outbox_key_order\" is not on (topic, msg_key, commit_seq) of idem_outbox"),
				 errhint("Undo the change, or drop and re-create the extension idem.")));
	return index;
}

/* Order two texts by length, then bytes.  Any total order does. */
int
idem_outbox_text_order(const text *a, const text *b)
{
	int			alen = VARSIZE_ANY_EXHDR(a);
	int			blen = VARSIZE_ANY_EXHDR(b);

	if (alen != blen)
		return alen < blen ? -1 : 1;
	return memcmp(VARDATA_ANY(a), VARDATA_ANY(b), alen);
}

/*
 * Register the table with the catalog, define the GUC (from
 * idem_outbox_init, outbox_emit.c).
 */
void
idem_outbox_register_table(void)
{
	idem_outbox_table_index = idem_catalog_register(&outbox_table);

	DefineCustomIntVariable("idem.outbox_max_deliveries",
							"How many times a message may be reported not delivered before it is a dead letter.",
							"For topics without their own max_deliveries (idem_outbox_set_topic), "
							"and for consumers' attempts (idem_consume_failed). Lapsed leases never count.",
							&idem_outbox_max_deliveries,
							5, 1, 1000,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);
}

/* Sort order of uint64 hashes. */
static int
hash_order(const void *a, const void *b)
{
	uint64		h1 = *(const uint64 *) a;
	uint64		h2 = *(const uint64 *) b;

	return h1 < h2 ? -1 : (h1 > h2);
}

/* The key hashes of the pairs (topics[i], keys[i]), sorted. */
static uint64 *
pair_hashes(ArrayType *topics, ArrayType *keys, int *n)
{
	Datum	   *tv;
	Datum	   *kv;
	bool	   *tn;
	bool	   *kn;
	int			nt;
	int			nk;
	uint64	   *hashes;

	deconstruct_array(topics, TEXTOID, -1, false, TYPALIGN_INT, &tv, &tn, &nt);
	deconstruct_array(keys, TEXTOID, -1, false, TYPALIGN_INT, &kv, &kn, &nk);
	if (nt != nk)
		elog(ERROR, "idem: the outbox's key locks need as many topics as keys");
	hashes = palloc(Max(nt, 1) * sizeof(uint64));
	for (int i = 0; i < nt; i++)
	{
		if (tn[i] || kn[i])
			elog(ERROR, "idem: the outbox's key locks got a NULL topic or key");
		hashes[i] = idem_outbox_hash_key(DatumGetTextPP(tv[i]), DatumGetTextPP(kv[i]));
	}
	qsort(hashes, nt, sizeof(uint64), hash_order);
	*n = nt;
	return hashes;
}

/*
 * SQL: idem_outbox_lock_keys(topics text[], keys text[]) returns void
 *
 * Take the commit-order locks of the pairs (topics[i], keys[i]) as a
 * committing emitter does, until the end of the transaction (the
 * acknowledgement of 1.4 to 1.11).
 */
Datum
idem_outbox_lock_keys(PG_FUNCTION_ARGS)
{
	int			n;
	uint64	   *hashes = pair_hashes(PG_GETARG_ARRAYTYPE_P(0), PG_GETARG_ARRAYTYPE_P(1), &n);

	idem_outbox_lock_key_order(hashes, n, ExclusiveLock);
	PG_RETURN_VOID();
}

/*
 * SQL: idem_outbox_guard() returns void
 *
 * The first statement of idem_outbox_fetch and of the dead-letter
 * functions (through idem_outbox_dead_letter_check), SQL functions that
 * update idem_outbox as the extension's owner.  It makes
 * the refusal every write of idem's C code makes (idem_rows_check_triggers).
 * No user trigger on the outbox runs as the owner for a caller whose
 * temporary tables could capture the names the trigger does not qualify.
 */
Datum
idem_outbox_guard(PG_FUNCTION_ARGS)
{
	const IdemCatalog *cat = idem_catalog(fcinfo);
	Relation	rel = table_open(idem_catalog_table(cat, idem_outbox_table_index)->relid,
								 RowExclusiveLock);

	idem_rows_check_triggers(rel, rel->trigdesc);
	table_close(rel, NoLock);
	PG_RETURN_VOID();
}
