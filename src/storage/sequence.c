/*-------------------------------------------------------------------------
 *
 * sequence.c
 *	  idem's sequences.  A value is never handed out twice, a promotion
 *	  included.
 *
 * idem hands values of its sequences to the world outside the database:
 * outbox message ids (a consumer's inbox keeps them to drop redeliveries),
 * fencing tokens (a worker that was cut off still holds one), order ids
 * and numbers, task ids.  A sequence is not transactional and is logged
 * ahead, so after a crash a server never hands a value out again.  But a
 * standby promoted after asynchronous replication has only what it had
 * replayed.  It would hand out again the values the old primary drew
 * since.  A new message would then be dropped as a redelivery, and a
 * cut-off worker's token would be valid again.
 *
 * So the first draw of a database's idem sequence on a new timeline (a
 * promotion, a point-in-time recovery) first moves every idem sequence of
 * its schema IDEM_TIMELINE_RESERVE (2^36) past its value here.  It then
 * records the timeline in idem_timeline_seq, and the draws of that
 * timeline all come after.  2^36 is more than a primary can draw before a
 * standby that far behind is promoted.  Patroni promotes none lagging more
 * than maximum_lag_on_failover, 1 MB of WAL by default, which holds at most
 * about 20,000 sequence records of 32 values.  Each backend asks once per
 * timeline; after that a draw costs one comparison.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xlog.h"
#include "catalog/pg_class.h"
#include "catalog/pg_sequence.h"
#include "commands/sequence.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "idem.h"
#include "compat.h"
#include "identity.h"
#include "sequence.h"


/* The sequences a new timeline moves on, and the one that records it. */
static const char *const idem_sequences[] = {
	"idempotency_record_id_seq", "purchase_order_id_seq",
	"idem_outbox_message_id_seq", "idem_task_token_seq", "idem_operator_audit_id_seq"
};
#define TIMELINE_SEQ	"idem_timeline_seq"

/* The timeline this backend has seen reserved (its database's). */
static TimeLineID reserved_tli = 0;

static Oid
relation_owner(Oid relid)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Oid			owner;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "idem: cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	return owner;
}

/* A sequence's maximum value. */
static int64
sequence_max(Oid seq)
{
	HeapTuple	tup = SearchSysCache1(SEQRELID, ObjectIdGetDatum(seq));
	int64		max;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "idem: cache lookup failed for sequence %u", seq);
	max = ((Form_pg_sequence) GETSTRUCT(tup))->seqmax;
	ReleaseSysCache(tup);
	return max;
}

/* The timeline recorded in idem_timeline_seq, 0 if it has none. */
static int64
recorded_timeline(Oid mark)
{
	Datum		d;
	LOCAL_FCINFO(fcinfo, 1);

	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(mark);
	fcinfo->args[0].isnull = false;
	d = pg_sequence_last_value(fcinfo);
	return fcinfo->isnull ? 0 : DatumGetInt64(d);
}

/*
 * On a timeline the sequences of nspid were not reserved for.  Move each
 * IDEM_TIMELINE_RESERVE ahead, then record the timeline.  Under a session
 * lock, so that the backends of the new timeline reserve once.
 */
static void
reserve_timeline(Oid nspid, TimeLineID tli)
{
	Oid			mark = get_relname_relid(TIMELINE_SEQ, nspid);
	LOCKTAG		tag;
	IdemIdentity identity = {0};

	if (!OidIsValid(mark))
		return;					/* an older version has nothing to record it in */
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, IDEM_LOCK_CLASS_TIMELINE);
	(void) LockAcquire(&tag, ExclusiveLock, true, false);
	PG_TRY();
	{
		idem_become_owner(&identity, relation_owner(mark));
		if (recorded_timeline(mark) != (int64) tli)
		{
			for (int i = 0; i < (int) lengthof(idem_sequences); i++)
			{
				Oid			seq = get_relname_relid(idem_sequences[i], nspid);
				int64		v;
				int64		max;

				if (!OidIsValid(seq))
					continue;
				v = nextval_internal(seq, false);
				max = sequence_max(seq);
				v = (v > max - IDEM_TIMELINE_RESERVE) ? max : v + IDEM_TIMELINE_RESERVE;
				DirectFunctionCall3(setval3_oid, ObjectIdGetDatum(seq), Int64GetDatum(v),
									BoolGetDatum(true));
			}
			DirectFunctionCall3(setval3_oid, ObjectIdGetDatum(mark), Int64GetDatum((int64) tli),
								BoolGetDatum(true));
			ereport(LOG,
					(errmsg("idem: sequences moved %lld ahead for timeline %u",
							(long long) IDEM_TIMELINE_RESERVE, tli),
					 errdetail("Values the previous timeline drew without this server replaying them are never handed out again.")));
		}
		idem_restore_caller(&identity);
	}
	PG_FINALLY();
	{
		LockRelease(&tag, ExclusiveLock, true);
	}
	PG_END_TRY();
}

/*
 * nextval of one of idem's sequences (seq), never a value of an earlier
 * timeline.  See the file's header.
 */
int64
idem_nextval(Oid seq, bool check_permissions)
{
	if (!RecoveryInProgress())
	{
		TimeLineID	tli = GetWALInsertionTimeLine();

		if (tli != reserved_tli)
		{
			reserve_timeline(get_rel_namespace(seq), tli);
			reserved_tli = tli;
		}
	}
	return nextval_internal(seq, check_permissions);
}

/*
 * Record the current timeline in idem_timeline_seq of schema nspid without
 * moving the sequences.  What CREATE EXTENSION and the update to 1.12 do
 * (idem_timeline_mark), so that only a later timeline moves them.
 */
void
idem_timeline_mark_current(Oid nspid)
{
	Oid			mark = get_relname_relid(TIMELINE_SEQ, nspid);

	if (!OidIsValid(mark))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem's sequence \"%s\" is missing", TIMELINE_SEQ),
				 errhint("Drop and re-create the extension idem.")));
	PreventCommandIfReadOnly("idem_timeline_mark()");
	DirectFunctionCall3(setval3_oid, ObjectIdGetDatum(mark),
						Int64GetDatum((int64) GetWALInsertionTimeLine()), BoolGetDatum(true));
	reserved_tli = 0;
}
