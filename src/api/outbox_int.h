/*-------------------------------------------------------------------------
 *
 * outbox_int.h
 *	  What the outbox's files share.  idem_outbox's columns, the commit-order
 *	  locks of its keys, the index of each key's messages.
 *
 * The outbox is three files behind this header, as pgvector's hnsw*.c are
 * behind hnsw.h.  outbox.c (the table, the key locks, the SQL helpers
 * idem_outbox_lock_keys and idem_outbox_guard), outbox_emit.c
 * (idem_outbox_emit and the commit's flush) and outbox_ack.c
 * (idem_outbox_ack).  The fetch is SQL (idem_outbox_fetch).  One UPDATE ...
 * FOR UPDATE SKIP LOCKED of the keys' heads, which the executor does well.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_OUTBOX_INT_H
#define IDEM_OUTBOX_INT_H

#include "storage/lockdefs.h"
#include "utils/relcache.h"

#include "catalog.h"

#define OUTBOX_TOPIC_MAX_LEN	IDEM_TOPIC_MAX_LEN
#define OUTBOX_KEY_MAX_LEN		256

/* The columns of idem_outbox, in the order of its spec. */
enum
{
	OB_ID, OB_TOPIC, OB_KEY, OB_PAYLOAD, OB_HEADERS, OB_EMITTED, OB_COMMIT_SEQ,
	OB_ATTEMPT, OB_READY, OB_LEASED, OB_ACKED, OB_OWNER,
	OB_NACKS, OB_LAPSES, OB_REASON, OB_NOT_BEFORE, OB_DEAD, OB_NCOLS
};

/* Up to this many keys, a commit locks each; past it, all keys at once. */
#define OUTBOX_KEY_LOCKS		16

/* idem_outbox's index in the catalog (outbox.c) */
extern int	idem_outbox_table_index;

extern void idem_outbox_lock_key_order(const uint64 *hashes, int n, LOCKMODE many_mode);
extern uint64 idem_outbox_hash_key(const text *topic, const text *msg_key);
extern Relation idem_outbox_open_key_index(const IdemTableLayout *t, Oid nspid, Relation heap);
extern int	idem_outbox_text_order(const text *a, const text *b);

extern void idem_outbox_register_table(void);

#endif							/* IDEM_OUTBOX_INT_H */
