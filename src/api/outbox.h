/*-------------------------------------------------------------------------
 *
 * outbox.h
 *	  The transactional outbox (outbox.c, outbox_emit.c, outbox_ack.c; what
 *	  they share is in outbox_int.h).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_OUTBOX_H
#define IDEM_OUTBOX_H

extern void idem_outbox_init(void);

#endif							/* IDEM_OUTBOX_H */
