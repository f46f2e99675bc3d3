/*-------------------------------------------------------------------------
 *
 * inbox.c
 *	  The consumer inbox.  idem_consume.
 *
 * idem_consume(consumer, message_id) runs in the consumer's transaction,
 * with the effect of the message.  It returns true and writes an inbox row
 * the first time, and false once a transaction that consumed the message
 * has committed.  It is the protocol of a key, without a response to
 * replay.
 *
 * Callers of one (consumer, message_id) meet on a transaction-scoped lock
 * of the two (class IDEM_LOCK_CLASS_INBOX), waited for at most
 * idem.wait_timeout, then IK002.  A redelivery racing the first delivery
 * waits.  It then sees its row (false) or, after a rollback, none (true).
 *
 * Under the lock, the row is looked up with a dirty snapshot.  What
 * committed before the lock was granted counts, whatever the caller's
 * snapshot; in REPEATABLE READ too, false is the right answer then.  A row
 * past its expires_at is an expired entry.  It is deleted, and the message
 * is taken afresh, as an expired key starts afresh.  The unique index on
 * (consumer, message_id) stays the arbiter against writers that bypass
 * idem.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/genam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "catalog.h"
#include "citus.h"
#include "inbox.h"
#include "identity.h"
#include "key.h"
#include "binding.h"
#include "record.h"
#include "stats.h"
#include "rowwrite.h"
#include "util.h"

PG_FUNCTION_INFO_V1(idem_consume);
PG_FUNCTION_INFO_V1(idem_consume_args);

#define INBOX_CONSUMER_MAX_LEN		64
#define INBOX_MESSAGE_ID_MAX_LEN	512
#define INBOX_ATTEMPTS				3

/* GUC variable */
static int	idem_inbox_ttl = 7 * 86400;

/* The columns of idem_inbox, in the order of its spec (key first). */
enum
{
	IN_CONSUMER, IN_MESSAGE, IN_CONSUMED, IN_EXPIRES, IN_OWNER, IN_NCOLS
};

static const IdemColumnSpec inbox_columns[IN_NCOLS] = {
	[IN_CONSUMER] = {"consumer", VARCHAROID, INBOX_CONSUMER_MAX_LEN, false, false},
	[IN_MESSAGE] = {"message_id", VARCHAROID, INBOX_MESSAGE_ID_MAX_LEN, false, false},
	[IN_CONSUMED] = {"consumed_at", TIMESTAMPTZOID, 0, false, false},
	[IN_EXPIRES] = {"expires_at", TIMESTAMPTZOID, 0, false, false},
	/* whose message, for idem_forget_owner */
	[IN_OWNER] = {"owner_id", INT8OID, 0, false, true},
};

static const IdemTableSpec inbox_table = {
	"idem_inbox", NULL, inbox_columns, IN_NCOLS,
	"pk_idem_inbox", 2, true, {NULL}
};

static int	inbox_table_index = -1;

/* Register the table, define the GUC. */
void
idem_inbox_init(void)
{
	inbox_table_index = idem_catalog_register(&inbox_table);

	DefineCustomIntVariable("idem.inbox_ttl",
							"How long the inbox remembers a consumed message.",
							"A redelivery after that is taken as a new message. "
							"idem_consume's ttl argument overrides it.",
							&idem_inbox_ttl,
							7 * 86400, 1, INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);
}


/* The lock of one (consumer, message_id) in this database. */
static void
inbox_locktag(LOCKTAG *tag, const text *consumer, const text *message_id)
{
	int			clen = VARSIZE_ANY_EXHDR(consumer);
	int			mlen = VARSIZE_ANY_EXHDR(message_id);
	char		buf[INBOX_CONSUMER_MAX_LEN + 1 + INBOX_MESSAGE_ID_MAX_LEN * MAX_MULTIBYTE_CHAR_LEN];
	uint64		h;

	Assert(clen <= INBOX_CONSUMER_MAX_LEN);
	memcpy(buf, VARDATA_ANY(consumer), clen);
	buf[clen] = '\0';
	memcpy(buf + clen + 1, VARDATA_ANY(message_id), mlen);
	h = hash_bytes_extended((unsigned char *) buf, clen + 1 + mlen, 0);
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_LOCK_CLASS_INBOX);
}

/* What the probe found. */
typedef enum InboxEntry
{
	INBOX_NONE,					/* no entry, so consume */
	INBOX_LIVE,					/* consumed and not expired, so a redelivery */
	INBOX_EXPIRED,				/* an expired entry at *tid, to replace */
	INBOX_BUSY					/* another transaction, *busy, is writing
								 * an entry.  Wait for it */
} InboxEntry;

/*
 * Look (consumer, message_id) up through the key index with a dirty
 * snapshot, under the message's lock, in the relation rows has open for
 * the insert.  An entry another transaction is still inserting or deleting
 * (a consumer that gave the message's lock back once its entry was
 * written, the cleanup, or a writer around idem) is INBOX_BUSY.
 */
