/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  The transactional outbox: idem_outbox_emit.
 *
 * A message exists if and only if the transaction that emitted it
 * commits, and for one (topic, msg_key) messages are delivered in the
 * order their transactions committed.  Both follow from when the row is
 * written: idem_outbox_emit draws the message id and keeps the message in
 * the transaction's memory; at PRE_COMMIT (or PRE_PREPARE) every message
 * of the transaction is inserted, and a keyed one gets its commit_seq then,
 * under a lock of its (topic, msg_key) that is held until the commit is
 * done.  So of two transactions emitting for one key, the one that commits
 * first draws the smaller commit_seq, and its rows are visible before the
 * other's: a fetcher that sees a message of the key sees every earlier one.
 *
 * The locks are two-level, as a table's are to its rows: a transaction of
 * at most OUTBOX_KEY_LOCKS keys takes the all-keys lock in ROW EXCLUSIVE
 * mode, which such transactions share, and then each key's lock; one of
 * more keys takes the all-keys lock in EXCLUSIVE mode alone, which orders
 * it against every key at once.  So a commit holds at most
 * OUTBOX_KEY_LOCKS + 1 locks, whatever it emitted: a backfill of a million
 * keyed messages cannot fill the server's lock table.  The locks of one
 * transaction are taken in one global order (the all-keys lock, then by
 * hash), so committing transactions cannot deadlock on them.  An
 * acknowledgement takes the same locks, except that one of more keys whose
 * messages are all their keys' heads takes the all-keys lock in SHARE
 * mode: it excludes every emitter, but not the other acknowledgements,
 * which touch only their own heads and the messages after them (see
 * idem_outbox_ack in idem--1.11--1.12.sql).
 *
 * A savepoint rolled back takes its messages with it.  Publishers are
 * woken by NOTIFY idem_outbox, '<topic>' once the transaction has
 * committed, for each topic of its messages: see notify.c.
 *
 * The fetch and the acknowledgement are SQL (idem--1.11--1.12.sql): the
 * fetch one UPDATE ... FOR UPDATE SKIP LOCKED, the acknowledgement a
 * DELETE under its keys' locks (idem_outbox_ack_lock_keys) and an UPDATE
 * of each key's next message, which the executor does well.
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
#include "commands/async.h"
#include "commands/sequence.h"
#include "common/hashfn.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "tcop/utility.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "sequence.h"
#include "catalog.h"
#include "outbox.h"
#include "identity.h"
#include "key.h"
#include "notify.h"
#include "stats.h"
#include "rowwrite.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_outbox_emit);
PG_FUNCTION_INFO_V1(idem_outbox_lock_keys);
PG_FUNCTION_INFO_V1(idem_outbox_ack);
PG_FUNCTION_INFO_V1(idem_outbox_guard);

#define OUTBOX_TOPIC_MAX_LEN	IDEM_TOPIC_MAX_LEN
#define OUTBOX_KEY_MAX_LEN		256

/* The columns of idem_outbox, in the order of its spec. */
enum
{
	OB_ID, OB_TOPIC, OB_KEY, OB_PAYLOAD, OB_HEADERS, OB_EMITTED, OB_COMMIT_SEQ,
	OB_ATTEMPT, OB_READY, OB_LEASED, OB_ACKED, OB_NCOLS
};

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
};

/* 1.4 */
static const IdemTableSpec outbox_table = {
	"idem_outbox", "idem_outbox_message_id_seq", outbox_columns, OB_NCOLS,
	NULL, 0, true, {NULL}
};

static int	outbox_table_index = -1;

/* A message this transaction emitted. */
typedef struct PendingMessage
{
	int64		message_id;
	text	   *topic;
	text	   *msg_key;		/* NULL: no key */
	Jsonb	   *payload;
	Jsonb	   *headers;		/* NULL: none */
	TimestampTz emitted_at;
	uint64		keyhash;		/* of (topic, msg_key), if it has a key */
	SubTransactionId subid;		/* emitted in */
	struct PendingMessage *next;
} PendingMessage;

