/*-------------------------------------------------------------------------
 *
 * entry.h
 *	  Start-up of the SQL entry-point modules (order.c, outbox.c, inbox.c), for
 *	  _PG_init.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_ENTRY_H
#define IDEM_ENTRY_H

extern void idem_order_init(void);
extern void idem_outbox_init(void);
extern void idem_inbox_init(void);

#endif							/* IDEM_ENTRY_H */
