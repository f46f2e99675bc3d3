/*-------------------------------------------------------------------------
 *
 * outbox.h
 *	  The transactional outbox (outbox.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_OUTBOX_H
#define IDEM_OUTBOX_H

extern void idem_outbox_init(void);

#endif							/* IDEM_OUTBOX_H */