/*
 * The transaction's messages in emit order, and where to write them: the
 * outbox as the first emit's catalog found it, all in TopTransactionContext.
 */
static PendingMessage *pending = NULL;
static PendingMessage **pending_tail = &pending;
static int	npending = 0;
static IdemTableLayout *target = NULL;
static Oid	target_owner = InvalidOid;
static Oid	target_nspid = InvalidOid;

/* The topics of the flushed messages, when the notifier sends their NOTIFY. */
static char **deferred_topics = NULL;
static int	ndeferred_topics = 0;

/* Up to this many keys, a commit locks each; past it, all keys at once. */
#define OUTBOX_KEY_LOCKS		16

/*
 * Take the commit-order locks of the keys hashes[0..n-1], sorted (a key
 * may repeat), until the end of the transaction (see the file's header):
 * for at most OUTBOX_KEY_LOCKS keys the all-keys lock in ROW EXCLUSIVE mode
 * and each key's, for more the all-keys lock in many_mode alone (EXCLUSIVE
 * for emitters).
 */
static void
lock_key_order(const uint64 *hashes, int n, LOCKMODE many_mode)
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
static uint64
hash_topic_key(const text *topic, const text *msg_key)
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
static Relation
open_key_index(const IdemTableLayout *t, Oid nspid, Relation heap)
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

/*
 * Has (topic, msg_key) an unacknowledged message?  Asked under the key's
 * lock, which every emitter and acknowledger of the key takes: a dirty
 * snapshot then sees exactly what they committed.
 */
