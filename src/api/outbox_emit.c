/*-------------------------------------------------------------------------
 *
 * outbox_emit.c
 *	  idem_outbox_emit, and the commit's flush of the emitted messages.
 *
 * A message exists if and only if the transaction that emitted it
 * commits, and for one (topic, msg_key) messages are delivered in the
 * order their transactions committed.  Both follow from when the row is
 * written.  idem_outbox_emit draws the message id and keeps the message in
 * the transaction's memory.  At PRE_COMMIT (or PRE_PREPARE) every message
 * of the transaction is inserted.  A keyed one gets its commit_seq then,
 * under the commit-order lock of its (topic, msg_key) (outbox.c), held
 * until the commit is done.  So of two transactions emitting for one key,
 * the one that commits first draws the smaller commit_seq, and its rows
 * are visible before the other's.  A fetcher that sees a message of the
 * key sees every earlier one.  A keyed message is its key's head (ready)
 * if the key had nothing unacknowledged when it was flushed.
 *
 * A savepoint rolled back takes its messages with it.  Publishers are
 * woken by NOTIFY idem_outbox, '<topic>' once the transaction has
 * committed, for each topic of its messages.  See notify.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "commands/async.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/rel.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "sequence.h"
#include "catalog.h"
#include "outbox.h"
#include "outbox_int.h"
#include "identity.h"
#include "key.h"
#include "notify.h"
#include "pending.h"
#include "binding.h"
#include "trace.h"
#include "stats.h"
#include "rowwrite.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_outbox_emit);

/* A message this transaction emitted. */
typedef struct PendingMessage
{
	int64		message_id;
	text	   *topic;
	text	   *msg_key;		/* NULL: no key */
	Jsonb	   *payload;
	Jsonb	   *headers;		/* NULL: none */
	int64		owner;
	bool		has_owner;		/* false: NULL */
	TimestampTz emitted_at;
	uint64		keyhash;		/* of (topic, msg_key), if it has a key */
	SubTransactionId subid;		/* emitted in */
	struct PendingMessage *next;
} PendingMessage;

/*
 * The transaction's messages in emit order, and where to write them.  The
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

/*
 * Has (topic, msg_key) an unacknowledged message?  Asked under the key's
 * lock, which every emitter and acknowledger of the key takes.  A dirty
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

/* Order two keyed messages by key: hash, then (topic, msg_key) apart. */
static int
key_order(const PendingMessage *m1, const PendingMessage *m2)
{
	int			c;

	if (m1->keyhash != m2->keyhash)
		return m1->keyhash < m2->keyhash ? -1 : 1;
	c = idem_outbox_text_order(m1->topic, m2->topic);
	return c != 0 ? c : idem_outbox_text_order(m1->msg_key, m2->msg_key);
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
	idem_outbox_lock_key_order(hashes, nhashes, ExclusiveLock);
	pfree(hashes);

	idem_become_owner(&identity, target_owner);
	idem_use_safe_search_path(&identity);
	PushActiveSnapshot(GetTransactionSnapshot());
	idem_rows_begin(&rows, &target->relid, 1, CMD_INSERT);
	idem_row_init(&row, target);
	if (n > 0 && order[0]->msg_key != NULL)
	{
		key_index = idem_outbox_open_key_index(target, target_nspid, rows.rels[0]->ri_RelationDesc);
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
		if (m->has_owner && target->att[OB_OWNER] != InvalidAttrNumber)
			idem_row_set(&row, OB_OWNER, Int64GetDatum(m->owner));
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
 * For each topic of the transaction's messages, count them in idem_stats
 * (at commit) and wake the topic's publishers once the transaction has
 * committed.  The notifier (notify.c) wakes them.  When it cannot be
 * counted on, or the transaction is being prepared, the transaction's own
 * NOTIFY does.
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
	/* no message left, so the next emit takes the outbox as it finds it */
	if (npending == 0)
	{
		target = NULL;
		target_owner = InvalidOid;
	}
}

/* The outbox's start-up, its table and the transaction callbacks of the emit. */
void
idem_outbox_init(void)
{
	idem_outbox_register_table();
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

/*
 * The message's headers: the emit's, with the caller's idem.trace_context
 * as "traceparent" unless they carry one; NULL for none.
 */
static void *
emit_headers(FunctionCallInfo fcinfo)
{
	const char *trace = idem_trace_context();
	Datum		headers;

	if (trace == NULL)
		return PG_ARGISNULL(3) ? NULL : keep(PG_GETARG_DATUM(3));
	/* the setting's check admits hex digits and dashes only */
	headers = DirectFunctionCall1(jsonb_in, CStringGetDatum(psprintf("{\"traceparent\": \"%s\"}", trace)));
	if (!PG_ARGISNULL(3))
		headers = DirectFunctionCall2(jsonb_concat, headers, PG_GETARG_DATUM(3));
	return keep(headers);
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

		/* as message_id and worker, printable text never echoed */
		idem_check_printable("msg_key", VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key),
							 OUTBOX_KEY_MAX_LEN);
	}
	if (!PG_ARGISNULL(3) && !JB_ROOT_IS_OBJECT(PG_GETARG_JSONB_P(3)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object")));
	/* an owner outside the session's binding is 42501, as for a claim */
	if (PG_NARGS() > 4 && !PG_ARGISNULL(4))
		idem_check_owner(PG_GETARG_INT64(4));
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
 * SQL: idem_outbox_emit(topic text, payload jsonb, msg_key text, headers jsonb,
 * owner bigint) returns bigint.  owner: whose the message is, for
 * idem_forget_owner; NULL: the owner of the transaction's unfinished claims
 * (idem_begin's), if they are all one owner's, else none.
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
	t = idem_catalog_table(cat, idem_outbox_table_index);
	keep_target(cat, t);

	m = MemoryContextAllocZero(TopTransactionContext, sizeof(PendingMessage));
	/* the extension's own sequence, drawn for the caller idem_outbox_emit serves */
	m->message_id = idem_nextval(t->seq, false);
	m->topic = keep(PG_GETARG_DATUM(0));
	m->msg_key = PG_ARGISNULL(2) ? NULL : keep(PG_GETARG_DATUM(2));
	m->payload = keep(PG_GETARG_DATUM(1));
	m->headers = emit_headers(fcinfo);
	/* whose it is, the owner given or else the owner of the transaction's unfinished claims */
	if (PG_NARGS() > 4 && !PG_ARGISNULL(4))
	{
		m->owner = PG_GETARG_INT64(4);
		m->has_owner = true;
	}
	else
		m->has_owner = idem_pending_owner(&m->owner);
	m->emitted_at = GetCurrentTransactionStartTimestamp();
	if (m->msg_key != NULL)
		m->keyhash = idem_outbox_hash_key(m->topic, m->msg_key);
	m->subid = GetCurrentSubTransactionId();
	*pending_tail = m;
	pending_tail = &m->next;
	npending++;

	PG_RETURN_INT64(m->message_id);
}
