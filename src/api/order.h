/*-------------------------------------------------------------------------
 *
 * order.h
 *	  The article's order operation, idem_create_order (order.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_ORDER_H
#define IDEM_ORDER_H

extern void idem_order_init(void);

#endif							/* IDEM_ORDER_H */