static bool
key_has_unacked(Relation heap, Relation index, TupleTableSlot *slot,
				text *topic, text *msg_key)
{
	SnapshotData dirty;
	ScanKeyData skey[2];
	IndexScanDesc scan;
	bool		found = false;

	InitDirtySnapshot(dirty);
	ScanKeyEntryInitialize(&skey[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[0], F_TEXTEQ, PointerGetDatum(topic));
	ScanKeyEntryInitialize(&skey[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[1], F_TEXTEQ, PointerGetDatum(msg_key));
	scan = idem_index_beginscan(heap, index, &dirty, 2, 0);
	index_rescan(scan, skey, 2, NULL, 0);
	while (!found && index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;

		(void) slot_getattr(slot, target->att[OB_ACKED], &isnull);
		found = isnull;
	}
	index_endscan(scan);
	return found;
}

/* Order two texts by length, then bytes: any total order does. */
static int
text_order(const text *a, const text *b)
{
	int			alen = VARSIZE_ANY_EXHDR(a);
	int			blen = VARSIZE_ANY_EXHDR(b);

	if (alen != blen)
		return alen < blen ? -1 : 1;
	return memcmp(VARDATA_ANY(a), VARDATA_ANY(b), alen);
}

/* Order two keyed messages by key: hash, then (topic, msg_key) apart. */
static int
key_order(const PendingMessage *m1, const PendingMessage *m2)
{
	int			c;

	if (m1->keyhash != m2->keyhash)
		return m1->keyhash < m2->keyhash ? -1 : 1;
	c = text_order(m1->topic, m2->topic);
	return c != 0 ? c : text_order(m1->msg_key, m2->msg_key);
}

/* Keyed messages first, by key (see key_order), each key's in emit order. */
static int
flush_order(const void *a, const void *b)
{
	const PendingMessage *m1 = *(PendingMessage *const *) a;
	const PendingMessage *m2 = *(PendingMessage *const *) b;

	if ((m1->msg_key == NULL) != (m2->msg_key == NULL))
		return m1->msg_key == NULL ? 1 : -1;
	if (m1->msg_key != NULL)
	{
		int			c = key_order(m1, m2);

		if (c != 0)
			return c;
	}
	return m1->message_id < m2->message_id ? -1 : (m1->message_id > m2->message_id);
}

/*
 * Insert the transaction's messages, as the extension's owner, each keyed
 * one under its key's commit-order lock with a commit_seq drawn there.
 */
static void
flush_pending(void)
{
	PendingMessage **order;
	IdemIdentity identity = {0};
	IdemRows	rows;
	IdemRow		row;
	int			n = 0;
	uint64	   *hashes;
	int			nhashes = 0;
	Relation	key_index = NULL;
	TupleTableSlot *probe_slot = NULL;

	order = palloc(npending * sizeof(PendingMessage *));
	for (PendingMessage *m = pending; m != NULL; m = m->next)
		order[n++] = m;
	qsort(order, n, sizeof(PendingMessage *), flush_order);

	/* first every lock, in hash order, so that no two commits deadlock */
	hashes = palloc(n * sizeof(uint64));
	for (int i = 0; i < n && order[i]->msg_key != NULL; i++)
		hashes[nhashes++] = order[i]->keyhash;
	lock_key_order(hashes, nhashes, ExclusiveLock);
	pfree(hashes);

	idem_become_owner(&identity, target_owner);
	idem_use_safe_search_path(&identity);
	PushActiveSnapshot(GetTransactionSnapshot());
	idem_rows_begin(&rows, &target->relid, 1, CMD_INSERT);
	idem_row_init(&row, target);
	if (n > 0 && order[0]->msg_key != NULL)
	{
		key_index = open_key_index(target, target_nspid, rows.rels[0]->ri_RelationDesc);
		probe_slot = table_slot_create(rows.rels[0]->ri_RelationDesc, NULL);
	}
	for (int i = 0; i < n; i++)
	{
		PendingMessage *m = order[i];
		int64		commit_seq = m->message_id;
		bool		ready = true;

		CHECK_FOR_INTERRUPTS();
		if (m->msg_key != NULL)
		{
			commit_seq = idem_nextval(target->seq, false);
			/* the head of its key if the key has nothing unacknowledged */
			if (i > 0 && order[i - 1]->msg_key != NULL && key_order(order[i - 1], m) == 0)
				ready = false;
			else
				ready = !key_has_unacked(rows.rels[0]->ri_RelationDesc, key_index,
										 probe_slot, m->topic, m->msg_key);
		}
		memset(row.nulls, true, target->natts * sizeof(bool));
		idem_row_set(&row, OB_ID, Int64GetDatum(m->message_id));
		idem_row_set(&row, OB_TOPIC, PointerGetDatum(m->topic));
		if (m->msg_key != NULL)
			idem_row_set(&row, OB_KEY, PointerGetDatum(m->msg_key));
		idem_row_set(&row, OB_PAYLOAD, JsonbPGetDatum(m->payload));
		if (m->headers != NULL)
			idem_row_set(&row, OB_HEADERS, JsonbPGetDatum(m->headers));
		idem_row_set(&row, OB_EMITTED, TimestampTzGetDatum(m->emitted_at));
		idem_row_set(&row, OB_COMMIT_SEQ, Int64GetDatum(commit_seq));
		idem_row_set(&row, OB_ATTEMPT, Int32GetDatum(0));
		idem_row_set(&row, OB_READY, BoolGetDatum(ready));
		idem_rows_insert(&rows, 0, row.values, row.nulls);
	}
	if (key_index != NULL)
	{
		ExecDropSingleTupleTableSlot(probe_slot);
		index_close(key_index, NoLock);
	}
	idem_rows_end(&rows);
	PopActiveSnapshot();
	idem_restore_caller(&identity);
	pfree(order);
}

/*
 * For each topic of the transaction's messages: count them in idem_stats
 * (at commit), and wake the topic's publishers once the transaction has
 * committed, through the notifier (see notify.c), or, when that cannot be
 * counted on or the transaction is being prepared, by its own NOTIFY.
 */
static void
announce_topics(bool preparing)
{
	char	  **topics = MemoryContextAlloc(TopTransactionContext, npending * sizeof(char *));
	int64	   *messages = palloc0(npending * sizeof(int64));
	int			n = 0;

	for (PendingMessage *m = pending; m != NULL; m = m->next)
	{
		char	   *t = text_to_cstring(m->topic);
		int			i = 0;

		while (i < n && strcmp(topics[i], t) != 0)
			i++;
		if (i == n)
			topics[n++] = MemoryContextStrdup(TopTransactionContext, t);
		messages[i]++;
		pfree(t);
	}
	for (int i = 0; i < n; i++)
		idem_stats_count_at_commit(IDEM_KIND_TOPIC, topics[i], IDEM_STAT_OUTBOX_EMITTED, messages[i]);
	pfree(messages);

	if (!preparing && idem_notify_defer(n))
	{
		deferred_topics = topics;
		ndeferred_topics = n;
		return;
	}
	for (int i = 0; i < n; i++)
		Async_Notify(IDEM_OUTBOX_CHANNEL, topics[i]);
}

static void
forget_pending(void)
{
	deferred_topics = NULL;
	ndeferred_topics = 0;
	/* the memory goes with TopTransactionContext */
	pending = NULL;
	pending_tail = &pending;
	npending = 0;
	target = NULL;
	target_owner = InvalidOid;
	target_nspid = InvalidOid;
}

static void
outbox_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			if (npending > 0)
			{
				flush_pending();
				announce_topics(event == XACT_EVENT_PRE_PREPARE);
			}
			break;
		case XACT_EVENT_COMMIT:
			if (ndeferred_topics > 0)
				idem_notify_committed(IDEM_NOTIFY_OUTBOX, (const char *const *) deferred_topics, ndeferred_topics);
			forget_pending();
			break;
		case XACT_EVENT_ABORT:
			if (ndeferred_topics > 0)
				idem_notify_aborted(ndeferred_topics);
			forget_pending();
			break;
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			forget_pending();
			break;
		default:
			break;
	}
}

