/*-------------------------------------------------------------------------
 *
 * sequence.h
 *	  idem's sequences.  A value is never handed out twice, a promotion
 *	  included.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_SEQUENCE_H
#define IDEM_SEQUENCE_H

/* How far each sequence jumps on the first draw of a new timeline, 2^36. */
#define IDEM_TIMELINE_RESERVE	INT64CONST(68719476736)

extern int64 idem_nextval(Oid seq, bool check_permissions);

extern void idem_timeline_mark_current(Oid nspid);

#endif							/* IDEM_SEQUENCE_H */