static InboxEntry
probe(const IdemTableLayout *t, IdemRows *rows, Datum consumer, Datum message_id,
	  TimestampTz now, ItemPointer tid, TransactionId *busy)
{
	ResultRelInfo *rri = rows->rels[0];
	Relation	heap = rri->ri_RelationDesc;
	Relation	index = NULL;
	SnapshotData dirty;
	ScanKeyData skey[2];
	IndexScanDesc scan;
	TupleTableSlot *slot = rows->slots[0];
	InboxEntry	entry = INBOX_NONE;

	for (int i = 0; i < rri->ri_NumIndices; i++)
		if (RelationGetRelid(rri->ri_IndexRelationDescs[i]) == t->keyindex)
			index = rri->ri_IndexRelationDescs[i];
	if (index == NULL)
		elog(ERROR, "idem: index %u of idem_inbox is not open", t->keyindex);

	InitDirtySnapshot(dirty);
	ScanKeyEntryInitialize(&skey[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[0], F_TEXTEQ, consumer);
	ScanKeyEntryInitialize(&skey[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[1], F_TEXTEQ, message_id);
	scan = idem_index_beginscan(heap, index, &dirty, 2, 0);
	index_rescan(scan, skey, 2, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		expires;

		*busy = idem_dirty_writer(&dirty);
		if (TransactionIdIsValid(*busy))
		{
			entry = INBOX_BUSY;
			break;
		}
		expires = slot_getattr(slot, t->att[IN_EXPIRES], &isnull);
		if (!isnull && DatumGetTimestampTz(expires) < now)
		{
			entry = INBOX_EXPIRED;
			*tid = slot->tts_tid;
		}
		else
			entry = INBOX_LIVE;
	}
	index_endscan(scan);
	ExecClearTuple(slot);
	return entry;
}

/* IK002: another transaction is consuming the message, past the wait. */
static void
report_in_flight(const char *consumer)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_IN_FLIGHT),
			 errmsg("another transaction is still consuming this message"),
			 errdetail("Consumer \"%s\" waited idem.wait_timeout (%d ms) for it.",
					   consumer, idem_wait_timeout),
			 errhint("Retry the delivery later.")));
}

static void
insert_entry(IdemRows *rows, const IdemTableLayout *t, Datum consumer, Datum message_id,
			 TimestampTz now, TimestampTz expires, const int64 *owner)
{
	IdemRow		row;

	idem_row_init(&row, t);
	idem_row_set(&row, IN_CONSUMER, consumer);
	idem_row_set(&row, IN_MESSAGE, message_id);
	idem_row_set(&row, IN_CONSUMED, TimestampTzGetDatum(now));
	idem_row_set(&row, IN_EXPIRES, TimestampTzGetDatum(expires));
	if (owner)
		idem_row_set(&row, IN_OWNER, Int64GetDatum(*owner));
	idem_rows_insert(rows, 0, row.values, row.nulls);
}

/* One message a consumer takes, from the call's checked arguments. */
typedef struct InboxCall
{
	IdemCatalog cat;			/* a copy, since a nested call may build the catalog again */
	const IdemTableLayout *t;	/* the inbox (its shard, on Citus) */
	text	   *consumer;
	char	   *consumer_name;
	text	   *message_id;
	TimestampTz now;
	TimestampTz expires;		/* of a new entry */
	bool		has_owner;		/* idem_consume's owner */
	int64		owner;
} InboxCall;

/* idem_consume's arguments: 22004 for a NULL, 22023 for a bad one. */
static void
consume_args(InboxCall *c, FunctionCallInfo fcinfo)
{
	idem_check_not_null(fcinfo, 0, "consumer");
	idem_check_not_null(fcinfo, 1, "message_id");
	c->consumer = PG_GETARG_TEXT_PP(0);
	c->message_id = PG_GETARG_TEXT_PP(1);
	idem_check_name("consumer", VARDATA_ANY(c->consumer), VARSIZE_ANY_EXHDR(c->consumer),
					INBOX_CONSUMER_MAX_LEN);
	idem_check_printable("message_id", VARDATA_ANY(c->message_id),
						 VARSIZE_ANY_EXHDR(c->message_id), INBOX_MESSAGE_ID_MAX_LEN);
	c->now = GetCurrentTransactionStartTimestamp();
	if (PG_ARGISNULL(2))
		c->expires = c->now + (TimestampTz) idem_inbox_ttl * USECS_PER_SEC;
	else
		c->expires = idem_check_ttl(PG_GETARG_INTERVAL_P(2), c->now);
	c->consumer_name = text_to_cstring(c->consumer);
	c->has_owner = PG_NARGS() > 3 && !PG_ARGISNULL(3);
	if (c->has_owner)
	{
		c->owner = PG_GETARG_INT64(3);
		idem_check_owner(c->owner);
	}
}

/*
 * One look at the message's entry, as the owner.  None (then this call
 * writes it), live, expired (its tid set) or being written by another
 * transaction (busy set).
 */