/*
 * A subtransaction that rolls back takes its messages with it; one that
 * commits hands them to its parent.
 */
static void
outbox_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	PendingMessage **link = &pending;

	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;
	pending_tail = &pending;
	while (*link != NULL)
	{
		PendingMessage *m = *link;

		if (m->subid == mySubid)
		{
			if (event == SUBXACT_EVENT_ABORT_SUB)
			{
				*link = m->next;
				npending--;
				continue;		/* its memory goes with the transaction */
			}
			m->subid = parentSubid;
		}
		link = &m->next;
	}
	pending_tail = link;
	/* no message left: the next emit takes the outbox as it finds it */
	if (npending == 0)
	{
		target = NULL;
		target_owner = InvalidOid;
	}
}

/* Register the table and the transaction callbacks. */
void
idem_outbox_init(void)
{
	outbox_table_index = idem_catalog_register(&outbox_table);
	RegisterXactCallback(outbox_xact_callback, NULL);
	RegisterSubXactCallback(outbox_subxact_callback, NULL);
}

/* A copy of varlena d in TopTransactionContext, detoasted. */
static void *
keep(Datum d)
{
	struct varlena *v = PG_DETOAST_DATUM_PACKED(d);
	Size		len = VARSIZE_ANY(v);
	void	   *copy = MemoryContextAlloc(TopTransactionContext, len);

	memcpy(copy, v, len);
	return copy;
}

