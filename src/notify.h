/*-------------------------------------------------------------------------
 *
 * notify.h
 *	  The outbox notifier: NOTIFY idem_outbox after emitting commits.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_NOTIFY_H
#define IDEM_NOTIFY_H

extern void idem_notify_shmem_request(void);
extern void idem_notify_shmem_startup(void);
extern bool idem_notify_defer(int ntopics);
extern void idem_notify_committed(const char *const *topics, int ntopics);
extern void idem_notify_aborted(int ntopics);

#endif							/* IDEM_NOTIFY_H */