static InboxEntry
consume_attempt(InboxCall *c, IdemIdentity *identity, ItemPointer tid, TransactionId *busy)
{
	IdemRows	rows;
	InboxEntry	entry;

	idem_rows_begin(&rows, &c->t->relid, 1, CMD_INSERT);
	if (idem_catalog_current(&c->cat))
		idem_rows_set_checks(&rows, 0, c->t->checks, c->t->ncheck);
	/* triggers and the like run under search_path = pg_catalog, pg_temp */
	if (idem_rows_run_user_code(&rows, 0))
		idem_use_safe_search_path(identity);
	entry = probe(c->t, &rows, PointerGetDatum(c->consumer), PointerGetDatum(c->message_id),
				  c->now, tid, busy);
	if (entry == INBOX_NONE)
		insert_entry(&rows, c->t, PointerGetDatum(c->consumer), PointerGetDatum(c->message_id),
					 c->now, c->expires, c->has_owner ? &c->owner : NULL);
	idem_rows_end(&rows);
	return entry;
}

/*
 * Take the message, holding its lock tag, as the owner.  True when this call
 * wrote its entry, false for a redelivery.  Written, or a redelivery.  The
 * lock goes at once (the written entry's uncommitted index entry makes a
 * redelivery wait now).  Another transaction writing the entry.  Wait for
 * it, keeping the lock so that the deliveries queued behind us keep their
 * order, then look again.  Expired: delete it, then look again.
 */
static bool
inbox_consume(InboxCall *c, LOCKTAG *tag, IdemIdentity *identity)
{
	for (int attempt = 1; attempt <= INBOX_ATTEMPTS; attempt++)
	{
		ItemPointerData tid;
		TransactionId busy = InvalidTransactionId;
		InboxEntry	entry = consume_attempt(c, identity, &tid, &busy);

		if (entry == INBOX_NONE || entry == INBOX_LIVE)
			idem_unlock_key(tag);
		if (entry == INBOX_NONE)
			return true;
		if (entry == INBOX_LIVE)
		{
			idem_stats_count(IDEM_KIND_CONSUMER, c->consumer_name, IDEM_STAT_INBOX_DUPLICATES, 1);
			return false;
		}
		if (entry == INBOX_BUSY)
		{
			if (!idem_wait_for_xact(busy, IDEM_KIND_CONSUMER, c->consumer_name))
			{
				idem_restore_caller(identity);
				report_in_flight(c->consumer_name);
			}
			continue;
		}
		/* expired, so delete it (or find it gone or changed) */
		(void) idem_rows_delete_read(c->t->relid, &tid, "an expired inbox entry");
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not consume the message: its inbox entry kept changing"),
			 errhint("Retry the transaction.")));
	return false;				/* keep the compiler quiet */
}

/*
 * SQL: idem_internal.idem_consume_args(consumer text, message_id text,
 * owner bigint) returns void.  idem_consume_check and idem_consume_failed
 * check their arguments with idem_consume's rules and SQLSTATEs, and the
 * caller's idem.allowed_owners.
 */
Datum
idem_consume_args(PG_FUNCTION_ARGS)
{
	text	   *consumer;
	text	   *message_id;

	idem_check_not_null(fcinfo, 0, "consumer");
	idem_check_not_null(fcinfo, 1, "message_id");
	consumer = PG_GETARG_TEXT_PP(0);
	message_id = PG_GETARG_TEXT_PP(1);
	idem_check_name("consumer", VARDATA_ANY(consumer), VARSIZE_ANY_EXHDR(consumer),
					INBOX_CONSUMER_MAX_LEN);
	idem_check_printable("message_id", VARDATA_ANY(message_id),
						 VARSIZE_ANY_EXHDR(message_id), INBOX_MESSAGE_ID_MAX_LEN);
	if (!PG_ARGISNULL(2))
		idem_check_owner(PG_GETARG_INT64(2));
	PG_RETURN_VOID();
}

/* SQL: idem_consume(consumer text, message_id text, ttl interval, owner bigint) returns boolean */
Datum
idem_consume(PG_FUNCTION_ARGS)
{
	InboxCall	c;
	IdemIdentity identity = {0};
	LOCKTAG		tag;
	bool		consumed;

	consume_args(&c, fcinfo);
	PreventCommandIfReadOnly("idem_consume()");
	c.cat = *idem_catalog(fcinfo);
	c.t = idem_catalog_table(&c.cat, inbox_table_index);
	if (!idem_citus_route(&c.cat, inbox_table_index, PointerGetDatum(c.consumer), TEXTOID))
		return idem_citus_redispatch(fcinfo);

	/* in the consumer's row, calls and the first consumptions as executed */
	idem_stats_count(IDEM_KIND_CONSUMER, c.consumer_name, IDEM_STAT_CALLS, 1);
	inbox_locktag(&tag, c.consumer, c.message_id);
	if (!idem_lock_key(&tag, IDEM_KIND_CONSUMER, c.consumer_name))
		report_in_flight(c.consumer_name);
	idem_become_owner(&identity, c.cat.owner);
	consumed = inbox_consume(&c, &tag, &identity);
	idem_restore_caller(&identity);
	if (consumed)
		idem_stats_count_at_commit(IDEM_KIND_CONSUMER, c.consumer_name, IDEM_STAT_EXECUTED, 1);
	PG_RETURN_BOOL(consumed);
}