/* idem_outbox_emit's arguments: 22004 for a NULL, 22023 for a bad one. */
static void
emit_args(FunctionCallInfo fcinfo)
{
	text	   *topic;

	idem_check_not_null(fcinfo, 0, "topic");
	idem_check_not_null(fcinfo, 1, "payload");
	topic = PG_GETARG_TEXT_PP(0);
	idem_check_name("topic", VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic),
					OUTBOX_TOPIC_MAX_LEN);
	if (!PG_ARGISNULL(2))
	{
		text	   *key = PG_GETARG_TEXT_PP(2);

		/* as message_id and worker: printable text, never echoed */
		idem_check_printable("msg_key", VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key),
							 OUTBOX_KEY_MAX_LEN);
	}
	if (!PG_ARGISNULL(3) && !JB_ROOT_IS_OBJECT(PG_GETARG_JSONB_P(3)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object")));
}

/*
 * Remember, for the commit's flush, the outbox this transaction's first
 * message goes to (t, of cat); a later message must go to the same one.
 */
static void
keep_target(const IdemCatalog *cat, const IdemTableLayout *t)
{
	MemoryContext oldcxt;

	if (target != NULL && target->relid != t->relid)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's outbox was re-created after this transaction emitted messages"),
				 errhint("Roll back, and emit the messages in a new transaction.")));
	if (target != NULL)
		return;
	oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	target = palloc(sizeof(IdemTableLayout));
	*target = *t;
	target->att = palloc(OB_NCOLS * sizeof(AttrNumber));
	memcpy(target->att, t->att, OB_NCOLS * sizeof(AttrNumber));
	target->ncheck = 0;
	target->checks = NULL;
	target_owner = cat->owner;
	target_nspid = cat->nspid;
	MemoryContextSwitchTo(oldcxt);
}

/*
 * SQL: idem_outbox_emit(topic text, payload jsonb, msg_key text, headers jsonb)
 * returns bigint
 */
Datum
idem_outbox_emit(PG_FUNCTION_ARGS)
{
	const IdemCatalog *cat;
	const IdemTableLayout *t;
	PendingMessage *m;

	emit_args(fcinfo);
	PreventCommandIfReadOnly("idem_outbox_emit()");
	PreventCommandIfParallelMode("idem_outbox_emit()");
	cat = idem_catalog(fcinfo);
	t = idem_catalog_table(cat, outbox_table_index);
	keep_target(cat, t);

	m = MemoryContextAllocZero(TopTransactionContext, sizeof(PendingMessage));
	/* the extension's own sequence, drawn for the caller idem_outbox_emit serves */
	m->message_id = idem_nextval(t->seq, false);
	m->topic = keep(PG_GETARG_DATUM(0));
	m->msg_key = PG_ARGISNULL(2) ? NULL : keep(PG_GETARG_DATUM(2));
	m->payload = keep(PG_GETARG_DATUM(1));
	m->headers = PG_ARGISNULL(3) ? NULL : keep(PG_GETARG_DATUM(3));
	m->emitted_at = GetCurrentTransactionStartTimestamp();
	if (m->msg_key != NULL)
		m->keyhash = hash_topic_key(m->topic, m->msg_key);
	m->subid = GetCurrentSubTransactionId();
	*pending_tail = m;
	pending_tail = &m->next;
	npending++;

	PG_RETURN_INT64(m->message_id);
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
		hashes[i] = hash_topic_key(DatumGetTextPP(tv[i]), DatumGetTextPP(kv[i]));
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

	lock_key_order(hashes, n, ExclusiveLock);
	PG_RETURN_VOID();
}

/*
 * SQL: idem_outbox_guard() returns void
 *
 * The first statement of idem_outbox_fetch and idem_outbox_ack, SQL
 * functions that update idem_outbox as the extension's owner: the same
 * refusal as every write of idem's C code (idem_rows_check_triggers), so
 * that no user trigger on the outbox runs as the owner for a caller whose
 * temporary tables could capture the names it does not qualify.
 */
Datum
idem_outbox_guard(PG_FUNCTION_ARGS)
{
	const IdemCatalog *cat = idem_catalog(fcinfo);
	Relation	rel = table_open(idem_catalog_table(cat, outbox_table_index)->relid,
								 RowExclusiveLock);

	idem_rows_check_triggers(rel, rel->trigdesc);
	table_close(rel, NoLock);
	PG_RETURN_VOID();
}

