/*-------------------------------------------------------------------------
 *
 * inbox.h
 *	  The consumer inbox (inbox.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_INBOX_H
#define IDEM_INBOX_H

extern void idem_inbox_init(void);

#endif							/* IDEM_INBOX_H */