/*
 * The acknowledgement (1.12): idem_outbox_ack.
 *
 * Every message acknowledged is deleted at once; each key whose head it
 * was gets its next message made the head (ready).  In order:
 *
 * 1. The messages are read (primary key) as the statement's snapshot
 *    shows them: a ready message stays ready until it is deleted, so
 *    whether each keyed one is its key's head holds until step 3.  A
 *    message committed after that snapshot is not acknowledged.
 * 2. Their keys' locks are taken, before any row is written: for at most
 *    OUTBOX_KEY_LOCKS keys each key's, for more the all-keys lock, in
 *    SHARE mode if every keyed message is its key's head, else EXCLUSIVE.
 *    Either excludes the emitters of those keys until the commit, so that
 *    a message an emitter left behind an old head is seen by step 4.
 *    SHARE lets acknowledgements of heads run together: each deletes only
 *    heads (two that delete the same one queue on its row) and touches
 *    only the message after each of its heads, which nobody else writes
 *    meanwhile (a fetch leases heads only; an acknowledgement of a message
 *    behind a head takes EXCLUSIVE).
 * 3. The messages are deleted (row locks, following updates: a fetch may
 *    have leased a message again since step 1), counted per topic.
 * 4. With a snapshot taken now, each key's first message after its
 *    acknowledged head (from the key's start if a message behind its head
 *    was acknowledged) is made ready, unless it already is.
 */

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
		c = text_order(m1->topic, m2->topic);
		if (c == 0)
			c = text_order(m1->msg_key, m2->msg_key);
		if (c != 0)
			return c;
	}
	return m1->commit_seq < m2->commit_seq ? -1 : (m1->commit_seq > m2->commit_seq);
}

static bool
same_key(const AckedMessage *m1, const AckedMessage *m2)
{
	return m1->keyhash == m2->keyhash && text_order(m1->topic, m2->topic) == 0 &&
		text_order(m1->msg_key, m2->msg_key) == 0;
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
			continue;			/* acknowledged before 1.12: the cleanup's */
		m->tid = slot->tts_tid;
		m->topic = DatumGetTextPCopy(slot_getattr(slot, t->att[OB_TOPIC], &isnull));
		d = slot_getattr(slot, t->att[OB_KEY], &isnull);
		m->msg_key = isnull ? NULL : DatumGetTextPCopy(d);
		m->commit_seq = DatumGetInt64(slot_getattr(slot, t->att[OB_COMMIT_SEQ], &isnull));
		m->ready = DatumGetBool(slot_getattr(slot, t->att[OB_READY], &isnull));
		m->keyhash = m->msg_key ? hash_topic_key(m->topic, m->msg_key) : 0;
		nfound++;
	}
	index_endscan(scan);
	index_close(pk, NoLock);
	ExecDropSingleTupleTableSlot(slot);
	return nfound;
}

/*
 * Step 2: the locks of the keyed messages found[0..nkeyed-1], sorted by key;
 * behind: one of them is not its key's head.
 */
static void
ack_lock(const AckedMessage *found, int nkeyed, bool behind)
{
	uint64	   *hashes = palloc(Max(nkeyed, 1) * sizeof(uint64));

	for (int i = 0; i < nkeyed; i++)
		hashes[i] = found[i].keyhash;
	lock_key_order(hashes, nkeyed, behind ? ExclusiveLock : ShareLock);
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
 * Step 4, for the key of m: its first unacknowledged message after
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
		if (DatumGetBool(slot_getattr(slot, t->att[OB_READY], &isnull)))
			break;				/* the head already */
		tmres = table_tuple_lock(heap, &tid, snapshot, locked, GetCurrentCommandId(false),
								 LockTupleNoKeyExclusive, LockWaitBlock,
								 TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd);
		if (tmres == TM_Deleted)
			continue;			/* acknowledged meanwhile: the next one */
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
	t = idem_catalog_table(cat, outbox_table_index);
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
		keyindex = open_key_index(t, cat->nspid, heap);
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
